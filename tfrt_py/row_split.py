"""Big batches in chunks of rows that fit the caches (issues 32 and 35: a CNN's random
batch of 1..32).

A CNN at a batch of 32 holds tens of megabytes an activation, so every layer streams its
input from memory and writes its output back: MobileNetV2 took 10.0 ms an image at a
batch of 32 against 8.3 as eight calls of 4 (one Zen 4 thread; onnxruntime 7.6), and its
1x1 projections and depthwise convs 50-75% longer an image. Where each output row of the
graph depends only on the same row of the inputs, ``Model.run`` (and ``run_async``)
runs a batch of more than ``RowSplit.rows`` rows as balanced chunks, one call each, and
each chunk writes its rows of the outputs in place (the first chunk's outputs are copied
once into the result, which is then the later chunks' output buffers).

``plan(graph)`` proves the row independence statically, op by op over the optimized graph
-- never by running the model (a probe cannot see a graph that mixes rows only at some
batch sizes): one symbolic first dim ``S`` on every batched input and every output; every
value that has ``S`` has it at axis 0 only and static dims after it; every node is an op
of ``_ROWWISE`` (or one of ``_CHECKED``'s with its attributes checked: a Softmax not over
axis 0, a Reshape by a constant shape that keeps the rows, a Pad of no rows, ...), and
every output of a node that reads rows keeps them at axis 0. Anything else -- shape
arithmetic (``Shape``), control flow, a contraction over rows, an op not listed -- means
no split, and calls run as before; so do calls on more than one thread (``plan``).
``rows``: ``CHUNK_BYTES`` over the largest value's bytes a row, at least 1.

Stateless after ``plan``; ``RowSplit`` is immutable and any thread may run calls on it.
``$TFRT_PY_ROW_SPLIT=0`` switches the split off (read per call: for A/B measurements).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .calls import CallContext
from .concurrency.env_switch import switched_off
from .executors.base import Executor
from .ir import Graph, Node, TensorType, Value

__all__ = ["CHUNK_BYTES", "MAX_CHUNK_ROWS", "RowSplit", "plan"]

#: The bytes of the largest activation a chunk may hold. MobileNetV2 (4.8 MB a row) at a
#: batch of 32, one Zen 4 thread (32 MB of L3), ms an image: chunks of 2 8.30, of 4 8.35,
#: of 8 8.97, the whole batch 9.98; ResNet-18 (3.2 MB a row) the same within 1%.
CHUNK_BYTES = 16 << 20
#: A graph whose chunks would hold more rows than this is not split: its rows are small
#: (an MLP's few kilobytes), splitting gains nothing a cache would see, and its calls of
#: microseconds would pay the check (~1.5 µs: ``Model.run``'s plain path is for models
#: without a split).
MAX_CHUNK_ROWS = 1024
SWITCH = "TFRT_PY_ROW_SPLIT"

# fmt: off
_ONNX_ROWWISE = {
    # convolutions and pools over NCHW (the batch is never a spatial axis)
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool", "InstanceNormalization", "GroupNormalization", "LRN",
    "DepthToSpace", "SpaceToDepth", "Resize", "Upsample",
    # elementwise (a row-free operand broadcasts; a rowed one is the same rows)
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu",
    "Selu", "Celu", "Gelu", "Mish", "Softplus", "Softsign", "Clip", "Erf", "Exp", "Log",
    "Sqrt", "Reciprocal", "Abs", "Neg", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
    "Identity", "Cast", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
    "Where", "Not", "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "IsNaN", "IsInf", "Dropout",
    # rank changes that keep axis 0 (checked by the shapes: rows stay at axis 0)
    "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split",
    # reductions (one over axis 0 loses the rows: the shapes refuse it)
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
    "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare",
    # products of rows by row-free operands (a contraction over rows has no rows out)
    "MatMul", "Gemm",
}
# fmt: on
_FUSED_ROWWISE = {"Conv", "Linear", "SqueezeExcite", "ChannelLayerNorm", "BatchNormAct"}
#: ops whose attributes decide: the check returns why not, or None
_CHECKED: dict[str, Callable[[Node, int], str | None]] = {}


@dataclass(frozen=True)
class RowSplit:
    """How a model's calls split: ``symbol`` the batch dim, ``inputs`` the feeds that have
    it (sliced per chunk; the others passed whole), ``tails`` their dims after the rows
    (a feed of other dims runs whole: its error names the call's shape, not a chunk's),
    ``rows`` the most rows a chunk holds, ``row_bytes`` the largest value's bytes a row."""

    symbol: str
    inputs: frozenset[str]
    tails: tuple[tuple[str, tuple[int, ...]], ...]
    rows: int
    row_bytes: int

    def describe(self) -> str:
        return (f"  rows: every output row reads only its own input rows (dim {self.symbol!r}):"
                f" calls of more than {self.rows} rows run as chunks of at most {self.rows} "
                f"(the largest value {self.row_bytes / 2**20:.2f} MB a row)")  # fmt: skip

    def _n(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None) -> int:
        """The rows of a call to split, or 0: not this call (few rows, feeds that are not
        arrays or disagree, buffers of other rows: the whole call runs and reports)."""
        if switched_off(SWITCH) or not isinstance(feeds, Mapping):
            return 0
        n = -1
        for name, tail in self.tails:
            v = feeds.get(name)
            if type(v) is not np.ndarray or v.shape[1:] != tail or v.ndim == 0:
                return 0
            if n >= 0 and v.shape[0] != n:
                return 0
            n = v.shape[0]
        if n <= self.rows:
            return 0
        if outputs and any(type(b) is not np.ndarray or b.ndim == 0 or b.shape[0] != n
                           for b in outputs.values()):  # fmt: skip
            return 0
        return n

    def _chunks(self, n: int) -> list[tuple[int, int]]:
        parts = -(-n // self.rows)
        edges = [n * k // parts for k in range(parts + 1)]
        return list(itertools.pairwise(edges))

    def _part(self, feeds: Mapping[str, Any], i: int, j: int) -> dict[str, Any]:
        return {k: (v[i:j] if k in self.inputs else v) for k, v in feeds.items()}

    def run(self, runtime: Executor, feeds: Mapping[str, Any],
            outputs: Mapping[str, Any] | None,
            call: CallContext | None) -> dict[str, Any] | None:  # fmt: skip
        """The call's outputs, chunk by chunk through ``runtime.run`` (``run_call`` under
        ``call``: one deadline for all the chunks), or None where this call is not split
        (the caller runs it whole)."""
        n = self._n(feeds, outputs)
        if not n:
            return None
        done = _Chunks(self, n, feeds, outputs)
        for part, bufs in done:
            done.took(runtime.run(part, bufs) if call is None
                      else runtime.run_call(part, bufs, call))  # fmt: skip
        return done.result()

    async def run_async(self, runtime: Executor, feeds: Mapping[str, Any],
                        outputs: Mapping[str, Any] | None,
                        call: CallContext | None) -> dict[str, Any] | None:  # fmt: skip
        """``run`` through ``runtime.run_async`` (the chunks one after another)."""
        n = self._n(feeds, outputs)
        if not n:
            return None
        done = _Chunks(self, n, feeds, outputs)
        for part, bufs in done:
            done.took(await runtime.run_async(part, call, bufs))
        return done.result()


class _Chunks:
    """One split call's chunks -- (feeds, output buffers) for each, in order -- and its
    results: the first chunk's outputs that had no buffer are copied into fresh results of
    ``n`` rows, which are the later chunks' buffers. The calling thread's own."""

    def __init__(self, split: RowSplit, n: int, feeds: Mapping[str, Any],
                 outputs: Mapping[str, Any] | None) -> None:  # fmt: skip
        self._split, self._n, self._feeds = split, n, feeds
        self._res: dict[str, Any] = dict(outputs) if outputs else {}
        self._order: list[str] = []
        self._span = (0, 0)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
        for i, j in self._split._chunks(self._n):
            self._span = (i, j)
            bufs = {k: b[i:j] for k, b in self._res.items()} or None
            yield self._split._part(self._feeds, i, j), bufs

    def took(self, got: Mapping[str, Any]) -> None:
        if self._order:
            return
        self._order = list(got)
        i, j = self._span
        for k, v in got.items():
            if k not in self._res:
                out = np.empty((self._n, *v.shape[1:]), v.dtype)
                out[i:j] = v
                self._res[k] = out

    def result(self) -> dict[str, Any]:
        return {k: self._res[k] for k in self._order}


def plan(graph: Graph, chunk_bytes: int | None = None,
         threads: int = 1) -> tuple[RowSplit | None, str]:  # fmt: skip
    """(the split, "") where ``graph``'s rows are independent (module doc) and its calls
    run on one thread, else (None, why not); chunks of ``chunk_bytes`` (default
    ``CHUNK_BYTES``) of the largest value. With two threads a call on this 2-core Zen 4
    measured no faster in chunks (MobileNetV2 at batches of 8 and 12: 3-10% slower in 4 of
    5 runs, 16 and 32 2-5% faster, runs 10% apart): a chunk's kernels pay their hand-offs
    to the other thread once a call."""
    if threads > 1:
        return None, f"calls run on {threads} threads (chunks pay only on one)"
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    symbol, why = _symbol(graph)
    if symbol is None:
        return None, why
    rowed: set[int] = set()
    row_bytes = 0
    for v in graph.inputs:
        kind = _kind(v, symbol)
        if kind == "bad":
            return None, f"input {v.name!r} has the batch dim {symbol!r} past axis 0"
        if kind == "rows":
            rowed.add(id(v))
            row_bytes = max(row_bytes, _row_bytes(v))
    for node in graph.nodes:
        problem = _node_problem(node, symbol, rowed)
        if problem:
            return None, f"{node.op_type} node {node.name!r:.80}: {problem}"
        for out in node.outputs:
            if out is not None and id(out) in rowed:
                row_bytes = max(row_bytes, _row_bytes(out))
    for v in graph.outputs:
        if id(v) not in rowed:
            return None, f"output {v.name!r} has no rows of dim {symbol!r}"
    rows = max(1, chunk_bytes // max(1, row_bytes))
    if rows > MAX_CHUNK_ROWS:
        return None, f"rows of {row_bytes:,} bytes at most: a chunk would hold {rows:,}"
    tails = tuple((v.name, _tail(v)) for v in graph.inputs if id(v) in rowed)
    return RowSplit(symbol, frozenset(n for n, _ in tails), tails, rows, row_bytes), ""


def _tail(v: Value) -> tuple[int, ...]:
    t = v.type
    assert isinstance(t, TensorType) and t.shape is not None
    return _static(t.shape[1:])


def _symbol(graph: Graph) -> tuple[str | None, str]:
    """The batch symbol: the first dim of every output, a name, on at least one input."""
    dims = set()
    for v in graph.outputs:
        t = v.type
        if not isinstance(t, TensorType) or not t.shape:
            return None, f"output {v.name!r} is not a tensor of known rank"
        dims.add(t.shape[0])
    if len(dims) != 1:
        return None, "the outputs' first dims differ"
    symbol = dims.pop()
    if not isinstance(symbol, str):
        return None, "no symbolic batch dim"
    return symbol, ""


def _kind(v: Value, symbol: str) -> str:
    """ "rows" (the symbol at axis 0 only, static dims after), "free" (no symbol: the same
    for every row), or "bad" (the symbol elsewhere, or dims unknown)."""
    t = v.type
    if v.const is not None:
        return "free"
    if not isinstance(t, TensorType) or t.shape is None or t.dtype is None:
        return "bad"
    if symbol not in t.shape:
        return "free"
    if t.shape[0] != symbol or not all(isinstance(d, int) for d in t.shape[1:]):
        return "bad"
    return "rows"


def _row_bytes(v: Value) -> int:
    t = v.type
    assert isinstance(t, TensorType) and t.shape is not None and t.dtype is not None
    return int(np.prod(_static(t.shape[1:]), dtype=np.int64)) * t.dtype.itemsize


def _static(dims: tuple[Any, ...]) -> tuple[int, ...]:
    """``dims`` known to be ints (``_kind`` "rows": static after the rows)."""
    assert all(isinstance(d, int) for d in dims)
    return tuple(int(d) for d in dims)


def _node_problem(node: Node, symbol: str, rowed: set[int]) -> str | None:
    """Why ``node`` may mix rows (None: it keeps them apart); marks its outputs rowed."""
    if node.domain == "tfrt_py.fused":
        if node.op_type not in _FUSED_ROWWISE:
            return "a fused op not known to keep rows apart"
    elif node.domain not in ("", "ai.onnx"):
        return f"op of domain {node.domain!r}"
    elif node.op_type not in _ONNX_ROWWISE and node.op_type not in _CHECKED:
        return "an op not known to keep rows apart"
    reads_rows = False
    for v in node.inputs:
        if v is None:
            continue
        if id(v) in rowed:
            reads_rows = True
        elif _kind(v, symbol) != "free":
            return f"input {v.name!r} has the batch dim {symbol!r} where rows cannot split"
    check = _CHECKED.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if check is not None:
        why = check(node, node.opset)
        if why:
            return why
    for out in node.outputs:
        if out is None:
            continue
        kind = _kind(out, symbol)
        if reads_rows and kind != "rows":
            return f"output {out.name!r} does not keep the rows at axis 0"
        if kind == "rows":
            if not reads_rows:
                return f"output {out.name!r} has rows no input gives"
            rowed.add(id(out))
        elif kind == "bad":
            return f"output {out.name!r} has the batch dim past axis 0"
    return None


def _rank(node: Node) -> int:
    t = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    return len(t.shape) if isinstance(t, TensorType) and t.shape is not None else 0


def _axis_not_rows(node: Node, opset: int) -> str | None:
    """Softmax, LogSoftmax, Hardmax, LayerNormalization: over an axis past 0 (before
    opset 13 the Softmax family flattens from ``axis``: 0 is every row at once)."""
    default = -1 if node.op_type == "LayerNormalization" or opset >= 13 else 1
    axis = int(node.attrs.get("axis", default))
    if axis < 0:
        axis += _rank(node)
    return None if axis > 0 else f"normalizes over axis {axis}"


def _inference(node: Node, opset: int) -> str | None:
    """BatchNormalization in inference (training mode computes the batch's statistics)."""
    if int(node.attrs.get("training_mode", 0)) or len([o for o in node.outputs if o]) > 1:
        return "batch statistics (training mode)"
    return None


def _const_ints(v: Value | None) -> list[int] | None:
    if v is None or v.const is None:
        return None
    return [int(x) for x in np.asarray(v.const).reshape(-1)]


def _reshape(node: Node, opset: int) -> str | None:
    """A constant shape that keeps the rows: its first entry 0 (the input's rows; not
    with ``allowzero``) or -1 with the rest the row's own elements."""
    shape = _const_ints(node.inputs[1] if len(node.inputs) > 1 else None)
    if not shape:
        return "a shape given at run time"
    if shape[0] == 0 and not int(node.attrs.get("allowzero", 0)):
        return None
    x = node.inputs[0]
    rest = shape[1:]
    if shape[0] == -1 and x is not None and all(d > 0 for d in rest):
        t = x.type
        if isinstance(t, TensorType) and t.shape and all(isinstance(d, int) for d in t.shape[1:]):
            per_row = int(np.prod(_static(t.shape[1:]), dtype=np.int64))
            if int(np.prod(rest, dtype=np.int64)) == per_row:
                return None
    return "a shape that may move rows"


def _no_row_pads(node: Node, opset: int) -> str | None:
    """Pad: no padding (or cropping) on axis 0."""
    pads = node.attrs.get("pads") if opset < 11 else _const_ints(
        node.inputs[1] if len(node.inputs) > 1 else None)  # fmt: skip
    if pads is None:
        return "pads given at run time"
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return "pads of some axes only"
    r = len(pads) // 2
    return None if r and pads[0] == 0 and pads[r] == 0 else "pads on axis 0"


def _not_rows_axis(node: Node, opset: int) -> str | None:
    """Concat: joins along an axis past 0."""
    axis = int(node.attrs.get("axis", 0))
    if axis < 0:
        axis += _rank(node)
    return None if axis > 0 else "joins rows"


_CHECKED.update({
    "Softmax": _axis_not_rows, "LogSoftmax": _axis_not_rows, "Hardmax": _axis_not_rows,
    "LayerNormalization": _axis_not_rows, "BatchNormalization": _inference,
    "Reshape": _reshape, "Pad": _no_row_pads, "Concat": _not_rows_axis,
})  # fmt: skip
