"""The vision-transformer work: the ``fuse_transformer`` pass (GELU erf/tanh forms,
decomposed LayerNorm and RMS norm, MatMul with a transposed operand) and the compiled GELU, against
onnxruntime and the unfused graph, with the compiled paths on and off (``TFRT_PY_JIT``),
on the sync and async executors.

Graphs are built with onnx.helper here (no torch); the helpers stay in this file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.kernels.lib.erf import erf_f32
from tfrt_py.kernels.lib.gelu_jit import gelu_erf_f32
from tfrt_py.kernels.lib.sigmoid_jit import gelu_tanh_f32, in_place

_RNG = np.random.default_rng(11)
_F32 = TensorProto.FLOAT
_NO_TR = set(PASSES) - {"fuse_transformer"}


def _c(name: str, value: Any) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model(
    nodes: list[onnx.NodeProto],
    x_shape: tuple[Any, ...],
    inits: list[onnx.TensorProto],
    outputs: tuple[str, ...] = ("y",),
    extra_inputs: tuple[tuple[str, tuple[Any, ...]], ...] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info("x", _F32, x_shape)]
    ins += [helper.make_tensor_value_info(n, _F32, s) for n, s in extra_inputs]
    g = helper.make_graph(
        nodes, "g", ins, [helper.make_tensor_value_info(o, _F32, None) for o in outputs], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run_all(
    m: onnx.ModelProto, feeds: dict[str, np.ndarray], executor: str, rtol: float = 1e-5,
    atol: float = 1e-5,
) -> tfrt_py.Model:  # fmt: skip
    """Check the optimized model and the model without fuse_transformer against ORT;
    returns the optimized one."""
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    fused = tfrt_py.load(m, executor=executor)
    plain = tfrt_py.load(m, executor=executor, optimize=_NO_TR)
    for model in (fused, plain):
        for _ in range(2):  # the probe call, then the planned one
            got = list(model.run(feeds).values())
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return fused


def _report(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "fuse_transformer")


def _ops(model: tfrt_py.Model) -> list[str]:
    return [n.op_type for n in model.prepared.graph.nodes]


# -- GELU ------------------------------------------------------------------------------------

_GELU_FORMS = {
    # (x * s) * 0.5 with s = erf(x / sqrt2) + 1  (torch.onnx's TorchScript exporter)
    "div_x_first": [
        ("Div", ["x", "sqrt2"], ["u"]),
        ("Erf", ["u"], ["e"]),
        ("Add", ["e", "one"], ["s"]),
        ("Mul", ["x", "s"], ["m"]),
        ("Mul", ["m", "half"], ["y"]),
    ],
    # (x * 0.5) * s, with x * (1/sqrt2)
    "half_first": [
        ("Mul", ["x", "half"], ["h"]),
        ("Mul", ["x", "isqrt2"], ["u"]),
        ("Erf", ["u"], ["e"]),
        ("Add", ["one", "e"], ["s"]),
        ("Mul", ["h", "s"], ["y"]),
    ],
    # (s * 0.5) * x
    "s_half_x": [
        ("Mul", ["isqrt2", "x"], ["u"]),
        ("Erf", ["u"], ["e"]),
        ("Add", ["e", "one"], ["s"]),
        ("Mul", ["s", "half"], ["m"]),
        ("Mul", ["x", "m"], ["y"]),
    ],
    # the tanh approximation with Pow(x, 3)
    "tanh_pow": [
        ("Pow", ["x", "three"], ["c"]),
        ("Mul", ["c", "k044"], ["c2"]),
        ("Add", ["x", "c2"], ["a"]),
        ("Mul", ["a", "k_tanh"], ["u"]),
        ("Tanh", ["u"], ["e"]),
        ("Add", ["e", "one"], ["s"]),
        ("Mul", ["x", "s"], ["m"]),
        ("Mul", ["m", "half"], ["y"]),
    ],
    # the tanh approximation with x * x * x
    "tanh_mul": [
        ("Mul", ["x", "x"], ["sq"]),
        ("Mul", ["sq", "x"], ["c"]),
        ("Mul", ["k044", "c"], ["c2"]),
        ("Add", ["c2", "x"], ["a"]),
        ("Mul", ["k_tanh", "a"], ["u"]),
        ("Tanh", ["u"], ["e"]),
        ("Add", ["e", "one"], ["s"]),
        ("Mul", ["half", "x"], ["h"]),
        ("Mul", ["h", "s"], ["y"]),
    ],
}
_GELU_CONSTS = [
    _c("sqrt2", math.sqrt(2.0)),
    _c("isqrt2", 1 / math.sqrt(2.0)),
    _c("one", 1.0),
    _c("half", 0.5),
    _c("three", 3.0),
    _c("k044", 0.044715),
    _c("k_tanh", math.sqrt(2 / math.pi)),
]


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("form", sorted(_GELU_FORMS))
def test_gelu_patterns_become_gelu(jit: str, executor: str, form: str) -> None:
    nodes = [helper.make_node(op, i, o) for op, i, o in _GELU_FORMS[form]]
    x = (_RNG.standard_normal((2, 7, 33)) * 3).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, _GELU_CONSTS), {"x": x}, executor)
    assert _ops(model) == ["Gelu"]
    assert _report(model).startswith("1 GELU")


def test_gelu_after_matmul_fuses_into_linear(jit: str) -> None:
    """The Gelu the pass makes becomes the activation of the preceding Linear."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["z"]),
        helper.make_node("Add", ["z", "b"], ["zb"]),
        *[
            helper.make_node(op, ["zb" if v == "x" else v for v in i], o)
            for op, i, o in _GELU_FORMS["div_x_first"]
        ],
    ]
    x = _RNG.standard_normal((3, 5, 16)).astype(np.float32)
    inits = [
        *_GELU_CONSTS,
        _c("w", _RNG.standard_normal((16, 24))),
        _c("b", _RNG.standard_normal(24)),
    ]
    model = _run_all(_model(nodes, x.shape, inits), {"x": x}, "sync", rtol=1e-4, atol=1e-4)
    assert _ops(model) == ["Linear"]
    assert [s[0] for s in model.prepared.graph.nodes[0].attrs["activation"]] == ["Gelu"]


