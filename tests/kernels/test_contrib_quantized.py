"""onnxruntime's QOperator ops (com.microsoft QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearConcat, QGemm) against onnxruntime's CPU
provider on random cases with the edges: values saturating at both type limits, zero points
at both ends of their range, uint8 and int8, broadcasting, per-column scales; and bad
constant scales refused at load, naming the node."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import (
    edge_codes,
    nbits_inputs,
    node_model,
    ort_outputs,
    runtime_feeds,
    tfrt_outputs,
)
from tests.support.ort_quant import u8s8_saturates
from tfrt_py.errors import UnsupportedOpError

RNG = np.random.default_rng(11)
F32 = np.float32


def _q(shape: tuple[int, ...], dt: Any) -> np.ndarray:
    return edge_codes(RNG, shape, dt)


def _s(v: float) -> np.ndarray:
    return np.array(v, F32)


def _z(v: int, dt: Any) -> np.ndarray:
    return np.array(v, dt)


def _check(op: str, inputs: list[Any], attrs: dict[str, Any] | None = None,
           const: tuple[int, ...] = ()) -> None:  # fmt: skip
    """Every executor, every call: the outputs equal onnxruntime's (floats to 1e-6)."""
    model = node_model(op, inputs, attrs, const=const)
    feeds = runtime_feeds(inputs, const)
    want = ort_outputs(model, feeds)
    for ex in ("sync", "async"):
        m = tfrt_py.load(model, executor=ex)
        for _ in range(2):
            got = tfrt_outputs(m, feeds)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape, (op, g.dtype, w.dtype)
                if g.dtype.kind == "f":
                    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
                else:
                    np.testing.assert_array_equal(g, w)


DTYPES = [np.uint8, np.int8]
ZPS = {np.uint8: (0, 128, 255), np.int8: (-128, 0, 127)}


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(
    "shapes",
    [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((1, 5), (3, 1)), ((3, 4, 5, 6), (3, 1, 1, 6))],
)
@pytest.mark.compiles
def test_binary(op: str, dt: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    for za, zc in [(ZPS[dt][0], ZPS[dt][2]), (ZPS[dt][1], ZPS[dt][1]), (ZPS[dt][2], ZPS[dt][0])]:
        a, b = _q(shapes[0], dt), _q(shapes[1], dt)
        scales = (0.02, 0.05, 0.01) if op == "QLinearAdd" else (0.02, 0.05, 0.5)
        inputs = [a, _s(scales[0]), _z(za, dt), b, _s(scales[1]), _z(ZPS[dt][1], dt),
                  _s(scales[2]), _z(zc, dt)]  # fmt: skip
        _check(op, inputs, const=(1, 2, 4, 5, 6, 7))
        _check(op, inputs)


@pytest.mark.compiles
def test_a_batch_of_squeeze_excitation_scales_runs_compiled() -> None:
    """EfficientNet at batch 8: QLinearMul of (N, 1, 1, C) scales by (N, H, W, C) codes runs
    compiled, image by image (it fell to NumPy's broadcast: 40x the batch-1 time), with
    NumPy's answers."""
    pytest.importorskip("numba", reason="the compiled path is numba's")
    from tfrt_py.kernels.contrib.quantized_elementwise import _BINARY, compiled_binary

    if _BINARY.get() is None:
        pytest.skip("numba is off in this process")
    a, b = _q((3, 4, 5, 6), np.uint8), _q((3, 1, 1, 6), np.uint8)
    params = np.array([3, 250, 0.01, 0, 7, 0, 255], np.float32)
    got = compiled_binary(False, a, b, params, np.dtype(np.uint8))
    assert got is not None and got.shape == a.shape
    one = [compiled_binary(False, a[i : i + 1], b[i : i + 1], params, np.dtype(np.uint8))
           for i in range(3)]  # fmt: skip
    np.testing.assert_array_equal(got, np.concatenate(one))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("x_shape", "shape"),
    [((4, 3, 8), (4, 3, 8)), ((1, 1, 8), (4, 3, 8)), ((8,), (4, 3, 8)), ((1,), (2, 5)),
     ((5,), (5,)), ((0, 5), (0, 5)), ((1, 3, 8), (4, 3, 8)), ((4, 1, 8), (4, 3, 8)),
     ((2, 1, 3, 1), (2, 4, 3, 5)), ((3, 5), (2, 3, 5))],
)  # fmt: skip
def test_a_broadcast_operand_is_viewed_as_rows_only_without_a_copy(
    x_shape: tuple[int, ...], shape: tuple[int, ...]
) -> None:
    """The compiled QLinearAdd/Mul read each operand as (rows, last axis): a view where
    NumPy's own reshape of the broadcast makes one (same values, same memory), None where
    it copies; read-only, and built without setting ``shape`` (a warning, an error here,
    from NumPy 2.5)."""
    from tfrt_py.kernels.contrib.quantized_elementwise import _rows

    x = np.random.default_rng(3).integers(0, 256, x_shape).astype(np.uint8)
    ref = np.broadcast_to(x, shape).reshape(-1, shape[-1])
    got = _rows(x, shape)
    if ref.size and not np.shares_memory(ref, x):
        assert got is None
        return
    assert got is not None and got.shape == ref.shape and not got.flags.writeable
    np.testing.assert_array_equal(got, ref)
    assert ref.size == 0 or np.shares_memory(got, x)


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("dt", DTYPES)
def test_unary(op: str, dt: Any) -> None:
    x = np.arange(256, dtype=np.int64).astype(np.uint8).view(dt).reshape(4, 64)
    attrs = {"alpha": 0.1} if op == "QLinearLeakyRelu" else {}
    for zx, zy in [(ZPS[dt][0], ZPS[dt][2]), (ZPS[dt][1], ZPS[dt][1])]:
        inputs = [x, _s(0.05), _z(zx, dt), _s(1.0 / 256 if op == "QLinearSigmoid" else 0.04),
                  _z(zy, dt)]  # fmt: skip
        _check(op, inputs, attrs, const=(1, 2, 3, 4))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.compiles
