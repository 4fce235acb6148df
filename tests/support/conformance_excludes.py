"""ONNX node cases tfrt_py does not run, by case-name pattern (``re.fullmatch``), each with
the reason. ``test_conformance.py`` fails if a pattern here stops matching any case.
"""

from __future__ import annotations

EXCLUDES: dict[str, str] = {
    # Random ops: the expected values come from the generator of the onnx reference
    # implementation; any other generator gives different (equally valid) samples.
    r"test_bernoulli(_double|_seed)?(_expanded)?": "random sampling; values depend on the RNG",
    # ImageDecoder decodes JPEG/PNG/TIFF/WebP/... bytes: an image codec library, not a
    # tensor kernel. tfrt_py has no codec dependency.
    r"test_image_decoder_decode_.*": "needs an image codec library (JPEG, PNG, WebP, ...)",
    # ai.onnx.preview.training optimizer updates: tfrt_py is an inference runtime.
    r"test_(adagrad|adam|momentum|nesterov_momentum)(_multiple)?": "training-only optimizer op",
}
