"""One-group float32 convolutions on ``kernels/lib/gemm_cols``: per block of output rows,
one kernel call that multiplies the filters by the block's columns, the bias, residual and
ReLU/Clip applied before its one store where it can.

``conv_blocked``'s BLAS routes copy the im2col matrix of a whole image, or of one block of
rows per thread (for a ResNet's first stages megabytes, written to memory and read back),
OpenBLAS packs the weights again on every call, and the epilogue is another pass. Here a
block's columns come in one of three forms (``plan`` picks it per input shape):

* GRID (stride 1, any kernel, dilation and pads): no im2col at all. The image is copied
  once, zero-padded, into planes of rows ``pw`` = OW + (KW-1)*DW wide; on that extended
  grid, tap (i, j)'s column for output t is the padded plane at t + i*DH*pw + j*DW, so
  the kernel reads every tap's rows in place at an offset (``toff``), K = C a tap, with
  the filters ordered taps-first (``taps_first``, made once at load). The extended
  output (pw - OW wasted columns a row) goes to a scratch and each channel's rows are
  cropped into the output, bias, residual and activation applied as they are
  (``_epilogue_row``).
* 1x1 stride-1 unpadded convs are not taken (``plan`` returns None): read in place with
  the plane as leading dimension the kernel lost to OpenBLAS's packed product on
  MobileNet's projections (one thread: 32x112x112 -> 16 601 vs 436 µs, 144x56x56 -> 24
  792 vs 429), so ``conv_blocked``'s BLAS routes keep them.
* IM2COL (strided convs): im2col of ``sub`` output rows at a time into a cache-sized
  scratch (``BLOCK_BYTES``), then the kernel with the epilogue fused.

Each thread takes blocks of output rows (``COLS_PAR``: a ``prange`` over them; one thread:
``COLS_ONE`` on the caller) and walks them ``sub`` rows at a time. Activations other than
ReLU and Clip run over each sub-block right after its product (``activations._act_row``,
while it is in cache). On a 2-core AVX-512 Xeon (one thread, interleaved with
onnxruntime in one process, 2026-11-29) ResNet-18 went from 2.25-2.29x onnxruntime's time
to 1.94-1.96x (74.5 -> 56.6 ms), its 3x3 convs from 38-53 to 59-88 GFLOP/s (the kernel
alone: 102-113 on the extended grid); onnxruntime's NCHWc kernels run them at 82-126.
numba and the kernel only: ``plan`` returns None without them (``conv_blocked`` keeps its
BLAS routes). Thread-safe: plans are immutable; scratch is per thread.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..lib import gemm_cols
from ..lib.activations import ACTIVATIONS, _act_row
from ..lib.jit import CONTRACT, Jitted, frozen, inline
from .conv_direct import _epilogue_row
from .conv_im2col import im2col_rows

__all__ = ["BLOCK_BYTES", "COLS_ONE", "COLS_PAR", "GRID", "IM2COL", "ColsPlan", "plan",
           "run", "taps_first"]  # fmt: skip

#: A sub-block's im2col columns take about this many bytes (with the weights' rows they
#: stay in a core's L2 between the copy and the product).
BLOCK_BYTES = 256 * 1024
#: ... but at least this many output pixels (two panels of the AVX-512 tile): fewer would
#: leave the kernel on its masked partial panel.
MIN_BLOCK_PIXELS = 64

#: numba (set by ``Jitted(parallel=True)``) and the kernel (``gemm_cols.register``)
numba: Any = None
_sgemm_cols: Any = None


#: How ``_block`` forms a block's columns: the im2col copy, or (stride 1) the padded input
#: on an extended grid, one tap an offset.
IM2COL, GRID = 0, 1


@inline
def _block(  # pragma: no cover - numba only
    x: Any, xpad: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, i: int, r0: int,
    r1: int, sub: int, cols: Any, act: int, p: Any, lohi: Any, flags: int, nr: int,
    mode: int, toff: Any, pw: int,
) -> None:  # fmt: skip
    """Output rows ``[r0, r1)`` of image ``i``, ``sub`` rows at a time, into ``y3`` (N, M,
    OH*OW). IM2COL: im2col into ``cols``, the kernel with ``flags``' epilogue, then the
    activation ``act`` (0: none or fused) over the sub-block's rows. GRID: the kernel
    reads the padded image ``xpad`` (N, C, L) in place, K = C an offset ``toff[t]`` a
    tap, on the extended grid (rows ``pw`` wide) into ``cols`` (M x rows*pw); each
    channel's rows are then cropped to OW into ``y3`` and finished there (bias,
    residual, activation ``act``)."""
    m = w2.shape[0]
    o = y3.shape[2]
    ow = geo[8]
    c_in = x.shape[1]
    has_b = (flags & 1) != 0
    has_res = res3.shape[0] > 0
    zero = p[2]
    four = np.uint64(4)
    for s0 in range(r0, r1, sub):
        s1 = min(r1, s0 + sub)
        p0, npx = s0 * ow, (s1 - s0) * ow
        at = np.uint64(i * m * o + p0) * four
        dst = y3.ctypes.data + at
        if mode == GRID:
            n_ext = (s1 - s0) * pw
            src = xpad.ctypes.data + np.uint64(i * xpad.shape[1] * xpad.shape[2] + s0 * pw) * four
            out = cols.ctypes.data
            _sgemm_cols(w2.ctypes.data, w2.shape[1], src, xpad.shape[2], toff.shape[0],
                        toff.ctypes.data, out, n_ext, m, c_in, n_ext, b.ctypes.data, out,
                        n_ext, lohi.ctypes.data, 0, nr)  # fmt: skip
            for mm in range(m):
                row = y3[i, mm, p0 : p0 + npx]
                src_m = cols[mm * n_ext : (mm + 1) * n_ext]
                for r in range(s1 - s0):
                    for t in range(ow):
                        row[r * ow + t] = src_m[r * pw + t]
                rr = res3[i, mm, p0 : p0 + npx] if has_res else row
                _epilogue_row(row, b[mm] if has_b else zero, rr, has_b, has_res, act, p)
            continue
        k = w2.shape[1]
        im2col_rows(x, i, cols[: k * npx].reshape((k, npx)), geo, 0, c_in, s0, s1)
        rp = res3.ctypes.data + at if has_res else dst
        _sgemm_cols(w2.ctypes.data, k, cols.ctypes.data, npx, toff.shape[0],
                    toff.ctypes.data, dst, o, m, k, npx, b.ctypes.data, rp, o,
                    lohi.ctypes.data, flags, nr)  # fmt: skip
        if act != 0:
            for mm in range(m):
                _act_row(y3[i, mm, p0 : p0 + npx], -zero, act, p)


@inline
def _pad_images(x: Any, xpad: Any, pt: int, pl: int, pw: int) -> None:  # pragma: no cover
    """``xpad`` (N, C, L): each channel zero-padded, rows ``pw`` wide, ``pt`` rows above
    and ``pl`` columns left of the image; zeros to the end of each plane."""
    n_, c_, h_, w_ = x.shape
    zero = xpad.dtype.type(0)
    for i in range(n_):
        for c in range(c_):
            plane = xpad[i, c]
            for t in range(plane.shape[0]):
                plane[t] = zero
            for r in range(h_):
                d = (pt + r) * pw + pl
                src = x[i, c, r]
                for t in range(w_):
                    plane[d + t] = src[t]


def _cols_par(  # pragma: no cover - numba only
    x: Any, xpad: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """The blocks (rows ``(image, first output row, end row)``) in a ``prange`` loop on
    native threads, block ``q`` with ``cols_buf[q]`` as its scratch (``_block``); GRID
    pads the images first (``pads``: top, left, row width)."""
    if mode == GRID:
        _pad_images(x, xpad, pads[0], pads[1], pads[2])
    for q in numba.prange(blocks.shape[0]):
        _block(x, xpad, w2, y3, b, res3, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2], sub,
               cols_buf[q], act, p, lohi, flags, nr, mode, toff, pads[2])  # fmt: skip


def _cols_one(  # pragma: no cover - numba only
    x: Any, xpad: Any, w2: Any, y3: Any, b: Any, res3: Any, geo: Any, blocks: Any,
    cols_buf: Any, act: int, p: Any, lohi: Any, flags: int, nr: int, mode: int, sub: int,
    toff: Any, pads: Any,
) -> None:  # fmt: skip
    """``_cols_par`` on the caller's thread, block after block, all with ``cols_buf[0]``."""
    if mode == GRID:
        _pad_images(x, xpad, pads[0], pads[1], pads[2])
    for q in range(blocks.shape[0]):
        _block(x, xpad, w2, y3, b, res3, geo, blocks[q, 0], blocks[q, 1], blocks[q, 2], sub,
               cols_buf[0], act, p, lohi, flags, nr, mode, toff, pads[2])  # fmt: skip


