"""Squeeze-and-excite in one pass: ``x * act2(W2 @ act1(W1 @ mean(x) + b1) + b2)`` per image
and channel (``compiler.fuse_vision``'s ``SqueezeExcite``: MobileNet v3, EfficientNet,
RegNetY). In NumPy its parts cost more than its work: the spatial mean of a (576, 49)
image is 18-22 µs of per-row reduction overhead, the broadcast multiply ~10 µs. The
compiled loop (float32) sums each channel's row, runs the two small products as
vectorized row updates, applies the activations with ``conv_direct._act_row`` (the fused
Conv epilogues' arithmetic) and scales ``x`` into the output; float64 and runs without
numba take the NumPy formulation, which computes the same values.

Thread-safe: no state but the compiled function and the immutable weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..common import scratch
from ..lib.jit import CONTRACT, Jitted
from .conv_direct import Epilogue, _act_row, _jit_act, _params, make_epilogue

__all__ = ["SPLIT_MIN_ELEMENTS", "squeeze_excite_fn"]


def _se_means(x: Any, n: int, g: Any, c0: int, c1: int) -> None:  # pragma: no cover
    """g[c] = mean(x[n, c]) for c0 <= c < c1: eight partial sums in the input's dtype (one
    vector of them: a single float64 chain ran ~1 element a cycle, 3x NumPy's mean on
    EfficientNet's 112x112 maps), added in float64."""
    s_ = x.shape[2]
    inv = 1.0 / s_
    zero = x.dtype.type(0)
    for c in range(c0, c1):
        xr = x[n, c]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
        t = 0
        while t + 8 <= s_:
            a0 += xr[t]
            a1 += xr[t + 1]
            a2 += xr[t + 2]
            a3 += xr[t + 3]
            a4 += xr[t + 4]
            a5 += xr[t + 5]
            a6 += xr[t + 6]
            a7 += xr[t + 7]
            t += 8
        acc = ((float(a0) + float(a1)) + (float(a2) + float(a3))) + (
            (float(a4) + float(a5)) + (float(a6) + float(a7))
        )
        while t < s_:
            acc += float(xr[t])
            t += 1
        g[c] = acc * inv


def _se_gate(  # pragma: no cover - numba only
    g: Any, w1t: Any, b1: Any, w2t: Any, b2: Any, act1: int, p1: Any, act2: int, p2: Any,
    h: Any, s: Any,
) -> None:  # fmt: skip
    """s = act2(act1(g @ w1t + b1) @ w2t + b2)."""
    neg0 = -p1[2]
    _se_vecmat(g, w1t, b1, h)
    _act_row(h, neg0, act1, p1)
    _se_vecmat(h, w2t, b2, s)
    _act_row(s, neg0, act2, p2)


def _se_vecmat(v: Any, w: Any, b: Any, out: Any) -> None:  # pragma: no cover - numba only
    """out = v @ w + b as row updates (each vectorized along ``out``)."""
    for j in range(out.shape[0]):
        out[j] = b[j]
    for i in range(v.shape[0]):
        vi = v[i]
        wr = w[i]
        for j in range(out.shape[0]):
            out[j] += vi * wr[j]


def _se_scale(x: Any, out: Any, n: int, s: Any, c0: int, c1: int) -> None:  # pragma: no cover
    for c in range(c0, c1):
        sc = s[c]
        xr = x[n, c]
        orow = out[n, c]
        for t in range(x.shape[2]):
            orow[t] = xr[t] * sc


def _squeeze_excite(  # pragma: no cover - numba only
    x: Any, w1t: Any, b1: Any, w2t: Any, b2: Any, out: Any, act1: int, p1: Any, act2: int,
    p2: Any, h: Any, s: Any, g: Any,
) -> None:  # fmt: skip
    """``out[n, c, :] = x[n, c, :] * s[c]`` with ``s = act2(act1(mean(x[n]) @ w1t + b1) @
    w2t + b2)``; ``x``, ``out`` (N, C, S) C-contiguous, ``w1t`` (C, C1), ``w2t`` (C1, C),
    ``h`` (C1,), ``s`` and ``g`` (C,) scratch."""
    c_ = x.shape[1]
    for n in range(x.shape[0]):
        _se_means(x, n, g, 0, c_)
        _se_gate(g, w1t, b1, w2t, b2, act1, p1, act2, p2, h, s)
        _se_scale(x, out, n, s, 0, c_)


#: numba, set by ``Jitted(parallel=True)`` before the parallel loops below compile.
numba: Any = None


def _squeeze_excite_par(  # pragma: no cover - numba only
    x: Any, w1t: Any, b1: Any, w2t: Any, b2: Any, out: Any, act1: int, p1: Any, act2: int,
    p2: Any, h: Any, s: Any, g: Any, edges: Any,
) -> None:  # fmt: skip
    """``_squeeze_excite`` with the means and the scaling of each image in channel blocks
    (between consecutive ``edges``) in ``prange`` loops on native threads; ``g`` (C,)."""
    for n in range(x.shape[0]):
        for i in numba.prange(edges.shape[0] - 1):
            _se_means(x, n, g, edges[i], edges[i + 1])
        _se_gate(g, w1t, b1, w2t, b2, act1, p1, act2, p2, h, s)
        for i in numba.prange(edges.shape[0] - 1):
            _se_scale(x, out, n, s, edges[i], edges[i + 1])


