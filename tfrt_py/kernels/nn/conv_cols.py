"""One-group float32 convolutions on ``kernels/lib/gemm_cols``: per block of output rows,
one kernel call that multiplies the filters by the block's columns, the bias, residual and
ReLU/Clip applied before its one store where it can.

``conv_blocked``'s BLAS routes copy the im2col matrix of a whole image, or of one block of
rows per thread (for a ResNet's first stages megabytes, written to memory and read back),
OpenBLAS packs the weights again on every call, and the epilogue is another pass. Here a
block's columns come in one of these forms (``plan`` picks it per input shape):

* GRID (stride 1, any kernel, dilation and pads): no im2col at all. Each block copies the
  rows of the image it reads, zero-padded, into its own planes (``_phase_rows``, on its
  thread) of rows ``pw`` = W + max(left, right pad) wide (each row's zeros before it,
  which are the row before's right pad too: ``_shared_gap``); on that extended grid, tap
  (i, j)'s column for output t is the padded plane at t + i*DH*pw + j*DW (+ the gap
  less the left pad), so the kernel reads
  every tap's rows in place at an offset (``toff``), K = C a tap, with the filters
  ordered taps-first (``taps_first``, made once at load). The extended
  output (pw - OW wasted columns a row) goes to a scratch and each channel's rows are
  cropped into the output, bias, residual and ReLU/Clip applied in the same pass
  (``_crop_grid``).
* DIRECT (1x1 stride-1 unpadded convs): the input itself, each channel's plane a row of
  the columns (``ldc`` the plane), no copy at all. Against OpenBLAS's packed product in
  ``conv_blocked`` (one process, interleaved, default threads, 2026-12-02): whole models
  2-8% faster on a Zen 5 host on both paths (``avx512``; ``avx2`` with OpenBLAS's
  Haswell kernels), SqueezeNet 3.47 -> 3.23 ms, EfficientNet-B0 6.88 -> 6.33, RegNetY
  5.63 -> 5.40; MobileNetV2's 96x56x56 -> 24 on one thread 148 -> 81 µs. (On a 2-core
  Xeon in 2026-11 the 6 x 16 tile of that time had lost to BLAS on MobileNet's
  projections.)
* GRID over phases (strided, undilated convs of 16 channels or more into rows 28 wide or
  more, or whose grid needs no crop: ``_phases_pay``): the block's padded rows
  split into the input's phases (``_phase_rows``: phase (a, b) holds rows a, a + SH, ...
  and columns b, b + SW, ...), so every tap reads one phase at a unit-stride offset and
  the kernel runs as at stride 1 with K = C a tap; the input copied once where im2col
  copies it KH*KW / (SH*SW) times. A grid as wide as the output (1x1/2, 2x2/2) is stored
  in place with the kernel's epilogue, not cropped.
* IM2COL (the other strided convs): im2col of ``sub`` output rows at a time into a
  cache-sized scratch (``BLOCK_BYTES``), then the kernel with the epilogue fused.

Each thread takes a block of output rows (``COLS_PAR``: a ``prange`` over them; one thread:
``COLS_ONE`` on the caller) and walks it ``sub`` rows at a time; an output with fewer
pixels than filters (or rows than two a thread) is split by filters instead (``_blocks``).
Activations other than ReLU and Clip run over each sub-block right after its product
(``activations._act_row``, while it is in cache). On a 2-core AVX-512 Xeon (one thread,
interleaved with onnxruntime in one process, 2026-11-29) ResNet-18 went from 2.25-2.29x
onnxruntime's time to 1.94-1.96x (74.5 -> 56.6 ms), its 3x3 convs from 38-53 to 59-88
GFLOP/s (the kernel alone: 102-113 on the extended grid); onnxruntime's NCHWc kernels run
them at 82-126. The few-pixel convs (256x14x14 and 512x7x7 3x3, which took the whole-image
BLAS product on one thread and BLAS's filter blocks on two) and the padding on each block's
thread: 2-core Zen 4 (AVX-512), one thread, 76 -> 94 and 59 -> 82 GFLOP/s; ResNet-18
1.33x -> 1.27x onnxruntime at one thread, 1.40-1.43x -> 1.36-1.37x at two (2026-12-02).
Since 2026-12-05 ``conv_packed`` takes the convs it serves before this route (one-group
3x3 convs whose filters fill their panels at any plane, few-pixel ones, few-pixel 1x1
convs into many filters: ``conv_packed.plan``, ``conv_packed.pointwise_pays``); this
route keeps the rest (1x1 convs over many pixels, few filters, stems of 3 channels).
numba and the kernel only: ``plan`` returns None without them (``conv_blocked`` keeps its
BLAS routes). Thread-safe: plans are immutable; scratch is per thread.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib import gemm_cols
from ..lib.activations import ACTIVATIONS, PARAMS_LEN, _act_row
from ..lib.jit import CONTRACT, Jitted, frozen, inline, jit_enabled, uses
from .conv_im2col import im2col_rows

__all__ = ["BLOCK_BYTES", "COLS_ONE", "COLS_PAR", "GRID", "IM2COL", "ColsPlan",
           "compile_at_build", "computed_columns", "plan", "run", "taps_first"]  # fmt: skip

#: A sub-block's im2col columns take about this many bytes (about half a core's L2 on
#: the hosts measured). 256 KB cut a strided 3x3 conv's product into calls of 4-5 panel
#: columns, each walking every filter again: one Zen 5 thread, interleaved, 64x56x56 ->
#: 128 3x3/2 137 -> 150 GFLOP/s, 128x28x28 -> 256 127 -> 142; 1 MB no better, the other
#: forms unchanged.
BLOCK_BYTES = 512 * 1024
#: ... but at least this many output pixels (two panels of the AVX-512 tile): fewer would
#: leave the kernel on its masked partial panel.
MIN_BLOCK_PIXELS = 64

#: Strided convs with at least this many input channels (the kernel's K a tap) take GRID
#: over the input's phases (``_phases``) instead of IM2COL where its grid needs no crop
#: (1x1/2, 2x2/2) or the output rows are at least ``PHASE_MIN_WIDTH`` wide. In-process
#: A/B on Zen 5 (2026-12-04), the conv alone at one thread / in ResNet-18 at two:
#: 64x56x56 -> 128 3x3/2 -7% / -6%, 1x1/2 -39% alone; 128x28x28 -> 256 3x3/2 (14-wide rows,
#: a 15-wide grid to crop) +0% / +6%, a 3-channel 7x7/2 stem -3% / +13%, a 3-channel
#: 3x3/2 stem +20% alone (nine taps of K = 3): those stay on IM2COL.
PHASE_MIN_CHANNELS = 16
PHASE_MIN_WIDTH = 28

#: numba (set by ``Jitted(parallel=True)``) and the kernel (``gemm_cols.register``)
numba: Any = None
_sgemm_cols: Any = None


#: How ``_block`` forms a block's columns: the im2col copy, (stride 1) the padded input
#: on an extended grid, one tap an offset, or (a 1x1 stride-1 unpadded conv) the input
#: itself.
IM2COL, GRID, DIRECT = 0, 1, 2


def _block(  # pragma: no cover - numba only
    x: Any, xb: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, i: int, r0: int,
    r1: int, m0: int, m1: int, sub: int, cols: Any, act: int, p: Any, lohi: Any, flags: int,
    nr: int, mode: int, toff: Any, pads: Any,
) -> None:  # fmt: skip
    """Output rows ``[r0, r1)`` of filters ``[m0, m1)`` of image ``i``, ``sub`` rows at a
    time, into ``y3`` (N, M, OH*OW). IM2COL: im2col into ``cols``, the kernel with
    ``flags``' epilogue, then the activation ``act`` (0: none or fused) over the
    sub-block's rows. GRID: the block's padded rows of image ``i`` are written into its
    own ``xb`` (C, L; strided: its phases) first (``_phase_rows``); the kernel reads them
    in place, K = C an offset ``toff[t]`` a tap, on the extended grid (rows ``pads[2]``
    wide) into ``cols`` ((m1 - m0) x rows*pw); each channel's rows are then cropped to OW
    into ``y3`` and finished there (bias, residual, activation ``act``) -- or, where the
    grid is as wide as the output, stored there as IM2COL's. DIRECT: the kernel reads image
    ``i``'s planes in place (K = C, ``ldc`` the plane), the epilogue as IM2COL's. Called,
    not inlined (one call a block): inlined into COLS_* and GROUPS_* it was compiled four
    times, half their compile on a cold numba cache (Zen 3, 2026-12-07: COLS_ONE alone
    55.7 -> 28.0 s)."""
    m = w2.shape[0]
    mb = m1 - m0
    o = y3.shape[2]
    ow = geo[8]
    c_in = x.shape[1]
    has_b = (flags & 1) != 0
    has_res = res3.shape[0] > 0
    zero = p[2]
    four = np.uint64(4)
    wa = w2.ctypes.data + np.uint64(m0 * w2.shape[1]) * four  # the block's filters
    ba = b.ctypes.data + np.uint64(m0 if b.shape[0] > m0 else 0) * four
    pw = pads[2]
    if mode == GRID:
        _phase_rows(x, xb, i, r0, r1 + pads[3], pads[0], pads[1], pw, geo[2], geo[3], pads[4],
                    pads[5])  # fmt: skip
    for s0 in range(r0, r1, sub):
        s1 = min(r1, s0 + sub)
        p0, npx = s0 * ow, (s1 - s0) * ow
        at = np.uint64((i * m + m0) * o + p0) * four
        dst = y3.ctypes.data + at
        if mode == GRID and pw > ow:
            n_ext = (s1 - s0) * pw
            src = xb.ctypes.data + np.uint64((s0 - r0) * pw) * four
            out = cols.ctypes.data
            _sgemm_cols(wa, w2.shape[1], src, xb.shape[1], toff.shape[0],
                        toff.ctypes.data, out, n_ext, mb, c_in, n_ext, ba, out,
                        n_ext, lohi.ctypes.data, 0, nr)  # fmt: skip
            _crop_grid(y3, cols, i, m0, m1, p0, s1 - s0, ow, pw, b, has_b, res3, has_res, act,
                       p)  # fmt: skip
            continue
        k = w2.shape[1]
        rp = res3.ctypes.data + at if has_res else dst
        if mode == DIRECT:
            src = x.ctypes.data + np.uint64(i * c_in * o + p0) * four
            _sgemm_cols(wa, k, src, o, 1, toff.ctypes.data, dst, o, mb, k, npx, ba, rp, o,
                        lohi.ctypes.data, flags, nr)  # fmt: skip
        elif mode == GRID:  # a grid as wide as the output (a 1x1/2 conv): stored in place
            src = xb.ctypes.data + np.uint64((s0 - r0) * pw) * four
            _sgemm_cols(wa, w2.shape[1], src, xb.shape[1], toff.shape[0], toff.ctypes.data,
                        dst, o, mb, c_in, npx, ba, rp, o, lohi.ctypes.data, flags, nr)  # fmt: skip
        else:
            im2col_rows(x, i, cols[: k * npx].reshape((k, npx)), geo, 0, c_in, s0, s1)
            _sgemm_cols(wa, k, cols.ctypes.data, npx, toff.shape[0],
                        toff.ctypes.data, dst, o, mb, k, npx, ba, rp, o,
                        lohi.ctypes.data, flags, nr)  # fmt: skip
        if act != 0:
            for mm in range(m0, m1):
                _act_row(y3[i, mm, p0 : p0 + npx], -zero, act, p)


@inline
def _crop_grid(  # pragma: no cover - numba only
    y3: Any, cols: Any, i: int, m0: int, m1: int, p0: int, rows: int, ow: int, pw: int,
    b: Any, has_b: bool, res3: Any, has_res: bool, act: int, p: Any,
) -> None:  # fmt: skip
    """GRID's extended output ``cols`` ((m1 - m0) x rows*pw) cropped into ``y3[i, m0:m1,
    p0 : p0 + rows*ow]`` and finished on the way: ``act((v + b[m]) + r)``, ReLU and Clip
    in the same pass (as ``activations._act_row``: NaN kept), any other activation by
    ``_act_row`` over each channel's rows after it (still in cache). One flat loop a row,
    unsigned indices: the loop over views it replaces did not vectorize (64x56x56: 81 ->
    17 µs, one Zen 5 thread)."""
    u = np.uint64
    m, o = y3.shape[1], y3.shape[2]
    n_ext = rows * pw
    neg0, inf = -p[2], p[6]
    lo, hi = (p[2], inf) if act == 1 else (p[0], p[1]) if act == 2 else (-inf, inf)
    rest = act if act > 2 else 0
    yf = y3.reshape(-1)
    rf = res3.reshape(-1)
    for mm in range(m0, m1):
        bm = b[mm] if has_b else neg0
        src = u((mm - m0) * n_ext)
        dst = u((i * m + mm) * o + p0)
        for r in range(rows):
            s_r, d_r = src + u(r * pw), dst + u(r * ow)
            if has_res:
                for t in range(ow):
                    v = (cols[s_r + u(t)] + bm) + rf[d_r + u(t)]
                    v = lo if v < lo else v
                    yf[d_r + u(t)] = hi if v > hi else v
            else:
                for t in range(ow):
                    v = cols[s_r + u(t)] + bm
                    v = lo if v < lo else v
                    yf[d_r + u(t)] = hi if v > hi else v
        if rest != 0:
            _act_row(y3[i, mm, p0 : p0 + rows * ow], neg0, rest, p)


@inline
def _zeros(bf: Any, d: Any, n: int, zero: Any) -> None:  # pragma: no cover - numba only
    """``n`` zeros into ``bf`` from ``d``: a pad of one or two written as stores (LLVM
    makes any zeroing loop a call to ``memset``, which a row's one-column pad paid each
    row: 7.7% of a 400x14x14 3x3/2 conv in 25 groups, one Zen 4 thread)."""
    if n <= 2:
        if n > 0:
            bf[d] = zero
        if n > 1:
            bf[d + np.uint64(1)] = zero
    else:
        for t in range(n):
            bf[d + np.uint64(t)] = zero


@inline
def _phase_cols(bb: int, pw: int, pl: int, sw: int, w_: int) -> tuple[int, int, int]:
    """Column phase ``bb``'s positions that hold image columns, ``[u0, u1)`` of its
    ``pw``, and the image column at ``u0``."""
    u0 = min(pw, max(0, (pl - bb + sw - 1) // sw))
    u1 = max(u0, min(pw, (w_ - 1 + pl - bb) // sw + 1))
    return u0, u1, u0 * sw + bb - pl


@inline
@uses(_zeros, _phase_cols)
def _phase_rows(  # pragma: no cover - numba only
    x: Any,
    xb: Any,
    i: int,
    q0: int,
    q1: int,
    pt: int,
    pl: int,
    pw: int,
    sh: int,
    sw: int,
    na: int,
    nb: int,
) -> None:
    """GRID's planes: rows ``[q0, q1)`` of image ``i``'s zero-padded input split into the
    ``na * nb`` phases its taps read (a < na <= sh, b < nb <= sw; one at stride 1), into
    ``xb`` (na*nb*C, L) from its row 0: phase ``(a, b)``'s channel c is plane ``(a*nb +
    b)*C + c``, its row q column u the padded input's row ``q*sh + a``, column ``u*sw +
    b`` (``pt`` rows above, ``pl`` columns left of the image -- at stride 1 the rows' shared
    gap, ``_shared_gap`` -- rows ``pw`` wide). A tap then reads one phase at a unit-stride
    offset. The rest of each plane zeroed. Each element written once; flat unsigned
    indices (views a row left the copies scalar: 64x56x56 131 -> 48 µs, one Zen 5
    thread). At column stride 2 both column phases are filled in one pass over each
    source row, a pair of adjacent columns at a time (a copy a phase read every other
    column, which LLVM left scalar or made gathers; one Zen 4 thread, all groups' copies:
    400x14x14 in 25 groups 91 -> 51 µs, 160x28x28 in 10 151 -> 50, 32x112x112 in 2 156
    -> 73)."""
    _, c_, h_, w_ = x.shape
    u = np.uint64
    plane_len = xb.shape[1]
    xf, bf = x.reshape(-1), xb.reshape(-1)
    zero = xb.dtype.type(0)
    # stride 2: the column phase that reads the even image columns (f) and the odd (s)
    f0, f1, fc = _phase_cols(0, pw, pl, sw, w_)
    s0, s1, sc = _phase_cols(1, pw, pl, sw, w_)
    pf = 0
    if sc == 0:  # phase 1 reads the even columns (an odd left pad)
        f0, f1, fc, s0, s1, sc = s0, s1, sc, f0, f1, fc
        pf = 1
    ps = 1 - pf
    pair = sw == 2 and nb == 2 and fc == 0 and sc == 1 and f1 > f0 and s1 > s0
    for a in range(na):
        # the phase's rows that fall inside the image: [qa, qb)
        qa = min(q1, max(q0, (pt - a + sh - 1) // sh))
        qb = max(qa, min(q1, (h_ - 1 + pt - a) // sh + 1))
        for c in range(c_):
            row0 = u((i * c_ + c) * h_ * w_ + (qa * sh + a - pt) * w_)
            for bb in range(nb):
                base = u(((a * nb + bb) * c_ + c) * plane_len)
                for t in range(u((qa - q0) * pw)):
                    bf[base + t] = zero
                for t in range(base + u((qb - q0) * pw), base + u(plane_len)):
                    bf[t] = zero
            if pair:
                nf, ns = f1 - f0, s1 - s0
                both = min(nf, ns)
                df = u(((a * nb + pf) * c_ + c) * plane_len + (qa - q0) * pw + f0)
                ds = u(((a * nb + ps) * c_ + c) * plane_len + (qa - q0) * pw + s0)
                src = row0
                for _q in range(qa, qb):
                    for t in range(both):
                        v0 = xf[src + u(2 * t)]
                        v1 = xf[src + u(2 * t + 1)]
                        bf[df + u(t)] = v0
                        bf[ds + u(t)] = v1
                    for t in range(both, nf):
                        bf[df + u(t)] = xf[src + u(2 * t)]
                    for t in range(both, ns):
                        bf[ds + u(t)] = xf[src + u(2 * t + 1)]
                    _zeros(bf, df - u(f0), f0, zero)
                    _zeros(bf, df + u(nf), pw - f1, zero)
                    _zeros(bf, ds - u(s0), s0, zero)
                    _zeros(bf, ds + u(ns), pw - s1, zero)
                    df += u(pw)
                    ds += u(pw)
                    src += u(sh * w_)
                continue
            for bb in range(nb):
                u0, u1, c0 = _phase_cols(bb, pw, pl, sw, w_)
                d = u(((a * nb + bb) * c_ + c) * plane_len + (qa - q0) * pw)
                src = row0 + u(c0) if u1 > u0 else row0
                for _q in range(qa, qb):
                    _zeros(bf, d, u0, zero)
                    dd = d + u(u0)
                    if sw == 1:  # a contiguous copy (stride 1): it vectorizes
                        for t in range(u1 - u0):
                            bf[dd + u(t)] = xf[src + u(t)]
                    else:
                        for t in range(u1 - u0):
                            bf[dd + u(t)] = xf[src + u(t * sw)]
                    _zeros(bf, dd + u(u1 - u0), pw - u1, zero)
                    d += u(pw)
                    src += u(sh * w_)


def _cols_par(  # pragma: no cover - numba only
    x: Any, xpad: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """The blocks (rows ``(image, first output row, end row, first filter, end filter)``,
    ``_blocks``) in a ``prange`` loop on native threads, each with its thread's row of
    ``cols_buf`` as its scratch and (GRID) of ``xpad`` for its padded rows (``_block``):
    rows ``native_threads.max_threads()``, numba's bound on ``get_thread_id`` (a row a
    block held 16 rows at batch 8 on two threads: 6.2 MB for SqueezeNet's 55x55 3x3
    convs; whole-model time the same within the noise)."""
    for q in numba.prange(blocks.shape[0]):
        t = numba.get_thread_id()
        _block(x, xpad[t], w2, y3, b, res3, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2],
               blocks[q, 3], blocks[q, 4], sub, cols_buf[t], act, p, lohi, flags, nr, mode,
               toff, pads)  # fmt: skip


def _cols_one(  # pragma: no cover - numba only
    x: Any, xpad: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """``_cols_par`` on the caller's thread, block after block, all with ``cols_buf[0]`` and
    ``xpad[0]``."""
    for q in range(blocks.shape[0]):
        _block(x, xpad[0], w2, y3, b, res3, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2],
               blocks[q, 3], blocks[q, 4], sub, cols_buf[0], act, p, lohi, flags, nr, mode,
               toff, pads)  # fmt: skip


def _warm(fn: Any) -> None:
    f = np.float32
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    x, w2, y3 = np.ones((1, 1, 2, 2), f), frozen(np.ones((2, 9), f)), np.zeros((1, 2, 4), f)
    blocks = np.array([[0, 0, 1, 0, 2], [0, 1, 2, 0, 2]], np.int64)
    toff = np.zeros(1, np.int64)
    rows = max(2, native_threads.max_threads())  # a row per thread that may take a block
    for mode in (IM2COL, GRID):  # weights and bias read-only, as a model's (taps_first)
        fn(x, np.zeros((rows, 1, 20), f), w2, y3, frozen(np.zeros(2, f)), np.zeros((0, 0, 0), f),
           geo, blocks, np.zeros((rows, 18), f), 0, np.zeros(PARAMS_LEN, f), np.zeros(2, f), 0,
           gemm_cols.panel_width(), mode, 1, toff, np.array([1, 1, 4, 2, 1, 1], np.int64),
           )  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    return gemm_cols.register(module_globals)


_HELPERS = (im2col_rows, _act_row, _block, _crop_grid, _phase_rows)
COLS_PAR = Jitted(_cols_par, _warm, helpers=_HELPERS, fastmath=CONTRACT, parallel=True,
                  prepare=_prepare)  # fmt: skip
COLS_ONE = Jitted(_cols_one, _warm, helpers=_HELPERS, fastmath=CONTRACT, prepare=_prepare)

#: the compiled activation codes the kernel applies itself, and its flag for each
_FUSED = {0: 0, ACTIVATIONS["Relu"]: gemm_cols.FLAG_RELU, ACTIVATIONS["Clip"]: gemm_cols.FLAG_CLIP}


class ColsPlan(NamedTuple):
    """How ``run`` computes one input shape (immutable)."""

    fn: Any  # COLS_PAR's or COLS_ONE's compiled function
    parallel: bool  # COLS_PAR's, over more than one block: one scratch per thread
    rows: int  # scratch rows (``cols``, ``xpad``): native_threads.max_threads() or 1
    mode: int  # IM2COL or GRID
    blocks: np.ndarray  # (image, first output row, end row, first filter, end filter)
    sub: int  # output rows per sub-block
    scratch_floats: int  # a block's scratch: its im2col columns or its extended output
    act: int  # the activation code ``_act_row`` applies after the kernel (0: none)
    flags: int  # the kernel's activation flag (the bias and residual flags join per call)
    lohi: np.ndarray  # Clip's bounds (float32)
    zeros: np.ndarray  # M zeros: the bias pointer when there is none
    nr: int
    toff: np.ndarray  # GRID: each tap's offset into a padded plane (int64); else [0]
    pads: np.ndarray  # GRID: (rows above, columns left (stride 1: the rows' gap), row
    # width, rows a block reads below its last output row, phases down, phases across --
    # 1, 1 at stride 1); else zeros
    xpad_shape: tuple[int, ...]  # GRID: (blocks, C, a block's padded rows); else (0, 0, 0)


def compile_at_build() -> None:
    """Compile the kernels ``plan`` picks from, now, from a float32 one-group conv's
    builder (its thread): ``plan`` runs per input shape, in the model's calls, where a
    first compile took seconds (ViT-Tiny's patch embedding at a new batch). A no-op where
    the compiled kernels may not run on this thread (``Jitted.get``)."""
    if not jit_enabled() or not gemm_cols.available():
        return
    COLS_ONE.get()
    if intra_pool().threads > 1:
        COLS_PAR.get()


def plan(
    x_shape: tuple[int, ...], m: int, kernel: tuple[int, int], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
    act: int, params: np.ndarray, threads: int, phase_min_width: int | None = None,
) -> ColsPlan | None:  # fmt: skip
    """The plan of a one-group float32 2-D conv of ``m`` filters of ``kernel`` (KH, KW)
    over ``x_shape`` (N, C, H, W) into ``out_shape``, compiled activation code ``act``
    (its ``params``), over ``threads`` native threads (one block of rows per thread per
    image; 1: on the caller); None where the kernel or numba is not there.
    ``phase_min_width``: ``_phases_pay``'s row width (None: ``PHASE_MIN_WIDTH``;
    ``conv_cols_grouped`` passes 0)."""
    if not gemm_cols.available():  # first: while $TFRT_PY_PACKED_GEMM=0 (read per call),
        return None  # compiling the kernels would fail for the rest of the process
    fn = (COLS_PAR if threads > 1 else COLS_ONE).get()
    if fn is None:
        return None
    n, c, h, w = x_shape
    kh, kw = kernel
    oh, ow = out_shape[2], out_shape[3]
    taps = kh * kw
    stride1 = tuple(strides) == (1, 1)
    toff, pads, xpad_shape = np.zeros(1, np.int64), np.zeros(6, np.int64), (0, 0, 0)
    direct = stride1 and taps == 1 and not any(pads_begin) and (oh, ow) == (h, w)
    blocks = _blocks(n, m, oh, ow, threads)
    parallel = threads > 1 and len(blocks) > 1
    slots = native_threads.max_threads() if parallel else 1  # scratch rows, one a thread
    if direct:
        mode, k = DIRECT, c
    elif stride1:
        mode, k = GRID, c
        dh, dw = dilations
        gap, pw = _shared_gap(w, ow, kw * dw - dw, pads_begin[1])
        halo = (kh - 1) * dh  # the padded rows below a block's last output row it reads
        rows = int((blocks[:, 2] - blocks[:, 1]).max()) + halo
        plane = rows * pw + (kw - 1) * dw + gap  # what the last row's last taps read past it
        shift = gap - pads_begin[1]
        toff = np.array([i * dh * pw + j * dw + shift for i in range(kh) for j in range(kw)],
                        np.int64)  # fmt: skip
        pads = np.array([pads_begin[0], gap, pw, halo, 1, 1], np.int64)
        xpad_shape = (slots, c, plane)
    elif tuple(dilations) == (1, 1) and _phases_pay(c, kw, strides[1], ow, phase_min_width):
        mode, k = GRID, c
        toff, pads, xpad_shape = _phases(c, kernel, ow, strides, pads_begin, blocks, slots)
    else:
        mode, k = IM2COL, c * taps
    want = max(MIN_BLOCK_PIXELS, BLOCK_BYTES // (4 * k))
    width = int(pads[2]) if mode == GRID else ow
    sub = oh if mode == DIRECT else max(1, min(oh, -(-want // width)))
    extended = mode == GRID and width > ow  # an extended output to crop
    scratch_floats = m * sub * width if extended else 0 if mode != IM2COL else k * sub * ow
    # GRID's extended output is cropped, its epilogue applied on the way; as wide as the
    # output, it is stored in place with the kernel's epilogue, as the other forms
    flag = None if extended else _FUSED.get(act)
    lohi = np.array([params[0], params[1]], np.float32)
    return ColsPlan(fn, parallel, slots, mode, blocks, sub, scratch_floats,
                    act if flag is None else 0, flag or 0, lohi, frozen(np.zeros(m, np.float32)),
                    gemm_cols.panel_width(), toff, pads, xpad_shape)  # fmt: skip


def run(
    cp: ColsPlan, x: np.ndarray, w2: np.ndarray, y3: np.ndarray, b: np.ndarray | None,
    res3: np.ndarray | None, geo: np.ndarray, params: np.ndarray, cols: np.ndarray,
    xpad: np.ndarray, fn: Any = None, zeros: np.ndarray | None = None,
) -> None:  # fmt: skip
    """``y3`` (N, M, OH*OW) = the conv of ``x`` (C-contiguous float32) by ``w2`` (M, K; for
    GRID the filters' taps outermost: ``taps_first``), + ``b`` + ``res3``, then the
    activation; ``cols`` a (blocks, scratch_floats) scratch, ``xpad`` GRID's padded rows
    (``xpad_shape``; any (1, 0, 0) array for IM2COL). ``fn`` and ``zeros`` (the bias when
    there is none) stand in for the plan's: ``conv_cols_grouped``'s loop over groups."""
    flags = cp.flags
    if b is not None and b.shape[0]:
        flags |= gemm_cols.FLAG_BIAS
    else:
        b = cp.zeros if zeros is None else zeros
    if res3 is not None:
        flags |= gemm_cols.FLAG_RESIDUAL
    else:
        res3 = _EMPTY3
    (cp.fn if fn is None else fn)(x, xpad, w2, y3, b, res3, geo, cp.blocks, cols, cp.act,
                                  params, cp.lohi, flags, cp.nr, cp.mode, cp.sub, cp.toff,
                                  cp.pads)  # fmt: skip


def _phases_pay(c: int, kw: int, sw: int, ow: int, min_width: int | None = None) -> bool:
    """Whether a strided conv of ``c`` channels, ``kw`` wide at column stride ``sw`` into
    rows ``ow`` wide takes GRID's phases (``PHASE_MIN_CHANNELS``, ``min_width`` or
    ``PHASE_MIN_WIDTH``)."""
    width = PHASE_MIN_WIDTH if min_width is None else min_width
    return c >= PHASE_MIN_CHANNELS and (kw <= sw or ow >= width)


def _phases(
    c: int, kernel: tuple[int, int], ow: int, strides: tuple[int, ...], pads_begin: tuple[int, ...],
    blocks: np.ndarray, slots: int,
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:  # fmt: skip
    """A strided undilated conv's GRID geometry: (tap offsets, pads, xpad shape). The
    padded input in phases (``_phase_rows``; the ``min(SH, KH) * min(SW, KW)`` its taps
    read), each ``pw`` = OW + (KW-1) // SW columns wide: tap (i, j) reads phase ``(i % SH,
    j % SW)`` at row ``i // SH`` and column ``j // SW`` of the output's position, so output
    t of the extended grid is that phase's plane at t plus an offset, as at stride 1, and
    K = C a tap. The input is copied once (im2col: KH*KW / (SH*SW) times its size)."""
    kh, kw = kernel
    sh, sw = strides
    na, nb = min(sh, kh), min(sw, kw)  # the phases the taps read (a 1x1/2 conv: one)
    pw = ow + (kw - 1) // sw
    halo = (kh - 1) // sh
    rows = int((blocks[:, 2] - blocks[:, 1]).max()) + halo
    plane = rows * pw + pw  # a row of slack: what a partial panel's masked lanes skip
    toff = np.array([
        (((i % sh) * nb + j % sw) * c) * plane + (i // sh) * pw + j // sw
        for i in range(kh) for j in range(kw)
    ], np.int64)  # fmt: skip
    pads = np.array([pads_begin[0], pads_begin[1], pw, halo, na, nb], np.int64)
    return toff, pads, (slots, na * nb * c, plane)


def _shared_gap(w: int, ow: int, span: int, pl: int) -> tuple[int, int]:
    """GRID's padded row: (the zeros before each image row, the row's width ``pw``). Rows
    share their padding: a row's right pad is the next row's left, so ``gap = max(left,
    right)`` zeros a row instead of ``left + right`` -- the extended grid wastes ``pw -
    OW`` columns a row (3x3 "same": 1 instead of 2, a 28-wide plane's 7% of its products
    down to 3.4%). ``span``: the kernel's reach ``(KW - 1) * DW``; ``pl`` the left pad
    (the right one follows from OW = W + left + right - span at stride 1); pads wider
    than the reach widen the gap to keep each output row inside its grid row."""
    pr = ow - w - pl + span
    gap = max(pl, pr, ow - w)
    return gap, w + gap


def _blocks(n: int, m: int, oh: int, ow: int, threads: int) -> np.ndarray:
    """(image, first output row, end row, first filter, end filter) per block: one block of
    output rows per thread per image; where the output has fewer pixels than filters
    (ResNet's last stages: 512 filters over 7x7) or fewer rows than two a thread, one
    block of filters per thread per image instead, cut at the kernel's tile rows (a row
    split would leave each thread a panel or two of columns, mostly masked)."""
    per = max(1, threads)
    if per > 1 and (m > oh * ow or oh < 2 * per):
        q = gemm_cols.tile_rows() or 1
        tiles = -(-m // q)
        cuts = sorted({min(m, q * (tiles * j // per)) for j in range(per + 1)} | {m})
        spans = [(0, oh, a, b) for a, b in itertools.pairwise(cuts) if b > a]
    else:
        per = min(per, oh)
        spans = [(oh * j // per, oh * (j + 1) // per, 0, m) for j in range(per)]
    return np.array([(i, *span) for i in range(n) for span in spans], np.int64)


def computed_columns(cp: ColsPlan, oh: int, ow: int) -> int:
    """The columns the kernel computes for one image's rows (each sub-block's columns --
    GRID: its extended rows -- rounded up to whole panels), the useful ones ``oh * ow``
    among them."""
    width = int(cp.pads[2]) if cp.mode == GRID else ow
    total = 0
    for r0 in range(0, oh, cp.sub):
        cols = (min(oh, r0 + cp.sub) - r0) * width
        total += -(-cols // cp.nr) * cp.nr
    return total


def taps_first(w: np.ndarray) -> np.ndarray:
    """Weights (M, C, KH, KW) as GRID's operand: (M, KH*KW*C), each tap's channels
    together (float32, C order)."""
    out = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1), dtype=np.float32)
    out.flags.writeable = False  # as the weights it stands for (one compiled signature)
    return out


_EMPTY3 = np.zeros((0, 0, 0), np.float32)