def _warm(fn: Any) -> None:
    f = np.float32
    geo = np.array([3, 3, 1, 1, 1, 1, 1, 1, 2], np.int64)
    x, w2, y3 = np.ones((1, 1, 2, 2), f), frozen(np.ones((2, 9), f)), np.zeros((1, 2, 4), f)
    blocks = np.array([[0, 0, 1], [0, 1, 2]], np.int64)
    toff = np.zeros(1, np.int64)
    for mode in (IM2COL, GRID):  # weights and bias read-only, as a model's (taps_first)
        fn(x, np.zeros((1, 1, 20), f), w2, y3, frozen(np.zeros(2, f)), np.zeros((0, 0, 0), f), geo,
           blocks, np.zeros((2, 18), f), 0, np.zeros(35, f), np.zeros(2, f), 0,
           gemm_cols.panel_width(), mode, 1, toff, np.array([1, 1, 4], np.int64))  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    return gemm_cols.register(module_globals)


_HELPERS = (im2col_rows, _act_row, _epilogue_row, _block, _pad_images)
COLS_PAR = Jitted(_cols_par, _warm, helpers=_HELPERS, fastmath=CONTRACT, parallel=True,
                  prepare=_prepare)  # fmt: skip
COLS_ONE = Jitted(_cols_one, _warm, helpers=_HELPERS, fastmath=CONTRACT, prepare=_prepare)

