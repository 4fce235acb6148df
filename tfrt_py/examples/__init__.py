"""Bundled example models and the demo (``python -m tfrt_py.examples.demo``)."""
