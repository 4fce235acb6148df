"""Kernels (image): NonMaxSuppression, RoiAlign, GridSample, AffineGrid.

* NonMaxSuppression-10/11: greedy per (batch, class), scores sorted descending (ties: lower
  box index first), a candidate is dropped when its IoU with a kept box is ``> iou_threshold``;
  ``score_threshold`` keeps scores strictly above it. Corner boxes may be flipped.
* RoiAlign-10/16/22: bilinear sampling on a ``sampling_ratio`` grid per bin (adaptive when 0),
  ``avg`` (separable: two small matmuls per ROI) or ``max``; ``half_pixel`` (default from
  opset 16) or ``output_half_pixel`` coordinates.
* GridSample-16/20/22: N-D (4-D before opset 20), ``linear``/``nearest``/``cubic`` (opset 16
  names ``bilinear``/``bicubic`` accepted), ``zeros``/``border``/``reflection`` padding,
  nearest rounds half to even; computed as a weighted sum of gathered taps. For ``cubic``
  the padding applies to each tap (as in torch and onnxruntime), not to the coordinate.
* AffineGrid-20: ``theta @ [x, y, (z,) 1]`` over the normalized base grid.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry
from .nms_jit import MAX_BOXES, cell_size, nms_greedy
from .nms_numpy import greedy_pairs, greedy_sweep
from .roi_align_jit import MAX_GRID, roi_align_avg, roi_align_par

__all__ = ["register_kernels"]


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


#: RoiAlign splits its ROIs over the native threads from two parts of this many ROIs.
ROIS_PER_PART = 8

# -- NonMaxSuppression ------------------------------------------------------------------


def _non_max_suppression(ctx: KernelContext) -> ComputeFn:
    """NonMaxSuppression-10: ``(boxes [B, N, 4], scores [B, C, N], max_output_boxes_per_class?,
    iou_threshold?, score_threshold?) -> selected_indices int64 [K, 3]``."""
    center = int(ctx.attr("center_point_box", 0))
    jit = nms_greedy()

    def non_max_suppression(
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: np.ndarray | None = None,
        iou_threshold: np.ndarray | None = None,
        score_threshold: np.ndarray | None = None,
    ) -> np.ndarray:
        max_out = 0
        if max_output_boxes_per_class is not None and max_output_boxes_per_class.size:
            max_out = max(int(max_output_boxes_per_class.reshape(-1)[0]), 0)
        iou_thr = 0.0
        if iou_threshold is not None and iou_threshold.size:
            iou_thr = float(iou_threshold.reshape(-1)[0])
        score_thr = None
        if score_threshold is not None and score_threshold.size:
            score_thr = float(score_threshold.reshape(-1)[0])
        if max_out == 0:
            return np.empty((0, 3), dtype=np.int64)
        b = boxes.astype(np.float64)
        if center:
            cx, cy, hw, hh = b[..., 0], b[..., 1], b[..., 2] / 2, b[..., 3] / 2
            x0, x1, y0, y1 = cx - hw, cx + hw, cy - hh, cy + hh
        else:
            x0 = np.minimum(b[..., 1], b[..., 3])
            x1 = np.maximum(b[..., 1], b[..., 3])
            y0 = np.minimum(b[..., 0], b[..., 2])
            y1 = np.maximum(b[..., 0], b[..., 2])
        area = (x1 - x0) * (y1 - y0)
        parts: list[np.ndarray] = []
        for bi in range(scores.shape[0]):
            box = (x0[bi], y0[bi], x1[bi], y1[bi], area[bi])
            finite = all(bool(np.isfinite(v).all()) for v in (x0[bi], y0[bi], area[bi]))
            fast = jit if jit is not None and finite else None  # the grid needs finite cells
            for ci in range(scores.shape[1]):
                sc = scores[bi, ci]
                cand = (
                    np.arange(sc.shape[0]) if score_thr is None else np.flatnonzero(sc > score_thr)
                )
                if cand.size == 0:
                    continue
                order = cand[np.lexsort((cand, -sc[cand].astype(np.float64)))]
                ordered = tuple(np.ascontiguousarray(v[order]) for v in box)
                if fast is not None and order.size <= MAX_BOXES:
                    keep = np.empty(order.size, np.int64)
                    cw, ch = cell_size(ordered[0], ordered[2]), cell_size(ordered[1], ordered[3])
                    origin = (float(ordered[0].min()), float(ordered[1].min()))
                    n = fast(*ordered, iou_thr, min(max_out, order.size), cw, ch, *origin, keep)
                    kept = order[keep[:n]]
                else:
                    pos = greedy_pairs(ordered, iou_thr, max_out) if finite else None
                    kept = order[greedy_sweep(ordered, iou_thr, max_out) if pos is None else pos]
                part = np.empty((kept.size, 3), np.int64)
                part[:, 0], part[:, 1], part[:, 2] = bi, ci, kept
                parts.append(part)
        return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)

    return non_max_suppression


# -- RoiAlign ---------------------------------------------------------------------------


def _bilinear_taps(
    start: float, bin_size: float, pooled: int, grid: int, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample (pooled*grid): low index, high index, low weight, high weight, valid."""
    p = np.repeat(np.arange(pooled), grid)
    g = np.tile(np.arange(grid), pooled)
    c = start + p * bin_size + (g + 0.5) * bin_size / grid
    valid = (c >= -1.0) & (c <= size)
    c = np.maximum(c, 0.0)
    lo = c.astype(np.int64)
    top = lo >= size - 1
    lo = np.where(top, size - 1, lo)
    hi = np.where(top, size - 1, lo + 1)
    c = np.where(top, lo, c)
    frac = c - lo
    return lo, hi, (1.0 - frac) * valid, frac * valid, valid


