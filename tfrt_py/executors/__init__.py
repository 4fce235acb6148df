"""Executors over a prepared program: the sync interpreter and the async dataflow executor.

They know nothing of the compiler, and of ONNX only its control-flow ops' semantics (the
dataflow executor runs If, Loop and Scan non-strictly).
"""

from __future__ import annotations

from .program import Program as Program
from .program import compile_program as compile_program

__all__ = ["Program", "compile_program"]
