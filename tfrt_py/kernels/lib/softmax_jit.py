"""A compiled float32 Softmax over the rows of a matrix, used by the Softmax kernel and
the contrib Attention for float32 rows along the last axis, at every size.

``softmax_rows_f32()`` (asked at load) gives ``fn(x, y)``: ``x`` and ``y`` C-contiguous
2-D float32 arrays of one shape (``y`` may be ``x``); per row ``y = exp(x - max) /
sum(exp(x - max))``, exp being ``sigmoid_jit``'s vectorizable polynomial (relative error
~2e-7; ``x - max`` below -87 gives 0, as float32's exp nearly does). A NaN anywhere in a
row, or a row whose max is +inf or whose entries are all -inf, gives a row of NaN, as the
NumPy formulation. Two loops:

* rows of at most ``SHORT_ROW`` (32) elements (a classifier's logits, one short
  sequence's attention scores): ``_softmax_rows``, the exp over the whole input in one
  flat loop (a loop over a row of a few classes does not vectorize): (64, 16) 5.8 -> 3.0
  µs, (1024, 4) 50 -> 9 µs against NumPy's passes;
* longer rows (attention over 197 or 256 positions): ``_softmax_long_rows``, every pass of
  a row while it is in L1 -- the max and the sum in eight independent chains (a single
  float chain waits on each add), the exp into a row of scratch -- so the input is read
  once and the output written once. Compiled with FMA contraction (``fastmath
  {"contract"}``: rounding only, 18% faster). (4096, 256) 2.29 ms (NumPy) -> 1.05 ms
  on one thread; inputs of at least ``SPLIT_MIN_ELEMENTS`` split their rows over the
  intra-op threads.

None when numba is unavailable (``kernels/lib/jit.py``). Any thread (releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from .jit import Jitted, inline, uses
from .sigmoid_jit import EXP_CONSTS

__all__ = ["SHORT_ROW", "SPLIT_MIN_ELEMENTS", "softmax_rows_f32"]

#: Rows of at most this many elements take the flat loop, longer ones the row loop (which
#: also splits over threads). One thread, µs, flat vs row loop: (1024, 64) 106 vs 76,
#: (1024, 48) 81 vs 61, (1024, 32) 50 vs 47, (2048, 16) 52 vs 64, (4096, 8) 57 vs 93.
SHORT_ROW = 32
#: Long-row inputs of at least this many elements split their rows over the intra-op
#: threads ((591, 197), ViT-Tiny's attention: 170 -> ~100 µs on two).
SPLIT_MIN_ELEMENTS = 1 << 15


@inline
def _exp_consts(c: Any) -> Any:  # pragma: no cover - numba only
    """``EXP_CONSTS``' exp constants as a tuple: values in registers, which no store can
    alias (loads from ``c`` in the loop would keep LLVM from vectorizing)."""
    return c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]


@inline
def _exp_parts(dk: Any, k: Any) -> Any:  # pragma: no cover - numba only
    """exp(``dk``) as (mantissa part, 2^k as int32 float bits): the product of the two
    (the bits viewed as float32) is exp(dk); ``dk`` below -87 gives 0, NaN stays NaN.
    ``sigmoid_jit``'s polynomial; ``k`` from ``_exp_consts``. Inlined (``jit.inline``)."""
    log2e, ln2hi, ln2lo, p0, p1, p2, p3, p4, p5, one, half, lo = k
    dc = lo if not dk >= lo else dk  # NaN -> lo here (a defined int below)
    fk = np.floor(dc * log2e + half)
    r = dc - fk * ln2hi
    r = r - fk * ln2lo
    p = ((((p0 * r + p1) * r + p2) * r + p3) * r + p4) * r + p5
    p = p * (r * r) + r + one
    value = (one - one) if dk < lo else (p if dk == dk else dk)  # NaN stays NaN
    return value, (np.int32(fk) + np.int32(127)) << np.int32(23)


#: The exp the loops below inline.
_EXP = (_exp_consts, _exp_parts)


def _softmax_rows(x: Any, y: Any, c: Any) -> None:  # pragma: no cover - numba only
    """Each row's max and ``x - max`` into a flat scratch array, then exp over all of it in
    one loop (with 2^k as float bits, as in ``sigmoid_jit``: a long loop vectorizes where a
    row of a few classes does not), then each row's sum and the scaled row into ``y``; only
    that last loop writes ``y``, so ``y`` may be ``x``. Scratch: 8 bytes per element, as
    NumPy's temporaries."""
    ec = _exp_consts(c)
    rows, n = x.shape
    size = rows * n
    xf = x.reshape(size)
    yf = y.reshape(size)
    d = np.empty(size, np.float32)
    ki = np.empty(size, np.int32)
    kf = ki.view(np.float32)
    for i in range(rows):
        base = i * n
        m = xf[base]
        for j in range(1, n):
            v = xf[base + j]
            m = v if v > m else m
        for j in range(n):
            d[base + j] = xf[base + j] - m
    for k in range(size):
        d[k], ki[k] = _exp_parts(d[k], ec)
    for k in range(size):
        d[k] = d[k] * kf[k]
    for i in range(rows):
        base = i * n
        s = 0.0
        for j in range(n):
            s += d[base + j]
        inv = np.float32(1.0 / s)
        for j in range(n):
            yf[base + j] = d[base + j] * inv


