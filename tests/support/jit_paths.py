"""Fixtures that run a test with the compiled kernels (``TFRT_PY_JIT=1``; skipped without
numba) and again with the NumPy paths (``TFRT_PY_JIT=0``). Import them into a test module:

* ``jit``: asked for by name; its value is ``"jit"`` or ``"numpy"``;
* ``both_paths``: the same, autouse: every test of the module runs twice;
* ``compiled_only``: a mark for a test of a compiled kernel itself;
* ``spy_compiled(monkeypatch, module, getter)``: records what the compiled kernel that
  ``module.getter()`` hands out returns, each time it runs;
* ``spy_served(monkeypatch, module, name)``: records whether a fast path that answers None
  where it does not apply served each call;
* ``spying_jitted(jitted)``: a context in which a ``Jitted``'s compiled function counts
  its calls;
* ``ir_lanes()`` / ``need_lanes(lanes)``: the vector widths this host builds the LLVM IR
  kernels at (``kernels/lib/pool_ir.host_lanes``), and a skip unless it builds one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tfrt_py.kernels.lib.jit import ENV_JIT, jit_enabled, why_off

__all__ = ["both_paths", "compiled_only", "ir_lanes", "jit", "need_lanes", "spy_compiled",
           "spy_served", "spying_jitted"]  # fmt: skip

#: For a test of a compiled kernel itself: skipped where this run has them off.
compiled_only = pytest.mark.skipif(
    not jit_enabled(),
    reason="compiled kernels are off in this run (no numba, or $TFRT_PY_JIT=0: CI's fallback leg)",
)


def _select(param: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if param == "numpy":
        monkeypatch.setenv(ENV_JIT, "0")
    else:
        monkeypatch.setenv(ENV_JIT, "1")
        if not jit_enabled():
            pytest.skip(f"the compiled kernels cannot run: {why_off()}")
    return param


@pytest.fixture(params=["jit", "numpy"])
def jit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return _select(str(request.param), monkeypatch)


@pytest.fixture(autouse=True, params=["jit", "numpy"])
def both_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return _select(str(request.param), monkeypatch)


def spy_compiled(monkeypatch: pytest.MonkeyPatch, module: ModuleType, getter: str) -> list[Any]:
    """Replace ``module.<getter>`` (a ``Jitted``-backed ``fn()`` returning the compiled
    kernel or None) so that the kernel it returns appends its result to the returned list
    at every call; None stays None (the NumPy path, nothing recorded)."""
    real = getattr(module, getter)
    calls: list[Any] = []

    def spy() -> Any:
        fn = real()
        if fn is None:
            return None

        def recording(*args: Any) -> Any:
            calls.append(fn(*args))
            return calls[-1]

        return recording

    monkeypatch.setattr(module, getter, spy)
    return calls


def spy_served(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[bool]:
    """Replace ``owner.<name>`` (a module's function or a class's method), a fast path that
    answers None when it does not apply, so that each call appends whether it served
    (answered something else than None)."""
    real = getattr(owner, name)
    served: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        served.append(out is not None)
        return out

    monkeypatch.setattr(owner, name, spy)
    return served


@contextlib.contextmanager
def spying_jitted(jitted: Any) -> Iterator[list[int]]:
    """``jitted``'s compiled function counted: the list gets an entry per call."""
    real = jitted.get()
    assert real is not None
    calls: list[int] = []

    def spy(*args: object) -> object:
        calls.append(1)
        return real(*args)

    jitted._compiled = spy
    try:
        yield calls
    finally:
        jitted._compiled = real


def ir_lanes() -> list[int]:
    """The floats a vector the IR kernels build at on this host (16: AVX-512F, 8: AVX2),
    none without an llvmlite JIT."""
    try:
        from tfrt_py.kernels.lib.pool_ir import host_lanes

        return host_lanes()
    except Exception:  # noqa: BLE001 - no llvmlite binding: no width
        return []


def need_lanes(lanes: int) -> None:
    """Skip the calling test unless this host builds the IR kernels ``lanes`` wide."""
    if lanes not in ir_lanes():
        pytest.skip(f"this host has no {'AVX-512F' if lanes == 16 else 'AVX2'}")
