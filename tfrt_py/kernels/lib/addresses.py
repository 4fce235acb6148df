"""Where arrays' data start, without ``ndarray.ctypes``.

``arr.ctypes.data`` costs ~1.2 µs in CPython (it builds a ``_ctypes`` object from
``__array_interface__``): a kernel that asks per call whether ``out`` is its input's own
buffer (the planner's in place) paid ~2.5 µs for it, and the stacked products' three
addresses cost ~4 µs, more than a small attention product. Here a tiny compiled function
reads them (~0.3-0.4 µs, numba's dispatch); without numba (or with ``$TFRT_PY_JIT=0`` at
the first call) ``ctypes.data`` answers, the same values.

``same_start(x, y)``: whether ``x`` and ``y`` start at the same address.
``addresses(a, b, c, d=None)``: a new uint64 array of the four start addresses (``d``
defaults to ``c``: three operands read the first three).
Any thread; each call compiles nothing after the first of its array types (numba's disk
cache keeps them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .jit import Jitted

__all__ = ["addresses", "same_start"]


def _same_start(x: Any, y: Any) -> bool:  # pragma: no cover - numba only
    return x.ctypes.data == y.ctypes.data


def _addresses(a: Any, b: Any, c: Any, d: Any, out: Any) -> None:  # pragma: no cover
    out[0] = a.ctypes.data
    out[1] = b.ctypes.data
    out[2] = c.ctypes.data
    out[3] = d.ctypes.data


def _warm_same(fn: Any) -> None:
    for t in (np.float32, np.float64):
        for shape in ((2,), (2, 2), (1, 2, 2), (1, 1, 2, 2)):
            x = np.zeros(shape, t)
            fn(x, x)


def _warm_addresses(fn: Any) -> None:
    out = np.empty(4, np.uint64)
    for t in (np.float32, np.float64):
        x = np.zeros((1, 2, 2, 2), t)
        view = x.transpose(0, 2, 1, 3)  # a head view: not C-contiguous
        fn(view, view, x, x, out)
        fn(x, view, x, x, out)
        fn(x, x, x, x, out)
        fn(view, view, view, x, out)
        fn(view, view, view, view, out)  # Attention's output, written as heads


_SAME = Jitted(_same_start, _warm_same)
_ADDRESSES = Jitted(_addresses, _warm_addresses)
#: [same_start's function, addresses' function] once resolved: compiled, or the
#: ``ctypes`` forms (the same values: nothing to switch per call, so ``$TFRT_PY_JIT`` is
#: read once, and ``Jitted.get``'s ~1 µs of checks is not paid per call)
_FNS: list[Any] = []


def _ctypes_same(x: np.ndarray, y: np.ndarray) -> bool:
    return bool(x.ctypes.data == y.ctypes.data)


def _ctypes_addresses(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, out: np.ndarray
) -> None:
    out[:] = (a.ctypes.data, b.ctypes.data, c.ctypes.data, d.ctypes.data)


def _resolve() -> list[Any]:
    if not _FNS:
        same, addr = _SAME.get(), _ADDRESSES.get()
        _FNS[:] = [same or _ctypes_same, addr or _ctypes_addresses]
    return _FNS


def same_start(x: np.ndarray, y: np.ndarray) -> bool:
    return bool((_FNS or _resolve())[0](x, y))


def addresses(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray | None = None
) -> np.ndarray:
    out = np.empty(4, np.uint64)
    (_FNS or _resolve())[1](a, b, c, c if d is None else d, out)
    return out
