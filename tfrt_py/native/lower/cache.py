"""A KV cache written in place by native code (issue 37, item 2).

A decoder's step makes each ``present = Concat(past, new)`` along the cache's sequence
axis and returns it; fed back as the next step's ``past`` that copies the whole cache
every step (at past 512 the copies of a 4-layer GPT-2 move 8 MB a step).
``cache_pairs(graph)`` finds the pairs whose in-place form this lowering writes: the
cache is ``[batch, heads, sequence, head size]`` (the sequence axis second-to-last), the past
is read by nothing but its Concat or GroupQueryAttention (and Shape; the attention writes
its presents in place itself: ``ops_gqa.py``), and the present by nothing but the
scores' keys (``MatMulTransB``) and the values of a stacked MatMul (and Shape), which
index each (batch, head) matrix by its own offset -- directly, or through views and an
Expand or Tile that repeat each KV head for a group of query heads (``stack_view``: no
copy either).

The function then takes two more arguments per pair: ``c<i>``, the buffer the present is
written into (C-ordered, of any length along the sequence axis from the present's up,
and of as many batch rows or more: served batches keep one buffer for all the rows they
may seat, ``serving/gen_cache.py``), and ``v<i>``, the caller's output buffer, which
must be its first rows and positions (else the function raises and the tier's checked
path takes the call).
Its first positions are the past when the past feed is exactly that prefix (the same
address and strides: generation's buffers), else they are copied from the feed (a past
elsewhere inside the buffer raises, as ``run(outputs=)``'s overlap check refuses it);
the Concat writes only the new positions. An empty ``c<i>`` asks the function to
allocate the present (a call without output buffers). The present returned is the
buffer's view of the present's rows and length; the past argument is typed ``'A'`` (a view of the
buffer is not C-contiguous) and never read as flat data (``NodeContext.unread``). Any
other reader of either declines with ``CACHE_DECLINE``, and ``lower`` lowers the graph
again with the cache copied.

Pure functions of the graph and shapes; load time or the compile worker.
"""

from __future__ import annotations

import math
from typing import Any

from ...feeds import concat_prefixes
from ...ir import Graph, Node, Value
from .context import CACHE_DECLINE, NodeContext
from .loops import Ref
from .source import literal

__all__ = [
    "CACHE_RANK",
    "cache_pairs",
    "cache_prologue",
    "concat_in_place",
    "is_stack_view",
    "matrix_at",
    "stack_view",
]

_FUSED = "tfrt_py.fused"
#: The rank of every cache written in place: [batch, heads, sequence, head size].
CACHE_RANK = 4
#: The import line of a module whose code copies a past into its buffer.
COPY_IMPORT = "from tfrt_py.native.kernels.rowdot import cache_misfit_f4, copy_past_f4"
#: (domain, op, input position) of the readers of a present this lowering handles
_STACK_READERS = frozenset({(_FUSED, "MatMulTransB", 1), ("", "MatMul", 1)})
#: Ops of the default domain that read a present as views of its matrices (``stack_view``):
#: optimum's grouped KV heads, ``Reshape(Expand(Unsqueeze(present)))`` (or a Tile)
_STACK_VIEWS = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Identity", "Expand", "Tile"})


def _readers(graph: Graph, v: Value) -> list[tuple[Node, int]]:
    return [(n, i) for n in graph.nodes for i, x in enumerate(n.inputs) if x is v]


def _read_as_stacks(graph: Graph, v: Value) -> bool:
    """Whether every reader of ``v`` (and of the views and Expands of it, none a graph
    output) is a Shape, or reads it as a stack of matrices (``_STACK_READERS``)."""
    outs = {id(o) for o in graph.outputs}
    todo = [v]
    while todo:
        for reader, slot in _readers(graph, todo.pop()):
            if reader.op_type == "Shape" or (reader.domain, reader.op_type, slot) in _STACK_READERS:
                continue
            if reader.domain or reader.op_type not in _STACK_VIEWS or slot != 0:
                return False
            y = reader.outputs[0] if reader.outputs else None
            if y is None or id(y) in outs:
                return False
            todo.append(y)
    return True


def cache_pairs(graph: Graph) -> tuple[tuple[int, int], ...]:
    """(past input index, present output index) of every cache pair written in place, in
    output order; () unless every Concat-grown output qualifies (one form per function)."""
    found = concat_prefixes(graph)
    pairs = []
    for j, (k, axis) in sorted(found.items()):
        out, past = graph.outputs[j], graph.inputs[k]
        shape = out.type.shape if out.type is not None else None  # type: ignore[union-attr]
        node = out.producer
        if shape is None or node is None or len(shape) != CACHE_RANK:
            return ()
        if node.op_type == "Concat" and len(node.inputs) != 2:
            return ()
        if axis % len(shape) != len(shape) - 2 or str(out.type.dtype) != "float32":  # type: ignore[union-attr]
            return ()
        if sum(o is out for o in graph.outputs) != 1 or any(o is past for o in graph.outputs):
            return ()
        for reader, _ in _readers(graph, past):
            if reader is not node and reader.op_type != "Shape":
                return ()
        if not _read_as_stacks(graph, out):
            return ()
        pairs.append((k, j))
    return tuple(pairs)