def test_global_average_pool(dt: Any, channels_last: int) -> None:
    for shape in [(2, 3, 7, 7), (1, 5, 1, 1), (1, 4, 3, 2, 2)]:
        x = _q(shape, dt)
        inputs = [x, _s(0.03), _z(ZPS[dt][2], dt), _s(0.02), _z(ZPS[dt][0], dt)]
        _check("QLinearGlobalAveragePool", inputs, {"channels_last": channels_last},
               const=(1, 2, 3, 4))  # fmt: skip


@pytest.mark.parametrize("dt", DTYPES)
def test_concat(dt: Any) -> None:
    xs = [_q((2, k, 3), dt) for k in (1, 4, 2)]
    inputs: list[Any] = [_s(0.05), _z(ZPS[dt][1], dt)]
    for x, (s, z) in zip(xs, [(0.05, ZPS[dt][1]), (0.2, ZPS[dt][0]), (0.01, ZPS[dt][2])]):
        inputs += [x, _s(s), _z(z, dt)]
    _check("QLinearConcat", inputs, {"axis": 1})


# QGemm: onnxruntime's u8 x s8 kernels on CPUs without VNNI sum pairs of products in
# 16 bits and saturate (so does its QLinearConv: ResNet-18 off by up to 44 units on such a
# host); B's int8 values stay within +-64 there, where no pair can saturate. u8 x u8 is exact.
@pytest.mark.parametrize(
    ("a_dt", "b_dt"), [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
)
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1)])
@pytest.mark.parametrize("requant", [True, False])
def test_qgemm(a_dt: Any, b_dt: Any, trans: tuple[int, int], requant: bool) -> None:
    m, k, n = 5, 33, 7
    a = _q((k, m) if trans[0] else (m, k), a_dt)
    b = _q((n, k) if trans[1] else (k, n), b_dt)
    if b_dt == np.int8:
        b = (b // 2).astype(np.int8)
        if a_dt == np.int8:
            a = (a // 2).astype(np.int8)
    c = RNG.integers(-5000, 5000, (n,)).astype(np.int32)
    b_scale = RNG.uniform(0.001, 0.01, n).astype(F32)
    b_zp = np.zeros(n, b_dt)  # onnxruntime takes per-column zero points of 0 only for s8
    if b_dt == np.uint8:
        b_zp = RNG.integers(0, 256, n).astype(b_dt)
    a_zp = _z(ZPS[a_dt][1], a_dt)
    y: list[Any] = [_s(0.05), _z(ZPS[a_dt][0], a_dt)] if requant else []
    inputs = [a, _s(0.02), a_zp, b, b_scale, b_zp, c, *y]
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.75}
    _check("QGemm", inputs, attrs, const=(1, 2, 3, 4, 5, 6, 7, 8)[: len(inputs) - 1])


@pytest.mark.parametrize("scale", [0.0, float("nan"), -1.0, float("inf")])
def test_bad_constant_scale_is_refused_at_load(scale: float) -> None:
    x = _q((2, 3), np.uint8)
    inputs = [x, _s(scale), _z(0, np.uint8), x, _s(0.1), _z(0, np.uint8), _s(0.1),
              _z(0, np.uint8)]  # fmt: skip
    model = node_model("QLinearAdd", inputs, const=(1, 2, 4, 5, 6, 7))
    model.graph.node[0].name = "the_add"
    with pytest.raises(UnsupportedOpError, match=r"the_add.*positive and finite"):
        tfrt_py.load(model)


@pytest.mark.compiles
def test_bad_scale_at_run_time_is_an_error_and_the_model_stays_usable() -> None:
    x = _q((2, 3), np.uint8)
    inputs = [x, _s(0.1), _z(0, np.uint8), x, _s(0.1), _z(0, np.uint8), _s(0.1),
              _z(0, np.uint8)]  # fmt: skip
    model = tfrt_py.load(node_model("QLinearAdd", inputs))
    feeds = runtime_feeds(inputs)
    good = model.run(feeds)["y0"]
    with pytest.raises(tfrt_py.errors.TfrtError, match="positive and finite"):
        model.run({**feeds, "i6": _s(0.0)})
    np.testing.assert_array_equal(model.run(feeds)["y0"], good)


@pytest.mark.parametrize(
    ("acc", "sa", "sb", "sy"),
    [
        (13408, 0.07115039974451065, 0.006491904146969318, 0.08542311936616898),
        (432, 0.07784067094326019, 0.029768450185656548, 0.02063976787030697),
        (3475, 0.0672711730003357, 0.059586361050605774, 0.09844060242176056),
        (6324, 0.023357108235359192, 0.04812176898121834, 0.05169515684247017),
    ],
)
def test_requantize_rounds_in_float32_as_onnxruntime(
    acc: int, sa: float, sb: float, sy: float
) -> None:
    """The accumulator times the output scale rounds as MLAS's requantize does, in float32:
    these cases fall on the other side of .5 in float64 (found by search; a float64
    requantize left a quantized ResNet-18 7e-3 of its output scale from onnxruntime, float32
    matches it bit for bit)."""
    row = np.zeros((1, 64), np.uint8)
    q, r = divmod(acc, 255)
    row[0, :q] = 255
    row[0, q] = r
    inputs = [row, _s(sa), _z(0, np.uint8), np.ones((64, 1), np.uint8), _s(sb), _z(0, np.uint8),
              _s(sy), _z(0, np.uint8)]  # fmt: skip
    model = node_model("QLinearMatMul", inputs, domain="", const=(1, 2, 3, 4, 5, 6, 7))
    want = ort_outputs(model, runtime_feeds(inputs, (1, 2, 3, 4, 5, 6, 7)))
    got = tfrt_outputs(model, runtime_feeds(inputs, (1, 2, 3, 4, 5, 6, 7)))
    np.testing.assert_array_equal(got[0], want[0])


# -- MatMulNBits ----------------------------------------------------------------------------


def _nbits_inputs(k: int, n: int, bits: int, block: int, zp: str, bias: bool,
                  a_shape: tuple[int, ...]) -> list[Any]:  # fmt: skip
    return nbits_inputs(RNG, a_shape, k, n, bits, block, zp, bias)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("k", "block"), [(64, 32), (40, 16), (300, 128), (16, 16)])
