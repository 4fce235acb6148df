"""tfrt_py: a TFRT-style model runtime for Python on NumPy.

Load a model once, call it many times::

    model = tfrt_py.load("model.onnx")
    outputs = model.run({"x": x})
    outputs = await model.run_async({"x": x})

This module only re-exports; see ``model.py`` and the subpackages.
"""

from __future__ import annotations

import warnings as _warnings

from . import errors as errors
from . import ir as ir
from .feeds import TensorSpec as TensorSpec
from .model import Model as Model
from .model import load as load

__version__ = "0.1.0"

__all__ = ["Model", "TensorSpec", "__version__", "errors", "ir", "load"]

# A kernel computes what the ONNX spec says for every input: log(0) is -inf, an int cast of
# NaN is whatever the cast gives, and NumPy's floating-point RuntimeWarnings from tfrt_py's
# own kernels ("divide by zero encountered in log" from T5's position buckets) are noise a
# user cannot act on (onnxruntime computes the same silently). Only warnings raised from
# tfrt_py's modules are ignored; a later filter (pytest's "error") still sees them.
_warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"tfrt_py(\.|$)")