def cache_prologue(cx: NodeContext, pairs: tuple[tuple[int, int], ...],
                   graph: Graph) -> list[str]:  # fmt: skip
    """The function's lines that take each pair's buffer ``c<i>`` (allocated when empty,
    checked, the past copied in unless it is the buffer's prefix) and bind the present's
    flat view ``r<j>``, its matrix stride ``cs<i>`` and the view returned, ``o<j>``."""
    lines: list[str] = []
    cx.imports.add(COPY_IMPORT)
    for i, (k, j) in enumerate(pairs):
        shape, _ = cx.shapes[id(graph.outputs[j])]
        ax = len(shape) - 2
        c, v = f"c{i}", f"v{i}"
        dims = ", ".join(f"np.int64({literal(n)})" for n in shape)
        wrong = f"cache_misfit_f4({c}, {v}, {dims})"
        upto = ", ".join([f":{literal(shape[0])}", *[":"] * (ax - 1), f":{literal(shape[ax])}"])
        lines += [
            f"if {c}.size == 0:",
            f"    {c} = np.empty(({', '.join(literal(n) for n in shape)},), f4)",
            f"elif {wrong}:",
            f"    raise ValueError('cache {i}: wrong shape')",
            f"if {c}.ctypes.data != a{k}.ctypes.data or {c}.strides != a{k}.strides:",
            # a past inside the buffer but not its prefix: ``run(outputs=)`` refuses that
            f"    if {c}.ctypes.data <= a{k}.ctypes.data < {c}.ctypes.data + {c}.nbytes:",
            f"        raise ValueError('cache {i}: the past overlaps its buffer')",
            f"    copy_past_f4(a{k}, {c})",
            f"cs{i} = {c}.shape[{ax}] * {literal(shape[-1])}",
            f"r{j} = {c}.reshape({c}.size)",
            f"o{j} = {c}[{upto}]",
        ]
        cx.unread.add(id(graph.inputs[k]))
        cx.cache_mat[j] = f"cs{i}"
    return ["    " + ln for ln in lines]


def concat_in_place(cx: Any, node: Node, y: Ref) -> list[str]:
    """A present's Concat in place: only the new positions, at the past's length along the
    sequence axis of each (batch, head) matrix of ``y``'s buffer."""
    past_v, new_v = node.inputs
    if past_v is None or new_v is None or id(past_v) not in cx.unread:
        cx.decline(f"{CACHE_DECLINE} a present that is not Concat(past, new)")
    x = cx.ref(new_v)
    ax = len(y.shape) - 2
    if x.dtype != y.dtype or x.shape[:ax] != y.shape[:ax] or x.shape[-1] != y.shape[-1]:
        cx.decline(f"{CACHE_DECLINE} Concat of {x.dtype}{list(x.shape)}")
    outer = math.prod(y.shape[:ax])
    width = x.shape[ax] * x.shape[-1]
    start = (y.shape[ax] - x.shape[ax]) * y.shape[-1]
    W = literal(width)
    return [
        f"for o in range({literal(outer)}):",
        f"    for c in range({W}):",
        f"        {y.buf}[{y.off} + o * {y.mat} + {literal(start)} + c] = "
        f"{x.buf}[{x.off} + o * {W} + c]",
    ]


def is_stack_view(cx: Any, node: Node) -> bool:
    """Whether ``node`` is a view or Expand of a present in place (``stack_view``)."""
    first = node.inputs[0] if node.inputs else None
    r = cx.refs.get(id(first)) if first is not None else None
    return r is not None and bool(r.mat) and not node.domain and node.op_type in _STACK_VIEWS


def stack_view(cx: Any, node: Node) -> list[str]:
    """A view of a present in place as other stacks of the same matrices (their last two
    dims unchanged, as many), or an Expand or Tile of its last stack dim from 1 to ``r``
    (each matrix read ``r`` times: ``Ref.rep``): no code."""
    x = cx.stack_ref(node.inputs[0])
    y = node.outputs[0]
    if y is None or id(y) in cx.outputs:
        cx.decline(f"{CACHE_DECLINE} a view of a present that is an output")
    if any(v is not None and cx.const(v) is None for v in node.inputs[1:]):
        cx.decline(f"{CACHE_DECLINE} {node.op_type} of a present by a shape known at run time")
    shape = tuple(cx.shapes[id(y)][0])
    stack, into = x.shape[:-2], shape[:-2]
    if len(shape) < 2 or shape[-2:] != x.shape[-2:]:
        cx.decline(f"{CACHE_DECLINE} {node.op_type} of a present's matrices")
    rep = x.rep
    if node.op_type in ("Expand", "Tile"):
        if not stack or len(into) != len(stack) or into[:-1] != stack[:-1] or stack[-1] != 1:
            cx.decline(f"{CACHE_DECLINE} {node.op_type} of a present {list(x.shape)} to "
                       f"{list(shape)}")  # fmt: skip
        rep *= into[-1]
    elif math.prod(into) != math.prod(stack):
        cx.decline(f"{CACHE_DECLINE} {node.op_type} of a present {list(x.shape)}")
    cx.refs[id(y)] = Ref(x.buf, x.off, shape, x.dtype, x.root, x.mat, rep)
    return []


def matrix_at(r: Ref, q: str, size: int) -> str:
    """The offset of matrix ``q`` (an expression) of the stack ``r`` whose matrices hold
    ``size`` elements: contiguous, or a present in place (``Ref.mat``, ``Ref.rep``)."""
    if not r.mat:
        return f"{r.off} + {q} * {literal(size)}"
    if r.rep > 1:
        return f"{r.off} + {q} // {literal(r.rep)} * {r.mat}"
    return f"{r.off} + {q} * {r.mat}"
