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
from typing import Any

import numpy as np

from ...compiler.load_limits import LOAD_MAX_BYTES, guarded_env, zero_feeds
from ...errors import ExecutionError
from ...executors.plan import Buffer, plan_offsets
from ...executors.program import Program
from ...ir import Graph, Node, TensorType, Value
from ...kernels.fused.domain import DOMAIN
from ...kernels.lib import blas
from ...records import record
from . import registry
from .budget import OverBudget, budget, check, precheck
from .cache import cache_pairs, cache_prologue, is_stack_view, stack_view
from .context import CACHE_DECLINE, NodeContext
from .emit import BLAS_IMPORT, EXP_IMPORT, copy_strided, tname
from .fold import shape_arithmetic, shape_values
from .loops import Ref, strides
from .ops_ml import KERNEL_IMPORTS, kernel_version
from .registry import lowerings
from .rows_source import NP_TYPES, TILE_ROWS, row_refs, rows_functions, tuple_text
from .rowwise import check_rows
from .runs import find_runs, lower_run_middle
from .source import Declined, audit, literal

__all__ = [
    "VIEW_OPS",
    "Declined",
    "Lowered",
    "Room",
    "blockers",
    "dynamic_inputs",
    "lower",
    "probe",
]

#: The default domain's views: their output is their input's memory (no code).
VIEW_OPS = frozenset(registry.VIEW_OPS)
#: Rows mode builds a tile for math that vectorizes across rows only (``_vector_math``) in
#: graphs of at most this many nodes: Exp's (a NaiveBayes's 10-19 nodes), and a linear
#: model's or forest's many-row code beside other ops (``MANY_ROW_NODES``).
VECTOR_MATH_NODES = 20
MANY_ROW_NODES = 10
#: Grouped ops with no many-row code of their own: ZipMap (the entry makes its dicts) and
#: SVMClassifier (its tile body calls the one-row kernel per row).
_NO_MANY_ROW_CODE = frozenset({"ZipMap", "SVMClassifier"})


@record(frozen=True)
class Room:
    """What ``generic.py`` holds fixed while it lowers the samples of a box, as the box's
    top lowered them: bytes per arena buffer and elements per constant (each at least
    a sample's own), and the choices between forms of code (``NodeContext.choose``)."""

    arena: tuple[int, ...]
    consts: tuple[int, ...]
    choices: tuple[bool, ...]


@record(frozen=True)
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
    #: "static" (declared static shapes), "signature" (one input signature's shapes,
    #: ``shapes``), "rows" (any batch size: the graph lowered for one row, looped) or
    #: "box" (every signature whose dim variables lie in ``box``: ``generic.py``).
    mode: str = "static"
    shapes: tuple[tuple[int, ...], ...] = ()
    #: Per output: None (the array), ("zipmap", labels) or ("labels", names): the entry
    #: turns the function's array into a list of dicts / maps label indices to strings.
    finishers: tuple[Any, ...] = ()
    #: Rows mode: which inputs are batched; each output's shape without the batch dim.
    batched: tuple[bool, ...] = ()
    out_rows: tuple[tuple[int, ...], ...] = ()
    out_dtypes: tuple[np.dtype, ...] = ()
    #: Signature mode: per arena buffer (in the order the lowering made them) its dtype
    #: alias, bytes, first and last step: what ``generic.lower_box`` plans with.
    arena: tuple[tuple[str, int, int, int], ...] = ()
    #: Signature mode: per constant packed, its dtype alias, offset in ``P_<alias>`` and
    #: size (elements).
    consts: tuple[tuple[str, int, int], ...] = ()
    #: Signature mode: the choices between two correct forms of code the lowering made
    #: (``NodeContext.choose``), in order.
    choices: tuple[bool, ...] = ()
    #: Box mode: per dim variable, the values (lo, hi] the function serves.
    box: tuple[tuple[int, int], ...] = ()
    #: Per input: None, or the vocabulary of the ``StringIds`` node that alone reads it (a
    #: string input): the entry maps the feed to ids (``kernels.fused.ml.encoder``) and
    #: the function takes those (int64); ``input_dtypes`` holds the feed's dtype.
    encoders: tuple[Any, ...] = ()
    #: (past input, present output) index pairs of a KV cache written in place
    #: (``cache.py``): ``run`` takes a buffer per pair after the inputs, then the caller's
    #: view of it per pair, then ``params``
    caches: tuple[tuple[int, int], ...] = ()
    #: Rows mode: the rows its tile body runs at once (``TILE_ROWS``), 0 without one.
    tile_rows: int = 0

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