def test_gelu_not_fused_when_intermediate_is_shared() -> None:
    nodes = [helper.make_node(op, i, o) for op, i, o in _GELU_FORMS["div_x_first"]]
    nodes.append(helper.make_node("Neg", ["e"], ["z"]))
    x = _RNG.standard_normal((4, 9)).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, _GELU_CONSTS, ("y", "z")), {"x": x}, "sync")
    assert "Gelu" not in _ops(model)


def test_gelu_not_fused_with_other_constants() -> None:
    form = [
        (op, ["hf" if v == "half" else v for v in i], o) for op, i, o in _GELU_FORMS["div_x_first"]
    ]
    nodes = [helper.make_node(op, i, o) for op, i, o in form]
    x = _RNG.standard_normal((4, 9)).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, [*_GELU_CONSTS, _c("hf", 0.25)]), {"x": x}, "sync")
    assert "Gelu" not in _ops(model)


def test_compiled_gelu_equals_numpy_formulation() -> None:
    fn = gelu_erf_f32()
    if fn is None:
        pytest.skip("numba is not installed")
    x = (_RNG.standard_normal(10_001) * 4).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    t = erf_f32(x * np.float32(1 / math.sqrt(2.0)))
    with np.errstate(invalid="ignore"):
        want = (t + np.float32(1)) * x * np.float32(0.5)
    np.testing.assert_array_equal(fn(x, None), want)
    y = x.copy()
    assert fn(y, y) is y
    np.testing.assert_array_equal(y, want)
    buf = x.copy()  # in place through two views of one buffer (the planner's way)
    xv, ov = buf.reshape(1, -1)[0], buf.reshape(1, -1)[0]
    assert fn(xv, ov) is ov
    np.testing.assert_array_equal(buf, want)
    assert fn(buf[1:], buf[:-1]) is None  # a partial overlap: NumPy runs
    assert fn(x[::2], None) is None  # not contiguous: NumPy runs