def _roi_align(ctx: KernelContext) -> ComputeFn:
    """RoiAlign-10/16/22: ``(X [N, C, H, W], rois [R, 4], batch_indices [R]) ->
    Y [R, C, output_height, output_width]``."""
    default_mode = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    half_pixel = _str(ctx.attr("coordinate_transformation_mode", default_mode)) == "half_pixel"
    mode = _str(ctx.attr("mode", "avg")).lower()
    if mode not in ("avg", "max"):
        raise ctx.unsupported(f"mode {mode!r}")
    ph_n = int(ctx.attr("output_height", 1))
    pw_n = int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    offset = 0.5 if half_pixel else 0.0
    jit = roi_align_avg() if mode == "avg" else None

    def roi_align(X: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray) -> np.ndarray:
        n_rois = rois.shape[0]
        C, H, W = X.shape[1], X.shape[2], X.shape[3]
        Y = np.empty((n_rois, C, ph_n, pw_n), dtype=X.dtype)
        r64 = rois.astype(np.float64)
        if jit is not None and _compiled_roi_align(jit, X, r64, batch_indices, Y):
            return Y
        cdt = np.float64 if X.dtype == np.float64 else np.float32
        for n in range(n_rois):
            x0, y0, x1, y1 = (r64[n] * scale - offset).tolist()
            rw, rh = x1 - x0, y1 - y0
            if not half_pixel:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            bh, bw = rh / ph_n, rw / pw_n
            gh = ratio if ratio > 0 else int(np.ceil(rh / ph_n))
            gw = ratio if ratio > 0 else int(np.ceil(rw / pw_n))
            count = max(gh * gw, 1)
            ylo, yhi, wyl, wyh, _ = _bilinear_taps(y0, bh, ph_n, gh, H)
            xlo, xhi, wxl, wxh, _ = _bilinear_taps(x0, bw, pw_n, gw, W)
            img = X[int(batch_indices[n])]
            if mode == "avg":
                ay = np.zeros((ph_n, H))
                rows = np.repeat(np.arange(ph_n), gh)
                np.add.at(ay, (rows, ylo), wyl)
                np.add.at(ay, (rows, yhi), wyh)
                ax = np.zeros((pw_n, W))
                cols = np.repeat(np.arange(pw_n), gw)
                np.add.at(ax, (cols, xlo), wxl)
                np.add.at(ax, (cols, xhi), wxh)
                ay = (ay / count).astype(cdt)
                Y[n] = ay @ img.astype(cdt, copy=False) @ ax.T.astype(cdt)
            else:
                v = None
                for yi, wy in ((ylo, wyl), (yhi, wyh)):
                    for xi, wx in ((xlo, wxl), (xhi, wxh)):
                        t = img[:, yi[:, None], xi[None, :]] * (wy[:, None] * wx[None, :])
                        v = t if v is None else np.maximum(v, t)
                assert v is not None
                Y[n] = v.reshape(C, ph_n, gh, pw_n, gw).max(axis=(2, 4))
        return Y

    def _compiled_roi_align(
        fn: Any, X: np.ndarray, r64: np.ndarray, bi: np.ndarray, Y: np.ndarray
    ) -> bool:
        """Fill ``Y`` by ``roi_align_jit`` when it takes the call: float maps, finite ROIs
        in range of the batch, sample grids within ``MAX_GRID``, and a map whose
        channels-last copy costs less than the sampling (else False, Y untouched)."""
        if X.dtype not in (np.float32, np.float64) or not r64.size or 0 in X.shape:
            return False
        if not np.isfinite(r64).all() or bi.min() < 0 or bi.max() >= X.shape[0]:
            return False
        ext = np.abs(r64[:, 2:] - r64[:, :2]) * scale
        grid = np.full(ext.shape, float(ratio)) if ratio > 0 else np.ceil(ext / (pw_n, ph_n))
        if grid.max() > MAX_GRID:
            return False
        samples = float(np.maximum(grid, 1.0).prod(axis=1).sum()) * ph_n * pw_n * 4
        if X[0].size * X.shape[0] > samples * X.shape[1]:
            return False  # a big map, few samples: the per-ROI products read only the ROI
        xt = np.ascontiguousarray(X.transpose(0, 2, 3, 1))
        args = (xt, r64, bi.astype(np.int64), scale, offset, half_pixel, ratio, Y)
        par = roi_align_par() if len(r64) >= 2 * ROIS_PER_PART else None
        threads = intra_pool().threads
        if par is not None and threads > 1:
            parts = min(2 * native_threads.enter(threads), len(r64) // ROIS_PER_PART)
            par(*args, native_threads.edges(len(r64), parts))
        else:
            fn(*args)
        return True

    return roi_align


# -- GridSample -------------------------------------------------------------------------


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates into [lo, hi] by the nearest border, repeatedly."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below = lo - x
    nb = np.floor(below / rng)
    rb = below - nb * rng
    above = x - hi
    na = np.floor(above / rng)
    ra = above - na * rng
    out = np.where(x < lo, np.where(nb % 2 == 0, lo + rb, hi - rb), x)
    return np.where(x > hi, np.where(na % 2 == 0, hi - ra, lo + ra), out)


def _cubic_coeffs(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    t1, t2 = t + 1, 1 - t
    return [
        ((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


_Taps = tuple[list[np.ndarray], list[np.ndarray | None]]


def _grid_taps(mode: str, padding: str, align: bool) -> Callable[[np.ndarray, int], _Taps]:
    """GridSample's ``taps(x, size) -> (indices, weights)`` for one dim: integer tap indices
    (clamped, safe to gather) and their weights (None: weight 1) under ``mode`` and
    ``padding``."""

    def taps(x: np.ndarray, size: int) -> _Taps:
        lo_b, hi_b = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            idx = [x.astype(np.int64)]
            weights: list[np.ndarray | None] = [None]
        else:
            x0 = np.floor(x)
            t = x - x0
            base = x0.astype(np.int64)
            if mode == "linear":
                idx = [base, base + 1]
                weights = [1 - t, t]
            else:
                idx = [base - 1, base, base + 1, base + 2]
                weights = list(_cubic_coeffs(t))
        out_idx = []
        for k, i in enumerate(idx):
            if padding == "zeros":
                ok = (i >= 0) & (i < size)
                w = weights[k]
                weights[k] = ok.astype(x.dtype) if w is None else w * ok
                out_idx.append(np.clip(i, 0, size - 1))
            elif padding == "border":
                out_idx.append(np.clip(i, 0, size - 1))
            else:
                r = _reflect(i.astype(np.float64), lo_b, hi_b).astype(np.int64)
                out_idx.append(np.clip(r, 0, size - 1))
        return out_idx, weights

    return taps


def _grid_sample(ctx: KernelContext) -> ComputeFn:
    """GridSample-16/20/22: ``(X [N, C, *D], grid [N, *O, nd]) -> Y [N, C, *O]``."""
    mode = _str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = _str(ctx.attr("padding_mode", "zeros"))
    align = bool(ctx.attr("align_corners", 0))
    if mode not in ("linear", "nearest", "cubic"):
        raise ctx.unsupported(f"mode {mode!r}")
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"padding_mode {padding!r}")

    taps = _grid_taps(mode, padding, align)

    def grid_sample(X: np.ndarray, grid: np.ndarray) -> np.ndarray:
        N, C = X.shape[0], X.shape[1]
        dims = X.shape[2:]
        nd = len(dims)
        out_sp = grid.shape[1:-1]
        Y = np.empty((N, C, *out_sp), dtype=X.dtype)
        g = grid.reshape(N, -1, nd)[:, :, ::-1]
        gdt = g.dtype if g.dtype.kind == "f" else np.dtype(np.float32)
        for n in range(N):
            per_dim = []
            for d, size in enumerate(dims):
                v = g[n, :, d].astype(gdt)
                if align:
                    x = (v + 1) / 2.0 * (size - 1)
                else:
                    x = ((v + 1) * size - 1) / 2.0
                x = x.astype(gdt, copy=False)
                if mode == "nearest":
                    x = np.rint(x)
                lo_b, hi_b = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
                if mode == "cubic":
                    pass  # as torch: padding applies to each of the 4 taps, not to x
                elif padding == "border":
                    x = np.where((x < lo_b) | (x > hi_b), np.clip(x, 0, size - 1), x)
                elif padding == "reflection":
                    x = _reflect(x.astype(np.float64), lo_b, hi_b).astype(gdt)
                per_dim.append(taps(x, size))
            img = X[n]
            acc = np.zeros((C, g.shape[1]), dtype=np.float64)
            for combo in itertools.product(*[range(len(p[0])) for p in per_dim]):
                index = tuple(per_dim[d][0][k] for d, k in enumerate(combo))
                w = None
                for d, k in enumerate(combo):
                    wk = per_dim[d][1][k]
                    if wk is not None:
                        w = wk if w is None else w * wk
                vals = img[(slice(None), *index)]
                acc += vals if w is None else vals * w
            Y[n] = acc.reshape(C, *out_sp)
        return Y

    return grid_sample


# -- AffineGrid -------------------------------------------------------------------------


def _affine_grid(ctx: KernelContext) -> ComputeFn:
    """AffineGrid-20: ``(theta [N, nd, nd+1], size [N, C, *D]) -> grid [N, *D, nd]``."""
    align = bool(ctx.attr("align_corners", 0))

    def axis(length: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, length) if length > 1 else np.full(length, -1.0)
        return (2.0 * np.arange(length) + 1.0) / length - 1.0

    def affine_grid(theta: np.ndarray, size: np.ndarray) -> np.ndarray:
        spatial = [int(s) for s in size.reshape(-1)[2:]]
        nd = len(spatial)
        # Homogeneous base grid, coordinates ordered (x, y[, z], 1): x follows the last dim.
        mesh = np.meshgrid(*[axis(s) for s in spatial], indexing="ij")
        base = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1).reshape(-1, nd + 1)
        out = np.matmul(base, theta.astype(np.float64).swapaxes(1, 2))
        return out.reshape(theta.shape[0], *spatial, nd).astype(theta.dtype)

    return affine_grid


def register_kernels(registry: KernelRegistry) -> None:
    """Register NonMaxSuppression, RoiAlign, GridSample and AffineGrid."""
    registry.add("NonMaxSuppression", _non_max_suppression, since=10)
    registry.add("RoiAlign", _roi_align, since=10)
    registry.add("GridSample", _grid_sample, since=16)
    registry.add("AffineGrid", _affine_grid, since=20)
