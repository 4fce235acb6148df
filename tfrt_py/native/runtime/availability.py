"""Whether the native tier can run here, asked without importing numba or the compiler
(``compile.py``): ``selection`` asks it for every model, most of which never compile."""

from __future__ import annotations

import importlib.util

from ...errors import TfrtError

__all__ = ["NativeUnavailable", "available"]


class NativeUnavailable(TfrtError, RuntimeError):
    """numba cannot be imported here, so the native tier cannot run."""


def available() -> bool:
    """Whether numba looks importable (does not import it; ``pip install 'tfrt-py[native]'``
    installs it)."""
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):  # an import hook refusing it, a broken install
        return False