#: the compiled activation codes the kernel applies itself, and its flag for each
_FUSED = {0: 0, ACTIVATIONS["Relu"]: gemm_cols.FLAG_RELU, ACTIVATIONS["Clip"]: gemm_cols.FLAG_CLIP}


class ColsPlan(NamedTuple):
    """How ``run`` computes one input shape (immutable)."""

    fn: Any  # COLS_PAR's or COLS_ONE's compiled function
    parallel: bool  # COLS_PAR's, over more than one block: one scratch per block
    mode: int  # IM2COL or GRID
    blocks: np.ndarray  # (image, first output row, end row) per block (one per thread)
    sub: int  # output rows per sub-block
    scratch_floats: int  # a block's scratch: its im2col columns or its extended output
    act: int  # the activation code ``_act_row`` applies after the kernel (0: none)
    flags: int  # the kernel's activation flag (the bias and residual flags join per call)
    lohi: np.ndarray  # Clip's bounds (float32)
    zeros: np.ndarray  # M zeros: the bias pointer when there is none
    nr: int
    toff: np.ndarray  # GRID: each tap's offset into a padded plane (int64); else [0]
    pads: np.ndarray  # GRID: (rows above, columns left, row width); else zeros
    xpad_shape: tuple[int, ...]  # GRID: (N, C, plane length); else (0, 0, 0)


