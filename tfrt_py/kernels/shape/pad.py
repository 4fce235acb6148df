"""Kernels (shape): Pad and CenterCropPad.

Pad writes straight into its output (``out=`` supported): the kept region of the input is
copied once and the borders are filled by slicing, axis after axis (as ``np.pad`` does, but
without its per-call overhead). Negative pads crop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import OUT, ComputeFn, KernelContext
from ..common import const_ints, input_rank, to_ints
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

_MODES = {"constant", "reflect", "edge", "wrap"}


def _per_dim(
    ndim: int, pads: tuple[int, ...], axes: tuple[int, ...] | None
) -> tuple[list[int], list[int]]:
    """(begins, ends) per dim from ONNX ``pads`` = [x1_begin, x2_begin, ..., x1_end, ...]."""
    if axes is None:
        if len(pads) != 2 * ndim:
            raise ValueError(f"Pad: {len(pads)} pads for rank {ndim}")
        return list(pads[:ndim]), list(pads[ndim:])
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValueError(f"Pad: {len(pads)} pads for {k} axes")
    b = [0] * ndim
    e = [0] * ndim
    for j, a in enumerate(axes):
        a = a + ndim if a < 0 else a
        b[a] = pads[j]
        e[a] = pads[k + j]
    return b, e


def _axis(i: int, s: slice) -> tuple[slice, ...]:
    return (*(slice(None),) * i, s)


def _fill_borders(out: np.ndarray, i: int, pb: int, n: int, pe: int, mode: str) -> bool:
    """Fill out's pads along axis ``i`` from its centre ``pb:pb+n``; False when the pads are
    too wide for a single reflection/wrap (the caller then falls back to ``np.pad``)."""
    if mode == "edge":
        if n == 0:
            return False
        if pb:
            out[_axis(i, slice(0, pb))] = out[_axis(i, slice(pb, pb + 1))]
        if pe:
            out[_axis(i, slice(pb + n, None))] = out[_axis(i, slice(pb + n - 1, pb + n))]
        return True
    if mode == "reflect":
        if pb > n - 1 or pe > n - 1:
            return False
        if pb:
            out[_axis(i, slice(0, pb))] = out[_axis(i, slice(2 * pb, pb, -1))]
        if pe:
            stop = pb + n - 2 - pe
            src = slice(pb + n - 2, None if stop < 0 else stop, -1)
            out[_axis(i, slice(pb + n, pb + n + pe))] = out[_axis(i, src)]
        return True
    # wrap
    if pb > n or pe > n:
        return False
    if pb:
        out[_axis(i, slice(0, pb))] = out[_axis(i, slice(n, pb + n))]
    if pe:
        out[_axis(i, slice(pb + n, pb + n + pe))] = out[_axis(i, slice(pb, pb + pe))]
    return True


def pad_array(
    x: np.ndarray,
    begins: list[int],
    ends: list[int],
    mode: str,
    value: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Pad (or crop, for negative pads) ``x`` per ONNX Pad; writes into ``out`` if given."""
    src: list[slice] = []
    dst: list[slice] = []
    oshape: list[int] = []
    centre: list[tuple[int, int, int]] = []
    for d, bb, ee in zip(x.shape, begins, ends):
        s0 = -bb if bb < 0 else 0
        s1 = d + ee if ee < 0 else d
        n = max(s1 - s0, 0)
        pb = bb if bb > 0 else 0
        pe = ee if ee > 0 else 0
        oshape.append(pb + n + pe)
        src.append(slice(s0, s0 + n))
        dst.append(slice(pb, pb + n))
        centre.append((pb, n, pe))
    if out is None:
        if mode != "constant":
            out = np.empty(oshape, x.dtype)
        elif value is None or (not value and x.dtype != object):
            out = np.zeros(oshape, x.dtype)
        else:
            out = np.full(oshape, value, x.dtype)
    elif mode == "constant":
        out.fill(0 if value is None else value)
    out[tuple(dst)] = x[tuple(src)]
    if mode != "constant":
        for i, (pb, n, pe) in enumerate(centre):
            if (pb or pe) and not _fill_borders(out, i, pb, n, pe, mode):
                widths = [(c[0], c[2]) for c in centre]
                out[...] = np.pad(x[tuple(src)], widths, mode=mode)  # type: ignore[call-overload]
                break
    return out


