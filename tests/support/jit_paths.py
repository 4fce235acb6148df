"""``both_paths``: an autouse fixture that runs every test of a module twice, with the
compiled kernels (``TFRT_PY_JIT=1``; skipped without numba) and with the NumPy paths
(``TFRT_PY_JIT=0``). Import it into a test module to use it."""

from __future__ import annotations

import pytest

from tfrt_py.kernels.jit import ENV_JIT, jit_enabled

__all__ = ["both_paths"]


@pytest.fixture(autouse=True, params=["jit", "numpy"])
def both_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setenv(ENV_JIT, "0")
    else:
        monkeypatch.setenv(ENV_JIT, "1")
        if not jit_enabled():
            pytest.skip("numba is not installed: the compiled kernels cannot run")
    return str(request.param)