def test_compiled_tanh_gelu_matches_the_float64_formula() -> None:
    """GELU's tanh form (GPT-2's gelu_new) as one compiled pass: y * sigmoid(2 sqrt(2/pi)
    (y + 0.044715 y^3)), within float32 rounding of the float64 formula, in place through
    the planner's second view of a buffer, with NaN, infinities and far tails."""
    fn = gelu_tanh_f32()
    if fn is None:
        pytest.skip("numba is not installed")
    x = (_RNG.standard_normal(10_001) * 5).astype(np.float32)
    x[:7] = [np.nan, np.inf, -0.0, 0.0, -10.0, -30.0, 30.0]
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):  # the same function; 1 + tanh(u) cancels in the tail
        want = x64 / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    buf = x.copy()
    out = in_place(fn, buf.reshape(1, -1)[0], buf.reshape(1, -1)[0])
    assert out.base is buf or out is buf or np.shares_memory(out, buf)
    core = np.abs(x) < 3
    np.testing.assert_allclose(buf[core], want[core], rtol=2e-6, atol=1e-30)
    # the tail: float32's rounding of the cubic argument (~40 at x = -5) moves exp by ~1e-5
    np.testing.assert_allclose(buf, want, rtol=2e-5, atol=1e-30)
    assert np.isnan(buf[0]) and buf[1] == np.inf and buf[5] == 0.0 and buf[6] == 30.0
    fresh = in_place(fn, x, None)  # a new array; x untouched
    np.testing.assert_array_equal(fresh, buf)
    assert np.isnan(x[0]) and x[4] == -10.0


# -- LayerNorm -----------------------------------------------------------------------------


def _ln_nodes(variant: str, opset: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    mk = helper.make_node
    inits = [_c("two", 2.0), _c("eps", 1e-5), _c("g", _RNG.standard_normal(24)),
             _c("b", _RNG.standard_normal(24))]  # fmt: skip
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
        rm = [mk("ReduceMean", ["x", "axes"], ["mu"]), mk("ReduceMean", ["p", "axes"], ["var"])]
    else:
        rm = [
            mk("ReduceMean", ["x"], ["mu"], axes=[-1]),
            mk("ReduceMean", ["p"], ["var"], axes=[2]),
        ]
    sq = mk("Mul", ["d", "d"], ["p"]) if variant == "mul" else mk("Pow", ["d", "two"], ["p"])
    nodes = [rm[0], mk("Sub", ["x", "mu"], ["d"]), sq, rm[1], mk("Add", ["var", "eps"], ["ve"]),
             mk("Sqrt", ["ve"], ["s"])]  # fmt: skip
    if variant == "reciprocal":
        nodes += [mk("Reciprocal", ["s"], ["rs"]), mk("Mul", ["d", "rs"], ["n"])]
    else:
        nodes.append(mk("Div", ["d", "s"], ["n"]))
    if variant == "no_affine":
        nodes[-1].output[0] = "y"
    else:
        nodes += [mk("Mul", ["n", "g"], ["ng"]), mk("Add", ["ng", "b"], ["y"])]
    return nodes, inits


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize(("variant", "opset"), [("pow", 17), ("mul", 13), ("reciprocal", 18),
                                                ("no_affine", 18)])  # fmt: skip
def test_layer_norm_pattern_becomes_layer_normalization(
    executor: str, variant: str, opset: int
) -> None:
    nodes, inits = _ln_nodes(variant, opset)
    x = _RNG.standard_normal((2, 5, 24)).astype(np.float32) * 3 + 1
    model = _run_all(_model(nodes, x.shape, inits, opset=opset), {"x": x}, executor)
    assert _ops(model) == ["LayerNormalization"], _ops(model)


def test_layer_norm_over_other_axis_is_left_alone() -> None:
    nodes, inits = _ln_nodes("pow", 17)
    nodes[0] = helper.make_node("ReduceMean", ["x"], ["mu"], axes=[1])
    x = _RNG.standard_normal((2, 5, 24)).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, inits), {"x": x}, "sync")
    assert "LayerNormalization" not in _ops(model)


# -- RMS norm (T5's LayerNorm) --------------------------------------------------------------


