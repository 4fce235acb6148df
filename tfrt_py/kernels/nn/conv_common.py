"""Shared load-time helpers of the conv and pool kernels.

Spatial attribute parsing (kernel_shape, strides, dilations, pads, auto_pad), the ONNX
output-size and padding rules, col2im slice planning, ``bias_vector`` (a call's bias as
one vector, for the three conv paths), ``ConvNode`` (a Conv node as the compiled paths
take it), ``depthwise_plan`` (the direct depthwise/grouped kernel's table; pure Python, so
it sits here, imported by both of its users); ``depthwise_taps`` (the NumPy paths' 2-D
depthwise conv, tap by tap); ``scratch`` (per-thread buffers) is
``kernels.common``'s, re-exported here. All the shape arithmetic runs once per input shape
(plans are memoised by shape); none of it runs per call when the shape repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ...records import record
from ..base import KernelContext
from ..common import attr_str, scratch
from ..lib.activations import Epilogue

__all__ = [
    "ConvNode",
    "RawOperands",
    "Spatial",
    "attr_ints",
    "bias_vector",
    "col2im_slices",
    "conv_geometry",
    "depthwise_plan",
    "depthwise_taps",
    "into_out",
    "parse_spatial",
    "raw_operands",
    "scratch",
]

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def attr_ints(ctx: KernelContext, name: str) -> tuple[int, ...] | None:
    v = ctx.attr(name, None)
    if v is None:
        return None
    return tuple(int(i) for i in v)


@record(frozen=True, slots=True)
class Spatial:
    """Spatial attributes of a conv/pool node; ``None`` fields default by rank at plan time."""

    kernel_shape: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    dilations: tuple[int, ...] | None
    pads: tuple[int, ...] | None
    auto_pad: str

    def resolve(
        self, kshape: Sequence[int] | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(kernel, strides, dilations, pads) with defaults filled for the kernel's rank."""
        k = tuple(self.kernel_shape) if self.kernel_shape is not None else tuple(kshape or ())
        r = len(k)
        s = self.strides if self.strides is not None else (1,) * r
        d = self.dilations if self.dilations is not None else (1,) * r
        p = self.pads if self.pads is not None else (0,) * (2 * r)
        return k, tuple(s), tuple(d), tuple(p)