def dynamic_inputs(graph: Graph) -> list[bool]:
    """Per input: whether any of its dims is not a fixed int (a symbol or unknown)."""
    return [_static(v) is None for v in graph.inputs]


def encoded_inputs(graph: Graph) -> dict[int, tuple[str, ...]]:
    """Input index -> vocabulary, for each string input whose one reader is a
    ``tfrt_py.fused::StringIds`` (``compiler/encode_strings.py``) and which is no graph
    output: the entry maps it to ids, the function never sees strings."""
    readers: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for x in n.inputs:
            if x is not None:
                readers.setdefault(id(x), []).append(n)
    outs = {id(v) for v in graph.outputs}
    got = {}
    for k, v in enumerate(graph.inputs):
        rs = readers.get(id(v), [])
        if (len(rs) == 1 and rs[0].domain == DOMAIN and rs[0].op_type == "StringIds"
                and id(v) not in outs):  # fmt: skip
            got[k] = tuple(rs[0].attrs["vocab"])
    return got


def _as_called(graph: Graph, specs: list[Any]) -> list[Any]:
    """``specs`` with the encoded inputs as the function gets them: int64 ids."""
    encoded = encoded_inputs(graph)
    return [(shape, np.dtype(np.int64)) if k in encoded else (shape, dt)
            for k, (shape, dt) in enumerate(specs)]  # fmt: skip


def blockers(graph: Graph) -> list[str]:
    """Why ``graph`` cannot lower (empty: it may; ``lower`` can still decline on an
    attribute, a dynamic dim it cannot loop over, ...). Cheap: no code is generated."""
    reasons = []
    encoded = encoded_inputs(graph)
    for k, v in enumerate(graph.inputs):
        t = v.type
        if not isinstance(t, TensorType) or t.dtype is None or t.shape is None:
            reasons.append(f"input {v.name!r} has unknown rank or dtype ({v.type})")
        elif k in encoded:
            continue  # strings mapped to ids by the entry
        elif str(t.dtype) not in ("float32", "float64", "int64", "int32", "bool"):
            reasons.append(f"input {v.name!r} has dtype {t.dtype}")
    folded = {id(n) for n in shape_arithmetic(graph)}  # constants per signature
    bad = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type
        for n in graph.nodes
        if (n.domain, n.op_type) not in lowerings() and id(n) not in folded
    )
    if bad:
        reasons.append("ops without a native lowering: " + ", ".join(
            f"{k} x{c}" for k, c in bad.most_common()))  # fmt: skip
    return reasons


def probe(graph: Graph, program: Program, shapes: list[tuple[int, ...]]) -> None:
    """Run the shape probe for this input signature alone; Declined when it fails (the
    model cannot run at these shapes, or would compute too much)."""
    _probe(graph, program, _input_specs(graph, shapes, None))


def folded_values(graph: Graph, program: Program,
                  shapes: list[tuple[int, ...]]) -> dict[int, np.ndarray]:  # fmt: skip
    """The shape arithmetic a signature's lowering folds into constants (value id ->
    value; ``fold.shape_values``); Declined when the probe fails."""
    return shape_values(graph, _probe(graph, program, _input_specs(graph, shapes, None))[1])


def _shapes(
    graph: Graph, program: Program, specs: list[tuple[tuple[int, ...], np.dtype]]
) -> dict[int, tuple[tuple[int, ...], np.dtype]]:
    """Every value's shape and dtype for inputs of these (shape, dtype), from a probe run
    on zero feeds."""
    return _probe(graph, program, specs)[0]


