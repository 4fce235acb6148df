"""GroupQueryAttention's small calls in one compiled pass (``gqa.py`` takes it): a decode
step's rotary embedding of the new queries and keys, the present caches and the attention
of its few query rows, in float32, where the NumPy formulation spent ~140 µs a layer in
two dozen array operations on arrays of a few hundred values (onnxruntime-genai's Llama
shape, 8 heads of 32, a past of 16: onnxruntime's whole step took 170 µs).

``gqa_small(q, k, v, past_k, past_v, start, lens, cos, sin, flags, scale, window, out,
present_k, present_v)`` -- q (B, S, N, H), k and v (B, S, Nkv, H), the pasts (B, Nkv, P,
H) (P may be 0), ``start``/``lens`` (B,) int64 (where each row's new tokens go and its
``seqlens_k``, as ``gqa.py`` computes them), cos and sin (positions, H / 2) (unused
without rotary), ``flags`` bit 0 rotary, bit 1 interleaved pairs; writes ``out`` (B, S, N,
H) and the presents (B, Nkv, P + S, H). The same steps as ``gqa.py``: each row's past up to
its start, its new entries, zeros after; query ``i`` of row ``b`` at position ``start[b] +
i`` sees keys ``j <= min(position, lens[b])`` (and ``j > position - window`` when
``window > 0``); scores ``scale * q.k``, softmax (the max subtracted), times V; a row that
sees no key gives NaN, as the NumPy path's softmax does. The dot products' order differs
from BLAS's (a rounding, not a semantic, difference). One thread (the calls it takes are
a few microseconds of work). None from ``kernel()`` where numba is off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["MAX_WORK", "kernel"]

#: Calls with at most this many multiply-adds in their attention (S x (P + S) x N x H)
#: take the compiled pass; bigger ones (a prompt) keep the blocked BLAS attention.
MAX_WORK = 1 << 20


def kernel() -> Any:
    """The compiled ``gqa_small``, or None."""
    return _GQA.get()


def _rotate_into(dst, src, c, s, half, interleaved):  # pragma: no cover - numba only
    if interleaved:
        for t in range(half):
            x1, x2 = src[2 * t], src[2 * t + 1]
            dst[2 * t] = x1 * c[t] - x2 * s[t]
            dst[2 * t + 1] = x2 * c[t] + x1 * s[t]
    else:
        for t in range(half):
            x1, x2 = src[t], src[half + t]
            dst[t] = x1 * c[t] - x2 * s[t]
            dst[half + t] = x2 * c[t] + x1 * s[t]


def _gqa_small(q, k, v, past_k, past_v, start, lens, cos, sin, flags, scale, window, out,
               present_k, present_v):  # pragma: no cover - numba only  # fmt: skip
    b_, s_, n_, h_ = q.shape
    nkv = k.shape[2]
    p_ = past_k.shape[2]
    t_ = p_ + s_
    group = n_ // nkv
    rotary = (flags & 1) != 0
    interleaved = (flags & 2) != 0
    half = h_ // 2
    qr = np.empty((s_, n_, h_), np.float32)
    w = np.empty(t_, np.float32)
    acc = np.empty(h_, np.float32)
    for b in range(b_):
        at = start[b]
        for g in range(nkv):  # the presents: the past up to ``at``, the new rows, zeros
            for j in range(t_):
                if j < at:
                    for d in range(h_):
                        present_k[b, g, j, d] = past_k[b, g, j, d]
                        present_v[b, g, j, d] = past_v[b, g, j, d]
                elif j < at + s_:
                    i = j - at
                    if rotary:
                        _rotate_into(present_k[b, g, j], k[b, i, g], cos[at + i], sin[at + i],
                                     half, interleaved)  # fmt: skip
                    else:
                        for d in range(h_):
                            present_k[b, g, j, d] = k[b, i, g, d]
                    for d in range(h_):
                        present_v[b, g, j, d] = v[b, i, g, d]
                else:
                    for d in range(h_):
                        present_k[b, g, j, d] = 0.0
                        present_v[b, g, j, d] = 0.0
        for i in range(s_):
            for n in range(n_):
                if rotary:
                    _rotate_into(qr[i, n], q[b, i, n], cos[at + i], sin[at + i], half,
                                 interleaved)  # fmt: skip
                else:
                    for d in range(h_):
                        qr[i, n, d] = q[b, i, n, d]
        for i in range(s_):
            pos = at + i
            hi = min(pos, lens[b])
            lo = max(0, pos - window + 1) if window > 0 else 0
            for n in range(n_):
                g = n // group
                if hi < lo:
                    for d in range(h_):
                        out[b, i, n, d] = np.nan
                    continue
                mx = np.float32(-np.inf)
                for j in range(lo, hi + 1):
                    dot = np.float32(0.0)
                    for d in range(h_):
                        dot += qr[i, n, d] * present_k[b, g, j, d]
                    sc = np.float32(dot * scale)
                    w[j] = sc
                    if sc > mx:
                        mx = sc
                tot = np.float32(0.0)
                for j in range(lo, hi + 1):
                    e = np.float32(np.exp(w[j] - mx))
                    w[j] = e
                    tot += e
                for d in range(h_):
                    acc[d] = 0.0
                for j in range(lo, hi + 1):
                    wj = w[j] / tot
                    for d in range(h_):
                        acc[d] += wj * present_v[b, g, j, d]
                for d in range(h_):
                    out[b, i, n, d] = acc[d]


def _warm(fn: Any) -> None:
    f4 = np.float32
    q = np.ones((1, 1, 2, 4), f4)
    kv = np.ones((1, 1, 1, 4), f4)
    past = np.ones((1, 1, 2, 4), f4)
    idx = np.array([2], np.int64)
    tab = np.ones((4, 2), f4)
    fn(q, kv, kv, past, past, idx, idx, tab, tab, 1, f4(0.5), 0, np.empty_like(q),
       np.empty((1, 1, 3, 4), f4), np.empty((1, 1, 3, 4), f4))  # fmt: skip


_GQA = Jitted(_gqa_small, _warm, helpers=(_rotate_into,))
