"""Which values' shapes are fixed by the input signature (shapes and dtypes of the feeds).

The memory planner may only give a value a fixed arena slot when its shape is the same on
every call with the same signature. That holds for most ops (their output shape follows
from input *shapes* and attributes); it fails for ops whose output shape depends on input
*data* (NonZero, Unique, TopK's k, a Reshape to a computed shape, control flow, ...).

The analysis tracks two facts per value:

* content-determined: its data is a function of the signature alone (constants, Shape and
  Size outputs, pure ops over such values), and
* shape-determined: its shape is a function of the signature alone.

An op listed in ``_DATA_INPUTS`` has a shape-determined output when its listed inputs
have determined shapes and every other input is content-determined; any other op needs
all inputs content-determined (then its output is content-determined too).
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Graph, Node
from ..kernels import KernelFlags
from .rewrite import op_names

__all__ = ["content_determined", "is_pure", "shape_determined", "signature_determined"]


class _All(frozenset[int]):
    """Every input index: each input only contributes its shape to the output's shape."""

    def __contains__(self, item: object) -> bool:
        return True


ALL = _All()
#: Ops whose output may be random: never treated as pure, whatever their flags say
#: (Dropout is random in training mode; the identity pass removes it in inference mode).
_RANDOM = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
     "Multinomial", "Dropout"}
)  # fmt: skip

_ELEMENTWISE = op_names(
    """
    Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot
    BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Cos Cosh Div Dropout Elu Equal Erf
    Exp Floor Gelu Greater GreaterOrEqual HardSigmoid HardSwish Identity IsInf IsNaN
    LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod Mul Neg Not Or Pow PRelu
    Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Sub
    Sum Swish Tan Tanh ThresholdedRelu Where Xor
    """
)

_SHAPE_ONLY = op_names(
    """
    Softmax LogSoftmax Hardmax MatMul Gemm Conv ConvTranspose MaxPool AveragePool
    GlobalAveragePool GlobalMaxPool GlobalLpPool LpPool BatchNormalization
    InstanceNormalization LayerNormalization RMSNormalization GroupNormalization
    LpNormalization LRN MeanVarianceNormalization Flatten Transpose Concat Gather
    GatherElements GatherND
    ScatterElements ScatterND Scatter Shape Size Einsum DepthToSpace SpaceToDepth Det
    Trilu CumSum ArgMax ArgMin ReduceMax ReduceMin ReduceSum ReduceMean ReduceProd
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare EyeLike MatMulInteger
    QLinearMatMul QuantizeLinear DequantizeLinear RNN GRU LSTM
    """
)

#: (op_type) -> input indices that only contribute their shape to the output shape; the
#: other inputs (axes, shapes, pads, sizes) must be content-determined.
_DATA_INPUTS: dict[str, frozenset[int]] = {op: ALL for op in _ELEMENTWISE + _SHAPE_ONLY}
_DATA_INPUTS.update(
    {
        # Reduce ops take ``axes`` as input 1 from opset 13/18: its content matters.
        **{op: frozenset({0}) for op in _SHAPE_ONLY if op.startswith("Reduce")},
        "Reshape": frozenset({0}),
        "Expand": frozenset({0}),
        "Tile": frozenset({0}),
        "Slice": frozenset({0}),
        "Pad": frozenset({0, 2}),
        "Squeeze": frozenset({0}),
        "Unsqueeze": frozenset({0}),
        "Split": frozenset({0}),
        "Resize": frozenset({0}),
        "Upsample": frozenset({0}),
        "OneHot": frozenset({0, 2}),
        "TopK": frozenset({0}),
        "ConstantOfShape": frozenset(),
        "Range": frozenset(),
    }
)
_DATA_INPUTS["SimplifiedLayerNormalization"] = ALL  # onnxruntime's, in the default domain
_CONTENT_OF_SHAPE = frozenset({"Shape", "Size"})
#: Domains whose ops all have shape-only inputs (tfrt_py's fused ops).
_SHAPE_ONLY_DOMAINS = frozenset({"tfrt_py.fused"})
#: onnxruntime's contrib ops (the ones its transformer optimizer writes) whose output
#: shapes follow from their inputs' shapes alone: a Shape of their output is then fixed by
#: the signature, and the shape arithmetic after it computed once per signature.
_CONTRIB_SHAPE_ONLY = frozenset(
    ("com.microsoft", op) for op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "FusedMatMul", "Attention",
    "EmbedLayerNormalization", "MultiHeadAttention")
)  # fmt: skip


def is_pure(node: Node, flags: KernelFlags | None) -> bool:
    """Whether running ``node`` twice on equal inputs gives equal outputs with no side
    effects, and it runs no nested graphs: what constant folding and CSE need."""
    return (
        flags is not None
        and flags.pure
        and not flags.is_async
        and not flags.control_flow
        and node.op_type not in _RANDOM
        and not any(True for _ in node.subgraphs())
    )


def shape_determined(graph: Graph, flags_of: Callable[[Node], KernelFlags | None]) -> set[int]:
    """Ids of the values of ``graph`` (top level) whose shape is fixed by the signature.

    ``flags_of(node)`` gives the node's kernel flags (None: unknown, treated as impure).
    Graph inputs and constants are included.
    """
    return signature_determined(graph, flags_of)[0]


def content_determined(graph: Graph, flags_of: Callable[[Node], KernelFlags | None]) -> set[int]:
    """Ids of the values of ``graph`` (top level) whose *data* the signature fixes: what
    pure nodes compute from constants and from Shape/Size of shape-determined values (the
    shape arithmetic exporters write: Shape -> Gather -> Concat -> Reshape). A plan may
    compute them once per signature. Constants are included."""
    return signature_determined(graph, flags_of)[1]


def signature_determined(
    graph: Graph, flags_of: Callable[[Node], KernelFlags | None]
) -> tuple[set[int], set[int]]:
    """(shape-determined ids, content-determined ids): see the module docstring."""
    shape_det: set[int] = {id(v) for v in graph.inputs} | {id(c) for c in graph.constants}
    content_det: set[int] = {id(c) for c in graph.constants}
    for node in graph.nodes:
        flags = flags_of(node)
        pure = is_pure(node, flags)
        ins = [v for v in node.inputs if v is not None]
        if pure and all(id(v) in content_det or v.is_const for v in ins):
            for o in node.outputs:
                if o is not None:
                    content_det.add(id(o))
                    shape_det.add(id(o))
            continue
        if pure and node.op_type in _CONTENT_OF_SHAPE and node.domain == "":
            if ins and id(ins[0]) in shape_det:
                for o in node.outputs:
                    if o is not None:
                        content_det.add(id(o))
                        shape_det.add(id(o))
            continue
        data = (
            ALL if node.domain in _SHAPE_ONLY_DOMAINS else
            _DATA_INPUTS.get(node.op_type) if node.domain == "" else
            ALL if (node.domain, node.op_type) in _CONTRIB_SHAPE_ONLY else None
        )  # fmt: skip
        if data is None or (flags is not None and flags.control_flow):
            continue
        ok = True
        for i, v in enumerate(node.inputs):
            if v is None or v.is_const:
                continue
            if i in data:
                ok = id(v) in shape_det
            else:
                ok = id(v) in content_det
            if not ok:
                break
        if ok:
            for o in node.outputs:
                if o is not None:
                    shape_det.add(id(o))
    return shape_det, content_det