@uses(*_EXP)
def _softmax_long_rows(  # pragma: no cover - numba only
    x: Any, y: Any, c: Any, r0: int, r1: int
) -> None:
    """Rows ``[r0, r1)``, each in L1: the max in eight chains, exp(x - max) into ``e`` and
    2^k into ``ki`` (``_softmax_rows``' polynomial), the sum of their products in eight
    chains, then ``y = e * 2^k * (1 / sum)``. Row i is read before it is written, so
    ``y`` may be ``x``."""
    ec = _exp_consts(c)
    one, inf = c[9], c[13]
    zero = one - one
    n = x.shape[1]
    e = np.empty(n, np.float32)
    ki = np.empty(n, np.int32)
    kf = ki.view(np.float32)
    n8 = n - n % 8
    for i in range(r0, r1):
        xr = x[i]
        yr = y[i]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -inf
        for j in range(0, n8, 8):
            v = xr[j]
            a0 = v if v > a0 else a0
            v = xr[j + 1]
            a1 = v if v > a1 else a1
            v = xr[j + 2]
            a2 = v if v > a2 else a2
            v = xr[j + 3]
            a3 = v if v > a3 else a3
            v = xr[j + 4]
            a4 = v if v > a4 else a4
            v = xr[j + 5]
            a5 = v if v > a5 else a5
            v = xr[j + 6]
            a6 = v if v > a6 else a6
            v = xr[j + 7]
            a7 = v if v > a7 else a7
        for j in range(n8, n):
            v = xr[j]
            a0 = v if v > a0 else a0
        a0 = a1 if a1 > a0 else a0
        a2 = a3 if a3 > a2 else a2
        a4 = a5 if a5 > a4 else a4
        a6 = a7 if a7 > a6 else a6
        a0 = a2 if a2 > a0 else a0
        a4 = a6 if a6 > a4 else a4
        m = a4 if a4 > a0 else a0
        for j in range(n):
            e[j], ki[j] = _exp_parts(xr[j] - m, ec)
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = zero
        for j in range(0, n8, 8):
            s0 += e[j] * kf[j]
            s1 += e[j + 1] * kf[j + 1]
            s2 += e[j + 2] * kf[j + 2]
            s3 += e[j + 3] * kf[j + 3]
            s4 += e[j + 4] * kf[j + 4]
            s5 += e[j + 5] * kf[j + 5]
            s6 += e[j + 6] * kf[j + 6]
            s7 += e[j + 7] * kf[j + 7]
        for j in range(n8, n):
            s0 += e[j] * kf[j]
        total = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
        inv = one / total
        for j in range(n):
            yr[j] = (e[j] * kf[j]) * inv


def _warm(fn: Any) -> None:
    x = np.zeros((2, 3), np.float32)
    fn(x, x, EXP_CONSTS)


def _warm_long(fn: Any) -> None:
    x = np.zeros((2, 9), np.float32)
    fn(x, x, EXP_CONSTS, 0, 2)


_SOFTMAX = Jitted(_softmax_rows, _warm, helpers=_EXP)
_SOFTMAX_LONG = Jitted(_softmax_long_rows, _warm_long, fastmath=frozenset({"contract"}))

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def _softmax_long_par(x: Any, y: Any, c: Any, edges: Any) -> None:  # pragma: no cover
    """``_softmax_long_rows`` over the row blocks between consecutive ``edges`` in a
    ``prange`` loop on native threads (``concurrency.native_threads``). numba only."""
    for i in numba.prange(edges.shape[0] - 1):
        _softmax_long_rows(x, y, c, edges[i], edges[i + 1])


def _warm_long_par(fn: Any) -> None:
    x = np.zeros((2, 9), np.float32)
    fn(x, x, EXP_CONSTS, native_threads.edges(2, 2))  # read-only, as the callers' edges


_SOFTMAX_LONG_PAR = Jitted(
    _softmax_long_par,
    _warm_long_par,
    helpers=(_softmax_long_rows,),
    fastmath=frozenset({"contract"}),
    parallel=True,
)


def softmax_rows_f32() -> Any:
    """``fn(x2d, y2d)`` (see the module doc), or None without numba / with
    ``$TFRT_PY_JIT=0``."""
    short, long = _SOFTMAX.get(), _SOFTMAX_LONG.get()
    if short is None or long is None:
        return None
    if intra_pool().threads > 1:  # compiled now (a build), not in the call that splits
        _SOFTMAX_LONG_PAR.get()

    def softmax(x: np.ndarray, y: np.ndarray) -> None:
        rows, n = x.shape
        pool = intra_pool()
        if n <= SHORT_ROW:
            short(x, y, EXP_CONSTS)
        elif pool.threads == 1 or x.size < SPLIT_MIN_ELEMENTS or rows < 2:
            long(x, y, EXP_CONSTS, 0, rows)
        elif (par := _SOFTMAX_LONG_PAR.get()) is not None:  # row blocks on native threads
            parts = min(2 * native_threads.enter(pool.threads), rows)
            par(x, y, EXP_CONSTS, native_threads.edges(rows, parts))
        else:
            parts = min(2 * pool.threads, rows)
            edges = [rows * i // parts for i in range(parts + 1)]

            def part(a: int, b: int) -> Any:
                return lambda: long(x, y, EXP_CONSTS, a, b)

            pool.run([part(edges[i], edges[i + 1]) for i in range(parts)])

    return softmax
