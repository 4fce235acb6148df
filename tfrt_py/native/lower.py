"""Lower a prepared graph (after fusion) into the source of one numba function.

``blockers(graph)`` says cheaply (op types and input shapes only) why a graph cannot
lower: ``describe()`` and ``executor="auto"`` use it. ``lower(graph, program)`` writes
the module: one ``run(a0, ..., P_f4, ...)`` whose arguments are the feeds (C-contiguous,
static shapes, checked again inside) and one packed array per constant dtype. Every
tensor is a flat array plus an offset (``loops.Ref``): feeds and constants are read in
place, intermediates live in one arena per dtype allocated per call (so concurrent calls
share nothing), laid out with the sync interpreter's best-fit planner (``plan.py``) over
node lifetimes, and graph outputs are written straight into fresh arrays. View ops
(Reshape, Flatten, Squeeze, Unsqueeze, Identity) cost nothing: their output is their
input's memory.

The module contains no model text (``source.py``): no node, value or graph names, no
attribute strings, only our identifiers, numbers formatted by ``source.literal``, comments
``# node <index>``, and fixed strings; ``source.audit`` checks it before it is returned.
Any failure while lowering (an op, attribute, shape or dtype the lowering does not know)
is ``Declined``.

Runs at load on the loading thread; the result is immutable.
"""

from __future__ import annotations

import collections
import hashlib
import math
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from ..compiler.load_limits import LOAD_MAX_BYTES, guarded_env, zero_feeds
from ..errors import ExecutionError
from ..executors.plan import ALIGN, Buffer, plan_offsets
from ..executors.program import Program
from ..ir import Graph, Node, TensorType, Value
from .budget import budget, check, precheck
from .emit import copy_strided, tname
from .loops import Ref, strides
from .ops import LOWER
from .runs import find_runs, lower_run_middle
from .source import Declined, audit, literal

__all__ = ["VIEW_OPS", "Declined", "Lowered", "blockers", "lower"]

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
_NP_TYPES = {"f4": "float32", "f8": "float64", "i8": "int64", "i4": "int32", "b1": "boolean"}


