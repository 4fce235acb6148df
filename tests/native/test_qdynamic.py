"""What ``onnxruntime.quantization.quantize_dynamic`` writes, on the native tier
(``native/lower/ops_quant.py``, ``native/kernels/qdynamic.py``): DynamicQuantizeLinear, the
MatMulInteger groups ``fuse_dynamic_quant`` makes MatMulIntegerToFloat, and the quantized
embeddings' Gather + DequantizeLinear. The compiled function's own outputs (called
directly) are the interpreter's bits, and onnxruntime's within float rounding: K not a whole
group of the kernel, N not a whole vector, weights uint8 with zero points and int8 without,
per-column scales, no bias; NaN and infinities in the quantized input; every row count of a
symbolic dim from one function."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.contrib import ort_outputs
from tests.support.ort_quant import u8s8_saturates
from tfrt_py.kernels.lib import qgemm_packed
from tfrt_py.native.runtime.entry import ROUNDING_TOL

RNG = np.random.default_rng(36)
F32 = np.float32

pytestmark = pytest.mark.skipif(
    qgemm_packed.available() is None, reason="no integer kernel on this host (portable path)"
)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
           consts: dict[str, np.ndarray]) -> onnx.ModelProto:  # fmt: skip
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "q", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compiled(m: tfrt_py.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The compiled function's outputs for ``feeds`` (not the interpreter's)."""
    assert m.native.state == "ready"
    low, fn = m.native.lowered, m.native.compiled.fn
    outs = fn(*[np.array(feeds[n], order="C") for n in low.input_names], *low.params)
    return list(outs if isinstance(outs, tuple) else (outs,))


def _dql_model(n: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    outs = [helper.make_tensor_value_info("y", TensorProto.UINT8, [n]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("z", TensorProto.UINT8, [])]  # fmt: skip
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    return _model([node], [x], outs, {})


def _values(kind: str) -> np.ndarray:
    x = RNG.standard_normal(37).astype(F32) * 3
    if kind == "positive":
        return np.abs(x) + 0.5
    if kind == "negative":
        return -np.abs(x) - 0.5
    if kind == "zeros":
        return np.zeros(37, F32)
    if kind == "one":
        return np.array([-2.5], F32)
    if kind in ("nan", "inf", "-inf"):
        x[[3, 20]] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[kind]
    if kind == "halves":  # codes at exact halves round to even
        return np.array([0.0, 0.5, 1.5, 2.5, 254.5, 255.0], F32)
    return x


@pytest.mark.parametrize("kind", ["normal", "positive", "negative", "zeros", "one", "halves",
                                  "nan", "inf", "-inf"])  # fmt: skip
@pytest.mark.compiles
def test_dynamic_quantize_linear_is_the_interpreters(kind: str) -> None:
    """Codes, scale and zero point, bit for bit; onnxruntime's where every value is
    finite (it has no defined answer for NaN or infinity)."""
    x = _values(kind)
    model = _dql_model(x.size)
    m = tfrt_py.load(model, executor="native", native="eager")
    assert "dql_u8(" in m.native.lowered.source
    got = _compiled(m, {"x": x})
    want = tfrt_py.load(model, executor="sync").run({"x": x})
    with np.errstate(invalid="ignore"):
        for g, k in zip(got, ("y", "s", "z")):
            np.testing.assert_array_equal(np.asarray(g), want[k], err_msg=k)
    if np.all(np.isfinite(x)):
        for g, o in zip(got, ort_outputs(model, {"x": x})):
            np.testing.assert_array_equal(np.asarray(g), o)


def _product_model(rows: int | str, k: int, n: int, wtype: Any, w_zp: bool, per_column: bool,
                   bias: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:  # fmt: skip
    """A product as ``quantize_dynamic`` writes it: DynamicQuantizeLinear, MatMulInteger,
    Cast, the scales' Mul and the bias' Add."""
    lo, hi = (0, 256) if wtype == np.uint8 else (-127, 128)
    ws = RNG.uniform(0.002, 0.02, n) if per_column else np.array(0.01)
    consts = {"w": RNG.integers(lo, hi, (k, n)).astype(wtype), "ws": ws.astype(F32)}
    ins = ["xq", "w", "xz"]
    if w_zp:
        consts["wz"] = np.array(131 if wtype == np.uint8 else 3, wtype)
        ins.append("wz")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["mult"]),
             helper.make_node("MatMulInteger", ins, ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "mult"], ["y0" if bias else "y"])]  # fmt: skip
    if bias:
        consts["b"] = RNG.standard_normal(n).astype(F32)
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])
    return _model(nodes, [x], [y], consts), consts