def _probe(
    graph: Graph, program: Program, specs: list[tuple[tuple[int, ...], np.dtype]]
) -> tuple[dict[int, tuple[tuple[int, ...], np.dtype]], dict[int, Any]]:
    """(every value's shape and dtype, every value) for inputs of these (shape, dtype),
    from a probe run on zero feeds."""
    feeds = zero_feeds(specs, attend=True)
    if feeds is not None:  # a string input holds a known value (an encoder may refuse others)
        for k, vocab in encoded_inputs(graph).items():
            if vocab:
                feeds[k] = np.full(feeds[k].shape, vocab[0], dtype=object)
    try:
        with np.errstate(all="ignore"):
            env = None if feeds is None else guarded_env(program, feeds)
    except ExecutionError as e:  # e.g. an index a feed gives past a dim of 1
        raise Declined([f"shapes cannot be probed on zero feeds ({e})"]) from e
    if env is None:
        raise Declined([f"the shape probe would compute more than {LOAD_MAX_BYTES:,} bytes"])
    out: dict[int, tuple[tuple[int, ...], np.dtype]] = {
        id(v): spec for v, spec in zip(graph.inputs, specs)
    }
    values: dict[int, Any] = {}
    for ins in program.instrs:
        for val, s in zip(ins.node.outputs, ins.outs):
            x = env[s]
            if val is not None and isinstance(x, (np.ndarray, np.generic)):
                out[id(val)] = (tuple(x.shape), x.dtype)
                values[id(val)] = np.asarray(x)
    return out, values


