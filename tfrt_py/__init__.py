"""tfrt_py: a TFRT-style model runtime for Python on NumPy.

Load a model once, call it many times::

    model = tfrt_py.load("model.onnx")
    outputs = model.run({"x": x})
    outputs = await model.run_async({"x": x})

This module only re-exports; see ``model.py`` and the subpackages.
"""

from __future__ import annotations

from . import errors as errors
from . import ir as ir
from .feeds import TensorSpec as TensorSpec
from .model import Model as Model
from .model import load as load

__version__ = "0.1.0"

__all__ = ["Model", "TensorSpec", "__version__", "errors", "ir", "load"]
