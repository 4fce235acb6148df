"""A compiled greedy NonMaxSuppression for one (batch, class) that compares a candidate
only with the kept boxes near it.

The greedy rule compares each candidate, in score order, with every box kept so far; a
detector's batched NMS (torchvision's: every class's boxes offset into their own square, one
class of ~27,000 boxes) keeps thousands, and the NumPy loop (one vector pass over the rest per
kept box) took 350 ms for SSDLite's. A kept box can suppress a candidate only when the two
overlap (IoU needs a positive intersection), so kept boxes are entered in the cells of a
uniform grid they cover (cells hashed into a table of ~2n heads: a collision only adds
boxes to compare, never drops one), and a candidate compares with the boxes in its own
cells. A box that covers more than ``MAX_CELLS`` cells is compared the old way (a kept wide
box with every later candidate; a wide candidate with every kept box), so the result is
the greedy rule's exactly, in the same IEEE float64 arithmetic as ``vision``'s NumPy path.

``nms_greedy()`` (asked at load) gives ``fn(x0, y0, x1, y1, area, thr, max_out, cell_w,
cell_h, origin_x, origin_y, keep) -> kept``: the boxes (float64, corners ordered, finite)
in score order, best first; ``keep`` (int64, n) receives the kept positions in that order.
None when numba is unavailable (``kernels/lib/jit.py``). Any thread (releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted, inline

__all__ = ["MAX_CELLS", "cell_size", "nms_greedy"]

#: A box over more grid cells is compared with every kept box (or every later candidate).
MAX_CELLS = 16
#: Cells per axis; coordinates beyond clamp to the edge cells (monotone, so still exact).
_GRID = 1 << 20


@inline
def _cell(v: float, origin: float, size: float) -> int:  # pragma: no cover - numba only
    t = (v - origin) / size
    if t <= 0.0:
        return 0
    if t >= _GRID - 1:
        return _GRID - 1
    return int(t)


@inline
def _suppresses(
    x0: Any, y0: Any, x1: Any, y1: Any, area: Any, k: int, r: int, thr: float
) -> bool:  # pragma: no cover - numba only
    """Whether kept box ``k`` suppresses candidate ``r`` (``vision``'s rule, same order)."""
    iw = min(x1[r], x1[k]) - max(x0[r], x0[k])
    ih = min(y1[r], y1[k]) - max(y0[r], y0[k])
    inter = iw * ih
    union = area[r] + area[k] - inter
    iou = inter / union  # inf or nan where union <= 0 (numpy's error model): not counted
    return (iw > 0.0) & (ih > 0.0) & (area[k] > 0.0) & (union > 0.0) & (iou > thr)


def _nms_greedy(
    x0: Any, y0: Any, x1: Any, y1: Any, area: Any, thr: float, max_out: int,
    cell_w: float, cell_h: float, ox: float, oy: float, keep: Any,
) -> int:  # pragma: no cover - numba only  # fmt: skip
    n = x0.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    mask = size - 1
    head = np.full(size, -1, np.int64)
    cap = 4 * n + MAX_CELLS
    nxt = np.empty(cap, np.int64)
    who = np.empty(cap, np.int64)
    used = 0
    wide = np.empty(n, np.int64)
    n_wide = 0
    kept = 0
    for r in range(n):
        i0 = _cell(x0[r], ox, cell_w)
        i1 = _cell(x1[r], ox, cell_w)
        j0 = _cell(y0[r], oy, cell_h)
        j1 = _cell(y1[r], oy, cell_h)
        cells = (i1 - i0 + 1) * (j1 - j0 + 1)
        hit = False
        if area[r] > 0.0:  # a box of no area is never suppressed and suppresses nothing
            if cells > MAX_CELLS:
                for q in range(kept):
                    if _suppresses(x0, y0, x1, y1, area, keep[q], r, thr):
                        hit = True
                        break
            else:
                for q in range(n_wide):
                    if _suppresses(x0, y0, x1, y1, area, wide[q], r, thr):
                        hit = True
                        break
                i = i0
                while not hit and i <= i1:
                    j = j0
                    while not hit and j <= j1:
                        e = head[(i * 0x9E3779B1 + j * 0x85EBCA77) & mask]
                        while e >= 0:
                            if _suppresses(x0, y0, x1, y1, area, who[e], r, thr):
                                hit = True
                                break
                            e = nxt[e]
                        j += 1
                    i += 1
        if hit:
            continue
        keep[kept] = r
        kept += 1
        if kept >= max_out:
            break
        if not area[r] > 0.0:
            continue
        if cells > MAX_CELLS:
            wide[n_wide] = r
            n_wide += 1
            continue
        if used + cells > cap:
            cap = 2 * cap + cells
            nxt2 = np.empty(cap, np.int64)
            who2 = np.empty(cap, np.int64)
            nxt2[:used] = nxt[:used]
            who2[:used] = who[:used]
            nxt = nxt2
            who = who2
        for i in range(i0, i1 + 1):
            for j in range(j0, j1 + 1):
                h = (i * 0x9E3779B1 + j * 0x85EBCA77) & mask
                who[used] = r
                nxt[used] = head[h]
                head[h] = used
                used += 1
    return kept


def _warm(fn: Any) -> None:
    b = np.array([0.0, 0.5])
    fn(b, b, b + 1.0, b + 1.0, np.ones(2), 0.5, 2, 1.0, 1.0, 0.0, 0.0, np.empty(2, np.int64))


_NMS = Jitted(_nms_greedy, _warm, helpers=(_cell, _suppresses))


def nms_greedy() -> Any:
    """The compiled kernel (see the module doc), or None when the NumPy path must run."""
    return _NMS.get()


def cell_size(lo: np.ndarray, hi: np.ndarray) -> float:
    """A grid cell's side on one axis: the median positive extent of the boxes (a typical
    box covers about four cells), 1.0 when none has one."""
    ext = hi - lo
    ext = ext[ext > 0]
    return float(np.median(ext)) if ext.size else 1.0
