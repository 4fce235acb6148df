"""A compiled RoiAlign (``avg`` mode) over a channels-last copy of the feature map.

The NumPy path builds each ROI's two weight matrices and multiplies per ROI (~75 µs of
calls a ROI: a Faster R-CNN's 150 ROIs over 256x10x10 took 11.5 ms). Here each output bin
sums its samples' four bilinear taps with the channels as the vector lanes, a ROI at a
time, then writes the bin's channels into the NCHW output: onnxruntime's pre-computed taps
(positions and weights per sample, the same for every channel), the same coordinates as
``vision._bilinear_taps`` (float64), the sums in the map's dtype.

``roi_align_avg()`` (asked at load) gives ``fn(xt, rois, batch, scale, offset, half_pixel,
ratio, out)``: ``xt`` (N, H, W, C) C-contiguous float32/float64, ``rois`` (R, 4) float64
(finite), ``batch`` (R,) int64 in [0, N), ``out`` (R, C, ph, pw) of ``xt``'s dtype, filled.
The caller bounds each ROI's sample grid (``MAX_GRID``). None when numba is unavailable
(``kernels/lib/jit.py``). Any thread (releases the GIL). ``roi_align_par()`` splits the ROIs
over the native threads (``concurrency.native_threads``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["MAX_GRID", "roi_align_avg", "roi_align_par"]

#: A ROI's adaptive sample grid (``sampling_ratio`` 0) beyond this many samples a bin on
#: an axis takes the NumPy path (whose memory it then bounds itself).
MAX_GRID = 1024


def _taps(
    start: float, bin_size: float, pooled: int, grid: int, size: int,
    lo: Any, hi: Any, wl: Any, wh: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """One axis's samples (``vision._bilinear_taps``): low and high index and weight."""
    for p in range(pooled):
        for g in range(grid):
            k = p * grid + g
            c = start + p * bin_size + (g + 0.5) * bin_size / grid
            lo[k], hi[k], wl[k], wh[k] = 0, 0, 0.0, 0.0
            if c < -1.0 or c > size:
                continue
            c = max(c, 0.0)
            low = int(c)
            high = low + 1
            if low >= size - 1:
                low = size - 1
                high = low
                c = float(low)
            lo[k], hi[k], wl[k], wh[k] = low, high, 1.0 - (c - low), c - low


def _one_roi(
    xt: Any, rois: Any, batch: Any, n: int, scale: float, offset: float, half_pixel: bool,
    ratio: int, out: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """ROI ``n``'s bins into ``out[n]``."""
    h, w, c_n = xt.shape[1], xt.shape[2], xt.shape[3]
    ph, pw = out.shape[2], out.shape[3]
    acc = np.empty(c_n, xt.dtype)
    f = np.empty(4, xt.dtype)  # a sample's four weights in the map's dtype
    x0, y0 = rois[n, 0] * scale - offset, rois[n, 1] * scale - offset
    rw, rh = rois[n, 2] * scale - offset - x0, rois[n, 3] * scale - offset - y0
    if not half_pixel:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    gh = ratio if ratio > 0 else max(int(np.ceil(rh / ph)), 0)
    gw = ratio if ratio > 0 else max(int(np.ceil(rw / pw)), 0)
    inv = 1.0 / max(gh * gw, 1)
    ylo, yhi = np.empty(ph * gh, np.int64), np.empty(ph * gh, np.int64)
    wyl, wyh = np.empty(ph * gh), np.empty(ph * gh)
    xlo, xhi = np.empty(pw * gw, np.int64), np.empty(pw * gw, np.int64)
    wxl, wxh = np.empty(pw * gw), np.empty(pw * gw)
    _taps(y0, rh / ph, ph, gh, h, ylo, yhi, wyl, wyh)
    _taps(x0, rw / pw, pw, gw, w, xlo, xhi, wxl, wxh)
    img = xt[batch[n]]
    for i in range(ph):
        for j in range(pw):
            acc[:] = 0.0
            for sy in range(i * gh, (i + 1) * gh):
                for sx in range(j * gw, (j + 1) * gw):
                    w1, w2 = wyl[sy] * wxl[sx], wyl[sy] * wxh[sx]
                    w3, w4 = wyh[sy] * wxl[sx], wyh[sy] * wxh[sx]
                    if w1 == 0.0 and w2 == 0.0 and w3 == 0.0 and w4 == 0.0:
                        continue
                    r1, r2 = img[ylo[sy], xlo[sx]], img[ylo[sy], xhi[sx]]
                    r3, r4 = img[yhi[sy], xlo[sx]], img[yhi[sy], xhi[sx]]
                    f[0], f[1], f[2], f[3] = w1, w2, w3, w4
                    f1, f2, f3, f4 = f[0], f[1], f[2], f[3]
                    for c in range(c_n):
                        acc[c] += f1 * r1[c] + f2 * r2[c] + f3 * r3[c] + f4 * r4[c]
            for c in range(c_n):
                out[n, c, i, j] = acc[c] * inv


def _roi_align_avg(
    xt: Any, rois: Any, batch: Any, scale: float, offset: float, half_pixel: bool,
    ratio: int, out: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    for n in range(rois.shape[0]):
        _one_roi(xt, rois, batch, n, scale, offset, half_pixel, ratio, out)


def _roi_align_par(
    xt: Any, rois: Any, batch: Any, scale: float, offset: float, half_pixel: bool,
    ratio: int, out: Any, edges: Any,
) -> None:  # pragma: no cover - numba only  # fmt: skip
    """``_roi_align_avg`` over the blocks of ROIs between consecutive ``edges``, one part
    of a ``prange`` loop on native threads each."""
    for q in numba.prange(edges.shape[0] - 1):
        for n in range(edges[q], edges[q + 1]):
            _one_roi(xt, rois, batch, n, scale, offset, half_pixel, ratio, out)


def _warm(fn: Any) -> None:
    for t in (np.float32, np.float64):
        rois = np.array([[0.0, 0.0, 2.0, 2.0]])
        fn(np.ones((1, 3, 3, 2), t), rois, np.zeros(1, np.int64), 1.0, 0.5, True, 2,
           np.empty((1, 2, 2, 2), t))  # fmt: skip


def _warm_par(fn: Any) -> None:
    _warm(lambda *a: fn(*a, np.array([0, 1], np.int64)))


_ROI_ALIGN = Jitted(_roi_align_avg, _warm, helpers=(_taps, _one_roi))
_ROI_ALIGN_PAR = Jitted(_roi_align_par, _warm_par, helpers=(_taps, _one_roi), parallel=True)
#: numba, set by ``Jitted(parallel=True)`` before ``_roi_align_par`` compiles.
numba: Any = None


def roi_align_avg() -> Any:
    """The compiled kernel (see the module doc), or None when the NumPy path must run."""
    return _ROI_ALIGN.get()


def roi_align_par() -> Any:
    """``roi_align_avg``'s kernel split over native threads, ``fn(..., out, edges)`` (the ROIs
    between consecutive ``edges`` a part); None where they are not ready."""
    return _ROI_ALIGN_PAR.get()
