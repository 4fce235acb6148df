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
when static (their scan axis moved as for a non-empty output), else come out as empty
float32 ``[0]`` arrays.

Loop and Scan-9+ run by a ``LoopSpec`` / ``ScanSpec`` (``iteration_spec``): ``begin`` on the
node's own inputs, then ``more`` / ``body_inputs`` / ``advance`` per iteration, ``finish``
for the outputs. The kernels are ``spec.run(body_fn, spec.begin(inputs), captured)``; the
dataflow executor drives the same steps itself to make Loop/Scan non-strict. The steps never
read captured values -- only the body does -- so a Loop or Scan that runs zero iterations
needs none of them (that executor relies on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...calls import current_call
from ...ir import Graph, TensorType
from ..base import KernelContext, KernelFlags, SubgraphFn
from ..registry import KernelRegistry

__all__ = ["LoopSpec", "LoopState", "ScanSpec", "ScanState", "iteration_spec", "register_kernels"]

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


class _Iteration:
    """What Loop's and Scan's specs share: ``run``, the kernel's whole call, over the
    steps each defines (``more``, ``body_inputs``, ``advance``, ``finish``)."""

    __slots__ = ()

    def run(self, body_fn: SubgraphFn, st: Any, captured: Sequence[Any]) -> Any:
        """Run the remaining iterations (Scan: slices) with ``body_fn`` and return the
        node's outputs. The thread's current call (deadline, cancellation) is checked
        before each one."""
        call = current_call()
        spec: Any = self
        while spec.more(st):
            if call is not None and call.stop:
                call.raise_stop()
            spec.advance(st, body_fn(spec.body_inputs(st), captured))
        return spec.finish(st)


class LoopSpec(_Iteration):
    """Load-time facts of one Loop node and its iteration steps, shared by the kernel and by
    the dataflow executor's non-strict Loop (which runs the first iteration itself).

    A per-call ``LoopState`` is made by ``begin`` and owned by whoever runs that call; the
    spec itself is immutable. The steps never read captured values: only the body does, so
    a Loop that runs zero iterations (``more`` false after ``begin``) needs none of them.
    """

    __slots__ = ("body", "n_carried", "n_out", "n_scan", "use_cond")

    def __init__(self, ctx: KernelContext) -> None:
        body: Graph = ctx.attr("body")
        self.body = body
        self.n_carried = ctx.n_inputs - 2
        self.n_scan = len(body.outputs) - 1 - self.n_carried
        if self.n_scan < 0:
            raise ctx.unsupported(
                f"body has {len(body.outputs)} outputs for {self.n_carried} loop-carried values"
            )
        self.use_cond = ctx.has_input(1)
        self.n_out = ctx.n_outputs

    def begin(self, inputs: Sequence[Any]) -> LoopState:
        """The state before the first iteration; ``inputs`` are the node's ONNX inputs
        ``(M, cond, carried...)`` (no captures)."""
        M, cond = inputs[0], inputs[1]
        trips = None if M is None else int(np.asarray(M).item())
        go = bool(cond) if self.use_cond and cond is not None else True
        return LoopState(trips, go, list(inputs[2 : 2 + self.n_carried]), self.n_scan)

    def more(self, st: LoopState) -> bool:
        """Whether another iteration runs."""
        return st.go and (st.trips is None or st.i < st.trips)

    def body_inputs(self, st: LoopState) -> list[Any]:
        """The body's formal inputs for the next iteration: (iteration_num, cond, carried...)."""
        return [np.array(st.i, dtype=np.int64), st.cond, *st.carried]

    def advance(self, st: LoopState, outs: Sequence[Any]) -> None:
        """Take one iteration's body outputs ``(cond, carried..., scan elements...)``."""
        n = self.n_carried
        st.carried = list(outs[1 : 1 + n])
        for k in range(self.n_scan):
            st.scans[k].append(outs[1 + n + k])
        if self.use_cond:
            st.cond = outs[0]
            st.go = bool(st.cond)
        st.i += 1

    def finish(self, st: LoopState) -> Any:
        """The node's outputs, as the kernel returns them (one value, or a tuple)."""
        outs = list(st.carried)
        if self.n_scan:
            outs.extend(
                [_stack(s) for s in st.scans]
                if st.i
                else _empty_scans(self.body, 1 + self.n_carried, self.n_scan)
            )
        return outs[0] if self.n_out == 1 else tuple(outs[: self.n_out])


class LoopState:
    """One Loop call's progress: trip count, cond, iteration number, carried values and
    the scan elements so far. Owned by the thread running the call."""

    __slots__ = ("carried", "cond", "go", "i", "scans", "trips")

    def __init__(self, trips: int | None, go: bool, carried: list[Any], n_scan: int) -> None:
        self.trips = trips
        self.go = go
        self.cond = np.array(go)  # the body's cond input: the body's last cond output
        self.i = 0
        self.carried = carried
        self.scans: list[list[Any]] = [[] for _ in range(n_scan)]


# -- Scan ----------------------------------------------------------------------------------------


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _sequences(
    xs: Sequence[np.ndarray], in_axes: Sequence[int], in_rev: Sequence[bool]
) -> list[np.ndarray]:
    """The scan inputs with their scan axis moved to 0, reversed where asked."""
    seqs = []
    for x, ax, rev in zip(xs, in_axes, in_rev, strict=True):
        s = np.moveaxis(x, _norm_axis(ax, x.ndim), 0) if ax else x
        seqs.append(s[::-1] if rev else s)
    return seqs


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
    seqs = _sequences(xs, in_axes, in_rev)
    n_states = len(states)
    T = seqs[0].shape[0] if seqs else 0
    elems: list[list[Any]] = [[] for _ in range(n_scan_out)]
    call = current_call()
    for t in range(T):
        if call is not None and call.stop:
            call.raise_stop()
        outs = body_fn([*states, *(s[t] for s in seqs)], captured)
        states = outs[:n_states]
        for k in range(n_scan_out):
            elems[k].append(outs[n_states + k])
    return states, elems


def _scan_output(elems: list[Any], rev: bool, axis: int, empty: np.ndarray) -> np.ndarray:
    if not elems:  # zero iterations: move the axis too when the element shape is known
        if axis and empty.ndim > 1:
            return np.moveaxis(empty, 0, _norm_axis(axis, empty.ndim))
        return empty
    y = _stack(elems[::-1] if rev else elems)
    if axis:
        y = np.moveaxis(y, 0, _norm_axis(axis, y.ndim))
    return y


class ScanSpec(_Iteration):
    """Load-time facts of one Scan-9+ node and its iteration steps, shared by the kernel and
    by the dataflow executor's non-strict Scan (as ``LoopSpec``: the steps never read
    captured values, so a Scan over zero slices needs none of them)."""

    __slots__ = ("K", "M", "N", "body", "empties", "in_axes", "in_rev", "n_out", "out_axes",
                 "out_rev")  # fmt: skip

    def __init__(self, ctx: KernelContext) -> None:
        body: Graph = ctx.attr("body")
        self.body = body
        M = self.M = int(ctx.attr("num_scan_inputs"))
        N = self.N = ctx.n_inputs - M
        K = self.K = len(body.outputs) - N
        if N < 0 or K < 0:
            raise ctx.unsupported("num_scan_inputs does not match the inputs and the body")
        self.in_axes = [int(a) for a in ctx.attr("scan_input_axes", [0] * M)]
        self.in_rev = [bool(d) for d in ctx.attr("scan_input_directions", [0] * M)]
        self.out_axes = [int(a) for a in ctx.attr("scan_output_axes", [0] * K)]
        self.out_rev = [bool(d) for d in ctx.attr("scan_output_directions", [0] * K)]
        if (len(self.in_axes), len(self.in_rev), len(self.out_axes), len(self.out_rev)) != (
            M, M, K, K,
        ):  # fmt: skip
            raise ctx.unsupported("scan axes/directions attributes have the wrong length")
        self.empties = _empty_scans(body, N, K)
        self.n_out = ctx.n_outputs

    def begin(self, inputs: Sequence[Any]) -> ScanState:
        """The state before the first slice; ``inputs`` are the node's ONNX inputs
        ``(states..., scan inputs...)`` (no captures)."""
        seqs = _sequences(inputs[self.N : self.N + self.M], self.in_axes, self.in_rev)
        return ScanState(list(inputs[: self.N]), seqs, self.K)

    def more(self, st: ScanState) -> bool:
        """Whether another slice is left."""
        return st.t < st.T

    def body_inputs(self, st: ScanState) -> list[Any]:
        """The body's formal inputs for the next slice: (states..., slices...)."""
        t = st.t
        return [*st.states, *(s[t] for s in st.seqs)]

    def advance(self, st: ScanState, outs: Sequence[Any]) -> None:
        """Take one slice's body outputs ``(states..., scan output elements...)``."""
        n = self.N
        st.states = list(outs[:n])
        for k in range(self.K):
            st.elems[k].append(outs[n + k])
        st.t += 1

    def finish(self, st: ScanState) -> Any:
        """The node's outputs, as the kernel returns them (one value, or a tuple)."""
        outs = list(st.states)
        for k in range(self.K):
            outs.append(
                _scan_output(st.elems[k], self.out_rev[k], self.out_axes[k], self.empties[k])
            )
        return outs[0] if self.n_out == 1 else tuple(outs[: self.n_out])


class ScanState:
    """One Scan call's progress: states, the (moved, reversed) scan sequences, the slice
    number and the output elements so far. Owned by the thread running the call."""

    __slots__ = ("T", "elems", "seqs", "states", "t")

    def __init__(self, states: list[Any], seqs: list[Any], n_scan_out: int) -> None:
        self.states = states
        self.seqs = seqs
        self.T = seqs[0].shape[0] if seqs else 0
        self.t = 0
        self.elems: list[list[Any]] = [[] for _ in range(n_scan_out)]


def iteration_spec(ctx: KernelContext) -> LoopSpec | ScanSpec | None:
    """The spec the Loop or Scan-9+ kernel for ``ctx`` runs by, for executors that drive the
    iterations themselves (the dataflow executor's non-strict Loop/Scan); None for any
    other node (Scan-8 included). Raises as the kernel builder would for a bad node."""
    if ctx.domain not in ("", "ai.onnx"):
        return None
    if ctx.op_type == "Loop":
        return LoopSpec(ctx)
    if ctx.op_type == "Scan" and ctx.opset >= 9:
        return ScanSpec(ctx)
    return None


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


def _iterate(spec_type: type[LoopSpec] | type[ScanSpec]) -> Any:
    """The kernel builder for Loop (``LoopSpec``) or Scan-9+ (``ScanSpec``): the spec and
    the body's callable made at load; each call begins a state and runs every iteration."""

    def build(ctx: KernelContext) -> Any:
        spec: Any = spec_type(ctx)  # LoopSpec or ScanSpec: one begin/run protocol
        body_fn = ctx.subgraph("body")
        n_in = ctx.n_inputs

        def iterate(*args: Any) -> Any:
            return spec.run(body_fn, spec.begin(args[:n_in]), args[n_in:])

        return iterate

    return build


def register_kernels(registry: KernelRegistry) -> None:
    """Register If, Loop and Scan (Scan-8 and Scan-9+ semantics)."""
    registry.add("If", _if, since=1, flags=_FLAGS)
    # Loop(M?, cond?, carried...) -> (final carried..., stacked scan outputs...)
    registry.add("Loop", _iterate(LoopSpec), since=1, flags=_FLAGS)
    registry.add("Scan", _scan8, since=8, until=8, flags=_FLAGS)
    # Scan-9+: (states..., scan inputs...) -> (final states..., scan outputs...)
    registry.add("Scan", _iterate(ScanSpec), since=9, flags=_FLAGS)
