"""Frontends: model formats -> IR. Only ONNX for now."""
