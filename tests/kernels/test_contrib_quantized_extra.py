"""onnxruntime's QLinearSoftmax, QLinearAveragePool, QLinearWhere and GatherBlockQuantized
(com.microsoft) against onnxruntime's CPU provider, on the sync and async executors, two
calls each, on random cases with the edges: codes at both type limits, zero points at both
ends of their range, uint8 and int8, both channel layouts, ceil mode and pads, broadcasting,
several axes, block sizes 16 to 128 with and without zero points, negative and edge indices;
and bad constants refused at load, naming the node.

QLinearSoftmax may differ from onnxruntime by one unit in a rare element (onnxruntime's
MLAS kernels differ by CPU, and a value within ~1e-7 of a half step may round the other
way); the rest are exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ort_quant
from onnxruntime.quantization import matmul_nbits_quantizer as mnq

import tfrt_py
from tests.support.contrib import edge_codes, node_model, ort_outputs, runtime_feeds, tfrt_outputs
from tests.support.ort_quant import u8s8_saturates
from tfrt_py.errors import UnsupportedOpError

RNG = np.random.default_rng(23)
F32 = np.float32
DTYPES = [np.uint8, np.int8]
ZPS = {np.uint8: (0, 128, 255), np.int8: (-128, 0, 127)}
_STATE = onnxruntime.capi.onnxruntime_pybind11_state
_ORT_REFUSALS = (_STATE.Fail, _STATE.InvalidArgument, _STATE.InvalidGraph, _STATE.NotImplemented)


def _s(v: float) -> np.ndarray:
    return np.array(v, F32)


def _z(v: int, dt: Any) -> np.ndarray:
    return np.array(v, dt)


def _want(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return ort_outputs(model, feeds)
    except _ORT_REFUSALS as e:
        pytest.skip(f"onnxruntime refuses the case: {e}")


def _check(op: str, inputs: list[Any], attrs: dict[str, Any] | None = None,
           const: tuple[int, ...] = (), tol: int = 0) -> np.ndarray:  # fmt: skip
    """Every executor, every call: the output equals onnxruntime's (floats bit for bit;
    integers within ``tol`` units, in at most one element in a thousand and one more).
    Returns onnxruntime's output."""
    model = node_model(op, inputs, attrs, const=const)
    feeds = runtime_feeds(inputs, const)
    want = _want(model, feeds)[0]
    for ex in ("sync", "async"):
        m = tfrt_py.load(model, executor=ex)
        for call in range(2):
            got = tfrt_outputs(m, feeds)[0]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (op, ex, call)
            if tol:
                diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
                assert diff.max(initial=0) <= tol, (op, ex, call, attrs, diff.max())
                assert np.count_nonzero(diff) <= 1 + diff.size // 1000, (op, ex, call, attrs)
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{op} {ex} call {call} {attrs}")
    return want


def _refused(op: str, inputs: list[Any], attrs: dict[str, Any], const: tuple[int, ...],
             match: str) -> None:  # fmt: skip
    model = node_model(op, inputs, attrs, const=const)
    model.graph.node[0].name = "the_node"
    with pytest.raises(UnsupportedOpError, match="the_node") as e:
        tfrt_py.load(model)
    assert match in str(e.value), str(e.value)


# -- QLinearSoftmax ------------------------------------------------------------------------


def _softmax_inputs(x: np.ndarray, x_scale: float, y_scale: float, y_zp: int) -> list[Any]:
    dt = x.dtype.type
    return [x, _s(x_scale), _z(ZPS[dt][1], dt), _s(y_scale), _z(y_zp, dt)]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize(("shape", "axis"), [((3, 5, 40), -1), ((3, 5, 40), 1), ((4, 33), 0),
                                             ((2, 70, 3), -2), ((6, 1), -1)])  # fmt: skip