@dataclass(frozen=True)
class Lowered:
    """The generated module source and what calling its ``run`` needs. The names are a
    side table (the source never contains them): ``run``'s arguments are the inputs in
    ``input_names`` order, then ``params``; it returns the outputs in ``output_names``
    order; ``input_dtypes`` are the (native byte order) dtypes its signature accepts."""

    source: str
    params: tuple[np.ndarray, ...]
    input_names: list[str]
    output_names: list[str]
    n_nodes: int
    input_dtypes: tuple[np.dtype, ...]
    units: int  # compile units (budget.py)

    @property
    def key(self) -> str:
        """A hash of the source (the compiled code depends on nothing else)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:24]


def _static(v: Value) -> tuple[tuple[int, ...], np.dtype] | None:
    t = v.type
    if not isinstance(t, TensorType) or t.dtype is None or t.shape is None:
        return None
    if not all(isinstance(d, int) for d in t.shape):
        return None
    return tuple(int(d) for d in t.shape), np.dtype(t.dtype)  # type: ignore[arg-type]


def blockers(graph: Graph) -> list[str]:
    """Why ``graph`` cannot lower (empty: it may; ``lower`` can still decline on an
    attribute). Cheap: no code is generated."""
    reasons = []
    for v in graph.inputs:
        st = _static(v)
        if st is None:
            reasons.append(f"input {v.name!r} has dynamic or unknown shape/dtype ({v.type})")
        elif str(st[1]) not in ("float32", "float64", "int64", "int32", "bool"):
            reasons.append(f"input {v.name!r} has dtype {st[1]}")
    bad = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type
        for n in graph.nodes
        if (n.domain, n.op_type) not in LOWER and not (n.domain == "" and n.op_type in VIEW_OPS)
    )
    if bad:
        reasons.append("ops without a native lowering: " + ", ".join(
            f"{k} x{c}" for k, c in bad.most_common()))  # fmt: skip
    return reasons


class NodeContext:
    """What an op lowering sees (``ops.py``): refs of its inputs, destinations for its
    outputs, constants, and ``decline``. One per lowering; not thread-safe."""

    def __init__(self, graph: Graph, shapes: dict[int, tuple[tuple[int, ...], np.dtype]]) -> None:
        self.refs: dict[int, Ref] = {}
        self.shapes = shapes
        # numba's np.dot goes to scipy's OpenBLAS, whose threads fought NumPy's here (M2b:
        # 30 ms instead of 0.3 ms with loops); off until that is understood.
        self.blas = False
        self.tag = "n0_"
        self.node: Node | None = None
        self.step = 0
        self.outputs = {id(v): k for k, v in reversed(list(enumerate(graph.outputs)))}
        self.params: dict[str, list[np.ndarray]] = {}
        self.param_size: dict[str, int] = {}
        self.buffers: dict[int, tuple[Buffer, str]] = {}  # root -> (buffer, dtype alias)
        self.written: set[int] = set()  # output positions already written

    def decline(self, reason: str) -> NoReturn:
        n = self.node
        where = f"{n.op_type} node {n.name!r}: " if n is not None else ""
        raise Declined([where + reason])

    def put_const(self, arr: np.ndarray) -> Ref:
        arr = np.ascontiguousarray(arr)
        t = tname(arr.dtype)
        off = self.param_size.get(t, 0)
        self.params.setdefault(t, []).append(arr.ravel())
        pad = (-(off + arr.size)) % (ALIGN // arr.dtype.itemsize or 1)
        if pad:
            self.params[t].append(np.zeros(pad, arr.dtype))
        self.param_size[t] = off + arr.size + pad
        return Ref(f"P_{t}", literal(off), tuple(arr.shape), arr.dtype)

    def const(self, v: Value) -> np.ndarray | None:
        return None if v.const is None else np.asarray(v.const)

    def ref(self, v: Value | None) -> Ref:
        if v is None:
            self.decline("an omitted input")
        r = self.refs.get(id(v))
        if r is None:
            if v.const is None:
                self.decline(f"value {v.name!r} has no native storage")
            r = self.refs[id(v)] = self.put_const(np.asarray(v.const))
        if r.root >= 0:
            self.buffers[r.root][0].last = self.step
        return r

    def out(self, v: Value | None) -> Ref:
        if v is None:
            self.decline("an omitted output")
        shape, dtype = self.shapes[id(v)]
        k = self.outputs.get(id(v))
        tname(dtype)  # Declined for a dtype the lowering does not know
        if k is not None:
            self.written.add(k)
            r = Ref(f"r{k}", "0", shape, dtype)
        else:
            r = self.new_buffer(shape, dtype)
        self.refs[id(v)] = r
        return r

    def new_buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> Ref:
        """A fresh arena buffer, live from the current step."""
        t = tname(dtype)
        root = len(self.buffers)
        nbytes = math.prod(shape) * dtype.itemsize
        self.buffers[root] = (Buffer(nbytes, self.step, self.step, [f"node {self.step}"]), t)
        return Ref(f"A_{t}", f"@{root}@", shape, dtype, root)

    def extend(self, *refs: Ref) -> None:
        """Keep these arena buffers live up to the current step."""
        for r in refs:
            if r.root >= 0:
                buf = self.buffers[r.root][0]
                buf.last = max(buf.last, self.step)


def _shapes(graph: Graph, program: Program) -> dict[int, tuple[tuple[int, ...], np.dtype]]:
    """Every value's static shape and dtype, from a probe run on zero feeds."""
    specs = []
    for v in graph.inputs:
        st = _static(v)
        assert st is not None
        specs.append(st)
    feeds = zero_feeds(specs)
    try:
        with np.errstate(all="ignore"):
            env = None if feeds is None else guarded_env(program, feeds)
    except ExecutionError as e:  # e.g. a Slice whose steps are a feed: zeros are invalid
        raise Declined([f"shapes cannot be probed on zero feeds ({e})"]) from e
    if env is None:
        raise Declined([f"the shape probe would compute more than {LOAD_MAX_BYTES:,} bytes"])
    out: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
    for ins in program.instrs:
        for val, s in zip(ins.node.outputs, ins.outs):
            x = env[s]
            if val is not None and isinstance(x, (np.ndarray, np.generic)):
                out[id(val)] = (tuple(x.shape), x.dtype)
    return out