@pytest.mark.parametrize("zp", ["none", "packed", "float"])
@pytest.mark.compiles
def test_matmul_nbits(bits: int, k: int, block: int, zp: str) -> None:
    """Codes low bits first, K not a multiple of the block, zero points absent (2**(bits-1)),
    packed or float, a bias, A of rank 2 and 3; the weight constant (dequantized at load) and
    given at run time."""
    if zp == "float" and bits == 8:
        pytest.skip("onnxruntime's CPU MatMulNBits refuses 8-bit weights with float zero points")
    for a_shape, bias in [((3,), False), ((2, 5), True)]:
        inputs = _nbits_inputs(k, 6, bits, block, zp, bias, a_shape)
        attrs = {"K": k, "N": 6, "bits": bits, "block_size": block}
        model = node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3, 5))
        feeds = runtime_feeds(inputs, (1, 2, 3, 5))
        want = ort_outputs(model, feeds)[0]
        for m in (model, node_model("MatMulNBits", inputs, attrs)):
            got = tfrt_outputs(m, runtime_feeds(inputs, () if m is not model else (1, 2, 3, 5)))
            np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"bits": 3}, "bits=3"),
        ({"block_size": 24}, "power of two"),
        ({"K": 65}, "B holds"),
    ],
)
def test_matmul_nbits_bad_models_are_refused_at_load(attrs: dict[str, Any], match: str) -> None:
    inputs = _nbits_inputs(64, 4, 4, 32, "none", False, (2,))
    attrs = {"K": 64, "N": 4, "bits": 4, "block_size": 32, **attrs}
    model = node_model("MatMulNBits", inputs, attrs, const=(1, 2))
    model.graph.node[0].name = "the_proj"
    with pytest.raises(UnsupportedOpError, match="the_proj") as e:
        tfrt_py.load(model)
    assert match in str(e.value)


