"""A compiled greedy NonMaxSuppression for one (batch, class) that compares a candidate
only with the kept boxes near it.

The greedy rule compares each candidate, in score order, with every box kept so far; a
detector's batched NMS (torchvision's: every class's boxes offset into their own square, one
class of ~27,000 boxes) keeps thousands, and the NumPy loop (one vector pass over the rest per
kept box) took 350 ms for SSDLite's. A kept box can suppress a candidate only when the two
overlap (IoU needs a positive intersection), so kept boxes are entered in the cells of a
uniform grid they cover, at the finest of ``LEVELS`` grids (each ``LEVEL_RATIO`` times
coarser) where they cover at most ``MAX_CELLS`` cells; cells of every level are hashed into
one table of ~2n heads (a collision only adds boxes to compare, never drops one). A
candidate compares with the boxes in its own cells at each level that holds any (or with
each of a level's boxes where it would probe more cells than the level holds), and with
the few kept boxes too big for the coarsest level. Cell indices are monotone in the
coordinate, so two boxes that overlap share a cell at every level: the result is the
greedy rule's exactly, in the same IEEE float64 arithmetic as ``vision``'s NumPy path.
Faster R-CNN's batched NMS over 13,500 boxes of all sizes (random weights: big proposals)
took 42 ms on one level, where most boxes covered too many cells.

``nms_greedy()`` (asked at load) gives ``fn(x0, y0, x1, y1, area, thr, max_out, cell_w,
cell_h, origin_x, origin_y, keep) -> kept``: the boxes (float64, corners ordered, finite)
in score order, best first; ``keep`` (int64, n) receives the kept positions in that order.
None when numba is unavailable (``kernels/lib/jit.py``). Any thread (releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted, inline

__all__ = ["LEVELS", "MAX_BOXES", "MAX_CELLS", "cell_size", "nms_greedy"]

#: A kept box goes to the finest grid level where it covers at most this many cells.
MAX_CELLS = 16
#: Grid levels, each cell ``LEVEL_RATIO`` times the last's side; a box too big for the
#: coarsest is compared with every later candidate (the "wide" list).
LEVELS = 6
LEVEL_RATIO = 4.0
#: The most boxes of one (image, class) the kernel takes (its links are int32, at most 16 a
#: box); more keep the NumPy loop.
MAX_BOXES = 1 << 26
#: A candidate probes a level's cells when it covers at most this many (and fewer than
#: the level holds boxes); else it compares with each of the level's boxes.
QUERY_CELLS = 64
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


@inline
def _span(lo: float, hi: float, origin: float, size: float) -> tuple[int, int]:
    """The first and last cell of [lo, hi] on an axis of cells ``size`` wide."""
    return _cell(lo, origin, size), _cell(hi, origin, size)


@inline
def _hash(level: int, i: int, j: int, mask: int) -> int:
    return (level * 0x27D4EB2F + i * 0x9E3779B1 + j * 0x85EBCA77) & mask


def _nms_greedy(
    x0: Any, y0: Any, x1: Any, y1: Any, area: Any, thr: float, max_out: int,
    cell_w: float, cell_h: float, ox: float, oy: float, keep: Any,
) -> int:  # pragma: no cover - numba only  # fmt: skip
    n = x0.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    mask = size - 1
    head = np.full(size, -1, np.int32)  # int32 links: at most 16 * MAX_BOXES entries
    cap = 4 * n + MAX_CELLS
    nxt = np.empty(cap, np.int32)
    who = np.empty(cap, np.int32)
    used = 0
    lists = np.empty((LEVELS + 1, n), np.int32)  # the kept boxes of each level; last: wide
    counts = np.zeros(LEVELS + 1, np.int64)
    kept = 0
    for r in range(n):
        hit = False
        if area[r] > 0.0:  # a box of no area is never suppressed and suppresses nothing
            for q in range(counts[LEVELS]):
                if _suppresses(x0, y0, x1, y1, area, lists[LEVELS, q], r, thr):
                    hit = True
                    break
            scale = 1.0
            level = 0
            while not hit and level < LEVELS:
                if counts[level] > 0:
                    i0, i1 = _span(x0[r], x1[r], ox, cell_w * scale)
                    j0, j1 = _span(y0[r], y1[r], oy, cell_h * scale)
                    if (i1 - i0 + 1) * (j1 - j0 + 1) > min(counts[level], QUERY_CELLS):
                        for q in range(counts[level]):  # fewer boxes than cells: each
                            if _suppresses(x0, y0, x1, y1, area, lists[level, q], r, thr):
                                hit = True
                                break
                    else:
                        i = i0
                        while not hit and i <= i1:
                            j = j0
                            while not hit and j <= j1:
                                e = head[_hash(level, i, j, mask)]
                                while e >= 0:
                                    if _suppresses(x0, y0, x1, y1, area, who[e], r, thr):
                                        hit = True
                                        break
                                    e = nxt[e]
                                j += 1
                            i += 1
                scale *= LEVEL_RATIO
                level += 1
        if hit:
            continue
        keep[kept] = r
        kept += 1
        if kept >= max_out:
            break
        if not area[r] > 0.0:
            continue
        # the finest level where the box covers at most MAX_CELLS cells, else the wide list
        scale = 1.0
        level = 0
        i0, i1 = _span(x0[r], x1[r], ox, cell_w)
        j0, j1 = _span(y0[r], y1[r], oy, cell_h)
        while level < LEVELS and (i1 - i0 + 1) * (j1 - j0 + 1) > MAX_CELLS:
            scale *= LEVEL_RATIO
            level += 1
            i0, i1 = _span(x0[r], x1[r], ox, cell_w * scale)
            j0, j1 = _span(y0[r], y1[r], oy, cell_h * scale)
        lists[level, counts[level]] = r
        counts[level] += 1
        if level == LEVELS:
            continue
        cells = (i1 - i0 + 1) * (j1 - j0 + 1)
        if used + cells > cap:
            cap = 2 * cap + cells
            nxt2 = np.empty(cap, np.int32)
            who2 = np.empty(cap, np.int32)
            nxt2[:used] = nxt[:used]
            who2[:used] = who[:used]
            nxt = nxt2
            who = who2
        for i in range(i0, i1 + 1):
            for j in range(j0, j1 + 1):
                h = _hash(level, i, j, mask)
                who[used] = r
                nxt[used] = head[h]
                head[h] = used
                used += 1
    return kept


def _warm(fn: Any) -> None:
    b = np.array([0.0, 0.5])
    fn(b, b, b + 1.0, b + 1.0, np.ones(2), 0.5, 2, 1.0, 1.0, 0.0, 0.0, np.empty(2, np.int64))


_NMS = Jitted(_nms_greedy, _warm, helpers=(_cell, _suppresses, _span, _hash))


def nms_greedy() -> Any:
    """The compiled kernel (see the module doc), or None when the NumPy path must run."""
    return _NMS.get()


def cell_size(lo: np.ndarray, hi: np.ndarray) -> float:
    """A grid cell's side on one axis: the median positive extent of the boxes (a typical
    box covers about four cells), 1.0 when none has one."""
    ext = hi - lo
    ext = ext[ext > 0]
    return float(np.median(ext)) if ext.size else 1.0