def lower(
    graph: Graph, program: Program, *, fastmath: bool = False, limit: int | None = None
) -> Lowered:
    """The module for ``graph`` (compiled as ``program``), at most ``limit`` compile units
    (default ``budget.budget()``: ``$TFRT_PY_NATIVE_BUDGET``). Raises Declined (OverBudget
    above the budget), and only Declined: an unexpected error while lowering becomes one
    too."""
    reasons = blockers(graph)
    if reasons:
        raise Declined(reasons)
    if any(list(n.subgraphs()) for n in graph.nodes):
        raise Declined(["nested graphs"])
    limit = budget() if limit is None else limit
    precheck(graph, limit)
    try:
        return _lower(graph, program, fastmath, limit)
    except Declined:
        raise
    except Exception as e:  # any failure keeps the model off the native tier
        raise Declined([f"lowering failed: {type(e).__name__}: {e}"]) from e


def _lower(graph: Graph, program: Program, fastmath: bool, limit: int) -> Lowered:
    cx = NodeContext(graph, _shapes(graph, program))
    sig, prologue = [], []
    for k, v in enumerate(graph.inputs):
        shape, dtype = _static(v)  # type: ignore[misc]
        cx.refs[id(v)] = Ref(f"x{k}", "0", shape, dtype)
        t = _NP_TYPES[tname(dtype)]
        sig.append(f"types.Array(types.{t}, {len(shape)}, 'C')")
        conds = " or ".join(f"a{k}.shape[{d}] != {literal(n)}" for d, n in enumerate(shape))
        if conds:
            prologue += [f"    if {conds}:", f"        raise ValueError('feed {k}: wrong shape')"]
        prologue.append(f"    x{k} = a{k}.reshape({literal(max(1, math.prod(shape)))})")
    body: list[str] = []
    runs = find_runs(graph, cx)
    nodes = graph.nodes
    i = 0
    while i < len(nodes):
        cx.node, cx.step, cx.tag = nodes[i], i, f"n{i}_"
        body += [f"    # node {i}"]
        body += ["    " + ln for ln in _lower_node(cx, nodes[i])]
        n = runs.get(i, 0)
        if n:
            middle = nodes[i + 1 : i + n - 1]
            cx.node, cx.step, cx.tag = middle[0], i + 1, f"n{i + 1}_"
            first_out = cx.refs[id(nodes[i].outputs[0])]
            loop = lower_run_middle(cx, middle, first_out)
            if loop is not None:
                cx.step = i + n - 2
                cx.extend(*[cx.refs[id(v)] for v in (nodes[i].outputs[0], middle[-1].outputs[0])])
                body += [f"    # nodes {i + 1} to {i + n - 2} as one loop"]
                body += ["    " + ln for ln in loop]
                i += n - 1
                continue
        i += 1
    cx.node, cx.step = None, len(graph.nodes)
    for k, v in enumerate(graph.outputs):
        if k not in cx.written:  # a feed, a constant, a view or a duplicate: copy it
            src = cx.ref(v)
            dst = Ref(f"r{k}", "0", src.shape, src.dtype)
            body += ["    " + ln for ln in copy_strided(dst, src, strides(src.shape))]
            cx.shapes[id(v)] = (src.shape, src.dtype)
    return _assemble(graph, cx, sig, prologue, body, fastmath, limit)