# -- QAttention, QEmbedLayerNormalization --------------------------------------------------


def _close(inputs: list[Any], op: str, attrs: dict[str, Any], const: tuple[int, ...],
           outputs: tuple[bool, ...] = (True,)) -> None:  # fmt: skip
    for c in (const, ()):
        model = node_model(op, inputs, attrs, const=c, outputs=outputs)
        feeds = runtime_feeds(inputs, c)
        want = ort_outputs(model, feeds)
        got = tfrt_outputs(model, feeds)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            scale = max(float(np.abs(w).max()), 1e-6)
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("mask", [False, True])
def test_qattention(per_column: bool, mask: bool) -> None:
    b, s, h, heads = 2, 5, 16, 2
    x = _q((b, s, h), np.uint8)
    w = (_q((h, 3 * h), np.int8) // 2).astype(np.int8)  # no u8 x s8 pair saturates (QGemm)
    bias = RNG.standard_normal(3 * h).astype(F32)
    ws = RNG.uniform(0.01, 0.05, 3 * h).astype(F32) if per_column else _s(0.02)
    wz = np.zeros(3 * h, np.int8) if per_column else _z(0, np.int8)
    mask_index = np.array([5, 3], np.int32) if mask else None
    inputs = [x, w, bias, _s(0.03), ws, mask_index, _z(128, np.uint8), wz]
    _close(inputs, "QAttention", {"num_heads": heads}, const=(1, 2, 3, 4, 6, 7))


def test_qattention_projects_on_the_integer_kernel() -> None:
    """With constant weights, scales, zero points and bias, QAttention's projection is one
    call of the integer kernel's float-storing form (it ran float32 BLAS on dequantized
    operands), and the answer stays onnxruntime's."""
    pytest.importorskip("numba", reason="the integer kernel's driver is numba's")
    from tests.support.jit_paths import spying_jitted
    from tfrt_py.kernels.lib import qgemm_rows

    if qgemm_rows._SCALED.get() is None:
        pytest.skip("no integer kernel in this process")
    b, s, h, heads = 2, 7, 32, 4
    x = _q((b, s, h), np.uint8)
    w = _q((h, 3 * h), np.int8)
    bias = RNG.standard_normal(3 * h).astype(F32)
    ws = RNG.uniform(0.01, 0.05, 3 * h).astype(F32)
    inputs = [x, w, bias, _s(0.03), ws, None,
              _z(100, np.uint8), np.zeros(3 * h, np.int8)]  # fmt: skip
    const = (1, 2, 3, 4, 6, 7)
    model = node_model("QAttention", inputs, {"num_heads": heads}, const=const)
    feeds = runtime_feeds(inputs, const)
    want = ort_outputs(model, feeds)
    m = tfrt_py.load(model, executor="sync")
    with spying_jitted(qgemm_rows._SCALED) as calls:
        (got,) = tfrt_outputs(m, feeds)
    assert calls == [1]
    # onnxruntime's float Attention over the dequantized operands: exact products, where
    # its QAttention's may saturate (tests.support.ort_quant.SATURATES)
    xf = ((x.astype(np.int32) - 100) * np.float32(0.03)).astype(F32)
    wf = (w.astype(F32) * ws).astype(F32)
    exact = ort_outputs(node_model("Attention", [xf, wf, bias], {"num_heads": heads},
                                   const=(1, 2)), {"i0": xf})  # fmt: skip
    tol = 1e-4 * float(np.abs(exact[0]).max())
    np.testing.assert_allclose(got, exact[0], rtol=0, atol=tol)
    if not u8s8_saturates():
        np.testing.assert_allclose(got, want[0], rtol=0, atol=tol)


def test_qembed_layer_normalization() -> None:
    b, s, h, vocab = 2, 6, 8, 20
    ids = RNG.integers(0, vocab, (b, s)).astype(np.int32)
    seg = RNG.integers(0, 2, (b, s)).astype(np.int32)
    tables = [_q((vocab, h), np.uint8), _q((16, h), np.uint8), _q((2, h), np.uint8),
              _q((h,), np.uint8), _q((h,), np.uint8)]  # fmt: skip
    scales = [_s(v) for v in (0.02, 0.01, 0.03, 0.004, 0.002)]
    zps = [_z(v, np.uint8) for v in (128, 0, 255, 3, 128)]
    mask = np.ones((b, s), np.int32)
    mask[1, 4:] = 0
    inputs = [ids, seg, *tables, mask, *scales, *zps]
    _close(inputs, "QEmbedLayerNormalization", {"epsilon": 1e-12}, const=tuple(range(2, 7)) +
           tuple(range(8, 18)), outputs=(True, True))  # fmt: skip


def test_qattention_bad_constant_weight_scale_is_refused_at_load() -> None:
    h = 8
    inputs = [_q((1, 3, h), np.uint8), _q((h, 3 * h), np.int8), np.zeros(3 * h, F32), _s(0.1),
              _s(0.0), None, _z(0, np.uint8), _z(0, np.int8)]  # fmt: skip
    model = node_model("QAttention", inputs, {"num_heads": 2}, const=(1, 2, 3, 4, 6, 7))
    model.graph.node[0].name = "the_attention"
    with pytest.raises(UnsupportedOpError, match=r"the_attention.*positive and finite"):
        tfrt_py.load(model)


@pytest.mark.parametrize(("a_dt", "b_dt"), [(np.uint8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer_to_float(a_dt: Any, b_dt: Any, per_column: bool) -> None:
    k, n = 40, 6
    a = _q((2, 3, k), a_dt)
    b = _q((k, n), b_dt)
    if b_dt == np.int8:
        b = (b // 2).astype(np.int8)
    bs = RNG.uniform(0.01, 0.1, n).astype(F32) if per_column else _s(0.03)
    bz = _q((n,), b_dt) if per_column and b_dt == np.uint8 else None
    inputs = [a, b, _s(0.02), bs, _z(ZPS[a_dt][1], a_dt), bz, RNG.standard_normal(n).astype(F32)]
    _close(inputs, "MatMulIntegerToFloat", {}, const=(1, 3, 5, 6))


@pytest.mark.parametrize("b_zp", [False, True])
def test_dynamic_quantize_matmul(b_zp: bool) -> None:
    k, n = 33, 5
    a = RNG.standard_normal((4, k)).astype(F32)
    a[0, 0] = 0.0
    b = (_q((k, n), np.int8) // 2).astype(np.int8)
    zp = np.zeros(n, np.int8) if b_zp else None
    inputs = [a, b, RNG.uniform(0.01, 0.1, n).astype(F32), zp, RNG.standard_normal(n).astype(F32)]
    _close(inputs, "DynamicQuantizeMatMul", {}, const=(1, 2, 3, 4))
    _close([np.abs(a), *inputs[1:]], "DynamicQuantizeMatMul", {}, const=(1, 2, 3, 4))
