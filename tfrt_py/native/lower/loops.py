"""Index arithmetic for the native lowering: C-order strides, broadcasting, dimension
coalescing, and nested ``for`` loops over constant extents.

Every tensor the generated function touches is a flat 1-D array plus an element offset
(``Ref``); an element's position is ``offset + sum(i_d * stride_d)`` with constant
strides, so reshapes are free and LLVM sees constant trip counts and unit strides it can
vectorize. Pure functions of shapes: no state, thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ...records import record
from .source import literal

__all__ = [
    "LANES",
    "Ref",
    "bcast_strides",
    "coalesce",
    "index",
    "lane_reduce",
    "loop_nest",
    "pairwise",
    "strides",
]


@record(frozen=True)
class Ref:
    """A tensor in the generated code: flat array ``buf`` from element ``off`` (an
    expression of ours: ``literal`` of an int, a temporary, or a placeholder ``@n@``
    resolved once the arena is planned), C order; with ``mat`` (an expression of ours) a
    stack of matrices over its last two dims, each C-ordered, matrix ``q`` from element
    ``off + (q // rep) * mat`` (a KV cache written in place, ``cache.py``: only the
    lowerings that ask for it by ``NodeContext.stack_ref`` see such a ref)."""

    buf: str
    off: str
    shape: tuple[int, ...]
    dtype: np.dtype
    root: int = -1  # the arena buffer it lives in (-1: input, constant or output)
    mat: str = ""
    #: with ``mat``: matrix ``q`` is the cache's ``q // rep`` (grouped KV heads, each read
    #: by ``rep`` query heads: ``cache.stack_view`` of an Expand)
    rep: int = 1

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def reshaped(self, shape: Sequence[int]) -> Ref:
        assert not self.mat, "a stack of matrices is not reshaped"
        return Ref(self.buf, self.off, tuple(shape), self.dtype, self.root)


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order strides in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def bcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of ``shape`` read at ``out_shape`` positions (NumPy broadcasting: right
    aligned, 0 where the operand's dim is 1). Raises ValueError if it does not broadcast
    without growing the output."""
    pad = len(out_shape) - len(shape)
    if pad < 0:
        raise ValueError(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    st = strides(shape)
    out = [0] * pad
    for d, (n, s) in enumerate(zip(shape, st)):
        if n == out_shape[pad + d]:
            out.append(s if n != 1 else 0)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    return tuple(out)


def coalesce(
    shape: Sequence[int], stride_lists: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours every operand walks contiguously, so a
    same-shape elementwise op becomes one flat loop."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in stride_lists]
    for d in dims:
        n = shape[d]
        if out_shape and all(ss[-1] == s[d] * n for ss, s in zip(out_strides, stride_lists)):
            out_shape[-1] *= n
            for ss, s in zip(out_strides, stride_lists):
                ss[-1] = s[d]
            continue
        out_shape.append(n)
        for ss, s in zip(out_strides, stride_lists):
            ss.append(s[d])
    return out_shape, out_strides


def index(off: str, ivars: Sequence[str], st: Sequence[int]) -> str:
    """The flat index expression ``off + i0*s0 + ...`` (zero strides dropped)."""
    terms = [] if off == "0" else [off]
    for v, s in zip(ivars, st):
        if s == 1:
            terms.append(v)
        elif s:
            terms.append(f"{v} * {literal(s)}")
    return " + ".join(terms) or "0"


def loop_nest(
    shape: Sequence[int], body: Callable[[list[str]], list[str]], prefix: str = "i"
) -> list[str]:
    """``for`` loops over ``shape`` (outermost first) around ``body(loop_vars)``; lines
    are indented relative to the nest's own level."""
    ivars = [f"{prefix}{d}" for d in range(len(shape))]
    lines = []
    for d, n in enumerate(shape):
        lines.append("    " * d + f"for {ivars[d]} in range({literal(n)}):")
    pad = "    " * len(shape)
    lines += [pad + ln for ln in body(ivars)]
    return lines


#: Independent accumulators a row reduction keeps (``lane_reduce``).
LANES = 4


def lane_reduce(name: str, n: int, load: Callable[[str], str], kind: str, t: str) -> list[str]:
    """Lines leaving in ``name`` the max (``kind`` "max": NaN wins, as the interpreter) or
    the sum ("sum") of ``load(j)`` for j < n. The row is read ``LANES`` elements a step
    into that many accumulators, combined at the end (a float add or compare waits for the
    one before it, and LLVM may not reorder them without fast-math), and its last
    ``n % LANES`` elements go to the first. The text is the same for every ``n`` but the
    literal ``n`` itself (``generic.py`` fits it over a box of dims)."""
    ks = range(LANES)
    whole = f"{literal(n)} // {literal(LANES)} * {literal(LANES)}"
    if kind == "sum":
        lines = [f"{name}{k} = {t}(0.0)" for k in ks]
    else:
        first = load("0")
        lines = [f"{name}0 = {first}", *(f"{name}{k} = {name}0" for k in ks[1:])]
    lines.append(f"for j in range(0, {whole}, {literal(LANES)}):")
    for k in ks:
        # parenthesized: ``load`` may multiply it by a stride
        lines += _accumulate(name, f"{name}{k}", load(f"(j + {literal(k)})" if k else "j"), kind)
    lines.append(f"for j in range({whole}, {literal(n)}):")
    lines += _accumulate(name, f"{name}0", load("j"), kind)
    if kind == "sum":
        return [*lines, f"{name} = {pairwise([f'{name}{k}' for k in ks])}"]
    lines.append(f"{name} = {name}0")
    for k in ks[1:]:
        lines += [f"if {name}{k} > {name} or {name}{k} != {name}{k}:", f"    {name} = {name}{k}"]
    return lines


def _accumulate(name: str, acc: str, v: str, kind: str) -> list[str]:
    if kind == "sum":
        return [f"    {acc} += {v}"]
    return [f"    {name}v = {v}", f"    if {name}v > {acc} or {name}v != {name}v:",
            f"        {acc} = {name}v"]  # fmt: skip


def pairwise(terms: list[str]) -> str:
    """``terms`` summed as a balanced tree of additions."""
    if len(terms) == 1:
        return terms[0]
    h = len(terms) // 2
    return f"({pairwise(terms[:h])} + {pairwise(terms[h:])})"
