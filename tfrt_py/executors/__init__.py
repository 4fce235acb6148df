"""Executors over a prepared program. Executors know nothing of ONNX."""

from __future__ import annotations

from .program import Program as Program
from .program import compile_program as compile_program

__all__ = ["Program", "compile_program"]
