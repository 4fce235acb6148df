"""The compiled loops of the convolutions -- the direct 2-D depthwise conv (no im2col) and
the conv epilogues -- and the epilogues' NumPy side. All loops that call ``_act_row`` live
in this file: numba's disk cache keys a function by its own file.

Helpers of ``conv``, ``conv_depthwise`` and ``conv_blocked`` (no kernels registered here):

* ``_depthwise2d`` (planned and run by ``conv_depthwise``): a depthwise conv (one input
  channel per group, any channel multiplier) as one compiled loop nest, polyphase on an
  extended grid: per channel, every kernel tap is one long contiguous multiply-add over
  the whole output plane, the bias starts it and the epilogue finishes it while it is in
  cache. Compiled with numba (``kernels/lib/jit.py``); without numba (or with
  ``$TFRT_PY_JIT=0``) ``conv_depthwise.plan_depthwise`` returns None and ``conv`` keeps
  im2col + GEMM,
  which measured faster than every NumPy formulation of the direct loop (one strided
  multiply-add per tap: 1.3-3x slower than im2col on MobileNet shapes). Grouped convs with
  several input channels per group stay on im2col too: a direct loop (per output row,
  ``cg x kh x kw`` short runs) measured 4-8x slower than im2col + batched GEMM on
  RegNet's 8-channel groups.
* ``_epilogue_cols``: the same epilogue on a block of columns (``conv_blocked``);
* ``apply_epilogue``: ``y += bias; y += residual; y = act(y)`` over a conv result
  ``(N, M, *spatial)`` in place: one compiled pass per output channel row with numba,
  else one in-place ufunc call per step.

An ``Epilogue`` (``lib/activations.py``) names the activation by ONNX op (``Relu``,
``Clip``, ``HardSwish``, ``HardSigmoid``, ``Sigmoid``, ``LeakyRelu``, ``Gelu``) or ``SiLU``
(``x * Sigmoid(x)``), with its float parameters; ``ACTIVATIONS`` lists them; float64's
Sigmoid, SiLU and Gelu run after the compiled pass as NumPy ufuncs (``_numpy_act``). The
activations propagate NaN as the ONNX kernels do. Arithmetic is in
the array's dtype (float32/float64); sums run in another order than im2col + GEMM, so
results differ by rounding only.

Thread-safe: no state but the compiled functions (``jit.Jitted``) and per-thread scratch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ..lib import activation_ir
from ..lib.activations import (
    ACTIVATIONS,
    Epilogue,
    _act_row,
    _jit_act,
    _params,
    numpy_act_after,
)
from ..lib.erf import erf
from ..lib.gelu_jit import gelu_erf_f32
from ..lib.jit import CONTRACT, Jitted, frozen, inline, uses
from ..lib.sigmoid_jit import sigmoid_f32
from .conv_common import depthwise_plan, scratch

__all__ = [
    "ACTIVATIONS",
    "Epilogue",
    "act_fns",
    "apply_epilogue",
    "make_epilogue",
    "numpy_act_after",
]

#: Output rows (pixels per map) shorter than this take the epilogue as passes over their
#: whole contiguous run (``_epilogue_run``); longer ones row by row, one pass each. A row
#: call costs ~35 ns, most of a 7x7 map's 49 elements (one thread, bias only: 960x49 36 ->
#: 5 µs, 576x196 27 -> 8 µs; 144x784 with Clip 14 -> 17 µs the other way).
SHORT_RUN = 256


def _epilogue_run(
    blk: Any, b: Any, rblk: Any, m0: int, o: int, has_b: bool, has_res: bool, act: int, p: Any
) -> None:  # pragma: no cover - numba only
    """Rows ``m0 ..`` of ``o`` elements each, one contiguous run ``blk`` (row ``j`` at ``j *
    o``), in place: + b[m0 + j] per row (``has_b``), + ``rblk`` (the residual's run,
    ``has_res``), then the activation over the whole run. The same operations in the
    same order as ``_epilogue_row`` per row, so the same values."""
    zero = p[2]
    if has_b:
        for j in range(blk.shape[0] // o):
            row = blk[j * o :]
            bm = b[m0 + j]
            for t in range(o):
                row[t] += bm
    if has_res:
        for t in range(blk.shape[0]):
            blk[t] += rblk[t]
    if act != 0:
        _act_row(blk, -zero, act, p)


def _epilogue_row(
    row: Any, bm: Any, r: Any, has_b: bool, has_res: bool, act: int, p: Any
) -> None:  # pragma: no cover - numba only
    """One output row (contiguous) in place: act((row + bm) + r); ``bm`` unused without
    ``has_b``, ``r`` without ``has_res``."""
    neg0 = -p[2]
    if has_res:
        b0 = bm if has_b else neg0
        for i in range(row.shape[0]):
            row[i] = (row[i] + b0) + r[i]
        if act != 0:
            _act_row(row, neg0, act, p)
    elif has_b or act != 0:
        _act_row(row, bm if has_b else neg0, act, p)


@inline
def _accumulate_taps(
    acc: Any, xs: Any, wm: Any, tab: Any, span: int
) -> None:  # pragma: no cover - numba only
    """``acc[:span]`` += every tap of the kernel ``wm`` (KH, KW) times the phase planes
    ``xs`` at the tap's offset (``tab[3:]``): ``_depthwise2d``'s multiply-adds. Inlined
    (``jit.inline``)."""
    kh_, kw_ = wm.shape
    n_taps = kh_ * kw_
    # several taps per pass over the grid: fewer loop set-ups and fewer
    # loads and stores of acc (per-tap overhead dominates small planes)
    k = 0
    if n_taps == 9:  # 3x3: the whole kernel in one pass
        w0, w1, w2 = wm[0, 0], wm[0, 1], wm[0, 2]
        w3, w4, w5 = wm[1, 0], wm[1, 1], wm[1, 2]
        w6, w7, w8 = wm[2, 0], wm[2, 1], wm[2, 2]
        s0, s1, s2 = xs[tab[3] :], xs[tab[4] :], xs[tab[5] :]
        s3, s4, s5 = xs[tab[6] :], xs[tab[7] :], xs[tab[8] :]
        s6, s7, s8 = xs[tab[9] :], xs[tab[10] :], xs[tab[11] :]
        for t in range(span):
            acc[t] += (
                (w0 * s0[t] + w1 * s1[t] + w2 * s2[t])
                + (w3 * s3[t] + w4 * s4[t] + w5 * s5[t])
                + (w6 * s6[t] + w7 * s7[t] + w8 * s8[t])
            )
        k = 9
    elif kw_ == 5:  # a kernel row (five taps) per pass: 5x5 in five
        for i in range(kh_):
            j0 = 3 + 5 * i
            w0, w1, w2 = wm[i, 0], wm[i, 1], wm[i, 2]
            w3, w4 = wm[i, 3], wm[i, 4]
            s0, s1, s2 = xs[tab[j0] :], xs[tab[j0 + 1] :], xs[tab[j0 + 2] :]
            s3, s4 = xs[tab[j0 + 3] :], xs[tab[j0 + 4] :]
            for t in range(span):
                acc[t] += (w0 * s0[t] + w1 * s1[t]) + (w2 * s2[t] + w3 * s3[t] + w4 * s4[t])
        k = n_taps
    elif kw_ == 7:  # seven taps per pass: ConvNeXt's 7x7 in seven
        for i in range(kh_):
            j0 = 3 + 7 * i
            w0, w1, w2 = wm[i, 0], wm[i, 1], wm[i, 2]
            w3, w4, w5, w6 = wm[i, 3], wm[i, 4], wm[i, 5], wm[i, 6]
            s0, s1, s2 = xs[tab[j0] :], xs[tab[j0 + 1] :], xs[tab[j0 + 2] :]
            s3, s4 = xs[tab[j0 + 3] :], xs[tab[j0 + 4] :]
            s5, s6 = xs[tab[j0 + 5] :], xs[tab[j0 + 6] :]
            for t in range(span):
                acc[t] += ((w0 * s0[t] + w1 * s1[t]) + (w2 * s2[t] + w3 * s3[t])) + (
                    (w4 * s4[t] + w5 * s5[t]) + w6 * s6[t]
                )
        k = n_taps
    while k + 3 <= n_taps:  # other kernels: three taps a pass
        w0 = wm[k // kw_, k % kw_]
        w1 = wm[(k + 1) // kw_, (k + 1) % kw_]
        w2 = wm[(k + 2) // kw_, (k + 2) % kw_]
        s0 = xs[tab[3 + k] :]
        s1 = xs[tab[4 + k] :]
        s2 = xs[tab[5 + k] :]
        for t in range(span):
            acc[t] += w0 * s0[t] + w1 * s1[t] + w2 * s2[t]
        k += 3
    while k < n_taps:
        wv = wm[k // kw_, k % kw_]
        src = xs[tab[3 + k] :]
        for t in range(span):
            acc[t] += wv * src[t]
        k += 1


@inline
def _finish_channel(
    acc: Any, res: Any, om: Any, n: int, m: int, has_res: bool, q: int, span: int, act: int,
    p: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """Output channel ``m`` of image ``n``: its grid ``acc`` + ``res[n, m]`` (``has_res``),
    the activation, then the crop into ``om`` (OH, OW): ``_depthwise2d``'s epilogue.
    Inlined (``jit.inline``)."""
    oh_, ow_ = om.shape
    # flat indices into one 2-D view per channel (a view per output row cost ~25 ns a
    # row, half the kernel's time on 7x7 and 14x14 planes)
    if has_res:
        rm = res[n, m]
        for oh in range(oh_):
            ab = np.uint64(oh) * np.uint64(q)
            for i in range(ow_):
                acc[ab + np.uint64(i)] += rm[oh, i]
    if act != 0:
        _act_row(acc[:span], -p[2], act, p)
    for oh in range(oh_):
        ab = np.uint64(oh) * np.uint64(q)
        for i in range(ow_):
            om[oh, i] = acc[ab + np.uint64(i)]


@uses(_accumulate_taps, _finish_channel)
def _depthwise2d(
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any, acc: Any,
    n0: int, n1: int, g0: int, g1: int,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """Depthwise or grouped with few channels per group (``w`` (M, CG, KH, KW)),
    polyphase on an extended grid, for images ``[n0, n1)`` and groups ``[g0, g1)``.

    Per input channel the zero-padded plane is split into ``sh x sw`` phase planes
    (padded row r, column c -> plane (r % sh, c % sw), position (r // sh, c // sw)), kept
    in ``xp`` (one segment of ``len(xp) // CG`` per channel of the group). Output (oh, ow)
    is grid element ``t = oh * q + ow`` of ``acc``; kernel tap k of input channel ci
    reads ci's phase plane at ``t + tap offset``, so every tap is one contiguous loop over
    the whole grid (the columns past OW are computed and dropped). The residual is added
    and the activation runs over the grid, then the crop copies it into ``out``. ``tab``
    (``conv_common.depthwise_plan``) holds q, the tap offsets and, per (input row, column
    phase), where its run lands; all divisions are done there, none here."""
    m_, cg, kh_, kw_ = w.shape
    mg = m_ // (x.shape[1] // cg)
    seg = xp.shape[0] // cg
    q, sw, span = tab[0], tab[1], tab[2]
    runs = tab[3 + kh_ * kw_ :]
    n_runs = runs.shape[0] // 4
    has_res = res.shape[0] > 0
    zero = p[2]
    for i in range(xp.shape[0]):
        xp[i] = zero
    for n in range(n0, n1):
        for g in range(g0, g1):
            for ci in range(cg):
                xc = x[n, g * cg + ci]
                xs = xp[ci * seg : (ci + 1) * seg]
                j = 0
                while j < n_runs:  # (input row, first column, count, destination)
                    # (unsigned: no negative-index wraparound; the plan's entries are >= 0;
                    # 2-D indexing, not a view of the row: a view per run cost ~10 ns,
                    # most of a small stride-2 plane's time)
                    r = np.uint64(runs[4 * j])
                    c0, cnt = np.uint64(runs[4 * j + 1]), np.uint64(runs[4 * j + 2])
                    d0, su = np.uint64(runs[4 * j + 3]), np.uint64(sw)
                    if sw == 1:
                        for i in range(cnt):
                            xs[d0 + i] = xc[r, c0 + i]
                    elif (
                        sw == 2 and cnt >= 16 and j + 1 < n_runs and runs[4 * j + 4] == runs[4 * j]
                    ):
                        # a wide row's even and odd columns in one loop: an interleaved
                        # load pair LLVM vectorizes (two strided runs are scalar gathers;
                        # rows of a few pairs run faster as those)
                        c1, cnt1 = runs[4 * j + 5], runs[4 * j + 6]
                        d1 = np.uint64(runs[4 * j + 7])
                        de, do, ce, co = (d0, d1, cnt, cnt1) if c0 == 0 else (d1, d0, cnt1, cnt)
                        ce, co = np.uint64(ce), np.uint64(co)
                        if c0 + c1 != 1:  # (the plan always pairs columns 0 and 1; guard)
                            for i in range(cnt):
                                xs[d0 + i] = xc[r, c0 + i * su]
                            j += 1
                            continue
                        for i in range(co):
                            xs[de + i] = xc[r, np.uint64(2) * i]
                            xs[do + i] = xc[r, np.uint64(2) * i + np.uint64(1)]
                        if ce > co:
                            xs[de + co] = xc[r, np.uint64(2) * co]
                        j += 2
                        continue
                    else:
                        for i in range(cnt):
                            xs[d0 + i] = xc[r, c0 + i * su]
                    j += 1
            for m in range(g * mg, (g + 1) * mg):
                bm = b[m]
                for t in range(span):
                    acc[t] = bm
                for ci in range(cg):
                    _accumulate_taps(acc, xp[ci * seg : (ci + 1) * seg], w[m, ci], tab, span)
                _finish_channel(acc, res, out[n, m], n, m, has_res, q, span, act, p)


#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def _depthwise2d_par(
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, buf: Any,
    xp_len: int, blocks: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """``_depthwise2d`` over ``blocks`` (rows n0, n1, g0, g1) in a ``prange`` loop on numba's
    TBB layer, each block with its own scratch row of ``buf`` (blocks, xp + acc). The
    caller sets the thread count and a chunk of one block (``native_threads.enter``: a
    helper a busy core holds up delays one block). ``numba`` is this module's global once
    ``Jitted`` compiles it (this file must import without numba)."""
    for k in numba.prange(blocks.shape[0]):
        s = buf[k]
        _depthwise2d(x, w, b, res, out, tab, act, p, s[:xp_len], s[xp_len:],
                     blocks[k, 0], blocks[k, 1], blocks[k, 2], blocks[k, 3])  # fmt: skip


def _epilogue3(y: Any, b: Any, res: Any, act: int, p: Any) -> None:  # pragma: no cover - numba only
    """y (N, M, S) in place: y + b[m] (b empty: none) + res (empty: none), then act."""
    n_, m_, s_ = y.shape
    has_b = b.shape[0] > 0
    has_res = res.shape[0] > 0
    zero = p[2]
    if s_ == 1:
        # one value per channel (a squeeze-excite block's 1x1 convs): the sums in one loop,
        # the activation in one pass over all of them (not a row call per value)
        for n in range(n_):
            for m in range(m_):
                v = y[n, m, 0]
                if has_b:
                    v = v + b[m]
                if has_res:
                    v = v + res[n, m, 0]
                y[n, m, 0] = v
        if act != 0:
            _act_row(y.reshape(n_ * m_), -zero, act, p)
        return
    if s_ < SHORT_RUN:  # each image's maps as one run (see SHORT_RUN)
        for n in range(n_):
            blk = y[n].reshape(m_ * s_)
            rblk = res[n].reshape(m_ * s_) if has_res else blk
            _epilogue_run(blk, b, rblk, 0, s_, has_b, has_res, act, p)
        return
    for n in range(n_):
        for m in range(m_):
            r = res[n, m] if has_res else y[n, m]
            _epilogue_row(y[n, m], b[m] if has_b else zero, r, has_b, has_res, act, p)


def _epilogue_cols(  # pragma: no cover - numba only
    y: Any, b: Any, res: Any, p0: int, p1: int, act: int, p: Any
) -> None:
    """y[m, p0:p1] (y (M, O) C-contiguous) in place: + b[m] (b empty: none) +
    res[m, p0:p1] (res empty: none), then act: ``_epilogue3`` on a block of columns
    (``conv_blocked``)."""
    has_b = b.shape[0] > 0
    has_res = res.shape[0] > 0
    zero = p[2]
    for m in range(y.shape[0]):
        row = y[m, p0:p1]
        r = res[m, p0:p1] if has_res else row
        _epilogue_row(row, b[m] if has_b else zero, r, has_b, has_res, act, p)


def _warm_epilogue(fn: Any) -> None:
    f = np.float32
    fn(np.zeros((1, 2, 3), f), np.zeros(2, f), np.zeros((0, 0, 0), f), 0, np.zeros(7, f))


def _warm_epilogue_cols(fn: Any) -> None:
    t = np.float32
    e1, e2 = np.zeros(0, t), np.zeros((0, 0), t)
    fn(np.zeros((2, 3), t), e1, e2, 0, 3, 0, np.zeros(7, t))


def _warm_depthwise(fn: Any) -> None:  # as a model calls it: read-only weights and bias
    f = np.float32
    x, w, y = (
        np.zeros((1, 2, 3, 3), f),
        frozen(np.zeros((2, 1, 2, 2), f)),
        np.zeros((1, 2, 2, 2), f),
    )
    tab, n_xp, n_acc = depthwise_plan((3, 3), (2, 2), (2, 2), (1, 1), (0, 0), (1, 1))
    fn(x, w, frozen(np.zeros(2, f)), np.zeros((0, 0, 0, 0), f), y, tab, 0, np.zeros(7, f),
       np.zeros(n_xp, f), np.zeros(n_acc, f), 0, 1, 0, 2)  # fmt: skip


def _warm_depthwise_par(fn: Any) -> None:  # read-only weights, bias and blocks
    f = np.float32
    x, w, y = (
        np.zeros((1, 2, 3, 3), f),
        frozen(np.zeros((2, 1, 2, 2), f)),
        np.zeros((1, 2, 2, 2), f),
    )
    tab, n_xp, n_acc = depthwise_plan((3, 3), (2, 2), (2, 2), (1, 1), (0, 0), (1, 1))
    blocks = native_threads.plane_blocks(1, 2, 2)
    fn(x, w, frozen(np.zeros(2, f)), np.zeros((0, 0, 0, 0), f), y, tab, 0, np.zeros(7, f),
       np.zeros((2, n_xp + n_acc), f), n_xp, blocks)  # fmt: skip


# The compiled loops that call ``_act_row`` live in this file: numba's on-disk cache
# keys a function by its own file, so a caller elsewhere would keep stale machine code
# after ``_act_row`` changed.
_HELPERS = (_act_row, _epilogue_row, _epilogue_run)
# (``CONTRACT``: fused multiply-adds in the taps and the activations' polynomials)
_DEPTHWISE = Jitted(_depthwise2d, _warm_depthwise, helpers=_HELPERS, fastmath=CONTRACT)
_DEPTHWISE_PAR = Jitted(
    _depthwise2d_par,
    _warm_depthwise_par,
    helpers=(*_HELPERS, _depthwise2d),
    fastmath=CONTRACT,
    parallel=True,
)
_EPILOGUE = Jitted(_epilogue3, _warm_epilogue, helpers=_HELPERS, fastmath=CONTRACT)
_EPILOGUE_COLS = Jitted(_epilogue_cols, _warm_epilogue_cols, helpers=_HELPERS, fastmath=CONTRACT)
_EMPTY = {np.dtype(t): np.zeros((0, 0, 0, 0), t) for t in (np.float32, np.float64)}
_EMPTY3 = {dt: np.zeros((0, 0, 0), dt) for dt in _EMPTY}
_EMPTY1 = {dt: np.zeros(0, dt) for dt in _EMPTY}


def make_epilogue(epi: Epilogue) -> Callable[..., np.ndarray]:
    """``fn(y, b, res)`` applying ``epi`` to ``y`` (N, M, *spatial) in place: ``+ b`` per
    channel (None: none), ``+ res`` (``y``'s shape; None: none), then the activation;
    returns ``y``. Whether the compiled pass is used is settled here, at load."""
    compiled, fns = _EPILOGUE.get(), act_fns(epi)
    # per compute dtype: (the compiled loop's activation code, NumPy's activation after)
    modes = {dt: (_jit_act(epi, dt), numpy_act_after(epi, dt)) for dt in _EMPTY}

    def epilogue(y: np.ndarray, b: np.ndarray | None, res: np.ndarray | None) -> np.ndarray:
        if b is None and res is None and not epi.act:
            return y
        dt = y.dtype
        if compiled is not None and dt in _EMPTY and y.flags.c_contiguous:
            y3 = y.reshape(y.shape[0], y.shape[1], -1)
            bb = _EMPTY1[dt] if b is None else b
            rr = _EMPTY3[dt] if res is None else res.reshape(y3.shape)
            code, numpy_act = modes[dt]
            compiled(y3, bb, rr, code, _params(epi, dt))
            if numpy_act:
                _numpy_act(y, epi, fns)
            return y
        if b is not None:
            y += b.reshape((-1,) + (1,) * (y.ndim - 2))
        if res is not None:
            y += res
        _numpy_act(y, epi, fns)
        return y

    return epilogue


def apply_epilogue(
    y: np.ndarray, b: np.ndarray | None, res: np.ndarray | None, epi: Epilogue
) -> np.ndarray:
    """``make_epilogue(epi)(y, b, res)``: for one-off calls (tests)."""
    return make_epilogue(epi)(y, b, res)


def act_fns(epi: Epilogue) -> tuple[Any, Any]:
    """(``sigmoid_jit.sigmoid_f32()``, ``gelu_jit.gelu_erf_f32()``): the compiled float32
    activations ``_numpy_act`` may use for ``epi``'s activation, each None without numba
    or when ``epi`` does not need it (then it is not compiled); asked at load."""
    act = epi.act
    if act in ("Gelu", "Sigmoid", "SiLU"):
        activation_ir.WANTED.set()  # a cold start's stand-in takes it once built
    return (sigmoid_f32() if act in ("Sigmoid", "SiLU") else None,
            gelu_erf_f32() if act == "Gelu" else None)  # fmt: skip


def _numpy_act(y: np.ndarray, epi: Epilogue, fns: tuple[Any, Any] = (None, None)) -> None:
    """The activation in place with ufuncs (the same operations as the ONNX kernels), or
    for float32 Sigmoid/SiLU/Gelu the compiled functions ``fns`` (``act_fns``) when given;
    a temporary lives in scratch slot 1 (the conv is done with it by now)."""
    sig, gelu = fns
    act = epi.act
    if not act:
        return
    t = y.dtype.type
    if act == "Relu":
        np.maximum(y, t(0), out=y)
    elif act == "Clip":  # one pass (maximum then minimum: two, 2.8x the time); NaN kept
        np.clip(y, t(epi.alpha), t(epi.beta), out=y)
    elif act in ("HardSwish", "HardSigmoid"):
        a, c = (1.0 / 6.0, 0.5) if act == "HardSwish" else (epi.alpha, epi.beta)
        tmp = np.multiply(y, t(a), out=scratch(1, y.shape, y.dtype))
        tmp += t(c)
        np.clip(tmp, t(0), t(1), out=tmp)
        if act == "HardSwish":
            with np.errstate(invalid="ignore"):  # -inf: -inf * 0 is NaN, as onnxruntime's
                np.multiply(y, tmp, out=y)
        else:
            np.copyto(y, tmp)
    elif (
        act in ("Sigmoid", "SiLU") and sig is not None and y.dtype == np.float32
        and y.flags.c_contiguous
    ):  # fmt: skip
        sig(y.reshape(-1), act == "SiLU")
    elif act in ("Sigmoid", "SiLU") and activation_ir.logistic(y, y, act == "SiLU") is not None:
        pass  # a stand-in's, once the warm-up built it: one pass
    elif act == "Sigmoid":
        with np.errstate(over="ignore"):  # exp(-y) -> inf: sigmoid 0, silently as ORT
            np.negative(y, out=y)
            np.exp(y, out=y)
            y += t(1)
            np.reciprocal(y, out=y)
    elif act == "SiLU":  # y * sigmoid(y) = y / (1 + exp(-y))
        # exp(-y) -> inf gives -0 (or NaN at -inf: -inf * 0), silently as onnxruntime
        with np.errstate(over="ignore", invalid="ignore"):
            s = np.negative(y, out=scratch(1, y.shape, y.dtype))
            np.exp(s, out=s)
            s += t(1)
            np.divide(y, s, out=y)
    elif act == "LeakyRelu":
        np.multiply(y, np.where(y < 0, t(epi.alpha), t(1)), out=y)
    elif act == "Gelu":  # the Gelu kernel's operations: (erf(y / sqrt 2) + 1) * y * 0.5
        done = y.dtype == np.float32 and gelu is not None and gelu(y, y) is not None
        if not done and activation_ir.gelu(y, y) is None:  # a stand-in's, once built
            with np.errstate(invalid="ignore"):  # -inf: 0 * -inf is NaN, as onnxruntime's
                g = np.multiply(y, t(1.0 / math.sqrt(2.0)), out=scratch(1, y.shape, y.dtype))
                erf(g, out=g)
                g += t(1)
                np.multiply(g, y, out=y)
                y *= t(0.5)
    else:
        raise ValueError(f"unknown activation {act!r}")