def _rms_nodes(variant: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """torch.onnx's T5LayerNorm: Pow(x, 2) -> ReduceMean -> Add eps -> Sqrt -> Div(1, s)
    -> Mul(x, r) -> Mul(weight, .); ``variant`` swaps in the other forms."""
    mk = helper.make_node
    inits = [_c("two", 2.0), _c("eps", 1e-6), _c("one", 1.0), _c("g", _RNG.standard_normal(24))]
    sq = mk("Mul", ["x", "x"], ["p"]) if variant == "mul" else mk("Pow", ["x", "two"], ["p"])
    nodes = [sq, mk("ReduceMean", ["p"], ["var"], axes=[-1]), mk("Add", ["var", "eps"], ["ve"]),
             mk("Sqrt", ["ve"], ["s"])]  # fmt: skip
    if variant == "div_x":
        nodes.append(mk("Div", ["x", "s"], ["n"]))
    elif variant == "reciprocal":
        nodes += [mk("Reciprocal", ["s"], ["r"]), mk("Mul", ["r", "x"], ["n"])]
    else:
        nodes += [mk("Div", ["one", "s"], ["r"]), mk("Mul", ["x", "r"], ["n"])]
    if variant == "no_weight":
        nodes[-1].output[0] = "y"
    else:
        nodes.append(mk("Mul", ["g", "n"], ["y"]))
    return nodes, inits


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("variant", ["pow", "mul", "div_x", "reciprocal", "no_weight"])
def test_rms_norm_pattern_becomes_rms_normalization(jit: str, executor: str, variant: str) -> None:
    nodes, inits = _rms_nodes(variant)
    x = _RNG.standard_normal((2, 5, 24)).astype(np.float32) * 3 + 1
    model = _run_all(_model(nodes, x.shape, inits), {"x": x}, executor)
    assert _ops(model) == ["RMSNormalization"], _ops(model)


def test_rms_norm_with_an_intermediate_read_elsewhere_is_left_alone() -> None:
    nodes, inits = _rms_nodes("pow")
    x = _RNG.standard_normal((2, 5, 24)).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, inits, outputs=("y", "var")), {"x": x}, "sync")
    assert "RMSNormalization" not in _ops(model)