def _pad(ctx: KernelContext) -> ComputeFn:
    """Pad(data[, pads, constant_value, axes]) -> new padded array (``out=`` supported).

    ``mode``: constant (default), reflect, edge, wrap (19+). Pads are the ``paddings``
    attribute at opset 1, ``pads`` at 2-10, an input from 11 (``axes`` input from 18); the
    constant is the ``value`` attribute before 11, the optional ``constant_value`` input
    from 11. Constant pads/axes are read at load.
    """
    mode = ctx.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in _MODES:
        raise ctx.unsupported(f"mode {mode!r}")
    rank = input_rank(ctx)
    if ctx.opset < 11:
        pads = to_ints(ctx.attr("paddings" if ctx.opset < 2 else "pads"))
        value = float(ctx.attr("value", 0.0))
        rank = len(pads) // 2
        begins, ends = _per_dim(rank, pads, None)

        def pad_attr(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            return pad_array(x, begins, ends, mode, value, out)

        return pad_attr

    const_pads = const_ints(ctx, 1)
    has_axes = ctx.opset >= 18 and ctx.has_input(3)
    const_axes = const_ints(ctx, 3) if has_axes else None
    cv = ctx.const_input(2)
    const_value = None if cv is None else cv.reshape(-1)[0]
    fixed: tuple[list[int], list[int]] | None = None
    if const_pads is not None and (not has_axes or const_axes is not None):
        if const_axes is None:
            rank = len(const_pads) // 2
        if rank is not None:
            fixed = _per_dim(rank, const_pads, const_axes)

    def pad(
        x: np.ndarray,
        pads: np.ndarray,
        constant_value: np.ndarray | None = None,
        axes: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        if fixed is not None:
            b, e = fixed
        else:
            p = const_pads if const_pads is not None else to_ints(pads)
            a = const_axes if const_axes is not None else None
            if a is None and axes is not None:
                a = to_ints(axes)
            b, e = _per_dim(x.ndim, p, a)
        v = const_value
        if v is None and constant_value is not None and constant_value.size:
            v = constant_value.reshape(-1)[0]
        return pad_array(x, b, e, mode, v, out)

    return pad


def _center_crop_pad(ctx: KernelContext) -> ComputeFn:
    """CenterCropPad(x, shape) -> new array: each listed axis (``axes``, default all) is
    centre-cropped (window start rounded down) or zero-padded (extra pixel on the right) to
    ``shape``."""
    a = ctx.attr("axes", None)
    axes = None if a is None else to_ints(a)
    const = const_ints(ctx, 1)

    def center_crop_pad(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        tgt = const if const is not None else to_ints(shape)
        nd = x.ndim
        ax = range(nd) if axes is None else [v + nd if v < 0 else v for v in axes]
        if len(tgt) != len(ax):
            raise ValueError(f"CenterCropPad: {len(tgt)} sizes for {len(ax)} axes")
        src = [slice(None)] * nd
        dst = [slice(None)] * nd
        oshape = list(x.shape)
        for i, t in zip(ax, tgt):
            d = x.shape[i]
            oshape[i] = t
            if t < d:
                s = (d - t) // 2
                src[i] = slice(s, s + t)
            elif t > d:
                s = (t - d) // 2
                dst[i] = slice(s, s + d)
        out = np.zeros(oshape, x.dtype)
        out[tuple(dst)] = x[tuple(src)]
        return out

    return center_crop_pad


def register_kernels(registry: KernelRegistry) -> None:
    """Register Pad and CenterCropPad."""
    registry.add("Pad", _pad, since=1, flags=OUT)
    registry.add("CenterCropPad", _center_crop_pad, since=18)
