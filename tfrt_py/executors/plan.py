"""The memory plan: buffer lifetimes -> offsets in one 64-byte-aligned arena.

Offsets come from TFLite's arena planner strategies, greedy with best fit: each buffer
goes into the smallest gap left between the buffers already placed whose lifetimes overlap
its own, or after the last of them; buffers are taken largest first ("by size") or step by
step, busiest step first ("by breadth"), and the smaller arena is kept. Lifetimes are closed
intervals of program steps, so a kernel's output never shares memory with an input that
is still live at that step, except where the planner chose to run the kernel in place
(then the two values are one buffer).

``lower_bound_bytes`` is the largest sum of live buffer bytes at any step: no arena can be
smaller, so ``arena_bytes / lower_bound_bytes`` says how much fragmentation costs.

A MemoryPlan is immutable after ``plan_offsets``; it is shared by every call that uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALIGN", "Buffer", "MemoryPlan", "lower_bound", "plan_offsets"]

#: Every buffer starts at a multiple of this many bytes (a cache line; AVX-512 friendly).
ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
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


@dataclass
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
    if not buffers:
        return []
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
    already placed whose lifetimes overlap its own, or after the last of them."""
    placed: list[Buffer] = []
    arena = 0
    for b in order:
        size = _aligned(b.nbytes)
        live = sorted((p for p in placed if p.overlaps_in_time(b)), key=lambda p: p.offset)
        best, best_gap, end = -1, -1, 0
        for p in live:
            gap = p.offset - end
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = end, gap
            end = max(end, p.offset + _aligned(p.nbytes))
        b.offset = best if best >= 0 else end
        placed.append(b)
        arena = max(arena, b.offset + size)
    return arena


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
