"""Kernels: control flow (If, Loop, Scan).

Contract: the compute function is called with the node's ONNX inputs (``ctx.n_inputs`` of
them, ``None`` for omitted ones) followed by the values its subgraphs capture from
enclosing scopes; that trailing tuple is passed unchanged to every subgraph call
(``SubgraphFn(inputs, captured)``). Values may be tensors, sequences (lists) or optionals
(a value or ``None``); loop-carried values pass through untouched, whatever their kind.

* If: runs ``then_branch`` or ``else_branch``; the output count is the branches'.
* Loop (opsets 1+): ``M`` (trip count) and ``cond`` are both optional; when ``cond`` is
  omitted the body's cond output is ignored (a for loop). Body inputs
  ``(iteration_num, cond, carried...)``, outputs ``(cond, carried..., scan elements...)``;
  node outputs are the final carried values then the scan elements stacked on a new axis 0.
* Scan (opset 9+): ``num_scan_inputs`` tensors sliced along ``scan_input_axes`` (reversed per
  ``scan_input_directions``), scan outputs stacked along ``scan_output_axes`` (reversed per
  ``scan_output_directions``). Scan-8: a leading optional ``sequence_lens`` input and a batch
  axis 0 on every state and scan input (scan axis 1), run batch entry by batch entry.

Zero-iteration scan outputs take their element shape from the body's declared output type
when static, else come out as empty float32 ``[0]`` arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir import Graph, TensorType
from .base import KernelContext, KernelFlags, SubgraphFn
from .registry import KernelRegistry

__all__ = ["register_kernels"]

_FLAGS = KernelFlags(pure=True, control_flow=True)


def _empty_scans(body: Graph, first: int, count: int) -> list[np.ndarray]:
    """``[0, *elem_shape]`` arrays for body outputs ``first..first+count`` (zero iterations)."""
    outs = []
    for v in body.outputs[first : first + count]:
        t = v.type
        dtype = np.dtype(np.float32)
        shape: tuple[int, ...] = (0,)
        if isinstance(t, TensorType):
            if t.dtype is not None:
                dtype = t.dtype
            if t.shape is not None and all(isinstance(d, int) for d in t.shape):
                shape = (0, *(int(d) for d in t.shape))  # type: ignore[arg-type]
        outs.append(np.empty(shape, dtype))
    return outs


def _stack(elems: list[Any]) -> np.ndarray:
    """Stack scan elements along a new axis 0 (``np.stack`` accepts 0-d scalars too)."""
    return np.stack(elems)


# -- If ------------------------------------------------------------------------------------------


def _if(ctx: KernelContext) -> Any:
    """If(cond) -> the outputs of then_branch when cond is true, else of else_branch."""
    then_fn = ctx.subgraph("then_branch")
    else_fn = ctx.subgraph("else_branch")
    no_inputs: tuple[()] = ()
    if ctx.n_outputs == 1:

        def if_1(cond: Any, *captured: Any) -> Any:
            return (then_fn if cond else else_fn)(no_inputs, captured)[0]

        return if_1

    def if_n(cond: Any, *captured: Any) -> tuple:
        return tuple((then_fn if cond else else_fn)(no_inputs, captured))

    return if_n


# -- Loop ----------------------------------------------------------------------------------------


def _loop(ctx: KernelContext) -> Any:
    """Loop(M?, cond?, carried...) -> (final carried..., stacked scan outputs...)."""
    body_fn = ctx.subgraph("body")
    body: Graph = ctx.attr("body")
    n_in = ctx.n_inputs
    n_carried = n_in - 2
    n_scan = len(body.outputs) - 1 - n_carried
    if n_scan < 0:
        raise ctx.unsupported(
            f"body has {len(body.outputs)} outputs for {n_carried} loop-carried values"
        )
    use_cond = ctx.has_input(1)
    n_out = ctx.n_outputs
    true = np.array(True)

    def loop(M: Any, cond: Any, *rest: Any) -> Any:
        carried = list(rest[:n_carried])
        captured = rest[n_carried:]
        trips = None if M is None else int(np.asarray(M).item())
        go = bool(cond) if use_cond and cond is not None else True
        cond_arr = np.array(go)
        scans: list[list[Any]] = [[] for _ in range(n_scan)]
        i = 0
        while go and (trips is None or i < trips):
            outs = body_fn([np.array(i, dtype=np.int64), cond_arr, *carried], captured)
            carried = outs[1 : 1 + n_carried]
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            if use_cond:
                cond_arr = outs[0]
                go = bool(cond_arr)
            else:
                cond_arr = true
            i += 1
        if n_scan:
            carried.extend(
                [_stack(s) for s in scans] if i else _empty_scans(body, 1 + n_carried, n_scan)
            )
        return carried[0] if n_out == 1 else tuple(carried[:n_out])

    return loop


# -- Scan ----------------------------------------------------------------------------------------


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _scan_core(
    body_fn: SubgraphFn,
    states: list[Any],
    xs: Sequence[np.ndarray],
    in_axes: Sequence[int],
    in_rev: Sequence[bool],
    n_scan_out: int,
    captured: Sequence[Any],
) -> tuple[list[Any], list[list[Any]]]:
    """Run the body over the scan inputs' slices; return final states, per-output elements
    in iteration order."""
    seqs = []
    for x, ax, rev in zip(xs, in_axes, in_rev, strict=True):
        s = np.moveaxis(x, _norm_axis(ax, x.ndim), 0) if ax else x
        seqs.append(s[::-1] if rev else s)
    n_states = len(states)
    T = seqs[0].shape[0] if seqs else 0
    elems: list[list[Any]] = [[] for _ in range(n_scan_out)]
    for t in range(T):
        outs = body_fn([*states, *(s[t] for s in seqs)], captured)
        states = outs[:n_states]
        for k in range(n_scan_out):
            elems[k].append(outs[n_states + k])
    return states, elems


def _scan_output(elems: list[Any], rev: bool, axis: int, empty: np.ndarray) -> np.ndarray:
    if not elems:
        return empty
    y = _stack(elems[::-1] if rev else elems)
    if axis:
        y = np.moveaxis(y, 0, _norm_axis(axis, y.ndim))
    return y


def _scan(ctx: KernelContext) -> Any:
    """Scan-9+: (states..., scan inputs...) -> (final states..., scan outputs...)."""
    body_fn = ctx.subgraph("body")
    body: Graph = ctx.attr("body")
    M = int(ctx.attr("num_scan_inputs"))
    n_in = ctx.n_inputs
    N = n_in - M
    K = len(body.outputs) - N
    if N < 0 or K < 0:
        raise ctx.unsupported("num_scan_inputs does not match the inputs and the body")
    in_axes = [int(a) for a in ctx.attr("scan_input_axes", [0] * M)]
    in_rev = [bool(d) for d in ctx.attr("scan_input_directions", [0] * M)]
    out_axes = [int(a) for a in ctx.attr("scan_output_axes", [0] * K)]
    out_rev = [bool(d) for d in ctx.attr("scan_output_directions", [0] * K)]
    if len(in_axes) != M or len(in_rev) != M or len(out_axes) != K or len(out_rev) != K:
        raise ctx.unsupported("scan axes/directions attributes have the wrong length")
    empties = _empty_scans(body, N, K)
    n_out = ctx.n_outputs

    def scan(*args: Any) -> Any:
        states, elems = _scan_core(
            body_fn, list(args[:N]), args[N:n_in], in_axes, in_rev, K, args[n_in:]
        )
        outs = [*states]
        for k in range(K):
            outs.append(_scan_output(elems[k], out_rev[k], out_axes[k], empties[k]))
        return outs[0] if n_out == 1 else tuple(outs[:n_out])

    return scan


def _scan8(ctx: KernelContext) -> Any:
    """Scan-8: (sequence_lens?, states..., scan inputs...), batch axis 0 everywhere."""
    body_fn = ctx.subgraph("body")
    body: Graph = ctx.attr("body")
    M = int(ctx.attr("num_scan_inputs"))
    n_in = ctx.n_inputs
    N = n_in - 1 - M
    K = len(body.outputs) - N
    if N < 0 or K < 0:
        raise ctx.unsupported("num_scan_inputs does not match the inputs and the body")
    in_rev = [bool(d) for d in ctx.attr("directions", [0] * M)]
    if len(in_rev) != M:
        raise ctx.unsupported("directions has the wrong length")
    zero_axes = [0] * M
    empties = _empty_scans(body, N, K)
    n_out = ctx.n_outputs

    def scan8(seq_lens: Any, *args: Any) -> Any:
        states0 = args[:N]
        xs = args[N : n_in - 1]
        captured = args[n_in - 1 :]
        batch = xs[0].shape[0] if xs else states0[0].shape[0]
        T = xs[0].shape[1] if xs else 0
        lens = [T] * batch if seq_lens is None else [int(v) for v in np.ravel(seq_lens)]
        final: list[list[Any]] = [[] for _ in range(N)]
        per_out: list[list[np.ndarray]] = [[] for _ in range(K)]
        for b in range(batch):
            n = lens[b]
            states, elems = _scan_core(
                body_fn, [s[b] for s in states0], [x[b, :n] for x in xs], zero_axes, in_rev, K,
                captured,
            )  # fmt: skip
            for j in range(N):
                final[j].append(states[j])
            for k in range(K):
                y = _scan_output(elems[k], False, 0, empties[k])
                if n < T:  # pad short sequences with zeros up to the batch's length
                    pad = np.zeros((T - n, *y.shape[1:]), y.dtype)
                    y = np.concatenate([y, pad]) if n else pad
                per_out[k].append(y)
        outs = [_stack(f) for f in final] + [_stack(p) for p in per_out]
        return outs[0] if n_out == 1 else tuple(outs[:n_out])

    return scan8


def register_kernels(registry: KernelRegistry) -> None:
    """Register If, Loop and Scan (Scan-8 and Scan-9+ semantics)."""
    registry.add("If", _if, since=1, flags=_FLAGS)
    registry.add("Loop", _loop, since=1, flags=_FLAGS)
    registry.add("Scan", _scan8, since=8, until=8, flags=_FLAGS)
    registry.add("Scan", _scan, since=9, flags=_FLAGS)