def test_softmax(dt: Any, opset: int, shape: tuple[int, ...], axis: int) -> None:
    """The quantization tool's output parameters (1/256; zero point 0 or -128) and others
    with zero points at both ends; rows of one element (probability 1: floor(1 / y_scale)
    from the zero point, saturated); X_scale constant (the table made at load) or not."""
    x = edge_codes(RNG, shape, dt)
    lo, mid, hi = ZPS[dt]
    for x_scale, y_scale, y_zp in [(0.08, 1 / 256, lo), (0.02, 0.0071, mid), (0.3, 0.004, hi),
                                   (0.003, 1 / 255, lo)]:  # fmt: skip
        inputs = _softmax_inputs(x, x_scale, y_scale, y_zp)
        attrs = {"opset": opset, "axis": axis}
        _check("QLinearSoftmax", inputs, attrs, const=(1, 2, 3, 4), tol=1)
    _check("QLinearSoftmax", inputs, attrs, tol=1)


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_without_input_zero_point_and_default_axis(dt: Any) -> None:
    x = edge_codes(RNG, (2, 3, 17), dt)
    inputs = _softmax_inputs(x, 0.05, 1 / 256, ZPS[dt][0])
    inputs[2] = None
    _check("QLinearSoftmax", inputs, {"opset": 13}, const=(1, 3, 4), tol=1)


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_saturates_a_dominant_code(dt: Any) -> None:
    """One code far above the rest: probability 1, the top of the output range (int8 too:
    no wrap-around), the rest the zero point."""
    lo, _, hi = ZPS[dt]
    x = np.full((2, 35), lo, dt)
    x[:, 34] = hi
    inputs = _softmax_inputs(x, 0.5, 1 / 256, lo)
    want = _check("QLinearSoftmax", inputs, {"opset": 13}, const=(1, 2, 3, 4), tol=1)
    got = tfrt_outputs(node_model("QLinearSoftmax", inputs, {"opset": 13}), runtime_feeds(inputs))
    np.testing.assert_array_equal(got[0][:, 34], [hi, hi])
    np.testing.assert_array_equal(got[0][:, :34], np.full((2, 34), lo))
    assert want.dtype == dt


# -- QLinearAveragePool --------------------------------------------------------------------

