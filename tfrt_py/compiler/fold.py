"""Constant folding: run at load every pure node whose inputs are all constants.

Shape and Size of a value whose shape is static fold too, so shape arithmetic chains
(Shape -> Gather -> Concat -> Reshape) collapse into a constant target shape, which the
Reshape kernel then sees at load. A Gather or Slice of a Shape that picks only static
dims of a value whose other dims vary folds as well (scaled dot-product attention's
exports compute their scale from ``Shape(q)[-1]``, the head size, at every call).
Folding runs the real kernels, so a folded constant is exactly what the call would have
computed. A node is left alone when its kernel fails or warns on the constants (the call
then fails or warns as it would have), when it returns something that is not a tensor,
or when an output would exceed ``FOLD_MAX_BYTES`` -- predicted before the kernel runs
(``load_limits``), and checked again after.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..ir import Graph, Node
from ..kernels import KernelContext
from .context import PassContext, flags_lookup
from .dynamic import is_pure
from .load_limits import predicted_nbytes
from .rewrite import make_const, static_shape, tensor_dtype

__all__ = ["FOLD_MAX_BYTES", "fold_constants", "run_kernel"]

#: Outputs larger than this stay computed per call (64 MiB): folding trades model memory
#: for call time, and a huge broadcast (ConstantOfShape, Expand) can cost more to hold.
FOLD_MAX_BYTES = 64 << 20

_SHAPE_OPS = frozenset({"Shape", "Size"})


def fold_constants(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    flags_of = flags_lookup(ctx)
    folded: list[Node] = []
    n_bytes = 0
    for node in graph.nodes:
        if not is_pure(node, flags_of(node)):
            continue
        args = _const_args(node, ctx)
        if args is None:
            continue
        results = run_kernel(node, ctx, args)
        if results is None:
            continue
        for v, r in zip(node.outputs, results):
            if v is not None:
                make_const(graph, v, r)
                n_bytes += r.nbytes
        folded.append(node)
    done = {id(n) for n in folded}
    graph.nodes = [n for n in graph.nodes if id(n) not in done]
    ops = sorted({n.op_type for n in folded})
    detail = f" ({', '.join(ops[:8])}{', ...' if len(ops) > 8 else ''})" if ops else ""
    return f"folded {len(folded)} nodes into constants{detail}, {n_bytes:,} bytes"


def _const_args(node: Node, ctx: PassContext) -> list[Any] | None:
    """The node's input arrays when all are load-time constants, else None. A Shape/Size
    input only needs a static shape: a zero-memory broadcast view stands in for it. A
    Gather/Slice of a Shape whose picked dims are static gets those dims
    (``_static_part``)."""
    part = _static_part(node, ctx)
    if part is not None:
        return part
    args: list[Any] = []
    for v in node.inputs:
        if v is None:
            args.append(None)
        elif v.const is not None:
            args.append(v.const)
        elif node.op_type in _SHAPE_OPS and node.domain == "" and not args:
            shape, dtype = static_shape(v), tensor_dtype(v)
            if shape is None:
                return None
            dtype = dtype if dtype is not None else np.dtype(np.float32)
            args.append(np.broadcast_to(np.zeros((), dtype), shape))
        else:
            return None
    return args


def _shape_dims(shape_node: Node) -> list[Any] | None:
    """The dims ``shape_node`` (an ONNX Shape) returns, ints where static and None where
    not, after its ``start``/``end`` (opset 15); None when its input's rank is unknown."""
    v = shape_node.inputs[0] if shape_node.inputs else None
    t = None if v is None else v.type
    dims = getattr(t, "shape", None)
    if dims is None:
        return None
    got = [d if isinstance(d, int) and not isinstance(d, bool) else None for d in dims]
    rank = len(got)
    start, end = int(shape_node.attrs.get("start", 0)), shape_node.attrs.get("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else int(end)
    stop = min(max(stop + rank if stop < 0 else stop, 0), rank)
    return got[start:stop]


def _static_part(node: Node, ctx: PassContext) -> list[Any] | None:
    """For ``Gather(Shape(x), idx)`` or ``Slice(Shape(x), ...)`` with constant indices or
    bounds: the arguments that fold it (the picked dims as an int64 array standing in for
    the Shape, the rest as they are) when every dim it picks is static, else None. The
    kernel runs once on the dims' positions to learn which it picks."""
    if node.domain != "" or node.op_type not in ("Gather", "Slice") or not node.inputs:
        return None
    src = node.inputs[0]
    shape_node = None if src is None else src.producer
    if shape_node is None or shape_node.op_type != "Shape" or shape_node.domain != "":
        return None
    if any(v is not None and v.const is None for v in node.inputs[1:]):
        return None
    dims = _shape_dims(shape_node)
    if dims is None or all(d is None for d in dims):
        return None
    rest = [None if v is None else v.const for v in node.inputs[1:]]
    got = run_kernel(node, ctx, [np.arange(len(dims), dtype=np.int64), *rest])
    picked = None if got is None else got[0]
    if picked is None or picked.dtype.kind not in "iu":
        return None
    if any(dims[int(i)] is None for i in picked.reshape(-1)):
        return None
    known = np.array([d if d is not None else -1 for d in dims], dtype=np.int64)
    return [known, *rest]


def run_kernel(node: Node, ctx: PassContext, args: list[Any]) -> list[np.ndarray] | None:
    """``node``'s kernel run on ``args`` at load: its outputs as arrays, or None when the
    kernel fails or warns, returns something that is not a tensor, or an output would
    exceed ``FOLD_MAX_BYTES`` (predicted before it runs, checked after)."""
    if predicted_nbytes(node, args) > FOLD_MAX_BYTES:
        return None  # never compute it to find out (a few bytes of model can ask for GBs)
    try:
        kdef = ctx.registry.lookup(node.domain, node.op_type, node.opset, node.name)
        fn = kdef.build(KernelContext(node))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = fn(*args)
    except Exception:  # noqa: BLE001 - the call will fail (or warn) as it would have
        return None
    rs = list(r) if isinstance(r, tuple) else [r]
    if len(rs) != len(node.outputs):
        return None
    out: list[np.ndarray] = []
    for v, x in zip(node.outputs, rs):
        if v is None:
            out.append(np.empty(0))
            continue
        if not isinstance(x, (np.ndarray, np.generic)):
            return None
        arr = np.asarray(x)
        if arr.nbytes > FOLD_MAX_BYTES:
            return None
        out.append(arr)
    return out
