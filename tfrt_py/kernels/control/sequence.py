"""Kernels (control): sequences and optionals.

Representation (shared with the executors): an ONNX sequence is a Python ``list`` of
arrays; an ONNX optional is its value, or ``None`` when empty. Kernels never mutate an input
list: every op that changes a sequence returns a new list (elements are shared, arrays are
immutable by contract).

Ops: SequenceEmpty, SequenceConstruct, SequenceAt, SequenceInsert, SequenceErase,
SequenceLength, ConcatFromSequence, SplitToSequence, SequenceMap (runs its ``body`` per
element), Optional, OptionalHasElement, OptionalGetElement. Positions accept ONNX negative
indices; out-of-range positions raise ``IndexError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import CONTROL_FLOW, ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _position(pos: Any, n: int, insert: bool) -> int:
    """ONNX position in [-n, n-1] (or [-n, n] for insertion) as a non-negative index."""
    p = int(np.asarray(pos).item())  # a scalar; 1-element tensors are accepted too
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise IndexError(f"sequence position {p} out of range for length {n}")
    return p + n if p < 0 else p


def _sequence_empty(ctx: KernelContext) -> ComputeFn:
    """SequenceEmpty() -> [] (the ``dtype`` attribute only types the empty sequence)."""

    def sequence_empty() -> list:
        return []

    return sequence_empty


def _sequence_construct(ctx: KernelContext) -> ComputeFn:
    """SequenceConstruct(x...) -> [x...]."""

    def sequence_construct(*xs: Any) -> list:
        return list(xs)

    return sequence_construct


def _sequence_at(ctx: KernelContext) -> ComputeFn:
    """SequenceAt(seq, position) -> seq[position]."""

    def sequence_at(seq: list, pos: Any) -> Any:
        return seq[_position(pos, len(seq), False)]

    return sequence_at


def _sequence_insert(ctx: KernelContext) -> ComputeFn:
    """SequenceInsert(seq, tensor, position=end) -> a new sequence with tensor inserted."""

    def sequence_insert(seq: list, x: Any, pos: Any = None) -> list:
        out = list(seq)
        if pos is None:
            out.append(x)
        else:
            out.insert(_position(pos, len(seq), True), x)
        return out

    return sequence_insert


def _sequence_erase(ctx: KernelContext) -> ComputeFn:
    """SequenceErase(seq, position=-1) -> a new sequence without that element."""

    def sequence_erase(seq: list, pos: Any = None) -> list:
        out = list(seq)
        del out[_position(-1 if pos is None else pos, len(seq), False)]
        return out

    return sequence_erase


def _sequence_length(ctx: KernelContext) -> ComputeFn:
    """SequenceLength(seq) -> int64 scalar."""

    def sequence_length(seq: list) -> np.ndarray:
        return np.array(len(seq), dtype=np.int64)

    return sequence_length


def _concat_from_sequence(ctx: KernelContext) -> ComputeFn:
    """ConcatFromSequence(seq) along ``axis``; ``new_axis=1`` stacks on a new axis instead."""
    axis = int(ctx.attr("axis"))
    new_axis = bool(ctx.attr("new_axis", 0))
    if new_axis:

        def stack_seq(seq: list) -> np.ndarray:
            return np.stack(seq, axis=axis)

        return stack_seq

    def concat_seq(seq: list) -> np.ndarray:
        return np.concatenate(seq, axis=axis)

    return concat_seq


def _split_points(split: np.ndarray, dim: int) -> list[int]:
    """Split input (scalar chunk size or 1-D sizes) -> cut indices for ``np.split``."""
    s = np.asarray(split)
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise ValueError(f"split size {size} must be positive")
        return list(range(size, dim, size))
    sizes = [int(v) for v in s]
    if sum(sizes) != dim or any(v < 0 for v in sizes):
        raise ValueError(f"split sizes {sizes} do not sum to dimension {dim}")
    return list(np.cumsum(sizes)[:-1])


def _split_to_sequence(ctx: KernelContext) -> ComputeFn:
    """SplitToSequence(x, split?) along ``axis``; without split, size-1 chunks, squeezed
    unless ``keepdims``."""
    axis = int(ctx.attr("axis", 0))
    keepdims = bool(ctx.attr("keepdims", 1))

    def split_to_sequence(x: np.ndarray, split: Any = None) -> list:
        ax = axis + x.ndim if axis < 0 else axis
        if split is None:
            n = x.shape[ax]
            if keepdims:
                return np.split(x, n, axis=ax) if n else []
            return [x[(slice(None),) * ax + (i,)] for i in range(n)]
        return np.split(x, _split_points(split, x.shape[ax]), axis=ax)

    return split_to_sequence


def _sequence_map(ctx: KernelContext) -> ComputeFn:
    """SequenceMap(seq, extra...): run ``body`` on the i-th element of every sequence input
    (tensor inputs are passed whole each time); each body output becomes a sequence."""
    body_fn = ctx.subgraph("body")
    n_in = ctx.n_inputs
    n_out = ctx.n_outputs

    def sequence_map(*args: Any) -> Any:
        ins = args[:n_in]
        captured = args[n_in:]
        is_seq = [isinstance(x, list) for x in ins]
        outs: list[list[Any]] = [[] for _ in range(n_out)]
        for i in range(len(ins[0])):
            r = body_fn([x[i] if s else x for x, s in zip(ins, is_seq, strict=True)], captured)
            for k in range(n_out):
                outs[k].append(r[k])
        return outs[0] if n_out == 1 else tuple(outs)

    return sequence_map


def _optional(ctx: KernelContext) -> ComputeFn:
    """Optional(x?) -> x, or None (an empty optional) without an input."""

    def optional(x: Any = None) -> Any:
        return x

    return optional


def _optional_has_element(ctx: KernelContext) -> ComputeFn:
    """OptionalHasElement(x?) -> bool scalar: x is present (opset 18: tensors, sequences)."""

    def optional_has_element(x: Any = None) -> np.ndarray:
        return np.array(x is not None)

    return optional_has_element


def _optional_get_element(ctx: KernelContext) -> ComputeFn:
    """OptionalGetElement(x) -> x; an empty optional is an error."""

    def optional_get_element(x: Any) -> Any:
        if x is None:
            raise ValueError(f"OptionalGetElement {ctx.node_name!r}: the optional is empty")
        return x

    return optional_get_element


def register_kernels(registry: KernelRegistry) -> None:
    """Register the sequence and optional ops (SequenceMap as a control-flow kernel)."""
    registry.add("SequenceEmpty", _sequence_empty, since=11)
    registry.add("SequenceConstruct", _sequence_construct, since=11)
    registry.add("SequenceAt", _sequence_at, since=11)
    registry.add("SequenceInsert", _sequence_insert, since=11)
    registry.add("SequenceErase", _sequence_erase, since=11)
    registry.add("SequenceLength", _sequence_length, since=11)
    registry.add("ConcatFromSequence", _concat_from_sequence, since=11)
    registry.add("SplitToSequence", _split_to_sequence, since=11)
    registry.add("SequenceMap", _sequence_map, since=17, flags=CONTROL_FLOW)
    registry.add("Optional", _optional, since=15)
    registry.add("OptionalHasElement", _optional_has_element, since=15)
    registry.add("OptionalGetElement", _optional_get_element, since=15)