def _warm(fn: Any) -> None:
    f = np.float32
    x = np.ones((1, 2, 3), f)
    p = _params(Epilogue(), np.dtype(f))
    fn(x, np.ones((2, 1), f), np.zeros(1, f), np.ones((1, 2), f), np.zeros(2, f),
       np.empty_like(x), 1, p, 0, p, np.empty(1, f), np.empty(2, f), np.empty(2, f))  # fmt: skip


def _warm_par(fn: Any) -> None:
    f = np.float32
    x = np.ones((1, 2, 3), f)
    p = _params(Epilogue(), np.dtype(f))
    fn(x, np.ones((2, 1), f), np.zeros(1, f), np.ones((1, 2), f), np.zeros(2, f),
       np.empty_like(x), 1, p, 0, p, np.empty(1, f), np.empty(2, f), np.empty(2, f),
       np.array([0, 1, 2], np.int64))  # fmt: skip


_PIECES = (_act_row, _se_vecmat, _se_means, _se_gate, _se_scale)
_SE = Jitted(_squeeze_excite, _warm, helpers=_PIECES, fastmath=CONTRACT)
_SE_PAR = Jitted(_squeeze_excite_par, _warm_par, helpers=_PIECES, fastmath=CONTRACT, parallel=True)
#: Inputs of at least this many elements per image split their means and scaling over
#: native threads (EfficientNet's 96x112x112: ~1.2M).
SPLIT_MIN_ELEMENTS = 1 << 16


def squeeze_excite_fn(
    w1: np.ndarray, b1: np.ndarray | None, w2: np.ndarray, b2: np.ndarray | None,
    epi1: Epilogue, epi2: Epilogue,
) -> Callable[..., np.ndarray]:  # fmt: skip
    """``fn(x, out=None)`` for the 1x1 convs' weights ``w1`` (C1, C, 1, 1) and ``w2`` (C,
    C1, 1, 1), biases (None: zero) and epilogue activations; ``x`` (N, C, ...) of the
    weights' dtype. Whether the compiled loop is used is settled here, at load."""
    dt = w1.dtype
    c, c1 = w1.shape[1], w1.shape[0]
    w1t = np.ascontiguousarray(w1.reshape(c1, c).T)  # (C, C1)
    w2t = np.ascontiguousarray(w2.reshape(c, c1).T)  # (C1, C)
    bb1 = np.zeros(c1, dt) if b1 is None else np.ascontiguousarray(b1, dtype=dt)
    bb2 = np.zeros(c, dt) if b2 is None else np.ascontiguousarray(b2, dtype=dt)
    compiled = _SE.get() if dt == np.float32 else None
    codes = (_jit_act(epi1, dt), _params(epi1, dt), _jit_act(epi2, dt), _params(epi2, dt))
    f1, f2 = make_epilogue(epi1), make_epilogue(epi2)

    def squeeze_excite(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.ndim < 3 or x.shape[1] != c or x.dtype != dt:
            raise ValueError(f"SqueezeExcite: input {x.shape} {x.dtype}, weights for {c} "
                             f"channels of {dt}")  # fmt: skip
        n = x.shape[0]
        if compiled is not None:
            xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            y = out if out is not None and out.flags.c_contiguous else np.empty_like(xc)
            x3, y3 = xc.reshape(n, c, -1), y.reshape(n, c, -1)
            buf = scratch(2, (c1 + 2 * c,), dt)  # h, s, g: never past this call
            h, s, g = buf[:c1], buf[c1 : c1 + c], buf[c1 + c :]
            t = intra_pool().threads
            par = _SE_PAR.get() if t > 1 and x3[0].size >= SPLIT_MIN_ELEMENTS else None
            if par is not None:
                k = min(2 * native_threads.enter(t), c)
                par(x3, w1t, bb1, w2t, bb2, y3, codes[0], codes[1], codes[2], codes[3],
                    h, s, g, native_threads.edges(c, k))  # fmt: skip
            else:
                compiled(x3, w1t, bb1, w2t, bb2, y3, codes[0], codes[1], codes[2], codes[3],
                         h, s, g)  # fmt: skip
            if out is not None and y is not out:
                out[...] = y
                return out
            return y
        g = x.reshape(n, c, -1).mean(axis=2)
        h = f1((g @ w1t).reshape(n, c1, 1), bb1, None)
        s = f2((h.reshape(n, c1) @ w2t).reshape(n, c, 1), bb2, None)
        return np.multiply(x, s.reshape(n, c, *((1,) * (x.ndim - 2))), out=out)

    return squeeze_excite