def plan(
    x_shape: tuple[int, ...], m: int, kernel: tuple[int, int], out_shape: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
    act: int, params: np.ndarray, threads: int,
) -> ColsPlan | None:  # fmt: skip
    """The plan of a one-group float32 2-D conv of ``m`` filters of ``kernel`` (KH, KW)
    over ``x_shape`` (N, C, H, W) into ``out_shape``, compiled activation code ``act``
    (its ``params``), over ``threads`` native threads (one block of rows per thread per
    image; 1: on the caller); None where the kernel or numba is not there."""
    fn = (COLS_PAR if threads > 1 else COLS_ONE).get()
    if fn is None or not gemm_cols.available():
        return None
    n, c, h, w = x_shape
    kh, kw = kernel
    oh, ow = out_shape[2], out_shape[3]
    taps = kh * kw
    stride1 = tuple(strides) == (1, 1)
    toff, pads, xpad_shape = np.zeros(1, np.int64), np.zeros(3, np.int64), (0, 0, 0)
    if stride1 and taps == 1 and not any(pads_begin) and (oh, ow) == (h, w):
        return None  # a 1x1 conv reading its input: the BLAS routes (module doc)
    if stride1:
        mode, k = GRID, c
        dh, dw = dilations
        pw = ow + (kw - 1) * dw  # the padded row: pads left and right included
        hp = oh + (kh - 1) * dh
        plane = hp * pw + (kw - 1) * dw  # what the last row's last taps read past it
        toff = np.array([i * dh * pw + j * dw for i in range(kh) for j in range(kw)], np.int64)
        pads = np.array([pads_begin[0], pads_begin[1], pw], np.int64)
        xpad_shape = (n, c, plane)
    else:
        mode, k = IM2COL, c * taps
    per = max(1, min(threads, oh))
    rows = [(oh * j // per, oh * (j + 1) // per) for j in range(per)]
    blocks = np.array([(i, r0, r1) for i in range(n) for r0, r1 in rows], np.int64)
    want = max(MIN_BLOCK_PIXELS, BLOCK_BYTES // (4 * k))
    width = int(pads[2]) if mode == GRID else ow
    sub = max(1, min(oh, -(-want // width)))
    scratch_floats = m * sub * width if mode == GRID else k * sub * ow
    flag = _FUSED.get(act) if mode != GRID else None
    lohi = np.array([params[0], params[1]], np.float32)
    return ColsPlan(fn, threads > 1 and len(blocks) > 1, mode, blocks, sub, scratch_floats,
                    act if flag is None else 0, flag or 0, lohi, np.zeros(m, np.float32),
                    gemm_cols.panel_width(), toff, pads, xpad_shape)  # fmt: skip


def run(
    cp: ColsPlan, x: np.ndarray, w2: np.ndarray, y3: np.ndarray, b: np.ndarray | None,
    res3: np.ndarray | None, geo: np.ndarray, params: np.ndarray, cols: np.ndarray,
    xpad: np.ndarray,
) -> None:  # fmt: skip
    """``y3`` (N, M, OH*OW) = the conv of ``x`` (C-contiguous float32) by ``w2`` (M, K; for
    GRID the filters' taps outermost: ``taps_first``), + ``b`` + ``res3``, then the
    activation; ``cols`` a (blocks, scratch_floats) scratch, ``xpad`` GRID's padded images
    (``xpad_shape``)."""
    flags = cp.flags
    if b is not None and b.shape[0]:
        flags |= gemm_cols.FLAG_BIAS
    else:
        b = cp.zeros
    if res3 is not None:
        flags |= gemm_cols.FLAG_RESIDUAL
    else:
        res3 = _EMPTY3
    cp.fn(x, xpad, w2, y3, b, res3, geo, cp.blocks, cols, cp.act, params, cp.lohi, flags,
          cp.nr, cp.mode, cp.sub, cp.toff, cp.pads)  # fmt: skip


def taps_first(w: np.ndarray) -> np.ndarray:
    """Weights (M, C, KH, KW) as GRID's operand: (M, KH*KW*C), each tap's channels
    together (float32, C order)."""
    out = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1), dtype=np.float32)
    out.flags.writeable = False  # as the weights it stands for (one compiled signature)
    return out


_EMPTY3 = np.zeros((0, 0, 0), np.float32)