@pytest.mark.parametrize(
    ("rows", "k", "n", "wtype", "w_zp", "per_column", "bias"),
    [
        (64, 256, 64, np.int8, False, False, True),  # BERT's form
        (7, 30, 20, np.uint8, True, False, False),  # K past a whole group, N past a vector
        (1, 64, 48, np.int8, False, True, True),
        (5, 300, 33, np.uint8, True, True, True),
    ],
)
@pytest.mark.compiles
def test_the_dynamic_product_is_the_interpreters(rows: int, k: int, n: int, wtype: Any,
                                                 w_zp: bool, per_column: bool,
                                                 bias: bool) -> None:  # fmt: skip
    model, _ = _product_model(rows, k, n, wtype, w_zp, per_column, bias)
    m = tfrt_py.load(model, executor="native", native="eager")
    assert "qmm_u8(" in m.native.lowered.source and "dql_u8(" in m.native.lowered.source
    x = RNG.standard_normal((rows, k)).astype(F32)
    got = _compiled(m, {"x": x})[0]
    np.testing.assert_array_equal(got, tfrt_py.load(model, executor="sync").run({"x": x})["y"])
    if wtype == np.int8 and u8s8_saturates():
        return  # (tests.support.ort_quant.SATURATES: the interpreter's bits above are exact)
    want = ort_outputs(model, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.compiles
def test_one_function_serves_every_row_count() -> None:
    """A symbolic row dim: each call's rows through the native tier, the interpreter's bits."""
    model, _ = _product_model("N", 40, 24, np.int8, False, False, True)
    native = tfrt_py.load(model, executor="native", native="eager")
    sync = tfrt_py.load(model, executor="sync")
    for rows in (1, 3, 17, 40):
        x = RNG.standard_normal((rows, 40)).astype(F32)
        np.testing.assert_array_equal(native.run({"x": x})["y"], sync.run({"x": x})["y"])
    assert native.executor == "native" and "qmm_u8(" in native.native.lowered.source
    # the trial lets the tiers differ by a flipped code: the float parts before a
    # DynamicQuantizeLinear differ by an ulp between tiers in a model
    assert native.native.rounding_tol == ROUNDING_TOL


def test_quantized_embeddings_dequantize_on_the_native_tier() -> None:
    """Gather over a uint8 table, then DequantizeLinear: the rows' codes as the interpreter
    dequantizes them, out-of-range ids refused as the interpreter refuses them."""
    table = RNG.integers(0, 256, (50, 16)).astype(np.uint8)
    nodes = [helper.make_node("Gather", ["t", "ids"], ["g"]),
             helper.make_node("DequantizeLinear", ["g", "s", "z"], ["e"]),
             helper.make_node("Add", ["e", "h"], ["y"])]  # fmt: skip
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 7])
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 7, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 16])
    consts: dict[str, np.ndarray] = {"t": table, "s": np.array(0.037, F32),
                                     "z": np.array(121, np.uint8)}  # fmt: skip
    model = _model(nodes, [ids, h], [y], consts)
    m = tfrt_py.load(model, executor="native", native="eager")
    feeds: dict[str, np.ndarray] = {"ids": RNG.integers(0, 50, (1, 7)).astype(np.int64),
                                    "h": RNG.standard_normal((1, 7, 16)).astype(F32)}  # fmt: skip
    got = _compiled(m, feeds)[0]
    np.testing.assert_array_equal(got, tfrt_py.load(model, executor="sync").run(feeds)["y"])
    np.testing.assert_allclose(got, ort_outputs(model, feeds)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(tfrt_py.errors.TfrtError):
        m.run({**feeds, "ids": np.full((1, 7), 50, np.int64)})
    np.testing.assert_array_equal(m.run(feeds)["y"], got)  # still usable


def _ms_model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
              consts: dict[str, np.ndarray]) -> onnx.ModelProto:  # fmt: skip
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "q", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.compiles
def test_qattention_on_the_native_tier(masked: bool) -> None:
    """onnxruntime's optimizer's QAttention after DynamicQuantizeLinear: the projection on
    the integer kernel, the heads as the float Attention's; the interpreter's and
    onnxruntime's outputs to float rounding."""
    b_, s_, hin, heads = 2, 9, 32, 4
    consts: dict[str, np.ndarray] = {
              "w": RNG.integers(-127, 128, (hin, 3 * hin)).astype(np.int8),
              "bias": RNG.standard_normal(3 * hin).astype(F32),
              "ws": np.array(0.002, F32), "wz": np.array(0, np.int8)}  # fmt: skip
    ins = ["xq", "w", "bias", "xs", "ws", "mask" if masked else "", "xz", "wz"]
    qatt = helper.make_node("QAttention", ins, ["y"], domain="com.microsoft", num_heads=heads)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]), qatt]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b_, s_, hin])]
    if masked:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [b_]))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [b_, s_, hin])
    model = _ms_model(nodes, inputs, [y], consts)
    m = tfrt_py.load(model, executor="native", native="eager")
    assert "qmm_u8(" in m.native.lowered.source
    feeds: dict[str, np.ndarray] = {"x": RNG.standard_normal((b_, s_, hin)).astype(F32)}
    if masked:
        feeds["mask"] = np.array([s_, 5], np.int32)
    got = _compiled(m, feeds)[0]
    want = tfrt_py.load(model, executor="sync").run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if not u8s8_saturates():  # (tests.support.ort_quant.SATURATES; int8 weights)
        np.testing.assert_allclose(got, ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_qembed_layer_normalization_on_the_native_tier() -> None:
    """onnxruntime's QEmbedLayerNormalization: word, position and segment tables, gamma and
    beta quantized; the sums' LayerNorm and the mask's lengths as the interpreter's and
    onnxruntime's."""
    b_, s_, h = 2, 6, 16
    names = ("word", "pos", "seg", "gamma", "beta")
    shapes = {"word": (30, h), "pos": (8, h), "seg": (2, h), "gamma": (h,), "beta": (h,)}
    consts: dict[str, np.ndarray] = {}
    for n in names:
        consts[n] = RNG.integers(0, 256, shapes[n]).astype(np.uint8)
        consts[n + "_s"] = np.array(RNG.uniform(0.005, 0.05), F32)
        consts[n + "_z"] = np.array(RNG.integers(100, 156), np.uint8)
    ins = ["ids", "segs", *names, "mask", *(n + "_s" for n in names), *(n + "_z" for n in names)]
    node = helper.make_node("QEmbedLayerNormalization", ins, ["y", "mi"],
                            domain="com.microsoft", epsilon=1e-12)  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, [b_, s_])
              for n in ("ids", "segs", "mask")]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b_, s_, h]),
               helper.make_tensor_value_info("mi", TensorProto.INT32, [b_])]  # fmt: skip
    model = _ms_model([node], inputs, outputs, consts)
    m = tfrt_py.load(model, executor="native", native="eager")
    feeds = {"ids": RNG.integers(0, 30, (b_, s_)).astype(np.int32),
             "segs": RNG.integers(0, 2, (b_, s_)).astype(np.int32),
             "mask": np.array([[1] * s_, [1] * 4 + [0] * (s_ - 4)], np.int32)}  # fmt: skip
    got = _compiled(m, feeds)
    want = tfrt_py.load(model, executor="sync").run(feeds)
    ort = ort_outputs(model, feeds)
    np.testing.assert_allclose(got[0], want["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], ort[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got[1], want["mi"])
    np.testing.assert_array_equal(got[1], ort[1])


@pytest.mark.parametrize("case", ["normal", "zeros", "negative", "nan", "inf", "big"])
def test_dynamic_quantize_at_offsets_is_the_interpreters(case: str) -> None:
    """``dql_u8`` on a stretch of an arena (input and output at offsets, as the generated
    code calls it): the interpreter's codes, scale and zero point (its bits path for finite
    values, its NumPy path's arithmetic for NaN and infinities), and nothing written
    outside the stretch."""
    from tfrt_py.kernels.lib import quant
    from tfrt_py.native.kernels.qdynamic import dql_u8

    n, xo, yo = 1000, 37, 11
    x = RNG.standard_normal(n + 80).astype(F32)
    part = x[xo : xo + n]
    if case == "zeros":
        part[:] = 0
    elif case == "negative":
        part[:] = -np.abs(part) - 1
    elif case == "nan":
        part[[3, 500]] = np.nan
    elif case == "inf":
        part[7] = np.inf
    elif case == "big":
        part *= F32(3e37)
    y = np.full(n + 30, 7, np.uint8)
    s, z = np.zeros(3, F32), np.zeros(3, np.uint8)
    dql_u8(x, xo, n, y, yo, s, 1, z, 2)
    with np.errstate(invalid="ignore", over="ignore"):
        codes, scale, zp = quant.dynamic_quantize(part.copy())
    np.testing.assert_array_equal(y[yo : yo + n], codes)
    assert s[1] == scale and z[2] == zp
    assert (y[:yo] == 7).all() and (y[yo + n :] == 7).all()