POOLS = [
    # (spatial, kernel_shape, strides, pads, ceil_mode, count_include_pad, auto_pad)
    ((9,), (3,), (2,), (1, 1), 0, 0, "NOTSET"),
    ((10,), (4,), (3,), (2, 0), 1, 1, "NOTSET"),
    ((7, 6), (3, 2), (2, 2), (1, 0, 1, 1), 1, 0, "NOTSET"),
    ((7, 6), (3, 2), (2, 2), (1, 0, 1, 1), 1, 1, "NOTSET"),
    ((8, 8), (2, 2), (2, 2), (0, 0, 0, 0), 0, 0, "NOTSET"),
    ((6, 5), (3, 3), (1, 1), (1, 1, 1, 1), 0, 0, "NOTSET"),
    ((6, 5), (3, 3), (2, 1), (0, 0, 0, 0), 0, 1, "SAME_UPPER"),
    ((6, 5), (2, 3), (2, 2), (0, 0, 0, 0), 1, 0, "SAME_LOWER"),
    ((6, 5), (3, 2), (2, 2), (0, 0, 0, 0), 1, 0, "VALID"),
    ((7, 6), (7, 6), (1, 1), (0, 0, 0, 0), 0, 0, "NOTSET"),  # the whole image
    ((5, 4, 6), (2, 3, 2), (2, 1, 2), (1, 0, 1, 0, 2, 1), 1, 0, "NOTSET"),
    ((4, 4, 4), (4, 4, 4), (1, 1, 1), (0, 0, 0, 0, 0, 0), 0, 1, "NOTSET"),
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("case", POOLS)
@pytest.mark.compiles
def test_average_pool(dt: Any, channels_last: int, case: tuple[Any, ...]) -> None:
    spatial, kernel, strides, pads, ceil, cip, auto = case
    shape = (2, *spatial, 3) if channels_last else (2, 3, *spatial)
    x = edge_codes(RNG, shape, dt)
    attrs: dict[str, Any] = {"kernel_shape": list(kernel), "strides": list(strides),
                             "ceil_mode": ceil, "count_include_pad": cip,
                             "channels_last": channels_last}  # fmt: skip
    if auto == "NOTSET":
        attrs["pads"] = list(pads)
    else:
        attrs["auto_pad"] = auto
    lo, mid, hi = ZPS[dt]
    for x_zp, y_zp, y_scale in [(lo, hi, 0.02), (hi, lo, 0.05), (mid, mid, 0.011)]:
        inputs = [x, _s(0.037), _z(x_zp, dt), _s(y_scale), _z(y_zp, dt)]
        _check("QLinearAveragePool", inputs, attrs, const=(1, 2, 3, 4))
    _check("QLinearAveragePool", inputs, attrs)


def test_average_pool_random_geometry() -> None:
    """Random 1-D to 3-D geometries, both layouts: the window sums in onnxruntime's order."""
    rng = np.random.default_rng(5)
    for trial in range(24):
        dt = DTYPES[trial % 2]
        r = 1 + trial % 3
        kernel = [int(k) for k in rng.integers(1, 4, r)]
        pads = [int(rng.integers(0, k)) for k in kernel * 2]
        sp = [int(v) for v in rng.integers(max(kernel), 9, r)]
        last = int(rng.integers(0, 2))
        x = edge_codes(rng, (2, *sp, 4) if last else (2, 4, *sp), dt)
        attrs = {"kernel_shape": kernel, "strides": [int(s) for s in rng.integers(1, 3, r)],
                 "pads": pads, "ceil_mode": int(rng.integers(0, 2)),
                 "count_include_pad": int(rng.integers(0, 2)), "channels_last": last}  # fmt: skip
        info = np.iinfo(dt)
        zps = [int(v) for v in rng.integers(info.min, info.max + 1, 2)]
        inputs = [x, _s(rng.uniform(0.01, 0.1)), _z(zps[0], dt), _s(rng.uniform(0.01, 0.1)),
                  _z(zps[1], dt)]  # fmt: skip
        _check("QLinearAveragePool", inputs, attrs, const=(1, 2, 3, 4))


# -- QLinearWhere --------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(
    "shapes",
    [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((2, 1, 4), (3, 1), (4,)), ((), (2, 5), (1, 5)),
     ((5,), (1,), (3, 1))],
)  # fmt: skip
def test_where(dt: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
    """Broadcasting; X's scale and zero point equal to Z's (its codes pass as they are) or
    not; zero points at both ends."""
    cond = RNG.integers(0, 2, shapes[0]).astype(bool)
    x, y = edge_codes(RNG, shapes[1], dt), edge_codes(RNG, shapes[2], dt)
    lo, mid, hi = ZPS[dt]
    for xp, yp, zp in [((0.05, lo), (0.02, hi), (0.05, lo)), ((0.1, hi), (0.01, mid), (0.04, lo)),
                       ((0.02, mid), (0.3, lo), (0.03, hi))]:  # fmt: skip
        inputs = [cond, x, _s(xp[0]), _z(xp[1], dt), y, _s(yp[0]), _z(yp[1], dt), _s(zp[0]),
                  _z(zp[1], dt)]  # fmt: skip
        _check("QLinearWhere", inputs, const=(2, 3, 5, 6, 7, 8))
    _check("QLinearWhere", inputs)


# -- GatherBlockQuantized ------------------------------------------------------------------


def _packed(shape: tuple[int, ...], bits: int) -> np.ndarray:
    """uint8 bytes holding ``shape``'s codes, 8 / bits per byte along the last axis."""
    per = 8 // bits
    return RNG.integers(0, 256, (*shape[:-1], -(-shape[-1] // per))).astype(np.uint8)


def _gbq_uint8(rows: tuple[int, ...], k: int, bits: int, block: int, zp: bool,
               sdt: Any = F32) -> list[Any]:  # fmt: skip
    blocks = -(-k // block)
    data = _packed((*rows, k), bits)
    data.reshape(-1)[:2] = (0, 255)
    scales = RNG.uniform(0.01, 0.1, (*rows, blocks)).astype(sdt)
    zps = _packed((*rows, blocks), bits) if zp else None
    return [data, None, scales, zps]


def _indices(n: int, shape: tuple[int, ...], dt: Any) -> np.ndarray:
    idx = RNG.integers(-n, n, shape).astype(dt)
    flat = idx.reshape(-1)
    flat[:3] = (-n, n - 1, 0)[: flat.size]
    return idx


@pytest.mark.parametrize("bits", [4, 2, 8])
@pytest.mark.parametrize(("k", "block"), [(64, 16), (96, 32), (200, 64), (128, 128), (48, 16)])
@pytest.mark.parametrize("zp", [False, True])
def test_gather_block_quantized_uint8(bits: int, k: int, block: int, zp: bool) -> None:
    """Packed uint8 codes (4-bit: two per byte), K not a multiple of the block, an odd
    number of blocks a row (packed zero points per row), zero points absent (2**(bits-1)),
    indices at -n, n-1, 0; the table constant and given at run time."""
    inputs = _gbq_uint8((11,), k, bits, block, zp)
    inputs[1] = _indices(11, (2, 3), np.int64)
    attrs = {"block_size": block, "bits": bits, "gather_axis": 0, "quantize_axis": 1}
    _check("GatherBlockQuantized", inputs, attrs, const=(0, 2, 3))
    _check("GatherBlockQuantized", inputs, attrs)


@pytest.mark.parametrize("sdt", [F32, np.float16])
def test_gather_block_quantized_uint8_rank3_float16(sdt: Any) -> None:
    inputs = _gbq_uint8((5, 3), 80, 4, 32, True, sdt)
    inputs[1] = _indices(5, (4,), np.int32)
    _check("GatherBlockQuantized", inputs, {"block_size": 32, "quantize_axis": -1},
           const=(0, 2, 3))  # fmt: skip


@pytest.mark.parametrize("kind", ["int4", "uint4"])
@pytest.mark.parametrize(
    ("shape", "gather", "quant", "block"),
    [((6, 40), 0, 1, 16), ((40, 6), 1, 0, 32), ((40, 6), 0, 0, 16), ((3, 70, 5), 2, 1, 64),
     ((3, 70, 5), -3, -2, 16), ((2, 5, 130), 1, 2, 128)],
)  # fmt: skip
@pytest.mark.parametrize("zp", [False, True])
def test_gather_block_quantized_int4(kind: str, shape: tuple[int, ...], gather: int, quant: int,
                                     block: int, zp: bool) -> None:  # fmt: skip
    """int4 / uint4 data (one code an element), any two axes (the quantized one gathered
    too), zero points of the data's type or absent (0), float16 scales."""
    mdt = getattr(ml_dtypes, kind)
    lo, hi = (-8, 8) if kind == "int4" else (0, 16)
    data = RNG.integers(lo, hi, shape).astype(mdt)
    sshape = list(shape)
    sshape[quant] = -(-shape[quant] // block)
    zps = RNG.integers(lo, hi, sshape).astype(mdt) if zp else None
    sdt = np.float16 if zp else F32
    n = shape[gather]
    inputs = [data, _indices(n, (3, 2), np.int64), RNG.uniform(0.01, 0.1, sshape).astype(sdt), zps]
    attrs = {"block_size": block, "bits": 4, "gather_axis": gather, "quantize_axis": quant}
    _check("GatherBlockQuantized", inputs, attrs, const=(0, 2, 3))


def test_gather_block_quantized_index_out_of_range_is_an_error_and_the_model_stays_usable() -> None:
    inputs = _gbq_uint8((7,), 32, 4, 16, True)
    inputs[1] = np.array([1, -7], np.int64)
    model = tfrt_py.load(node_model("GatherBlockQuantized", inputs, {"block_size": 16},
                                    const=(0, 2, 3)))  # fmt: skip
    good = model.run({"i1": inputs[1]})["y0"]
    for bad in (7, -8):
        with pytest.raises(tfrt_py.errors.TfrtError, match=rf"index {bad} is out of range"):
            model.run({"i1": np.array([0, bad], np.int64)})
    np.testing.assert_array_equal(model.run({"i1": inputs[1]})["y0"], good)


# -- bad models ----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, float("nan"), -1.0, float("inf")])
@pytest.mark.parametrize("where", ["x", "y"])
def test_bad_constant_scale_is_refused_at_load(scale: float, where: str) -> None:
    dt = np.uint8
    x = edge_codes(RNG, (2, 3, 4, 4), dt)
    sx, sy = (_s(scale), _s(0.1)) if where == "x" else (_s(0.1), _s(scale))
    pool = [x, sx, _z(0, dt), sy, _z(0, dt)]
    _refused("QLinearSoftmax", pool, {"opset": 13}, (1, 2, 3, 4), "positive and finite")
    _refused("QLinearAveragePool", pool, {"kernel_shape": [2, 2]}, (1, 2, 3, 4),
             "positive and finite")  # fmt: skip
    cond = np.ones((2, 3, 4, 4), bool)
    where_in = [cond, x, sx, _z(0, dt), x, sy, _z(0, dt), _s(0.1), _z(0, dt)]
    _refused("QLinearWhere", where_in, {}, (2, 3, 5, 6, 7, 8), "positive and finite")


def test_zero_points_of_another_type_are_refused_at_load() -> None:
    x = edge_codes(RNG, (2, 3, 4, 4), np.uint8)
    inputs = [x, _s(0.1), _z(0, np.uint8), _s(0.1), _z(0, np.int8)]
    _refused("QLinearSoftmax", inputs, {"opset": 13}, (1, 2, 3, 4), "differ in type")
    _refused("QLinearAveragePool", inputs, {"kernel_shape": [2, 2]}, (1, 2, 3, 4),
             "differ in type")  # fmt: skip
    cond = np.ones((4,), bool)
    where_in = [cond, x, _s(0.1), _z(0, np.uint8), x, _s(0.1), _z(0, np.int8), _s(0.1),
                _z(0, np.uint8)]  # fmt: skip
    _refused("QLinearWhere", where_in, {}, (2, 3, 5, 6, 7, 8), "differ in type")


def test_bad_pool_and_softmax_attributes_are_refused_at_load() -> None:
    x = edge_codes(RNG, (1, 2, 5, 5), np.int8)
    inputs = [x, _s(0.1), _z(0, np.int8), _s(0.1), _z(0, np.int8)]
    _refused("QLinearAveragePool", inputs, {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]},
             (1, 2, 3, 4), "smaller than the kernel")  # fmt: skip
    _refused("QLinearAveragePool", inputs, {"kernel_shape": [1, 1, 1, 1]}, (1, 2, 3, 4), "1-D")
    _refused("QLinearSoftmax", inputs, {"axis": 1}, (1, 2, 3, 4), "'opset'")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"bits": 3}, "bits=3"),
        ({"block_size": 24}, "power of two"),
        ({"block_size": 8}, "power of two"),
        ({"gather_axis": 1}, "gathered on axis 0"),
        ({"quantize_axis": 0}, "gathered on axis 0"),
        ({"scales": (9, 3)}, "scales have shape"),
        ({"zero_points": (9, 3)}, "zero_points have shape"),
        ({"zero_points_type": np.int8}, "zero_points are int8"),
        ({"scale": float("nan")}, "not finite"),
        ({"int4_bits": 8}, "int4 data holds 4-bit codes"),
        ({"float8": True}, "not supported"),
    ],
)
def test_gather_block_quantized_bad_models_are_refused_at_load(change: dict[str, Any],
                                                               match: str) -> None:  # fmt: skip
    """What onnxruntime refuses (it says so at load, in shape inference) and scales or zero
    points that do not fit the data's blocks."""
    inputs = _gbq_uint8((9,), 64, 4, 16, True)
    inputs[1] = np.array([0, 1], np.int64)
    attrs: dict[str, Any] = {"block_size": 16, "bits": 4, "gather_axis": 0, "quantize_axis": 1}
    attrs.update({k: v for k, v in change.items() if k in attrs})
    if "scales" in change:
        inputs[2] = RNG.uniform(0.01, 0.1, change["scales"]).astype(F32)
    if "zero_points" in change:
        inputs[3] = RNG.integers(0, 256, change["zero_points"]).astype(np.uint8)
    if "zero_points_type" in change:
        inputs[3] = inputs[3].astype(change["zero_points_type"])
    if "scale" in change:
        inputs[2].reshape(-1)[3] = change["scale"]
    if "int4_bits" in change:
        inputs[0] = RNG.integers(-8, 8, (9, 64)).astype(ml_dtypes.int4)
        inputs[3] = None
        attrs["bits"] = change["int4_bits"]
    if "float8" in change:
        inputs[0] = RNG.uniform(-1, 1, (9, 64)).astype(ml_dtypes.float8_e4m3fn)
        inputs[3] = None
    _refused("GatherBlockQuantized", inputs, attrs, (0, 2, 3), match)


# -- what the quantization tools write -----------------------------------------------------


def _tool_case(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ops: set[str]) -> None:
    assert ops <= {n.op_type for n in model.graph.node}, [n.op_type for n in model.graph.node]
    want = ort_outputs(model, feeds)
    for ex in ("sync", "async"):
        got = tfrt_outputs(tfrt_py.load(model, executor=ex), feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("activations", ["QUInt8", "QInt8"])
@pytest.mark.compiles
def test_quantize_static_qoperator_model(activations: str, tmp_path: Path) -> None:
    """``quantize_static(QOperator)`` of Conv -> AveragePool -> Softmax writes
    QLinearAveragePool and QLinearSoftmax (``opset`` 17, ``axis`` 1); its output equals
    onnxruntime's. Where onnxruntime's u8 x s8 kernels saturate pairs of products in int16
    (AVX2 without VNNI: ``u8s8_saturates``) the weights take 7 bits (``reduce_range``, as
    its docs advise there), so its QLinearConv is exact as tfrt_py's is."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(F32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 2], strides=[2, 2],
                              pads=[1, 0, 1, 0], ceil_mode=1),
             helper.make_node("Softmax", ["p"], ["y"], axis=1)]  # fmt: skip
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 8])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x_info], [y_info], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "f.onnx")
    batches = iter([{"x": RNG.standard_normal((1, 3, 9, 8)).astype(F32)} for _ in range(4)])

    class Reader(ort_quant.CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(batches, None)

    ort_quant.quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(),
                              quant_format=ort_quant.QuantFormat.QOperator,
                              activation_type=getattr(ort_quant.QuantType, activations),
                              weight_type=ort_quant.QuantType.QInt8,
                              reduce_range=activations == "QUInt8"
                              and u8s8_saturates())  # fmt: skip
    quantized = onnx.load(tmp_path / "q.onnx")
    feeds = {"x": RNG.standard_normal((1, 3, 9, 8)).astype(F32) * 2}
    _tool_case(quantized, feeds, {"QLinearAveragePool", "QLinearSoftmax"})


@pytest.mark.parametrize("symmetric", [False, True])
def test_matmul_nbits_quantizer_gather(symmetric: bool) -> None:
    """``MatMulNBitsQuantizer`` on a Gather writes GatherBlockQuantized over uint4 codes
    (two a byte in the file) with uint4 zero points; its output equals onnxruntime's."""
    emb = numpy_helper.from_array(RNG.standard_normal((50, 80)).astype(F32), "emb")
    ids_info = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Gather", ["emb", "ids"], ["y"])
    graph = helper.make_graph([node], "g", [ids_info], [y_info], initializer=[emb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    axes = (("Gather", 1),)
    config = mnq.DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=symmetric, op_types_to_quantize=("Gather",), quant_axes=axes
    )
    quantizer = mnq.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=symmetric,
                                         algo_config=config, op_types_to_quantize=("Gather",),
                                         quant_axes=axes)  # fmt: skip
    quantizer.process()
    feeds = {"ids": np.array([[0, 49, -1], [-50, 7, 7]], np.int64)}
    _tool_case(quantizer.model.model, feeds, {"GatherBlockQuantized"})


def test_softmax_keeps_a_bounded_number_of_tables() -> None:
    """The exp table depends on the row length, which the request's shape picks: past
    ``TABLES_KEPT`` lengths a table is made per call and not kept (before, one was kept
    for every length a caller ever sent)."""
    from tfrt_py.kernels.contrib.quantized_softmax_pool import TABLES_KEPT

    x = edge_codes(RNG, (1, 4), np.uint8)
    model = node_model("QLinearSoftmax", _softmax_inputs(x, 0.05, 1 / 256, 0),
                       {"opset": 13}, const=(1, 2, 3, 4))  # fmt: skip
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "d"
    m = tfrt_py.load(model, executor="sync")
    fn = next(i.fn for i in m._prepared.program.instrs if i.node.op_type == "QLinearSoftmax")
    tables = next(c.cell_contents for c in fn.__closure__ or ()
                  if isinstance(c.cell_contents, dict))  # fmt: skip
    for d in range(1, TABLES_KEPT + 40):
        x = edge_codes(RNG, (1, d), np.uint8)
        y = m.run({"i0": x})[m.outputs[0].name]
        assert y.shape == (1, d)
    assert len(tables) == TABLES_KEPT