def _input_specs(
    graph: Graph, shapes: list[tuple[int, ...]] | None, batch: int | None
) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) per input: the declared static shape, ``shapes`` (a signature), or
    with dynamic first dims set to ``batch`` (rows mode); Declined otherwise."""
    specs = []
    for k, v in enumerate(graph.inputs):
        t = v.type
        assert isinstance(t, TensorType) and t.shape is not None and t.dtype is not None
        dims = list(t.shape)
        if shapes is not None:
            if len(shapes[k]) != len(dims):
                raise Declined([f"input {k}: rank {len(shapes[k])}, declared {len(dims)}"])
            dims = list(shapes[k])
        elif batch is not None and dims and not isinstance(dims[0], int):
            dims[0] = batch
        if not all(isinstance(d, int) for d in dims):
            raise Declined([f"input {v.name!r} has dynamic or unknown shape ({t})"])
        specs.append((tuple(int(d) for d in dims), np.dtype(t.dtype)))  # type: ignore[arg-type]
    return specs


def lower(
    graph: Graph,
    program: Program,
    *,
    fastmath: bool = False,
    limit: int | None = None,
    shapes: list[tuple[int, ...]] | None = None,
    rows: bool = False,
    room: Room | None = None,
    audited: bool = True,
    keep: frozenset[int] = frozenset(),
    spell: frozenset[int] = frozenset(),
    cache: bool | None = None,
) -> Lowered:
    """The module for ``graph`` (compiled as ``program``), at most ``limit`` compile units
    (default ``budget.budget()``: ``$TFRT_PY_NATIVE_BUDGET``). ``shapes`` lowers one input
    signature of a graph with dynamic dims; ``rows`` lowers the graph for one row and loops
    over a dynamic first dim (``rowwise``: only when rows are independent); ``room``
    (with ``shapes``) lays the arena and the constants out as ``Room`` says and makes its
    choices (``generic`` lowers every signature of a box as its top); ``audited=False``
    skips ``source.audit`` (``generic`` audits the module it makes of the samples);
    ``keep``: ids of shape-arithmetic values lowered as code, not folded into constants
    (``generic``: those whose size changes inside a box); ``spell``: folded values a node
    reads as data written into the arena by code (``NodeContext.spelled``); ``cache``:
    a signature's KV cache written in place (``cache.py``) -- None tries it and lowers
    again with the cache copied where only that form declines (``generic`` passes the
    top's outcome to its samples).
    Raises Declined (OverBudget above the budget), and only Declined: an unexpected error
    while lowering becomes one too."""
    reasons = blockers(graph)
    if reasons:
        raise Declined(reasons)
    if any(list(n.subgraphs()) for n in graph.nodes):
        raise Declined(["nested graphs"])
    limit = budget() if limit is None else limit
    precheck(graph, limit)
    pairs = cache_pairs(graph) if shapes is not None and not rows and cache is not False else ()
    try:
        try:
            return _lower(graph, program, fastmath, limit, shapes, rows, room, audited, keep,
                          spell, pairs)  # fmt: skip
        except Declined as e:
            if not pairs or cache or not any(r.startswith(CACHE_DECLINE) for r in e.reasons):
                raise
        return _lower(graph, program, fastmath, limit, shapes, rows, room, audited, keep,
                      spell, ())  # fmt: skip
    except Declined:
        raise
    except Exception as e:  # any failure keeps the model off the native tier
        raise Declined([f"lowering failed: {type(e).__name__}: {e}"]) from e


def _lower(graph: Graph, program: Program, fastmath: bool, limit: int,
           shapes: list[tuple[int, ...]] | None, rows: bool,
           room: Room | None = None, audited: bool = True,
           keep: frozenset[int] = frozenset(),
           spell: frozenset[int] = frozenset(),
           pairs: tuple[tuple[int, int], ...] = ()) -> Lowered:  # fmt: skip
    batched = [False] * len(graph.inputs)
    if rows:
        if any(n.domain == "" and n.op_type in ("Shape", "Size") for n in shape_arithmetic(graph)):
            # its values change with the batch size: one signature at a time folds them
            raise Declined(["rows: shape arithmetic (Shape) depends on the batch size"])
        dyn = dynamic_inputs(graph)
        for k, v in enumerate(graph.inputs):
            dims = v.type.shape  # type: ignore[union-attr]
            if dyn[k] and not (dims and all(isinstance(d, int) for d in dims[1:])):
                raise Declined([f"rows: input {v.name!r} is dynamic beyond its first dim"])
        batched = dyn
        specs = _input_specs(graph, None, 1)
        s1 = _shapes(graph, program, specs)
        check_rows(graph, s1, _shapes(graph, program, _input_specs(graph, None, 2)), batched)
        cx = NodeContext(graph, s1)
        cx.packed_products = True
    else:
        specs = _input_specs(graph, shapes, None)
        probed, values = _probe(graph, program, specs)
        cx = NodeContext(graph, probed)
        if room is not None:
            cx.const_room, cx.replay = room.consts, room.choices
        # one signature's big products on NumPy's gemm (a transformer's projections; the
        # loops reach a third of its rate there); small ones stay loops (BLAS_MIN_MACS)
        cx.blas = shapes is not None and blas.available()
        cx.packed_products = shapes is not None
        # one signature: the shape arithmetic is constants (rows mode probes two batch
        # sizes, whose shape values differ: it keeps the nodes)
        for vid, arr in shape_values(graph, values).items():
            if vid not in keep:
                cx.folded[vid] = arr
        cx.spelled = spell
    sig, prologue = [], []
    pasts = {k for k, _ in pairs}
    for k, (shape, dtype) in enumerate(_as_called(graph, specs)):
        t = NP_TYPES[tname(dtype)]
        # Feeds are typed read-only: the code never writes them, and a read-only array
        # (Ray's object store, np.frombuffer over a request) then calls it without a copy;
        # a writable one converts to the read-only type in numba's dispatcher at no cost.
        # A cache's past may be a view of its buffer: any layout, never read flat.
        layout = "A" if k in pasts else "C"
        sig.append(f"types.Array(types.{t}, {len(shape)}, '{layout}', readonly=True)")
        lo = 1 if batched[k] else 0
        conds = " or ".join(f"a{k}.shape[{d}] != {literal(n)}" for d, n in enumerate(shape)
                            if d >= lo)  # fmt: skip
        if batched[k]:
            more = f"a{k}.shape[0] != nb"
            conds = f"{conds} or {more}" if conds else more
        if conds:
            prologue += [f"    if {conds}:", f"        raise ValueError('feed {k}: wrong shape')"]
        size = f"nb * {literal(max(1, math.prod(shape)))}" if batched[k] else literal(
            max(1, math.prod(shape)))  # fmt: skip
        if k not in pasts:
            prologue.append(f"    x{k} = a{k}.reshape({size})")
    if pairs:
        prologue += cache_prologue(cx, pairs, graph)
        sig += [f"types.Array(types.float32, {len(specs[k][0])}, 'C')" for k, _ in pairs]
        sig += [f"types.Array(types.float32, {len(specs[k][0])}, 'A', readonly=True)"
                for k, _ in pairs]  # fmt: skip
    body = _body(graph, cx, specs, batched)
    if cx.blas and any("gemm_f" in ln for ln in body):
        cx.imports.add(BLAS_IMPORT)
    tile = _tile(graph, program, cx, batched) if rows else None
    if tile is not None:
        try:
            return _assemble(graph, cx, sig, prologue, body, fastmath, limit, specs,
                             batched, False, tile=tile)  # fmt: skip
        except OverBudget:
            pass  # the tile body doubles the code: rows one at a time fit
    return _assemble(graph, cx, sig, prologue, body, fastmath, limit, specs, batched,
                     shapes is not None, sizes=None if room is None else room.arena,
                     audited=audited, pairs=pairs)  # fmt: skip


def _body(graph: Graph, cx: NodeContext, specs: list[Any], batched: list[bool],
          tile: bool = False) -> list[str]:  # fmt: skip
    """The lines computing every node into ``cx``'s refs (inputs bound to ``x<k>``,
    outputs to ``r<k>``; in rows mode (``rows_source.row_refs``) batched inputs to ``xv<k>``
    and outputs to ``rv<k>``, views from the current row (or ``tile``'s first row), so
    every index is provably non-negative: numba then adds no negative-index wraparound,
    and LLVM vectorizes the loops; a row narrower than ``ROW_VIEW_MIN`` elements is read
    and written at the offset ``xo<k>``/``ro<k>`` instead, without a view's reference
    counting on every row)."""
    for k, (v, (shape, dtype)) in enumerate(zip(graph.inputs, _as_called(graph, specs))):
        buf, off = row_refs("x", k, shape, tile) if batched[k] else (f"x{k}", "0")
        cx.refs[id(v)] = Ref(buf, off, shape, dtype)
    if any(batched):
        for k, v in enumerate(graph.outputs):  # a feed or constant output: shape later
            known = cx.shapes.get(id(v))
            cx.out_buf[k] = row_refs("r", k, known[0], tile) if known else (f"rv{k}", "0")
    body: list[str] = []
    runs = find_runs(graph, cx)
    nodes = graph.nodes
    i = 0
    while i < len(nodes):
        cx.node, cx.step, cx.tag = nodes[i], i, f"n{i}_"
        if nodes[i].outputs and all(v is None or id(v) in cx.folded for v in nodes[i].outputs):
            body += [f"    # node {i}: folded"]  # shape arithmetic: constants here
            i += 1
            continue
        if _only_shape_read(cx, nodes[i]):
            body += [f"    # node {i}: only its shape is read"]
            i += 1
            continue
        body += [f"    # node {i}"]
        lines = _lower_node(cx, nodes[i])
        body += ["    " + ln for ln in [*cx.pre, *lines]]
        cx.pre = []
        n = runs.get(i, 0)
        if n:
            middle = nodes[i + 1 : i + n - 1]
            cx.node, cx.step, cx.tag = middle[0], i + 1, f"n{i + 1}_"
            first_out = cx.refs[id(nodes[i].outputs[0])]
            loop = lower_run_middle(cx, middle, first_out)
            if loop is not None:
                loop, cx.pre = [*cx.pre, *loop], []
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
            src = cx.refs[id(v)] if id(v) in cx.refs else cx.ref(v)
            buf, off = cx.out_buf.get(k, (f"r{k}", "0"))
            dst = Ref(buf, off, src.shape, src.dtype)
            lines, cx.pre = [*cx.pre, *copy_strided(dst, src, strides(src.shape))], []
            body += ["    " + ln for ln in lines]
            cx.shapes[id(v)] = (src.shape, src.dtype)
            cx.written.add(k)
    return body


def _only_shape_read(cx: NodeContext, node: Node) -> bool:
    """Whether no node reads ``node``'s outputs' data: none is a graph output and every
    reader is folded shape arithmetic (a Shape of T5's K heads). The folded readers took
    the shapes from the probe; the node need not run."""
    outs = [v for v in node.outputs if v is not None]
    if not outs or node.domain != "" or node.op_type not in _DATA_ONLY:
        return False
    for v in outs:
        if id(v) in cx.outputs:
            return False
        for reader, _ in cx.consumers.get(id(v), ()):
            if not reader.outputs or not all(o is None or id(o) in cx.folded
                                             for o in reader.outputs):  # fmt: skip
                return False
    return True


#: Ops whose only effect is their outputs' data (never raise on data they are given a
#: valid shape for): the ones ``_only_shape_read`` may leave out.
_DATA_ONLY = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                        "Identity", "Cast", "Relu", "Add", "Sub", "Mul", "Div", "MatMul",
                        "Concat"})  # fmt: skip


def _tile(graph: Graph, program: Program, row_cx: NodeContext,
          batched: list[bool]) -> tuple[NodeContext, list[str]] | None:  # fmt: skip
    """Rows mode: the body for ``TILE_ROWS`` rows at once, with its big products on
    NumPy's gemm, or a graph of grouped ops only (``OpLowering.grouped``: their many-row
    code), or a small graph with math that vectorizes across rows only (``_vector_math``),
    and its context (which holds the row body's constants too); None when the graph is
    none of these or has no product big enough there for BLAS (where BLAS can be called).
    String labels and ZipMap outputs are the same arrays either way (the entry's finishers
    map them after the call)."""
    reg = lowerings()
    records = [reg.get(n.domain, n.op_type) for n in graph.nodes]
    # grouped code pays for the tile's second copy of the graph where it is the whole row
    # (a lone LinearClassifier: 1,000 rows 17.4 -> 12.8 µs) or the graph is small; not in a
    # 12-node one-hot pipeline before one (106 -> 102 µs, its compile 2.0 -> 4.4 s)
    grouped = bool(records) and all(r is not None and (r.grouped or r.view) for r in records)
    vector = _vector_math(graph, records)
    with_blas = blas.available()
    if not (grouped or vector or (with_blas and any(r is not None and r.product for r in records))):
        return None
    try:
        specs = _input_specs(graph, None, TILE_ROWS)
        cx = NodeContext(graph, _shapes(graph, program, specs))
        cx.blas = with_blas
        cx.packed_products = True
        cx.share_constants(row_cx)
        body = _body(graph, cx, specs, batched, tile=True)
    except Declined:
        return None
    products = any("gemm_" in ln for ln in body)  # NumPy's gemm or the packed kernel
    if not (grouped or vector or products):
        return None
    if products:
        cx.imports.add(BLAS_IMPORT)
    return cx, body


def _vector_math(graph: Graph, records: list[Any]) -> bool:
    """Whether a small graph (``VECTOR_MATH_NODES``) has math that vectorizes across rows
    only: a float Exp or ReduceLogSumExp (``fastmath.expf_rn``: a row's 3-10 classes are no
    vector; a ComplementNB at 1,000 rows 66 -> 31 µs, a MultinomialNB's 17 nodes 77 -> 40),
    or, in at most ``MANY_ROW_NODES``, an op with many-row code beside others (a
    LogisticRegression's LinearClassifier and its Normalizer: 33 -> 22 µs). The tile is a
    second copy of the graph's code: its compile took 1.6 -> 3.2 s for those two, so a
    bigger graph, whose rows cost more than such math, goes without."""
    nodes = len(graph.nodes)
    if nodes > VECTOR_MATH_NODES:
        return False
    exp = any(n.domain == "" and n.op_type in ("Exp", "ReduceLogSumExp") for n in graph.nodes)
    many_row = any(
        r is not None and r.grouped and n.op_type not in _NO_MANY_ROW_CODE
        for n, r in zip(graph.nodes, records)
    )
    return exp or (many_row and nodes <= MANY_ROW_NODES)


def _lower_node(cx: NodeContext, node: Node) -> list[str]:
    first = node.inputs[0] if node.inputs else None
    if first is not None and id(first) in cx.label_tables:
        return _label_view(cx, node, first)
    if is_stack_view(cx, node):  # grouped KV heads over a cache in place
        return stack_view(cx, node)
    if node.domain == "" and node.op_type in VIEW_OPS:
        if any(v is not None and cx.const(v) is None for v in node.inputs[1:]):
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
    record = lowerings().get(node.domain, node.op_type)
    if record is None or record.emit is None:
        cx.decline(f"{node.op_type} has no native lowering")
    try:
        return record.emit(cx, node)
    except Declined:
        raise
    except Exception as e:  # noqa: BLE001 - an attribute, shape or dtype we do not handle
        cx.decline(f"{type(e).__name__}: {e}")


def _label_view(cx: NodeContext, node: Node, x_v: Value) -> list[str]:
    """A view (or Cast to string) of string label indices: the same indices, the same
    table; the entry maps them when they reach an output."""
    to_str = node.op_type == "Cast" and int(node.attrs.get("to", 0)) == 8
    y = node.outputs[0]
    if not (node.domain == "" and (node.op_type in VIEW_OPS or to_str)) or y is None:
        cx.decline("string labels read by an op other than a view")
    if any(v is not None and v.const is None for v in node.inputs[1:]):
        cx.decline(f"{node.op_type} shape/axes given at run time")
    x = cx.refs[id(x_v)]
    shape = cx.shapes[id(y)][0] if id(y) in cx.shapes else x.shape
    cx.refs[id(y)] = x.reshaped(shape)
    cx.shapes[id(y)] = (tuple(shape), x.dtype)
    cx.label_tables[id(y)] = cx.label_tables[id(x_v)]
    return []


def _planned(cx: NodeContext, body: list[str], arenas: dict[str, int],
             sizes: tuple[int, ...] | None = None) -> str:  # fmt: skip
    """``body`` as text with its arena offsets planned (buffers as big as ``sizes`` says,
    when given); ``arenas`` grows to hold them."""
    by_dtype: dict[str, list[tuple[int, Buffer]]] = {}
    if sizes is not None and (len(sizes) != len(cx.buffers) or any(
            n < buf.nbytes for n, (buf, _) in zip(sizes, cx.buffers.values()))):  # fmt: skip
        raise Declined(["an arena buffer is bigger than its room (planned at another signature)"])
    for root, (buf, t) in cx.buffers.items():
        if sizes is not None:
            buf = Buffer(sizes[root], buf.first, buf.last)
        by_dtype.setdefault(t, []).append((root, buf))
    subst: dict[str, str] = {}
    for t, items in by_dtype.items():
        size = plan_offsets([b for _, b in items])
        item = np.dtype(NP_TYPES[t] if t != "b1" else "bool").itemsize
        arenas[t] = max(arenas.get(t, 1), size // item, 1)
        for root, b in items:
            subst[f"@{root}@"] = literal(b.offset // item)
    text = "\n".join(body)
    for token, off in subst.items():
        text = text.replace(token, off)
    return text


def _assemble(graph: Graph, cx: NodeContext, sig: list[str], prologue: list[str],
              body: list[str], fastmath: bool, limit: int, specs: list[Any],
              batched: list[bool], signature: bool,
              tile: tuple[NodeContext, list[str]] | None = None,
              sizes: tuple[int, ...] | None = None, audited: bool = True,
              pairs: tuple[tuple[int, int], ...] = ()) -> Lowered:  # fmt: skip
    """The module. ``tile`` (rows mode): the tile body and its context, whose constants
    (a superset of ``cx``'s, at the same offsets) are the ones packed. ``pairs``: a KV
    cache in place (``cache.py``), whose buffers ``run`` takes after the inputs."""
    arenas: dict[str, int] = {}
    text = _planned(cx, body, arenas, sizes)
    tile_text = None
    packed = cx
    if tile is not None:
        packed = tile[0]
        tile_text = _planned(packed, tile[1], arenas)
    uses_kernels = cx.uses_kernels or packed.uses_kernels
    expf_used = any(f in t for f in ("expf(", "expf_neg(", "expf_rn(")
                    for t in (text, tile_text or ""))  # fmt: skip
    imports = sorted(cx.imports | packed.imports | ({EXP_IMPORT} if expf_used else set()))
    param_types = sorted(packed.params)
    params = tuple(np.concatenate(packed.params[t]) for t in param_types)
    psig = [f"types.Array(types.{NP_TYPES[t]}, 1, 'C')" for t in param_types]
    pargs = [f"P_{t}" for t in param_types]
    ins = [f"a{k}" for k in range(len(graph.inputs))]
    ins += [f"c{i}" for i in range(len(pairs))] + [f"v{i}" for i in range(len(pairs))]
    presents = {j for _, j in pairs}
    n_out = len(graph.outputs)
    out_specs = [cx.shapes[id(v)] for v in graph.outputs]
    rows = any(batched)
    head = [
        '"""tfrt_py native code (generated; do not edit)."""',
        "import math",
        "import numpy as np",
        "from numba import njit, types",
        *(KERNEL_IMPORTS if uses_kernels else ()),
        *imports,
        "",
        "f4, f8, i8, i4, b1 = np.float32, np.float64, np.int64, np.int32, np.bool_",
        "u1, s1 = np.uint8, np.int8",  # (i1 would be a loop variable's name)
        # the kernels' version: numba's cache of this module holds their machine code
        *([f"KV = {literal(kernel_version())}"] if uses_kernels or imports else []),
    ]
    # without fastmath, still fused multiply-adds (``contract``: no reassociation, so the
    # reductions keep their order; the interpreter's jitted kernels do the same)
    fm = "True" if fastmath else "{{'contract'}}"
    deco = f"@njit({{sig}}, cache=True, nogil=True, error_model='numpy', fastmath={fm})"
    setup = [f"    A_{t} = np.empty({literal(n)}, {t})" for t, n in sorted(arenas.items())]
    setup += ["    " + ln for ln in packed.hoisted]
    if not rows:
        outs = []
        for k, (shape, dtype) in enumerate(out_specs):
            if k in presents:  # bound by the cache's prologue
                continue
            outs += [f"    o{k} = np.empty({_shape_literal(shape)}, {tname(dtype)})",
                     f"    r{k} = o{k}.reshape({literal(max(1, math.prod(shape)))})"]  # fmt: skip
        src = [*head, f"SIG = {tuple_text(sig + psig)}", "", "", deco.format(sig="SIG"),
               f"def run({', '.join(ins + pargs)}):", *prologue, *setup, *outs, text,
               f"    return {', '.join(f'o{k}' for k in range(n_out))}", ""]  # fmt: skip
    else:
        src = [*head, *rows_functions(cx, sig, psig, pargs, ins, prologue, setup, text,
                                       _as_called(graph, specs), batched, out_specs, deco,
                                       tile_text)]  # fmt: skip
    source = "\n".join(src)
    if audited:
        audit(source)
    units = check(source, limit)
    return Lowered(
        source,
        params,
        [v.name for v in graph.inputs],
        [v.name for v in graph.outputs],
        len(graph.nodes),
        tuple(np.dtype(dt) for _, dt in specs),
        units,
        encoders=tuple(encoded_inputs(graph).get(k) for k in range(len(graph.inputs))),
        mode="rows" if rows else ("signature" if signature else "static"),
        shapes=tuple(shape for shape, _ in specs) if signature else (),
        finishers=tuple(_finisher(cx, v) for v in graph.outputs),
        batched=tuple(batched) if rows else (),
        out_rows=tuple(tuple(shape[1:]) for shape, _ in out_specs) if rows else (),
        out_dtypes=tuple(np.dtype(dt) for _, dt in out_specs),
        arena=tuple((t, b.nbytes, b.first, b.last) for b, t in cx.buffers.values())
        if signature
        else (),
        consts=tuple((tname(a.dtype), int(r.off), a.size) for a, r in packed.packed)
        if signature
        else (),
        choices=tuple(cx.choices) if signature else (),
        caches=pairs,
        tile_rows=TILE_ROWS if rows and tile_text is not None else 0,
    )


def _finisher(cx: NodeContext, v: Value) -> Any:
    if id(v) in cx.finishers:
        return cx.finishers[id(v)]
    if id(v) in cx.label_tables:
        return ("labels", cx.label_tables[id(v)])
    return None


def _shape_literal(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"({literal(shape[0])},)"
    return "(" + ", ".join(literal(d) for d in shape) + ")"
