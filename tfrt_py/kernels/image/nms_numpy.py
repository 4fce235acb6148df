"""NonMaxSuppression's NumPy paths: the greedy rule for one (batch, class) without numba.

Both take the boxes ``(x0, y0, x1, y1, area)`` (float64, corners ordered) in score order,
best first, and return the kept positions in that order. A kept box suppresses a later
candidate when ``iw > 0``, ``ih > 0``, both areas and the union are positive and ``inter /
union > thr`` -- the arithmetic of ``nms_jit``'s kernel, which is symmetric in the two boxes,
so the result is the same whichever path runs.

* ``greedy_pairs`` (finite boxes): sorts the boxes by ``x0``; a box can only meet those after
  it whose ``x0`` is below its ``x1`` (its *window*, one ``searchsorted``). Every window is
  visited at once, a column at a time (each box against its d-th successor, the boxes whose
  windows are done dropping out; the last few long windows row by row), which finds every
  suppressing pair in a few hundred vector operations; the greedy rule then needs a Python
  step only per box that suppresses something. A cold process (the compiled kernels held
  back, ``tfrt_py.cold_start``) and a process without numba take it: SSDLite's batched NMS
  over 27,000 boxes (90 classes, each in its own square) ~6x faster than the sweep. It
  declines (None) when the windows hold more than ``PAIR_BUDGET`` pairs -- boxes that overlap
  in x by the thousands -- or more than ``max_out`` passes of the sweep would read.
* ``greedy_sweep``: any boxes (NaN and infinities never suppress): one vector pass over the
  rest of the candidates per kept box.

Pure functions; any thread.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PAIR_BUDGET", "greedy_pairs", "greedy_sweep"]

#: ``greedy_pairs`` visits at most this many (box, later box in its window) pairs (SSDLite's
#: 27,000 boxes: 4.0 million); its suppressing pairs take 8 bytes each (at most 64 MB: box
#: positions as int32, which a class's boxes -- 40 bytes each -- never outgrow in memory).
PAIR_BUDGET = 1 << 23

_Boxes = tuple[np.ndarray, ...]  # (x0, y0, x1, y1, area)


def greedy_sweep(box: _Boxes, iou_thr: float, max_out: int) -> list[int]:
    """The kept positions: one vector pass over the rest of the candidates per kept box."""
    x0, y0, x1, y1, area = box
    alive = np.ones(x0.size, dtype=bool)
    kept: list[int] = []
    for k in range(x0.size):
        if not alive[k]:
            continue
        kept.append(k)
        if len(kept) >= max_out:
            break
        rest = slice(k + 1, None)
        iw = np.minimum(x1[rest], x1[k]) - np.maximum(x0[rest], x0[k])
        ih = np.minimum(y1[rest], y1[k]) - np.maximum(y0[rest], y0[k])
        inter = iw * ih
        union = area[rest] + area[k] - inter
        ok = (iw > 0) & (ih > 0) & (area[rest] > 0) & (area[k] > 0) & (union > 0)
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=ok)
        alive[rest] &= ~(ok & (iou > iou_thr))
    return kept


def greedy_pairs(box: _Boxes, iou_thr: float, max_out: int) -> list[int] | None:
    """The kept positions from every suppressing pair (module doc), or None when the
    windows are too many pairs. The boxes must be finite."""
    n = box[0].size
    by_x = np.argsort(box[0], kind="stable")
    sx0, sy0, sx1, sy1, sarea = (np.ascontiguousarray(v[by_x]) for v in box)
    span = np.searchsorted(sx0, sx1, "left") - np.arange(1, n + 1)
    np.maximum(span, 0, out=span)  # later boxes in reach
    total = int(span.sum())
    if total > PAIR_BUDGET or total > max_out * n:
        return None
    by_x32 = by_x.astype(np.int32)
    firsts: list[np.ndarray] = []
    seconds: list[np.ndarray] = []

    def visit(i: np.ndarray, j: np.ndarray) -> None:  # sorted positions i[t] < j[t]
        iw = np.minimum(sx1[i], sx1[j]) - np.maximum(sx0[i], sx0[j])
        ih = np.minimum(sy1[i], sy1[j]) - np.maximum(sy0[i], sy0[j])
        inter = iw * ih
        ai, aj = sarea[i], sarea[j]
        union = ai + aj - inter
        ok = (iw > 0) & (ih > 0) & (ai > 0) & (aj > 0) & (union > 0)
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=ok)
        hit = np.flatnonzero(ok & (iou > iou_thr))
        if hit.size:
            firsts.append(by_x32[i[hit]])
            seconds.append(by_x32[j[hit]])

    live = np.flatnonzero(span)
    d = 1
    while live.size and live.size >= int(span[live].max()) - d:  # a column per offset
        visit(live, live + d)
        d += 1
        live = live[span[live] >= d]
    for i in live.tolist():  # few long windows left: a row each
        j = np.arange(i + d, i + 1 + int(span[i]))
        visit(np.full(j.size, i), j)
    alive = np.ones(n, dtype=bool)
    if firsts:
        a, b = np.concatenate(firsts), np.concatenate(seconds)
        winner, loser = np.minimum(a, b), np.maximum(a, b)  # score order: lower wins
        order = np.argsort(winner, kind="stable")
        winner, loser = winner[order], loser[order]
        starts = np.flatnonzero(np.r_[True, winner[1:] != winner[:-1]])
        ends = np.r_[starts[1:], winner.size].tolist()
        for w, s, e in zip(winner[starts].tolist(), starts.tolist(), ends, strict=True):
            if alive[w]:  # every box that could suppress w came earlier in this loop
                alive[loser[s:e]] = False
    return np.flatnonzero(alive)[:max_out].tolist()
