"""Resize planning: per-axis sampling tables, computed once per input shape.

Resize is separable: each resized axis maps output index ``j`` to a source coordinate
``x_ori(j)`` (``coordinate_transformation_mode``) and takes either the nearest source
element (``nearest_mode``) or a weighted sum of ``n`` neighbours (linear: 2 taps, cubic: 4;
with ``antialias`` when downsampling the kernel is stretched by 1/scale and renormalized).
Out-of-range neighbours are clamped to the edge (or dropped and the weights renormalized,
``exclude_outside``). ``tf_crop_and_resize`` marks source coordinates outside the input as
extrapolated (they get ``extrapolation_value``).

For interpolating modes an axis's taps become a dense [out, in] weight matrix, so applying
the axis is one matrix product; nearest becomes an index vector. The semantics follow the
ONNX reference implementation (onnx/reference/ops/op_resize.py) and spec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...records import record

__all__ = ["AxisPlan", "Params", "output_geometry", "plan_axis"]


@record(frozen=True, slots=True)
class Params:
    """A Resize node's attributes, resolved at load."""

    mode: str  # nearest | linear | cubic
    ctm: str  # coordinate_transformation_mode
    nearest_mode: str  # round_prefer_floor | round_prefer_ceil | floor | ceil | simple
    cubic_a: float
    exclude_outside: bool
    extrapolation_value: float
    antialias: bool
    policy: str  # keep_aspect_ratio_policy
    axes: tuple[int, ...] | None


@record(frozen=True, slots=True)
class AxisPlan:
    """How one axis is resampled: ``index`` [out] (nearest) or ``taps`` (indices [out, n]
    clamped to the input, weights [out, n]) for interpolation; and the output positions to
    set to the extrapolation value (their weights are zero)."""

    axis: int
    in_len: int
    out_len: int
    index: np.ndarray | None
    taps: tuple[np.ndarray, np.ndarray] | None
    extrapolated: np.ndarray | None

    def dense(self) -> np.ndarray:
        """The taps as a dense [out, in] float64 weight matrix."""
        assert self.taps is not None
        idx, w = self.taps
        m = np.zeros((self.out_len, self.in_len), dtype=np.float64)
        rows = np.broadcast_to(np.arange(self.out_len)[:, None], idx.shape)
        np.add.at(m, (rows, idx), w)
        return m


def output_geometry(
    shape: Sequence[int],
    scales: Sequence[float] | None,
    sizes: Sequence[int] | None,
    axes: Sequence[int],
    policy: str,
) -> tuple[list[float], list[int]]:
    """Per-axis (scale, output length) for an input of ``shape``.

    ``scales``/``sizes`` are given for ``axes`` only (the other axes keep scale 1).
    """
    r = len(shape)
    scale: list[float] = [1.0] * r
    out = list(shape)
    if sizes is not None:
        for a, s in zip(axes, sizes):
            out[a] = int(s)
            scale[a] = int(s) / shape[a] if shape[a] else 1.0
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            sc = pick(scale[a] for a in axes)
            for a in axes:
                scale[a] = sc
                out[a] = int(sc * shape[a] + 0.5)
    elif scales is not None:
        for a, f in zip(axes, scales):
            scale[a] = float(f)
            out[a] = math.floor(float(f) * shape[a])
    return scale, out


def _source_coords(
    ctm: str, in_len: int, out_len: int, scale: float, roi: tuple[Any, Any] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """x_ori for every output index, and the extrapolated mask (tf_crop_and_resize)."""
    y = np.arange(out_len, dtype=np.float64)
    out_w = scale * in_len  # the real-valued output length, as the spec's formulas use it
    extrapolated = None
    if ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "align_corners":
        x = np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adjustment = out_len / out_w
        offset = in_len / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    elif ctm == "tf_crop_and_resize":
        # roi arithmetic in roi's own dtype, as the reference (knife-edge nearest cases)
        r0, r1 = roi if roi is not None else (np.float32(0), np.float32(1))
        span, start = float(r1 - r0), float(r0 * (in_len - 1))
        if out_w == 1:
            x = np.full(out_len, span * (in_len - 1) / 2)
        else:
            x = y * span * (in_len - 1) / (out_w - 1)
        x = x + start
        extrapolated = (x < 0) | (x > in_len - 1)
        if not extrapolated.any():
            extrapolated = None
    else:
        raise ValueError(f"coordinate_transformation_mode={ctm!r}")
    return x, extrapolated


def _nearest(x: np.ndarray, mode: str, scale: float, in_len: int) -> np.ndarray:
    if mode == "round_prefer_floor":
        i = np.ceil(x - 0.5)
    elif mode == "round_prefer_ceil":
        i = np.floor(x + 0.5)
    elif mode == "floor":
        i = np.floor(x)
    elif mode == "ceil":
        i = np.ceil(x)
    elif mode == "simple":  # Resize-10 / Upsample: floor when upsampling, ceil when down
        i = np.floor(x) if scale >= 1 else np.ceil(x)
    else:
        raise ValueError(f"nearest_mode={mode!r}")
    return np.clip(i, 0, in_len - 1).astype(np.intp)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    t2, t3 = t * t, t * t * t
    near = (a + 2) * t3 - (a + 3) * t2 + 1
    far = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _taps(x: np.ndarray, p: Params, scale: float, in_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(source indices [out, n] clamped to the input, weights [out, n]) for linear/cubic."""
    base = np.floor(x)
    ratio = x - base
    exact = ratio == 0
    ratio[exact] = 1.0  # prefer the left neighbour at exact positions, as the reference
    base[exact] -= 1
    s = min(scale, 1.0) if p.antialias else 1.0
    support = 1.0 if p.mode == "linear" else 2.0
    start = int(math.floor(-support / s) + 1)  # first tap offset from ``base``
    n = 2 - 2 * start
    offs = np.arange(start, start + n, dtype=np.float64)
    t = (offs[None, :] - ratio[:, None]) * s
    if p.mode == "linear":
        w = np.clip(1 - np.abs(t), 0, 1)
    else:
        w = _cubic(t, p.cubic_a)
    if p.antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = base.astype(np.int64)[:, None] + np.arange(start, start + n)[None, :]
    if p.exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return np.clip(idx, 0, in_len - 1), w


def plan_axis(
    p: Params,
    axis: int,
    in_len: int,
    out_len: int,
    scale: float,
    roi: tuple[Any, Any] | None,
) -> AxisPlan | None:
    """The sampling plan of one axis, or None when the axis is left unchanged."""
    if (
        out_len == in_len
        and math.isclose(scale, 1.0)
        and (roi is None or (math.isclose(float(roi[0]), 0.0) and math.isclose(float(roi[1]), 1.0)))
    ):
        return None
    if out_len == 0 or in_len == 0:
        return AxisPlan(axis, in_len, out_len, np.zeros(out_len, np.intp), None, None)
    x, extrap = _source_coords(p.ctm, in_len, out_len, scale, roi)
    if p.mode == "nearest":
        index = _nearest(x, p.nearest_mode, scale, in_len)
        return AxisPlan(axis, in_len, out_len, index, None, extrap)
    idx, w = _taps(x, p, scale, in_len)
    if extrap is not None:
        w[extrap] = 0.0
    return AxisPlan(axis, in_len, out_len, None, (idx.astype(np.intp), w), extrap)