# -- MatMul(A, Transpose(B)) ---------------------------------------------------------------


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("scale", ["none", "const", "computed"])
@pytest.mark.parametrize("batch", [1, 3])
def test_matmul_transposed_operand(executor: str, scale: str, batch: int) -> None:
    """Attention scores: q @ k^T (k's last two axes swapped), optionally with a scalar
    scaling between the Transpose and the MatMul (computed at run time or constant)."""
    mk = helper.make_node
    nodes = [mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    inits = [_c("s", [0.125])]
    if scale == "const":
        nodes.append(mk("Mul", ["kt", "s"], ["kts"]))
    elif scale == "computed":
        nodes += [
            mk("ReduceMax", ["x"], ["mx"], keepdims=0),
            mk("Div", ["s", "mx"], ["sc"]),
            mk("Reshape", ["sc", "one_shape"], ["sc1"]),
            mk("Mul", ["sc1", "kt"], ["kts"]),
        ]
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "one_shape"))
    b = "kt" if scale == "none" else "kts"
    nodes += [mk("MatMul", ["x", b], ["sc_"]), mk("Softmax", ["sc_"], ["y"], axis=-1)]
    x = _RNG.standard_normal((batch, 3, 10, 8)).astype(np.float32)
    k = _RNG.standard_normal((batch, 3, 10, 8)).astype(np.float32)
    m = _model(nodes, x.shape, inits, extra_inputs=(("k", k.shape),))
    model = _run_all(m, {"x": x, "k": k}, executor)
    assert "MatMulTransB" in _ops(model) and "Transpose" not in _ops(model)


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("shape", [(1, 3, 10, 8), (1, 3, 197, 64)])  # NumPy's, native rows
def test_scaled_dot_product_scalings_become_the_products_alpha(
    executor: str, shape: tuple[int, ...]
) -> None:
    """torch's scaled dot-product attention export: Q and K each times sqrt(scale) (a
    value computed from K's shape) before Q @ K^T. Both Muls go: the product applies
    their factor."""
    mk = helper.make_node
    nodes = [
        mk("Shape", ["k"], ["ks"]),
        mk("Gather", ["ks", "last"], ["d"], axis=0),
        mk("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        mk("Sqrt", ["df"], ["sd"]),
        mk("Div", ["one", "sd"], ["scale"]),
        mk("Sqrt", ["scale"], ["root"]),
        mk("Mul", ["x", "root"], ["qs"]),
        mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        mk("Mul", ["kt", "root"], ["kts"]),
        mk("MatMul", ["qs", "kts"], ["sc"]),
        mk("Softmax", ["sc"], ["y"], axis=-1),
    ]
    inits = [_c("one", 1.0), numpy_helper.from_array(np.array(3, np.int64), "last")]
    x = _RNG.standard_normal(shape).astype(np.float32)
    k = _RNG.standard_normal(shape).astype(np.float32)
    m = _model(nodes, x.shape, inits, extra_inputs=(("k", k.shape),))
    model = _run_all(m, {"x": x, "k": k}, executor)
    ops = _ops(model)
    assert "MatMulTransB" in ops and "Mul" not in ops and "Transpose" not in ops
    (mm,) = [n for n in model.prepared.graph.nodes if n.op_type == "MatMulTransB"]
    assert len(mm.inputs) == 4


def test_a_scaled_operand_read_elsewhere_keeps_its_mul() -> None:
    mk = helper.make_node
    nodes = [
        mk("Mul", ["x", "s"], ["qs"]),
        mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        mk("MatMul", ["qs", "kt"], ["y"]),
        mk("Relu", ["qs"], ["z"]),
    ]
    x = _RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    k = _RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    m = _model(nodes, x.shape, [_c("s", [0.5])], outputs=("y", "z"), extra_inputs=(("k", k.shape),))
    model = _run_all(m, {"x": x, "k": k}, "sync")
    assert "Mul" in _ops(model) and "MatMulTransB" in _ops(model)


def test_matmul_transpose_of_other_axes_is_left_alone() -> None:
    mk = helper.make_node
    nodes = [mk("Transpose", ["k"], ["kt"], perm=[1, 0, 2]), mk("MatMul", ["x", "kt"], ["y"])]
    x = _RNG.standard_normal((4, 3, 5)).astype(np.float32)
    k = _RNG.standard_normal((5, 4, 6)).astype(np.float32)
    m = _model(nodes, x.shape, [], extra_inputs=(("k", k.shape),))
    model = _run_all(m, {"x": x, "k": k}, "sync")
    assert _ops(model) == ["Transpose", "MatMul"]
    assert _report(model) == "nothing to fuse"


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_silu_becomes_swish_and_joins_the_linear(executor: str) -> None:
    mk = helper.make_node
    nodes = [
        mk("MatMul", ["x", "w"], ["z"]),
        mk("Sigmoid", ["z"], ["s"]),
        mk("Mul", ["s", "z"], ["y"]),
    ]
    x = _RNG.standard_normal((4, 16)).astype(np.float32)
    model = _run_all(_model(nodes, x.shape, [_c("w", _RNG.standard_normal((16, 8)))]), {"x": x},
                     executor, rtol=1e-4, atol=1e-4)  # fmt: skip
    assert _ops(model) == ["Linear"]
    assert [s[0] for s in model.prepared.graph.nodes[0].attrs["activation"]] == ["Swish"]


# -- Softmax in place ------------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [False, True])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_runs_in_place(fallback: bool, opset: int, dtype: Any) -> None:
    """Softmax is registered in place: ``out`` may be ``x``, on the fast path and when the
    row-sum test sends the call to the classic path (rows far below the global max)."""
    from tfrt_py.ir import Node, Value
    from tfrt_py.kernels import KernelContext, default_registry
    from tfrt_py.kernels.base import OUT_INPLACE

    kdef = default_registry().lookup("", "Softmax", opset)
    assert kdef.flags == OUT_INPLACE
    node = Node("Softmax", [Value("x")], [Value("y")], {"axis": -1}, name="s", opset=opset)
    fn = kdef.build(KernelContext(node))
    x = _RNG.standard_normal((3, 40, 17)).astype(dtype)
    if fallback:
        x[1] -= 1000.0  # its exp-sums underflow after the global shift
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    buf = x.copy()
    assert fn(buf, out=buf) is buf
    np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fn(x), want, rtol=1e-5, atol=1e-7)  # and not in place


def test_rms_normalization_keeps_shapes_fixed_by_the_signature() -> None:
    """The fused node's output shape follows from its input's, as for LayerNormalization:
    without that, every Shape/Gather/Concat computation downstream ran on each call
    instead of once per input signature (T5: 206 -> 233 µs per call)."""
    from tfrt_py.compiler.dynamic import shape_determined

    nodes, inits = _rms_nodes("pow")
    m = tfrt_py.load(_model(nodes, ("n", 5, 24), inits), executor="sync")
    graph = m.prepared.graph
    (rms,) = [n for n in graph.nodes if n.op_type == "RMSNormalization"]
    assert id(rms.outputs[0]) in shape_determined(graph, lambda n: None)