def _lower_node(cx: NodeContext, node: Node) -> list[str]:
    if node.domain == "" and node.op_type in VIEW_OPS:
        if any(v is not None and v.const is None for v in node.inputs[1:]):
            # The output shape would be the probe's, baked in: only constant shapes/axes.
            cx.decline(f"{node.op_type} shape/axes given at run time")
        x = cx.ref(node.inputs[0])
        y = node.outputs[0]
        shape = cx.shapes[id(y)][0] if y is not None else x.shape
        if y is not None and id(y) in cx.outputs:
            return copy_strided(cx.out(y), x, strides(shape))  # same elements, new shape
        if y is not None:
            cx.refs[id(y)] = x.reshaped(shape)
        return []
    fn = LOWER[(node.domain, node.op_type)]
    try:
        return fn(cx, node)
    except Declined:
        raise
    except Exception as e:  # noqa: BLE001 - an attribute, shape or dtype we do not handle
        cx.decline(f"{type(e).__name__}: {e}")


def _assemble(graph: Graph, cx: NodeContext, sig: list[str], prologue: list[str],
              body: list[str], fastmath: bool, limit: int) -> Lowered:  # fmt: skip
    arenas: dict[str, int] = {}
    by_dtype: dict[str, list[tuple[int, Buffer]]] = {}
    for root, (buf, t) in cx.buffers.items():
        by_dtype.setdefault(t, []).append((root, buf))
    subst: dict[str, str] = {}
    for t, items in by_dtype.items():
        size = plan_offsets([b for _, b in items])
        item = np.dtype(_NP_TYPES[t] if t != "b1" else "bool").itemsize
        arenas[t] = max(1, size // item)
        for root, b in items:
            subst[f"@{root}@"] = literal(b.offset // item)
    text = "\n".join(body)
    for token, off in subst.items():
        text = text.replace(token, off)
    param_types = sorted(cx.params)
    params = tuple(np.concatenate(cx.params[t]) for t in param_types)
    sig += [f"types.Array(types.{_NP_TYPES[t]}, 1, 'C')" for t in param_types]
    args = [f"a{k}" for k in range(len(graph.inputs))] + [f"P_{t}" for t in param_types]
    outs = []
    for k, v in enumerate(graph.outputs):
        shape, dtype = cx.shapes[id(v)]
        outs += [f"    o{k} = np.empty({_shape_literal(shape)}, {tname(dtype)})",
                 f"    r{k} = o{k}.reshape({literal(max(1, math.prod(shape)))})"]  # fmt: skip
    ret = ", ".join(f"o{k}" for k in range(len(graph.outputs)))
    src = [
        '"""tfrt_py native code (generated; do not edit)."""',
        "import numpy as np",
        "from numba import njit, types",
        "",
        "f4, f8, i8, i4, b1 = np.float32, np.float64, np.int64, np.int32, np.bool_",
        f"SIG = ({', '.join(sig)}{',' if len(sig) == 1 else ''})",
        "",
        "",
        f"@njit(SIG, cache=True, nogil=True, error_model='numpy', "
        f"fastmath={literal(bool(fastmath))})",
        f"def run({', '.join(args)}):",
        *prologue,
        *[f"    A_{t} = np.empty({literal(n)}, {t})" for t, n in sorted(arenas.items())],
        *outs,
        text,
        f"    return {ret}",
        "",
    ]
    source = "\n".join(src)
    audit(source)
    units = check(source, limit)
    return Lowered(
        source,
        params,
        [v.name for v in graph.inputs],
        [v.name for v in graph.outputs],
        len(graph.nodes),
        tuple(np.dtype(_static(v)[1]) for v in graph.inputs),  # type: ignore[index]
        units,
    )


def _shape_literal(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"({literal(shape[0])},)"
    return "(" + ", ".join(literal(d) for d in shape) + ")"
