"""``RotaryHalf(x, cos, sin, h)`` (from ``compiler/fuse_rotary.py``): the rotate-half rotary
position embedding ``x * cos + Concat(-x[..., h:], x[..., :h], axis=-1) * sin``, with ONNX's
Mul/Add broadcasting and Slice's index rules for ``h`` (negative counts from the end, out
of range clamps).

When ``cos`` and ``sin`` broadcast to ``x``'s shape along every axis but the last, which
they share with ``x``: each element is ``x * cos -/+ x' * sin`` with the same float
operations as the seven nodes it replaces (negation is exact; no contraction into FMA),
so the same bits -- in one compiled pass for float32 at rank 4 (Hugging Face's (batch,
heads, length, head size) with cos/sin (batch or 1, 1, length, head size); numba, compiled
at load for float32 only: float16 has no numba arithmetic, and another dtype would compile
inside a call), else in three NumPy passes. Anything else runs the nodes' composition in
NumPy. Supports ``out=``. Thread-safe: no state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import Cost, KernelContext, KernelFlags
from ..lib.jit import Jitted
from ..registry import KernelRegistry
from .domain import DOMAIN

__all__ = ["register_kernels", "rotary_half"]


def _point(h: Any, d: int) -> int:
    """ONNX Slice's position of index ``h`` on an axis of ``d``: negative from the end,
    clamped to [0, d]."""
    k = int(h.reshape(-1)[0]) if isinstance(h, np.ndarray) else int(np.asarray(h).reshape(-1)[0])
    if k < 0:
        k += d
    return min(max(k, 0), d)


def _fits(shape: tuple[int, ...], a: np.ndarray) -> bool:
    """Whether ``a`` broadcasts to ``shape`` and has its last axis whole."""
    n = a.ndim
    if not n or n > len(shape) or a.shape[-1] != shape[-1]:
        return False
    for got, want in zip(a.shape[:-1], shape[len(shape) - n : -1]):
        if got != want and got != 1:
            return False
    return True


def _rotary4(x: Any, cos: Any, sin: Any, k: int, y: Any) -> None:  # pragma: no cover
    """``rotary_half`` of a rank-4 ``x`` into ``y``; ``cos``/``sin`` rank 4, each axis but
    the last of ``x``'s size or 1. numba only."""
    nb, nh, nl, d = x.shape
    m = d - k
    for b in range(nb):
        cb = b if cos.shape[0] != 1 else 0
        sb = b if sin.shape[0] != 1 else 0
        for h in range(nh):
            ch = h if cos.shape[1] != 1 else 0
            sh = h if sin.shape[1] != 1 else 0
            for t in range(nl):
                ct = t if cos.shape[2] != 1 else 0
                st = t if sin.shape[2] != 1 else 0
                for j in range(m):
                    a = x[b, h, t, j] * cos[cb, ch, ct, j]
                    y[b, h, t, j] = a - x[b, h, t, k + j] * sin[sb, sh, st, j]
                for j in range(k):
                    a = x[b, h, t, m + j] * cos[cb, ch, ct, m + j]
                    y[b, h, t, m + j] = a + x[b, h, t, j] * sin[sb, sh, st, m + j]


def _warm(fn: Any) -> None:
    x = np.ones((1, 2, 1, 4), np.float32)
    fn(x, x[:, :1], x[:, :1], 2, np.empty_like(x))
    fn(x.transpose(0, 2, 1, 3), x[:, :1], x[:, :1], 2, np.empty((1, 1, 2, 4), np.float32))
    # cos/sin gathered per position come Fortran-ordered (Llama's decode steps)
    f = np.asfortranarray(np.ones((1, 1, 2, 4), np.float32))
    y = np.empty((1, 2, 2, 4), np.float32)
    fn(np.ones((1, 2, 2, 4), np.float32).transpose(0, 2, 1, 3), f, f, 2, y)  # heads' view
    fn(y, f, f, 2, np.empty_like(y))


_ROTARY4 = Jitted(_rotary4, _warm)


def rotary_half(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    h: Any,
    out: np.ndarray | None = None,
    compiled: Any = None,
) -> np.ndarray:
    """``x * cos + Concat(-x[..., h:], x[..., :h], axis=-1) * sin`` (see the module);
    ``compiled``: ``_rotary4``'s dispatcher, for rank 4."""
    d = x.shape[-1] if x.ndim else 1
    k = _point(h, d)
    if _fits(x.shape, cos) and _fits(x.shape, sin) and cos.dtype == sin.dtype == x.dtype:
        if compiled is not None and x.dtype == np.float32 and x.ndim == 4 == cos.ndim == sin.ndim:
            y = np.empty(x.shape, x.dtype) if out is None else out
            compiled(x, cos, sin, k, y)
            return y
        y = np.multiply(x, cos, out=out)
        m = d - k  # the second half's length: it comes first in the rotation
        if m:
            y[..., :m] -= x[..., k:] * sin[..., :m]
        if k:
            y[..., m:] += x[..., :k] * sin[..., m:]
        return y
    rot = np.concatenate([np.negative(x[..., k:]), x[..., :k]], axis=-1)
    return np.add(np.multiply(x, cos), np.multiply(rot, sin), out=out)


def _rotary(ctx: KernelContext) -> Any:
    compiled = _ROTARY4.get()

    def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, h: Any, out: Any = None) -> Any:
        return rotary_half(x, cos, sin, h, out, compiled)

    return rotary


def _rotary_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    y = float(math.prod(outs[0])) if outs and outs[0] else 0.0
    return Cost(3.0 * y, 4.0 * 3.0 * y)


def register_kernels(registry: KernelRegistry) -> None:
    """Register ``RotaryHalf`` into ``registry``."""
    registry.add("RotaryHalf", _rotary, domain=DOMAIN, flags=KernelFlags(supports_out=True),
                 cost=_rotary_cost)  # fmt: skip
