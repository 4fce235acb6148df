"""Fixtures that run a test with the compiled kernels (``TFRT_PY_JIT=1``; skipped without
numba) and again with the NumPy paths (``TFRT_PY_JIT=0``). Import them into a test module:

* ``jit``: asked for by name; its value is ``"jit"`` or ``"numpy"``;
* ``both_paths``: the same, autouse: every test of the module runs twice.
"""

from __future__ import annotations

import pytest

from tfrt_py.kernels.jit import ENV_JIT, jit_enabled

__all__ = ["both_paths", "jit"]


def _select(param: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if param == "numpy":
        monkeypatch.setenv(ENV_JIT, "0")
    else:
        monkeypatch.setenv(ENV_JIT, "1")
        if not jit_enabled():
            pytest.skip("numba is not installed: the compiled kernels cannot run")
    return param


@pytest.fixture(params=["jit", "numpy"])
def jit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return _select(str(request.param), monkeypatch)


@pytest.fixture(autouse=True, params=["jit", "numpy"])
def both_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return _select(str(request.param), monkeypatch)
