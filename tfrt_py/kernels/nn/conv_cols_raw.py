"""A cold start's NumPy stand-ins' one-group float32 convolutions on ``gemm_cols``'s
machine code through ctypes (``gemm_cols.raw()``), as ``conv_depthwise_grid.run_raw``
does for the depthwise ones.

Until numba is warm, a model serves on its NumPy paths (``cold_start``), where a one-group
conv is im2col and OpenBLAS's sgemm, and then a pass a step of the epilogue: ResNet-18 at
batch 16 took 1.8x its compiled time, most of it in those convs. ``gemm_cols`` is LLVM IR
built by llvmlite, not numba, so the warm-up can build it seconds before numba is warm
and the stand-ins call it at once. A group of images a kernel call (below), on the
caller's thread (the GIL released in each), the input's columns in one of three forms
(``_plan`` picks it per input shape, as ``conv_cols`` does for the compiled route):

* DIRECT (1x1, stride 1, unpadded): the kernel reads the images' planes in place (K = C,
  ``ldc`` the plane) and stores into the output with the bias, residual and ReLU/Clip;
* GRID (stride 1: any kernel, dilation and padding): the images are copied zero-padded
  into scratch slot 0 with rows ``pw`` = W + left + right pad wide; tap (i, j) then reads
  every channel's plane at one offset (K = C a tap, the weights taps-first: made at the
  first such call, kept with the node); the extended output (``pw - OW`` wasted columns a
  row) goes to scratch slot 1 with the bias (and ReLU/Clip where there is no residual)
  and is cropped into the output with one ufunc, the residual added on the way;
* IM2COL (strided): im2col of whole images (one NumPy copy of a strided view of the
  padded images) into slot 1, then the kernel with the epilogue into the output.

Images go in groups (``GROUP_BYTES`` of scratch): one kernel call (``gemm_cols.raw``'s
loop over images) and at most three NumPy copies a group. Each hands the GIL over, and
the warm-up thread beside a stand-in takes it every time: one call an image made
ResNet-18's stand-in at batch 16 next to a spinning Python thread (the warm-up's switch
interval) slower than NumPy's im2col and OpenBLAS (1054 against 887 ms).
Other activations run over the whole output after (``conv_direct._numpy_act``).
Thread-safe: plans are immutable, scratch is per thread, the taps-first weights are
replaced whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency.env_switch import switched_off
from ..common import ShapeMemo, scratch
from ..lib import gemm_cols
from ..lib.jit import ENV_JIT
from .conv_common import ConvNode, into_out, raw_call_operands, raw_geometry, store_flags
from .conv_direct import _numpy_act

__all__ = ["DIRECT", "GRID", "GROUP_BYTES", "IM2COL", "raw_cols_fn"]

#: A group of images takes at most this much scratch (its padded copy and its extended
#: output or im2col columns; one image at least): fewer, longer kernel calls hand the GIL
#: over less often to a warm-up thread that takes it every time.
GROUP_BYTES = 16 << 20

DIRECT, GRID, IM2COL = 0, 1, 2


class _Plan(NamedTuple):
    """How one input shape runs (immutable)."""

    mode: int
    out_shape: tuple[int, int, int, int]
    k: int  # the kernel's K (a tap's)
    kernel: tuple[int, int]  # (KH, KW)
    toff: np.ndarray  # int64 tap offsets (GRID: into a padded plane; else [0])
    ldc: int  # GRID: a padded plane's floats (zero tail included); IM2COL: 0
    pad: tuple[int, int, int, int]  # (top, left, padded rows, padded row width)
    strides: tuple[int, ...]  # IM2COL: the im2col view's (KH, KW, OH, OW) strides, bytes


def _plan(shape: tuple[int, ...], w4: tuple[int, ...], sp: Any) -> _Plan | None:
    """The plan of ``shape`` (N, C, H, W) for weights of shape ``w4``; None where it is not
    one this route serves (rank, channels, negative pads, an empty output, no channels or
    no filters: the kernel divides by its K and walks M)."""
    geo = raw_geometry(shape, w4, sp)
    if geo is None:
        return None
    kernel, strides, dil, begin, end, out_sp = geo
    n, c, h, w = shape
    oh, ow = out_sp
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dil
    hp, wp = h + begin[0] + end[0], w + begin[1] + end[1]
    out_shape = (n, w4[0], oh, ow)
    pad = (begin[0], begin[1], hp, wp)
    zero = np.zeros(1, np.int64)
    unit = (sh, sw) == (1, 1)
    if unit and (kh, kw) == (1, 1) and not any((*begin, *end)):
        return _Plan(DIRECT, out_shape, c, (1, 1), zero, 0, pad, ())
    if unit:
        toff = np.array([i * dh * wp + j * dw for i in range(kh) for j in range(kw)], np.int64)
        return _Plan(GRID, out_shape, c, (kh, kw), toff, hp * wp + (kw - 1) * dw, pad, ())
    k = c * kh * kw
    strides4 = tuple(4 * s for s in (dh * wp, dw, sh * wp, sw))
    return _Plan(IM2COL, out_shape, k, (kh, kw), zero, 0, pad, strides4)


def raw_cols_fn(node: ConvNode) -> Callable[..., np.ndarray | None] | None:
    """``fn(x, b, r, out)``: a float32 one-group 2-D conv with constant weights and its
    epilogue on ``gemm_cols``'s ctypes build once something in this process built it
    (``gemm_cols.raw()``: a cold start's warm-up, early, for its NumPy stand-ins); None
    where the conv is not one this route serves, or ``$TFRT_PY_JIT`` is ``0``. ``fn``
    returns None before the kernel is built and for inputs it does not serve (another
    dtype or channel count, a residual of another shape, a bias of another length); the
    caller then takes NumPy's path. Notes the conv (``gemm_cols.WANTED``). Any thread."""
    sp, group, w_const, b_c, cdt, epi = node
    if (w_const is None or w_const.ndim != 4 or cdt != np.float32 or group != 1
            or switched_off(ENV_JIT)):  # fmt: skip
        return None
    m = int(w_const.shape[0])
    w4 = tuple(int(d) for d in w_const.shape)
    w_plain = np.ascontiguousarray(w_const.reshape(m, -1), dtype=np.float32)
    taps_first: list[np.ndarray] = []  # GRID's layout, made at its first call
    act_flag, lohi = store_flags(epi, gemm_cols.FLAG_RELU, gemm_cols.FLAG_CLIP)
    zeros = np.zeros(m, np.float32)
    plans: ShapeMemo[tuple[int, ...], Any] = ShapeMemo()
    gemm_cols.WANTED.set()

    def weights_taps_first() -> np.ndarray:
        if not taps_first:
            taps_first.append(np.ascontiguousarray(
                w_const.transpose(0, 2, 3, 1).reshape(m, -1), dtype=np.float32))  # fmt: skip
        return taps_first[0]

    def raw_cols(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        raw = gemm_cols.raw()
        if raw is None or x.dtype != np.float32:
            return None
        plan = plans.decided(x.shape, _plan, x.shape, w4, sp)
        if plan is None:
            return None
        got = raw_call_operands(x, b, r, out, plan.out_shape, b_c, cdt, m)
        if got is None:
            return None
        ops, bb = got
        a = weights_taps_first() if plan.mode == GRID else w_plain
        bias = zeros if bb is None else bb
        fused = _run(raw, plan, ops.x, a, ops.y, bias, bb is not None, ops.r, act_flag, lohi)
        if epi.act and not (fused and act_flag):
            _numpy_act(ops.y, epi)
        return into_out(ops.y, out)

    return raw_cols


def _run(raw: gemm_cols.Raw, plan: _Plan, x: np.ndarray, a: np.ndarray, y: np.ndarray,
         bias: np.ndarray, has_bias: bool, res: np.ndarray | None, act_flag: int,
         lohi: np.ndarray) -> bool:  # fmt: skip
    """``y`` = the conv of ``plan`` of ``x`` by ``a`` (its layout for the plan's mode) with
    the bias, the residual ``res`` and (where returned True) the activation of
    ``act_flag``; all float32 and C-contiguous. Images in groups of ``_group``: one
    kernel call (``raw.images``) and at most three NumPy copies a group, each of which
    hands the GIL over (a busy warm-up thread takes it every time). Scratch slots 0, 1."""
    n, m, oh, ow = plan.out_shape
    _, c, h, w = x.shape
    plane_x, plane_y = h * w, oh * ow
    f32 = np.dtype(np.float32)
    images, nr = raw.images, raw.nr
    flags = gemm_cols.FLAG_BIAS if has_bias else 0
    aa, ba, la, ta = a.ctypes.data, bias.ctypes.data, lohi.ctypes.data, plan.toff.ctypes.data
    lda, taps, k = a.shape[1], plan.toff.shape[0], plan.k
    pt, pl, hp, wp = plan.pad
    y_step = m * plane_y

    def call(cp: int, ldc: int, yp: int, ldy: int, npx: int, rp: int, kflags: int, count: int,
             c_step: int, y_step: int) -> None:  # fmt: skip
        if images(aa, lda, cp, ldc, taps, ta, yp, ldy, m, k, npx, ba, rp, ldy, la, kflags, nr,
                  count, c_step, y_step, y_step):  # fmt: skip
            raise ValueError("gemm_cols: a panel width other than this process's kernel's")

    if plan.mode == DIRECT:
        flags |= act_flag | (0 if res is None else gemm_cols.FLAG_RESIDUAL)
        rp = y.ctypes.data if res is None else res.ctypes.data
        call(x.ctypes.data, plane_x, y.ctypes.data, plane_y, plane_y, rp, flags, n,
             c * plane_x, y_step)  # fmt: skip
        return True
    if plan.mode == GRID:
        ldc, n_ext = plan.ldc, oh * wp
        g = _group(n, c * ldc + m * n_ext)
        xp = scratch(0, (g, c, ldc), f32)
        xp.fill(0)  # the pads; each group writes the interior only
        inner = xp[:, :, : hp * wp].reshape(g, c, hp, wp)[:, :, pt : pt + h, pl : pl + w]
        ext = scratch(1, (g, m, n_ext), f32)
        crop = ext.reshape(g, m, oh, wp)[:, :, :, :ow]
        fused = res is None
        kflags = flags | (act_flag if fused else 0)
        for i in range(0, n, g):
            j = min(n, i + g)
            np.copyto(inner[: j - i], x[i:j])
            call(xp.ctypes.data, ldc, ext.ctypes.data, n_ext, n_ext, ext.ctypes.data, kflags,
                 j - i, c * ldc, m * n_ext)  # fmt: skip
            if res is None:
                np.copyto(y[i:j], crop[: j - i])
            else:
                np.add(crop[: j - i], res[i:j], out=y[i:j])
        return fused
    flags |= act_flag | (0 if res is None else gemm_cols.FLAG_RESIDUAL)
    padded = any((pt, pl, hp - h - pt, wp - w - pl))
    g = _group(n, k * plane_y + (c * hp * wp if padded else 0))
    if padded:
        xp = scratch(0, (g, c, hp, wp), f32)
        xp.fill(0)
    cols = scratch(1, (g, k, plane_y), f32)
    st = plan.strides
    shape = (c, *plan.kernel, oh, ow)
    for i in range(0, n, g):
        j = min(n, i + g)
        if padded:
            np.copyto(xp[: j - i, :, pt : pt + h, pl : pl + w], x[i:j])
            src = xp
        else:
            src = x[i:]
        view = np.ndarray((j - i, *shape), f32, src, 0, (c * hp * wp * 4, hp * wp * 4, *st))
        np.copyto(cols[: j - i].reshape(j - i, *shape), view)
        at = i * y_step * 4
        rp = y.ctypes.data + at if res is None else res.ctypes.data + at
        call(cols.ctypes.data, plane_y, y.ctypes.data + at, plane_y, plane_y, rp, flags, j - i,
             k * plane_y, y_step)  # fmt: skip
    return True


def _group(n: int, floats: int) -> int:
    """Images a group of ``n`` takes when one needs ``floats`` floats of scratch: as many
    as ``GROUP_BYTES`` hold, at least one."""
    return max(1, min(n, GROUP_BYTES // max(1, 4 * floats)))
