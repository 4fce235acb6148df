"""The memory plan: buffer lifetimes -> offsets in one 64-byte-aligned arena.

Offsets come from TFLite's arena planner strategies, greedy with best fit: each buffer
goes into the smallest gap left between the buffers already placed whose lifetimes overlap
its own, or after the last of them; buffers are taken largest first ("by size") or step by
step, busiest step first ("by breadth"), and the smaller arena is kept. Lifetimes are closed
intervals of program steps, so a kernel's output never shares memory with an input that
is still live at that step, except where the planner chose to run the kernel in place
(then the two values are one buffer).

The greedy's work is the number of pairs of buffers live at once (each placement looks at
the buffers overlapping it in time: for up to ``SCAN_MAX_BUFFERS`` buffers by a vector scan
of those placed -- SSDLite's 197 buffers over 1,943 steps placed in 11-25 ms, not the 55-70
of a Python walk -- for more through an index of step blocks). A plan above
``GREEDY_MAX_PAIRS`` such pairs (a graph of 100k values all live at once, from a stranger)
is placed instead by one sweep over the steps, best fit in the gaps that buffers freed
(``_sweep``): a valid plan in about n log n, less tight.

``lower_bound_bytes`` is the largest sum of live buffer bytes at any step: no arena can be
smaller, so ``arena_bytes / lower_bound_bytes`` says how much fragmentation costs.

A MemoryPlan is immutable after ``plan_offsets``; it is shared by every call that uses it.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import field
from typing import Any

import numpy as np

from ..records import record

__all__ = ["ALIGN", "GREEDY_MAX_PAIRS", "Buffer", "MemoryPlan", "lower_bound", "plan_offsets"]

#: Every buffer starts at a multiple of this many bytes (a cache line; AVX-512 friendly).
ALIGN = 64
#: Above this many pairs of buffers live at the same time, the sweep places them.
GREEDY_MAX_PAIRS = 2_000_000
#: Up to this many buffers the greedy finds the placed buffers live with each by a vector
#: scan; more are indexed by blocks of 2**_BLOCK_SHIFT steps.
SCAN_MAX_BUFFERS = 2048
#: The greedy's index of placed buffers: blocks of 2**_BLOCK_SHIFT steps.
_BLOCK_SHIFT = 5


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@record
class Buffer:
    """One region of the arena: ``nbytes`` at ``offset``, live from step ``first`` to step
    ``last`` (inclusive), holding ``values`` (several when a kernel ran in place)."""

    nbytes: int
    first: int
    last: int
    values: list[str] = field(default_factory=list)
    offset: int = -1

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_memory(self, other: Buffer) -> bool:
        if self.nbytes == 0 or other.nbytes == 0:
            return False
        return (
            self.offset < other.offset + other.nbytes and other.offset < self.offset + self.nbytes
        )


@record
class MemoryPlan:
    """The plan for one input signature.

    ``arena_bytes``: the arena size; ``lower_bound_bytes``: the largest sum of live buffer
    bytes at any step; ``buffers``: the arena's buffers (offset, size, lifetime, values);
    ``n_inplace``: kernels that write into their input's buffer; ``n_fresh``: outputs
    allocated per call (they go to the user); ``n_unplanned``: values kernels allocate
    themselves (no ``out=`` support, or a shape the signature does not fix); ``n_joined``:
    Concats never run, their inputs written into their output's slices.
    """

    signature: tuple[Any, ...]
    arena_bytes: int
    lower_bound_bytes: int
    buffers: list[Buffer]
    n_inplace: int = 0
    n_fresh: int = 0
    n_unplanned: int = 0
    n_joined: int = 0

    @property
    def ratio(self) -> float:
        """arena_bytes / lower_bound_bytes (1.0 for an empty plan)."""
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    def summary(self) -> str:
        sig = ", ".join(f"{tuple(s)}:{d}" for s, d in self.signature)
        return (
            f"[{sig}] arena {self.arena_bytes:,} B (lower bound {self.lower_bound_bytes:,} B, "
            f"x{self.ratio:.2f}), {len(self.buffers)} buffers, {self.n_inplace} in place, "
            f"{self.n_fresh} fresh outputs, {self.n_unplanned} unplanned values, "
            f"{self.n_joined} Concats written in place"
        )

    def __str__(self) -> str:
        return f"MemoryPlan {self.summary()}"


def plan_offsets(buffers: Sequence[Buffer]) -> int:
    """Assign ``offset`` to every buffer; returns the arena size in bytes.

    Best fit, in two greedy orders (TFLite's, after Pisarchyk and Lee 2020): by size, and
    by breadth (the steps with the most live bytes first, each step's buffers largest
    first); the smaller arena wins. Sizes are rounded up to ``ALIGN``; offsets are
    multiples of it. Zero-byte buffers get offset 0 and take no room.
    """
    for b in buffers:
        if b.nbytes == 0:
            b.offset = 0
    sized = [b for b in buffers if b.nbytes > 0]
    if _live_pairs(sized) > GREEDY_MAX_PAIRS:
        return _sweep(sized)
    by_size = sorted(sized, key=lambda b: (-_aligned(b.nbytes), b.first))
    best = _place(by_size)
    offsets = [b.offset for b in sized]
    arena = _place(_by_breadth(sized))
    if arena >= best:
        for b, off in zip(sized, offsets):
            b.offset = off
        return best
    return arena


def _by_breadth(buffers: list[Buffer]) -> list[Buffer]:
    """The buffers busiest step first (ties: the step of the earliest buffer in
    ``buffers`` that covers it, then the earlier step), each step's buffers largest first
    (ties: their order in ``buffers``), each once."""
    if not buffers or len(buffers) > SCAN_MAX_BUFFERS:
        return _by_breadth_steps(buffers)
    n = len(buffers)
    first = np.fromiter((b.first for b in buffers), np.int64, n)
    last = np.fromiter((b.last for b in buffers), np.int64, n)
    nbytes = np.fromiter((b.nbytes for b in buffers), np.int64, n)
    # the live set is constant between these steps: one segment each
    starts = np.unique(np.concatenate([first, last + 1]))
    live = (first <= starts[:, None]) & (last >= starts[:, None])  # (segment, buffer)
    some = np.flatnonzero(live.any(axis=1))
    live_bytes = (live[some] * nbytes).sum(axis=1)
    first_cover = live[some].argmax(axis=1)
    segments = some[np.lexsort((starts[some], first_cover, -live_bytes))]
    rank = np.empty(n, np.int64)
    rank[np.argsort(-nbytes, kind="stable")] = np.arange(n)
    seen = np.zeros(n, bool)
    order: list[Buffer] = []
    for seg in segments.tolist():
        new = np.flatnonzero(live[seg] & ~seen)
        if new.size:
            new = new[np.argsort(rank[new])]
            seen[new] = True
            order.extend(buffers[i] for i in new.tolist())
            if len(order) == n:
                break
    return order


def _by_breadth_steps(buffers: list[Buffer]) -> list[Buffer]:
    """``_by_breadth`` for many buffers (step by step: work in their summed lifetimes)."""
    steps: dict[int, list[Buffer]] = {}
    for b in buffers:
        for t in range(b.first, b.last + 1):
            steps.setdefault(t, []).append(b)
    order: list[Buffer] = []
    seen: set[int] = set()
    for _, live in sorted(steps.items(), key=lambda kv: -sum(b.nbytes for b in kv[1])):
        for b in sorted(live, key=lambda b: -b.nbytes):
            if id(b) not in seen:
                seen.add(id(b))
                order.append(b)
    return order


def _place(order: list[Buffer]) -> int:
    """Best fit in ``order``: each buffer goes into the smallest gap between the buffers
    already placed whose lifetimes overlap its own (the first such gap by offset, then
    placement order), or after the last of them."""
    if len(order) > SCAN_MAX_BUFFERS:
        return _place_indexed(order)
    n = len(order)
    first = np.fromiter((b.first for b in order), np.int64, n)
    last = np.fromiter((b.last for b in order), np.int64, n)
    size = np.fromiter((_aligned(b.nbytes) for b in order), np.int64, n)
    offset = np.zeros(n, np.int64)
    arena = 0
    for k, b in enumerate(order):
        live = np.flatnonzero((first[:k] <= last[k]) & (last[:k] >= first[k]))
        at = 0
        if live.size:
            by_offset = live[np.argsort(offset[live], kind="stable")]
            lo = offset[by_offset]
            ends = np.maximum.accumulate(lo + size[by_offset])
            before = np.concatenate(([0], ends[:-1]))  # the end of what lies below each
            gap = lo - before
            fits = np.flatnonzero(gap >= size[k])
            at = int(before[fits[np.argmin(gap[fits])]]) if fits.size else int(ends[-1])
        offset[k] = b.offset = at
        arena = max(arena, at + int(size[k]))
    return arena


def _place_indexed(order: list[Buffer]) -> int:
    """``_place`` for many buffers: the placed ones indexed by blocks of steps."""
    index: dict[int, list[tuple[int, Buffer]]] = {}  # step block -> (seq, placed buffer)
    arena = 0
    for seq, b in enumerate(order):
        size = _aligned(b.nbytes)
        blocks = range(b.first >> _BLOCK_SHIFT, (b.last >> _BLOCK_SHIFT) + 1)
        found = {q: p for k in blocks for q, p in index.get(k, ()) if p.overlaps_in_time(b)}
        # by offset, then placement order (what a scan of every placed buffer gave)
        live = sorted(found.items(), key=lambda qp: (qp[1].offset, qp[0]))
        best, best_gap, end = -1, -1, 0
        for _, p in live:
            gap = p.offset - end
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = end, gap
            end = max(end, p.offset + _aligned(p.nbytes))
        b.offset = best if best >= 0 else end
        for k in blocks:
            index.setdefault(k, []).append((seq, b))
        arena = max(arena, b.offset + size)
    return arena


def _live_pairs(buffers: Sequence[Buffer]) -> int:
    """How many pairs of ``buffers`` are live at a common step (n log n)."""
    firsts = sorted(b.first for b in buffers)
    lasts = sorted(b.last for b in buffers)
    # per buffer: the others starting by its last step, less those ended before its first
    total = sum(bisect.bisect_right(firsts, b.last) - bisect.bisect_left(lasts, b.first) - 1
                for b in buffers)  # fmt: skip
    return total // 2


def _sweep(buffers: list[Buffer]) -> int:
    """Place ``buffers`` in one pass over the steps: at each buffer's first step, the
    buffers whose last step is behind it give their room back (merged with free
    neighbours), and it takes the smallest free gap it fits (found by bisection), or the
    arena's end."""
    gaps = _Gaps()
    ending: list[tuple[int, int, int, int]] = []  # (last step, seq, offset, size) placed
    arena = 0
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i].first, -buffers[i].nbytes))
    for seq in order:
        b = buffers[seq]
        while ending and ending[0][0] < b.first:
            _, _, off, size = heapq.heappop(ending)
            gaps.give_back(off, size)
        size = _aligned(b.nbytes)
        off = gaps.take(size)
        if off < 0:
            off = arena
            arena += size
        b.offset = off
        heapq.heappush(ending, (b.last, seq, off, size))
    return arena


