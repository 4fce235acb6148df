"""Shape and dtype inference: fill in ``Value.type`` where the frontend left gaps.

The ONNX frontend records what ONNX shape inference found. This pass adds (1) propagation
through common ops whose output type follows from input types (elementwise with NumPy
broadcasting, symbolic dims included; MatMul; Gemm; Concat; Transpose; Reshape to a
constant shape), and (2) when every graph input has a static shape and gaps remain, a
*probe*: the graph runs once on zero feeds and the observed shape and dtype of every value
whose shape the signature determines (``dynamic.shape_determined``) is recorded. The probe
only runs when every kernel is pure (no custom or async kernels) and is best effort: a
kernel that fails on zeros just leaves the gaps.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from ..ir import Dim, Graph, Node, TensorType, Value
from .context import PassContext, flags_lookup
from .dynamic import is_pure, shape_determined
from .load_limits import guarded_env, zero_feeds
from .rewrite import op_names

__all__ = ["AS_ONNX", "infer_shapes", "propagates_fully"]

_UNARY = frozenset(
    op_names(
        """
        Abs Acos Acosh Asin Asinh Atan Atanh Ceil Celu Clip Cos Cosh Elu Erf Exp Floor
        Gelu HardSigmoid HardSwish Identity LeakyRelu Log LogSoftmax Mish Neg Reciprocal
        Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softmax Softplus Softsign Sqrt Tan
        Tanh ThresholdedRelu Hardmax Dropout BitwiseNot Not Swish
        """
    )
)
_BROADCAST = frozenset(
    op_names(
        """
        Add Sub Mul Div Pow Max Min Sum Mean Mod And Or Xor PRelu
        """
    )
)
_COMPARE = frozenset(["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])


def infer_shapes(graph: Graph, ctx: PassContext) -> str:
    """The pass: propagate types, then probe if needed. Returns its one-line report."""
    values = [v for n in graph.nodes for v in n.outputs if v is not None]
    before = sum(_is_typed(v) for v in values)
    for node in graph.nodes:
        _propagate(node)
    propagated = sum(_is_typed(v) for v in values) - before
    probed = 0
    if any(not _is_static(v) for v in values):
        probed = _probe(graph, ctx)
    typed = sum(_is_typed(v) for v in values)
    static = sum(_is_static(v) for v in values)
    return (
        f"{typed}/{len(values)} values typed, {static} with static shapes "
        f"({propagated} by propagation, {probed} by probe)"
    )


#: Standard ops (from opset 7: older binary ops broadcast by an ``axis`` attribute) whose
#: output types ``_propagate`` derives as ONNX's shape inference does, when it derives them.
AS_ONNX = (_UNARY - {"Dropout"}) | _BROADCAST | _COMPARE | {"Where"} | {
    "MatMul", "Gemm", "Concat", "Transpose", "Reshape"}  # fmt: skip


def propagates_fully(graph: Graph) -> bool:
    """Whether this pass's propagation alone types every node output of ``graph`` (dtype
    and every dim known, static or named) -- the frontend's test for a graph imported
    without ONNX shape inference (``frontends.onnx.OwnTypes``). Only graphs of ``AS_ONNX``
    ops qualify; types are filled in place either way."""
    if any(n.domain != "" or n.op_type not in AS_ONNX or n.opset < 7 for n in graph.nodes):
        return False
    for node in graph.nodes:
        _propagate(node)
    for node in graph.nodes:
        for v in node.outputs:
            t = None if v is None else v.type
            if not isinstance(t, TensorType) or t.dtype is None or t.shape is None:
                return False
            if any(d is None for d in t.shape):
                return False
    return True


def _is_typed(v: Value) -> bool:
    """dtype and rank known (dims may be symbolic)."""
    t = v.type
    return isinstance(t, TensorType) and t.dtype is not None and t.shape is not None


def _is_static(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.dtype is not None and t.is_static


def _ttype(v: Value | None) -> TensorType | None:
    if v is None:
        return None
    t = v.type
    return t if isinstance(t, TensorType) else None


def _set(v: Value | None, dtype: np.dtype | None, shape: Sequence[Dim] | None) -> None:
    """Merge (dtype, shape) into ``v.type``; known facts (symbolic dims too) win over new
    ones, so declared interfaces keep their names."""
    if v is None:
        return
    old = _ttype(v)
    if old is None and v.type is not None:
        return  # a sequence or optional: not ours to touch
    dt = old.dtype if old is not None and old.dtype is not None else dtype
    shp: tuple[Dim, ...] | None
    if old is None or old.shape is None:
        shp = None if shape is None else tuple(shape)
    elif shape is None or len(shape) != len(old.shape):
        shp = old.shape
    else:
        shp = tuple(a if a is not None else b for a, b in zip(old.shape, shape))
    v.type = TensorType(dt, shp)


def _broadcast(shapes: list[tuple[Dim, ...]]) -> tuple[Dim, ...] | None:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        known = {d for d in dims if d != 1}
        if not known:
            out.append(1)
        elif len(known) == 1:
            d = known.pop()
            out.append(d)
        else:
            return None  # unknown sizes that may or may not broadcast
    return tuple(out)


def _propagate(node: Node) -> None:
    if not node.outputs or node.outputs[0] is None:
        return
    op = node.op_type
    ins = [_ttype(v) for v in node.inputs]
    out = node.outputs[0]
    if node.domain != "":
        rule = _CONTRIB_RULES.get((node.domain, op))
        if rule is not None and ins and ins[0] is not None:
            rule(node, ins, out)
        return
    if op in _UNARY and ins and ins[0] is not None:
        _set(out, ins[0].dtype, ins[0].shape)
        return
    if op in _BROADCAST or op in _COMPARE or op == "Where":
        ts = [t for t in ins if t is not None]
        if len(ts) != len([v for v in node.inputs if v is not None]) or not ts:
            return
        shapes = [t.shape for t in ts]
        shape = None if any(s is None for s in shapes) else _broadcast(shapes)  # type: ignore[arg-type]
        dtype = np.dtype(bool) if op in _COMPARE else ts[-1 if op == "Where" else 0].dtype
        _set(out, dtype, shape)
        return
    fn = _RULES.get(op)
    if fn is not None and all(t is not None for t in ins[:1]):
        fn(node, ins, out)


def _matmul(node: Node, ins: list[TensorType | None], out: Value) -> None:
    if len(ins) < 2 or ins[1] is None or ins[0] is None:
        return
    a, b = ins[0].shape, ins[1].shape
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return
    batch = _broadcast([a[:-2], b[:-2]]) if len(a) > 2 or len(b) > 2 else ()
    if batch is None:
        return
    _set(out, ins[0].dtype, (*batch, a[-2], b[-1]))


def _gemm(node: Node, ins: list[TensorType | None], out: Value) -> None:
    if len(ins) < 2 or ins[1] is None or ins[0] is None:
        return
    a, b = ins[0].shape, ins[1].shape
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return
    m = a[1] if node.attrs.get("transA", 0) else a[0]
    n = b[0] if node.attrs.get("transB", 0) else b[1]
    _set(out, ins[0].dtype, (m, n))


def _concat(node: Node, ins: list[TensorType | None], out: Value) -> None:
    if any(t is None or t.shape is None for t in ins) or not ins:
        return
    shapes = [t.shape for t in ins if t is not None and t.shape is not None]
    rank = len(shapes[0])
    axis = int(node.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if any(len(s) != rank for s in shapes) or not 0 <= axis < rank:
        return
    along = [s[axis] for s in shapes]
    total: Dim = sum(along) if all(isinstance(d, int) for d in along) else None  # type: ignore[arg-type]
    shape = list(shapes[0])
    for s in shapes[1:]:  # other dims: take a static one where any input has it
        shape = [a if isinstance(a, int) else b for a, b in zip(shape, s)]
    shape[axis] = total
    _set(out, ins[0].dtype if ins[0] is not None else None, shape)


def _transpose(node: Node, ins: list[TensorType | None], out: Value) -> None:
    t = ins[0]
    if t is None or t.shape is None:
        return
    perm = node.attrs.get("perm") or list(range(len(t.shape)))[::-1]
    if sorted(perm) != list(range(len(t.shape))):
        return
    _set(out, t.dtype, [t.shape[p] for p in perm])


def _reshape(node: Node, ins: list[TensorType | None], out: Value) -> None:
    t = ins[0]
    target = node.inputs[1].const if len(node.inputs) > 1 and node.inputs[1] else None
    if t is None or target is None or t.shape is None or node.attrs.get("allowzero", 0):
        return
    dims: list[Dim] = []
    for i, d in enumerate(int(x) for x in target.reshape(-1)):
        dims.append((t.shape[i] if i < len(t.shape) else None) if d == 0 else d)
    if dims.count(-1) == 1:
        known = [d for d in dims if d != -1]
        if t.is_static and all(isinstance(d, int) for d in known):
            total = math.prod([int(d) for d in t.shape if isinstance(d, int)])
            rest = math.prod([int(d) for d in known if isinstance(d, int)])
            dims[dims.index(-1)] = total // rest if rest else 0
        else:
            dims[dims.index(-1)] = None
    _set(out, t.dtype, dims)


def _same_as_input(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """Output 0 (and a skip-norm's optional sum, output 3) is input 0's type: the
    normalizations and activations onnxruntime's transformer optimizer writes."""
    t = ins[0]
    assert t is not None
    _set(out, t.dtype, t.shape)
    if len(node.outputs) > 3 and node.op_type.startswith("Skip"):
        _set(node.outputs[3], t.dtype, t.shape)


def _attention(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """com.microsoft Attention: (batch, sequence, v_hidden) from input (batch, sequence,
    hidden) and weights (hidden, q + k + v hidden) or ``qkv_hidden_sizes``."""
    t, w = ins[0], ins[1] if len(ins) > 1 else None
    if t is None or t.shape is None or len(t.shape) != 3:
        return
    sizes = node.attrs.get("qkv_hidden_sizes")
    if sizes is not None and len(sizes) == 3:
        v_hidden: Dim = int(sizes[2])
    elif w is not None and w.shape is not None and len(w.shape) == 2:
        if not isinstance(w.shape[1], int):
            return
        v_hidden = w.shape[1] // 3
    else:
        return
    _set(out, t.dtype, (t.shape[0], t.shape[1], v_hidden))


def _mha(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """com.microsoft MultiHeadAttention: output (batch, sequence, v_hidden) from query
    (B, S, D) and value (B, L, Dv) or (B, N, L, Hv), or packed KV (Dv = D), or from packed
    QKV (B, L, N, 3, H) alone (N * H)."""
    q = ins[0]
    if q is None or q.shape is None:
        return
    k = ins[1] if len(ins) > 1 else None
    v = ins[2] if len(ins) > 2 else None
    vs = v.shape if v is not None else None
    if len(q.shape) == 5 and k is None:
        n, h = q.shape[2], q.shape[4]
        if isinstance(n, int) and isinstance(h, int):
            _set(out, q.dtype, (q.shape[0], q.shape[1], n * h))
        return
    if len(q.shape) != 3:
        return
    if vs is not None and len(vs) == 3:
        _set(out, q.dtype, (q.shape[0], q.shape[1], vs[2]))
    elif vs is not None and len(vs) == 4 and isinstance(vs[1], int) and isinstance(vs[3], int):
        _set(out, q.dtype, (q.shape[0], q.shape[1], vs[1] * vs[3]))
    elif v is None and k is not None and k.shape is not None and len(k.shape) == 5:
        _set(out, q.dtype, q.shape)


def _embed_layer_norm(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """com.microsoft EmbedLayerNormalization: (batch, sequence, hidden) in the word
    embedding's dtype from input_ids (batch, sequence); mask_index (batch,) int32."""
    ids, emb = ins[0], ins[2] if len(ins) > 2 else None
    if ids is None or ids.shape is None or len(ids.shape) != 2 or emb is None:
        return
    if emb.shape is None or len(emb.shape) != 2:
        return
    _set(out, emb.dtype, (ids.shape[0], ids.shape[1], emb.shape[1]))
    if len(node.outputs) > 1:
        _set(node.outputs[1], np.dtype(np.int32), (ids.shape[0],))


def _fused_matmul(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """com.microsoft FusedMatMul without batch transposes: MatMul of op(A) and op(B)."""
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        return
    if node.attrs.get("transBatchA", 0) or node.attrs.get("transBatchB", 0):
        return
    a, b = ins[0].shape, ins[1].shape
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return
    if node.attrs.get("transA", 0):
        a = (*a[:-2], a[-1], a[-2])
    if node.attrs.get("transB", 0):
        b = (*b[:-2], b[-1], b[-2])
    batch = _broadcast([a[:-2], b[:-2]]) if len(a) > 2 or len(b) > 2 else ()
    if batch is not None:
        _set(out, ins[0].dtype, (*batch, a[-2], b[-1]))


def _matmul_nbits(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """com.microsoft MatMulNBits: A's dims but the last, then N, in A's dtype."""
    a, n = ins[0], node.attrs.get("N")
    if a is not None and a.shape is not None and len(a.shape) >= 1 and isinstance(n, int):
        _set(out, a.dtype, (*a.shape[:-1], n))


def _float_of_input(node: Node, ins: list[TensorType | None], out: Value) -> None:
    """ai.onnx.ml Normalizer and Scaler: float32 of input 0's shape (their spec's output
    type; a pipeline's KNN scan after one is matched by ``fuse_ml`` on its rank)."""
    t = ins[0]
    assert t is not None
    _set(out, np.dtype(np.float32), t.shape)


_RULES = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Concat": _concat,
    "Transpose": _transpose,
    "Reshape": _reshape,
    "SimplifiedLayerNormalization": _same_as_input,  # onnxruntime's, in the default domain
}

_MS = "com.microsoft"
#: Contrib and ai.onnx.ml ops (by domain and type) whose outputs follow from their inputs'
#: types: ONNX's shape inference does not know them, and everything after one was left
#: untyped (no Linear fusion, no cost estimates).
_CONTRIB_RULES = {
    **{(_MS, op): _same_as_input for op in ("SkipLayerNormalization",
       "SkipSimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "QuickGelu")},
    (_MS, "Attention"): _attention,
    (_MS, "MultiHeadAttention"): _mha,
    (_MS, "EmbedLayerNormalization"): _embed_layer_norm,
    (_MS, "FusedMatMul"): _fused_matmul,
    (_MS, "MatMulNBits"): _matmul_nbits,
    ("ai.onnx.ml", "Normalizer"): _float_of_input,
    ("ai.onnx.ml", "Scaler"): _float_of_input,
    ("ai.onnx.ml", "Binarizer"): _same_as_input,
    ("ai.onnx.ml", "Imputer"): _same_as_input,
}  # fmt: skip


def _probe(graph: Graph, ctx: PassContext) -> int:
    """Run the graph on zero feeds; record observed types of shape-determined values."""
    if not all(_is_static(v) for v in graph.inputs):
        return 0
    flags_of = flags_lookup(ctx)
    if not all(is_pure(n, flags_of(n)) for n in graph.nodes):
        return 0
    from ..executors.plan_probe import value_slots
    from ..executors.program import compile_program

    det = shape_determined(graph, flags_of)
    specs = []
    for v in graph.inputs:
        t = v.type
        assert isinstance(t, TensorType) and t.shape is not None and t.dtype is not None
        specs.append((tuple(int(d) for d in t.shape if isinstance(d, int)), t.dtype))
    feeds = zero_feeds(specs)
    if feeds is None:
        return 0
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            program = compile_program(graph, ctx.registry)
            env = guarded_env(program, feeds)
    except Exception:  # noqa: BLE001 - the probe is best effort
        return 0
    if env is None:  # the feeds or some value would exceed LOAD_MAX_BYTES
        return 0
    slot = value_slots(program)
    n = 0
    for node in graph.nodes:
        for o in node.outputs:
            if o is None or _is_static(o) or id(o) not in det:
                continue
            x = env[slot[id(o)]]
            if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind != "O":
                o.type = TensorType(x.dtype, tuple(int(d) for d in x.shape))
                n += 1
    return n