def parse_spatial(ctx: KernelContext) -> Spatial:
    """Read kernel_shape/strides/dilations/pads/auto_pad; validate what load time can."""
    auto_pad = attr_str(ctx, "auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        raise ctx.unsupported(f"auto_pad={auto_pad!r}")
    sp = Spatial(
        attr_ints(ctx, "kernel_shape"),
        attr_ints(ctx, "strides"),
        attr_ints(ctx, "dilations"),
        attr_ints(ctx, "pads"),
        auto_pad,
    )
    if sp.strides is not None and any(s < 1 for s in sp.strides):
        raise ctx.unsupported(f"strides {sp.strides} must be >= 1")
    if sp.dilations is not None and any(d < 1 for d in sp.dilations):
        raise ctx.unsupported(f"dilations {sp.dilations} must be >= 1")
    if sp.pads is not None and len(sp.pads) % 2:
        raise ctx.unsupported(f"pads {sp.pads} must have 2 entries per spatial axis")
    return sp


def conv_geometry(
    in_sp: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    auto_pad: str,
    ceil_mode: bool = False,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """ONNX conv/pool geometry: (pads_begin, pads_end, output spatial shape).

    SAME_* pads so that ``out = ceil(in / stride)`` (the extra pad at the end for
    SAME_UPPER, at the beginning for SAME_LOWER); VALID pads nothing; NOTSET uses ``pads``.
    ``ceil_mode`` rounds the output size up but never starts a window in the end padding.
    """
    r = len(in_sp)
    begin: list[int] = []
    end: list[int] = []
    out: list[int] = []
    for i in range(r):
        n, s = int(in_sp[i]), strides[i]
        ext = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + ext - n)
            small = total // 2
            b = small if auto_pad == "SAME_UPPER" else total - small
            begin.append(b)
            end.append(total - b)
            out.append(o)
            continue
        if auto_pad == "VALID":
            pb = pe = 0
        else:
            pb, pe = pads[i], pads[i + r]
        span = n + pb + pe - ext
        if ceil_mode:
            o = -(-span // s) + 1
            if (o - 1) * s >= n + pb:
                o -= 1
        else:
            o = span // s + 1
        begin.append(pb)
        end.append(pe)
        out.append(max(o, 0))
    return tuple(begin), tuple(end), tuple(out)


def col2im_slices(
    n_blocks: Sequence[int],
    out_sp: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
) -> list[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
    """For col2im: per kernel position, (kernel index, block slices, output slices).

    Block ``i`` at kernel offset ``k`` lands on output ``i*stride + k*dilation - pad_begin``;
    blocks landing outside ``[0, out)`` are dropped. Positions with no block are omitted.
    """
    per_dim: list[list[tuple[int, slice, slice]]] = []
    for L, O, K, s, d, pb in zip(n_blocks, out_sp, kernel, strides, dilations, pads_begin):
        opts: list[tuple[int, slice, slice]] = []
        for k in range(K):
            off = k * d - pb  # output index of block 0
            i_lo = -(off // s) if off < 0 else 0
            i_hi = min(L - 1, (O - 1 - off) // s) if O - 1 - off >= 0 else -1
            if i_hi < i_lo:
                continue
            o_lo = i_lo * s + off
            o_hi = i_hi * s + off
            opts.append((k, slice(i_lo, i_hi + 1), slice(o_lo, o_hi + 1, s)))
        per_dim.append(opts)
    result: list[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]] = [((), (), ())]
    for opts in per_dim:
        result = [((*ks, k), (*bs, b), (*os_, o)) for ks, bs, os_ in result for k, b, o in opts]
    return result


class ConvNode(NamedTuple):
    """A Conv node as its compiled paths (``conv_depthwise``, ``conv_blocked``) take it at
    load."""

    sp: Spatial
    group: int
    w_const: np.ndarray | None  # the constant weights (M, C/group, *kernel), or None
    b_c: np.ndarray | None  # the constant bias in ``cdt``, or None
    cdt: np.dtype  # the compute dtype
    epi: Epilogue


def bias_vector(b: Any, b_c: np.ndarray | None, cdt: np.dtype) -> np.ndarray | None:
    """A conv call's bias as a contiguous 1-D ``cdt`` array: ``b_c`` (the constant bias,
    converted at load) when there is one, else ``b`` converted; None without a bias."""
    if b is None:
        return None
    return b_c if b_c is not None else np.ascontiguousarray(b, dtype=cdt).reshape(-1)


class RawGeometry(NamedTuple):
    """A 2-D conv's resolved geometry for one input shape (``raw_geometry``)."""

    kernel: tuple[int, ...]  # (KH, KW)
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]  # pads before (top, left)
    end: tuple[int, ...]  # pads after (bottom, right)
    out_hw: tuple[int, ...]


def raw_geometry(shape: tuple[int, ...], w4: tuple[int, ...], sp: Any) -> RawGeometry | None:
    """The geometry of a 2-D conv of input ``shape`` (N, C, H, W) by weights of shape
    ``w4`` for the ctypes kernels of the NumPy paths (``conv_cols_raw``,
    ``conv_packed_raw``); None where none of them serves it: another rank or channel
    count, no channels or no filters (the kernels divide by K and walk M), a kernel shape
    other than the weights', negative pads, an empty output."""
    if len(shape) != 4 or shape[1] != w4[1] or shape[1] < 1 or w4[0] < 1:
        return None
    kernel, strides, dil, pads = sp.resolve(w4[2:])
    if len(kernel) != 2 or tuple(kernel) != tuple(w4[2:]):
        return None
    begin, end, out_sp = conv_geometry(shape[2:], kernel, strides, dil, pads, sp.auto_pad)
    if min(out_sp) < 1 or min(*begin, *end) < 0:
        return None
    return RawGeometry(tuple(kernel), tuple(strides), tuple(dil), tuple(begin), tuple(end),
                       tuple(out_sp))  # fmt: skip


def store_flags(epi: Epilogue, relu: int, clip: int) -> tuple[int, np.ndarray]:
    """(the ctypes kernel's activation flag for ``epi``, its ``lohi`` bounds): ``relu`` or
    ``clip`` (the kernel's flags) for ReLU and Clip, which the kernels store; 0 for the
    others (the caller applies them after)."""
    if epi.act == "Relu":
        return relu, np.zeros(2, np.float32)
    if epi.act == "Clip":
        return clip, np.array([epi.alpha, epi.beta], np.float32)
    return 0, np.zeros(2, np.float32)


class RawOperands(NamedTuple):
    """A float32 conv's operands for a ctypes kernel (``raw_operands``)."""

    y: np.ndarray  # the output buffer: the caller's ``out`` where C-contiguous, else new
    x: np.ndarray  # the input, C-contiguous
    r: np.ndarray | None  # the residual, C-contiguous, or None


def raw_operands(x: np.ndarray, r: Any, out: Any, out_shape: tuple[int, ...]) -> RawOperands | None:
    """The operands of a float32 conv into ``out_shape`` for the ctypes kernels of the NumPy
    paths (``conv_cols_raw``, ``conv_depthwise_grid``); None where the residual ``r`` is
    not float32 of that shape (NumPy's path then broadcasts it). ``out`` is written in place
    only where it is a C-contiguous float32 buffer of ``out_shape`` (a caller's buffer of
    a residual's broadcast shape is not one): the kernels write ``out_shape``'s floats."""
    if r is not None and (r.shape != out_shape or r.dtype != np.float32):
        return None
    fits = (out is not None and out.shape == out_shape and out.dtype == np.float32
            and out.flags.c_contiguous)  # fmt: skip
    y = out if fits else np.empty(out_shape, np.float32)
    xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    return RawOperands(y, xc, None if r is None else np.ascontiguousarray(r))


def raw_call_operands(
    x: np.ndarray, b: Any, r: Any, out: Any, out_shape: tuple[int, ...],
    b_c: np.ndarray | None, cdt: Any, m: int,
) -> tuple[RawOperands, np.ndarray | None] | None:  # fmt: skip
    """(``raw_operands``, the bias vector or None) of a call on a ctypes kernel of ``m``
    filters; None where the kernel cannot take them (a residual of another shape or dtype,
    a bias of another length: it reads one a filter, and NumPy's path says what is
    wrong)."""
    ops = raw_operands(x, r, out, out_shape)
    bb = bias_vector(b, b_c, cdt)
    if ops is None or (bb is not None and bb.shape[0] != m):
        return None
    return ops, bb


def into_out(y: np.ndarray, out: Any) -> np.ndarray:
    """``y``, copied into the caller's ``out`` when one was given and ``y`` is not it."""
    if out is not None and y is not out:
        out[...] = y
        return out
    return y


def depthwise_plan(
    in_hw: tuple[int, ...], kernel: tuple[int, ...], out_hw: tuple[int, ...],
    strides: tuple[int, ...], pads_begin: tuple[int, ...], dilations: tuple[int, ...],
) -> tuple[np.ndarray, int, int]:  # fmt: skip
    """(table, phase-plane elements, grid elements) for ``_depthwise2d`` over (H, W) planes
    ``in_hw`` and (OH, OW) ``out_hw``: the table is [q, sw, grid loop length, tap
    offsets..., then per (input row, column phase) with columns: input row, first column,
    count, offset in the phase planes]."""
    h, wd = in_hw
    kh, kw = kernel
    oh, ow = out_hw
    sh, sw = strides
    dh, dw = dilations
    ph, pw = pads_begin
    # a grid row holds OW outputs plus the widest tap shift; a plane row the padded input
    q = max(ow + ((kw - 1) * dw) // sw, -(-(wd + pw) // sw))
    rows = max(oh + ((kh - 1) * dh) // sh, -(-(h + ph) // sh)) + 1
    plane = rows * q
    taps = []
    for i in range(kh):
        for j in range(kw):
            rh, rw = i * dh, j * dw
            taps.append(((rh % sh) * sw + rw % sw) * plane + (rh // sh) * q + rw // sw)
    runs = []
    for r in range(h):
        pr = r + ph
        for f in range(sw):
            i0 = (f - pw) % sw  # columns i with (i + pw) % sw == f
            if i0 >= wd:
                continue
            cnt = (wd - i0 + sw - 1) // sw
            off = ((pr % sh) * sw + f) * plane + (pr // sh) * q + (i0 + pw) // sw
            runs += [r, i0, cnt, off]
    # the grid loops run over a multiple of 32 elements: LLVM vectorizes them 8 wide,
    # 4 interleaved, and leaves the rest to a scalar loop (most of a 7x7 plane's grid)
    span = -(-((oh - 1) * q + ow) // 32) * 32
    tab = np.array([q, sw, span, *taps, *runs], np.int64)
    return tab, max(sh * sw * plane, max(taps) + span), max(oh * q, span)


#: Bytes of output a ``depthwise_taps`` block covers (its temporary as much again): blocks
#: of (image, channel) planes, whole images where they fit. Each block costs two NumPy
#: calls a tap, and each call hands the GIL back and waits for it: with a cold start's
#: warm-up running Python beside it, a call can wait a switch interval for it. In blocks of
#: 128 KB of one image (3,780 calls for MobileNetV2's 96x112x112 stride-2 layer at batch
#: 21) its stand-in took 5.1-5.5 s a call next to a spinning Python thread (0.2 ms switch
#: interval, as the warm-up sets it) and 0.67 s alone; in these blocks (and the grid
#: below) 1.33-1.42 s and 0.62-0.64 s; EfficientNet-B0 8.1-8.7 -> 2.3-2.4 s and 1.06-1.08
#: -> 1.05-1.07 s (2-core Zen 4, one thread, 2026-12-04). 4 MB: alone 10-15% slower (the
#: strided reads of a stride-2 layer's blocks leave L2).
TAP_BLOCK_BYTES = 2 << 20
#: Stride-1 convs whose padded rows are at most this fraction wider than their output
#: rows (the wide planes of a network's first stages) run on the flat grid.
GRID_MAX_WASTE = 1 / 16


def depthwise_taps(
    xp: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    dil: Sequence[int],
) -> np.ndarray:
    """A 2-D depthwise convolution (one output channel per input channel) on NumPy:
    ``out[n, c] = sum over taps (i, j) of w[c, i*kw + j] * xp[n, c, i*dh + sh*y, j*dw +
    sw*x]``, one multiply and one add a tap over blocks of (image, channel) planes
    (``TAP_BLOCK_BYTES``), accumulated in ``out``. ``xp`` (N, C, Hp, Wp) is the already
    padded input, ``w`` (C, kh*kw), ``out`` (N, C, Ho, Wo) contiguous, of ``xp``'s float
    dtype. A stride-1 conv over wide planes (``GRID_MAX_WASTE``) runs on the flat grid
    instead: each plane of ``xp`` read as one run per tap, the output rows ``Wp`` wide
    (the columns past ``Wo`` computed and cropped), as ``conv_cols``' GRID -- NumPy's
    loops then run thousands of elements, not a row's (MobileNetV2's 144x56x56 layer at
    batch 21: 48 -> 24 ms). Unlike im2col (1.3 GB for MobileNetV2's widest depthwise
    layer at batch 30) it needs one block-sized temporary (``scratch`` slot 2; the grid:
    two). Sums run tap by tap (rounding differs from a product's). Any thread."""
    n_img, c, ho, wo = out.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dil
    if not (n_img and c and ho and wo):
        return out
    wp = xp.shape[3]
    grid = sh == 1 and sw == 1 and (wp - wo) <= GRID_MAX_WASTE * wp
    width = wp if grid else wo  # the block's output rows
    nb, cb = _block_planes(n_img, c, ho * width * out.itemsize)
    work = scratch(2, (2 if grid else 1, nb * cb * ho * width), out.dtype)
    taps = [(i * dh, j * dw) for i in range(kh) for j in range(kw)]  # each tap's origin
    reads: list[tuple[np.ndarray, tuple[slice, ...]]]  # per tap: (source, its block's view)
    if grid:  # each plane one flat run a tap: the outputs' rows wp wide, cropped after
        flat, span = xp.reshape(n_img, c, -1), (ho - 1) * wp + wo
        reads = [(flat, (slice(y0 * wp + x0, y0 * wp + x0 + span),)) for y0, x0 in taps]
    else:
        hs, ws = sh * (ho - 1) + 1, sw * (wo - 1) + 1
        reads = [(xp, (slice(y0, y0 + hs, sh), slice(x0, x0 + ws, sw))) for y0, x0 in taps]
    # the grid's cropped columns may read what no output does (Inf - Inf there is no error)
    with np.errstate(invalid="ignore", over="ignore"):
        for n0 in range(0, n_img, nb):
            for c0 in range(0, c, cb):
                blk = (slice(n0, min(n_img, n0 + nb)), slice(c0, min(c, c0 + cb)))
                ob = out[blk]
                size = ob.size // wo * width
                if grid:
                    lay = (*ob.shape[:2], ho * width)
                    acc, tmp = (work[i, :size].reshape(lay)[..., :span] for i in (0, 1))
                else:
                    acc, tmp = ob, work[0, :size].reshape(ob.shape)
                wb = w[blk[1]].reshape(acc.shape[1], -1, *([1] * (acc.ndim - 2)))
                for k, (src, where) in enumerate(reads):
                    v = src[(*blk, *where)]
                    np.multiply(v, wb[:, k], out=acc if k == 0 else tmp)
                    if k:
                        np.add(acc, tmp, out=acc)
                if grid:
                    np.copyto(ob, work[0, :size].reshape(*ob.shape[:3], width)[..., :wo])
    return out


def _block_planes(n_img: int, c: int, per_plane: int) -> tuple[int, int]:
    """(images, channels) a ``depthwise_taps`` block holds: whole images where one fits in
    ``TAP_BLOCK_BYTES``, else channels of one image (at least one plane)."""
    if c * per_plane <= TAP_BLOCK_BYTES:
        return max(1, min(n_img, TAP_BLOCK_BYTES // (c * per_plane))), c
    return 1, max(1, min(c, TAP_BLOCK_BYTES // per_plane))