class _Gaps:
    """The free gaps of ``_sweep``'s arena: by offset (to merge neighbours) and by
    (size, offset) (best fit), both sorted lists kept by bisection."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.size_at: dict[int, int] = {}
        self.by_size: list[tuple[int, int]] = []

    def _add(self, off: int, size: int) -> None:
        bisect.insort(self.offsets, off)
        self.size_at[off] = size
        bisect.insort(self.by_size, (size, off))

    def _remove(self, off: int) -> int:
        size = self.size_at.pop(off)
        del self.offsets[bisect.bisect_left(self.offsets, off)]
        del self.by_size[bisect.bisect_left(self.by_size, (size, off))]
        return size

    def take(self, size: int) -> int:
        """The offset of the smallest gap of at least ``size`` bytes, taken (its rest stays
        free); -1 when none fits."""
        k = bisect.bisect_left(self.by_size, (size, -1))
        if k == len(self.by_size):
            return -1
        gap, off = self.by_size[k]
        self._remove(off)
        if gap > size:
            self._add(off + size, gap - size)
        return off

    def give_back(self, off: int, size: int) -> None:
        """Free [off, off + size), merged with the gaps on either side."""
        k = bisect.bisect_left(self.offsets, off)
        if k < len(self.offsets) and self.offsets[k] == off + size:  # the gap after
            size += self._remove(off + size)
        if k > 0:
            before = self.offsets[k - 1]
            if before + self.size_at[before] == off:  # the gap before
                size += self._remove(before)
                off = before
        self._add(off, size)


def lower_bound(buffers: Sequence[Buffer]) -> int:
    """The largest sum of live buffer bytes at any step."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.first] = events.get(b.first, 0) + b.nbytes
        events[b.last + 1] = events.get(b.last + 1, 0) - b.nbytes
    best = live = 0
    for step in sorted(events):
        live += events[step]
        best = max(best, live)
    return best
