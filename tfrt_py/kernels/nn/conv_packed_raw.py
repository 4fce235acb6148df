"""A cold start's NumPy stand-ins' one-group float32 convolutions on ``gemm_indirect``'s
machine code through ctypes (``gemm_indirect.raw()``), where the kernel stores NCHW itself
(the AVX-512 build): the convs ``conv_packed`` serves, before numba is warm.

``conv_cols_raw`` runs a stand-in's one-group convs on ``gemm_cols``: over ResNet-18 that
route is slower than the compiled model's ``conv_packed`` (its 7x7 plane computes 9-wide
extended rows and crops them; every stride-1 plane is copied twice more in NumPy), so the
stand-in served ResNet-18 at a batch of 30 at 1.30-1.37x onnxruntime's time on one Zen 4
thread, against 1.07x once switched. Here the same convs take ``conv_packed``'s two
passes, each a ctypes call (the GIL released in it) on the caller's thread: each image
copied channels-last and zero-padded into scratch slot 0 (``raw.nhwc``), then the indirect
product of the chunk with the bias, the residual and ReLU/Clip stored into the NCHW
output (``raw.product``), in the compiled route's cache-sized chunks
(``conv_packed.chunk_images``): each call hands the GIL over, and the warm-up thread
beside the stand-in takes it for a switch interval, but chunks of as many images as 16 MB
of padded copy hold cost more (ResNet-18 at a batch of 30 on one Zen 4 thread, the
second call: 1.08x -> 1.21x onnxruntime's time alone, 1.16x -> 1.14x next to a spinning
Python thread at the warm-up's interval). Other activations run over
the whole output after (``conv_direct._numpy_act``). The route serves what
``conv_packed.serves`` says (and a 1x1 conv only where ``pointwise_pays``), with
non-negative pads; elsewhere it declines and ``conv_cols_raw`` or NumPy's path runs.

The filters are packed at the conv's first call on this route (a second copy of them,
dropped with the stand-in's program at the switch). Thread-safe: plans are immutable,
scratch is per thread, the packed filters are set whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency.env_switch import switched_off
from ..common import ShapeMemo, scratch
from ..lib import gemm_indirect
from ..lib.gemm_indirect import FLAG_BIAS, FLAG_CLIP, FLAG_NCHW, FLAG_RELU, FLAG_RESIDUAL
from ..lib.gemm_packed import TileShape
from ..lib.jit import ENV_JIT
from . import conv_packed
from .conv_common import ConvNode, into_out, raw_call_operands, raw_geometry, store_flags
from .conv_direct import _numpy_act

__all__ = ["raw_packed_fn"]


class _Plan(NamedTuple):
    """How one input shape runs (immutable)."""

    out_shape: tuple[int, int, int, int]
    plane: tuple[int, int]  # (Hp, Wp) of the padded copy
    pads: tuple[int, int]  # (top, left)
    chunk: int  # images a product call takes
    rowoff: np.ndarray  # a chunk's (``conv_packed.offsets``)
    toff: np.ndarray
    yoff: np.ndarray
    k_tap: int  # a tap's run of floats (C, or a filter row's KW*C)


def _plan(shape: tuple[int, ...], w4: tuple[int, ...], sp: Any, tile: TileShape) -> _Plan | None:
    """The plan of input ``shape`` (N, C, H, W) for weights of shape ``w4``; None where the
    route does not serve it (module doc)."""
    geo = raw_geometry(shape, w4, sp)
    if geo is None or min(shape) < 1:
        return None
    kernel, strides, dil, begin, _end, out_sp = geo
    n, c = shape[:2]
    m, (kh, kw), (oh, ow) = w4[0], kernel, out_sp
    pixels = oh * ow
    if kh * kw == 1 and not conv_packed.pointwise_pays(m, pixels, tile):
        return None
    if not conv_packed.serves(c * kh * kw, m, pixels, tile):
        return None
    out_shape = (n, m, oh, ow)
    hp, wp = conv_packed.padded_plane(shape, (kh, kw), out_shape, strides, begin, dil)
    chunk = conv_packed.chunk_images(n, hp * wp * c, 0, pixels * c * kh * kw)
    if chunk == 0:
        return None
    rowoff, toff, yoff = conv_packed.offsets(chunk, c, m, (hp, wp), (kh, kw), (oh, ow), strides,
                                             dil)  # fmt: skip
    k_tap = c * kh * kw // toff.shape[0]
    return _Plan(out_shape, (hp, wp), (begin[0], begin[1]), chunk, rowoff, toff, yoff, k_tap)


def raw_packed_fn(node: ConvNode) -> Callable[..., np.ndarray | None] | None:
    """``fn(x, b, r, out)``: a float32 one-group 2-D conv with constant weights and its
    epilogue on ``gemm_indirect``'s ctypes build once something in this process built it
    (``gemm_indirect.raw()``: a cold start's warm-up, early, for its NumPy stand-ins);
    None where the conv is not one this route could serve, or ``$TFRT_PY_JIT`` is ``0``.
    ``fn`` returns None before the kernels are built, on a build without the NCHW stores,
    and for inputs it does not serve (another dtype or channel count, a residual of
    another shape, a bias of another length); the caller then takes its next path. Notes
    the conv (``gemm_indirect.WANTED``). Any thread."""
    sp, group, w_const, b_c, cdt, epi = node
    if (w_const is None or w_const.ndim != 4 or cdt != np.float32 or group != 1
            or switched_off(ENV_JIT)):  # fmt: skip
        return None
    w4 = tuple(int(d) for d in w_const.shape)
    m = w4[0]
    if w4[1] * w4[2] * w4[3] < conv_packed.MIN_K:
        return None
    packed: list[np.ndarray] = []  # the filters in the kernel's panels, at the first call
    act_flag, lohi = store_flags(epi, FLAG_RELU, FLAG_CLIP)
    plans: ShapeMemo[tuple[int, ...], Any] = ShapeMemo()
    gemm_indirect.WANTED.set()

    def filters(tile: TileShape) -> np.ndarray:
        if not packed:
            wp = conv_packed.pack_filters(w_const, tile)
            assert wp is not None  # a tile was given
            packed.append(wp)
        return packed[0]

    def raw_packed(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        raw = gemm_indirect.raw()
        if raw is None or x.dtype != np.float32 or not gemm_indirect.stores_nchw(raw.shape):
            return None  # not built yet, or a build that stores rows (no FLAG_NCHW)
        plan = plans.decided(x.shape, _plan, x.shape, w4, sp, raw.shape)
        if plan is None:
            return None
        got = raw_call_operands(x, b, r, out, plan.out_shape, b_c, cdt, m)
        if got is None:
            return None
        ops, bb = got
        _run(raw, plan, ops.x, filters(raw.shape), ops.y, bb, ops.r, act_flag, lohi)
        if epi.act and not act_flag:
            _numpy_act(ops.y, epi)
        return into_out(ops.y, out)

    return raw_packed


def _run(raw: gemm_indirect.Raw, plan: _Plan, x: np.ndarray, wp: np.ndarray, y: np.ndarray,
         bias: np.ndarray | None, res: np.ndarray | None, act_flag: int,
         lohi: np.ndarray) -> None:  # fmt: skip
    """``y`` = act(conv(``x``) + ``bias`` + ``res``), all float32 and C-contiguous: per
    chunk of images, one call for their padded copies (``raw.nhwc``), then one product
    call that stores NCHW. Scratch slot 0."""
    n, m, oh, ow = plan.out_shape
    _, c, h, w = x.shape
    hp, wpd = plan.plane
    pt, pl = plan.pads
    nr = raw.shape.nr
    panels = -(-m // nr)
    xt = scratch(0, (plan.chunk, hp, wpd, c), np.dtype(np.float32))
    flags = FLAG_NCHW | act_flag | (0 if bias is None else FLAG_BIAS)
    flags |= 0 if res is None else FLAG_RESIDUAL
    # the kernel reads the bias only where FLAG_BIAS, the residual only where
    # FLAG_RESIDUAL: any readable address serves otherwise
    bp = y.ctypes.data if bias is None else bias.ctypes.data
    taps = plan.toff.shape[0]
    k_all = plan.k_tap * taps  # C*KH*KW
    image_x, image_y = c * h * w * 4, m * oh * ow * 4
    xp, yp, xtp = x.ctypes.data, y.ctypes.data, xt.ctypes.data
    rp = yp if res is None else res.ctypes.data
    for i in range(0, n, plan.chunk):
        j = min(n, i + plan.chunk)
        raw.nhwc(xp + i * image_x, c, h, w, xtp, hp, wpd, pt, pl, 0, hp, j - i)
        status = raw.product(xtp, plan.rowoff.ctypes.data, taps, plan.toff.ctypes.data,
                             plan.k_tap, wp.ctypes.data, k_all, yp + i * image_y, 0,
                             (j - i) * oh * ow, panels, bp, flags, nr, plan.yoff.ctypes.data,
                             oh * ow, m, rp + i * image_y, lohi.ctypes.data)  # fmt: skip
        if status != 0:
            raise ValueError(f"gemm_indirect: status {status} (a panel width or store form "
                             "other than this build's)")  # fmt: skip
