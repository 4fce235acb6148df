"""Resize/Upsample kernels against the ONNX reference implementation (whose semantics the
ONNX node cases encode) and onnxruntime (legacy opsets, integer inputs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tfrt_py.ir import Node, Value
from tfrt_py.ir.types import TensorType
from tfrt_py.kernels.base import KernelContext
from tfrt_py.kernels.image import resize
from tfrt_py.kernels.registry import KernelRegistry

_REG = KernelRegistry()
resize.register_kernels(_REG)
_RNG = np.random.default_rng(2)


def _model(op: str, inputs: list[Any], attrs: dict[str, Any], opset: int) -> onnx.ModelProto:
    """A one-node model; inputs after the first are initializers ('' when None)."""
    names = ["x"] + [f"i{i}" if a is not None else "" for i, a in enumerate(inputs[1:], 1)]
    node = helper.make_node(op, names, ["y"], **attrs)
    x = inputs[0]
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
        initializer=[
            numpy_helper.from_array(a, n) for n, a in zip(names[1:], inputs[1:]) if a is not None
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _ours(
    op: str, inputs: list[Any], attrs: dict[str, Any], opset: int, const: bool = True
) -> np.ndarray:
    vals: list[Value | None] = [Value("x", TensorType(inputs[0].dtype, inputs[0].shape))]
    for i, a in enumerate(inputs[1:], 1):
        vals.append(None if a is None else Value(f"i{i}", None, a if const else None))
    node = Node(op, vals, [Value("y")], attrs, name="n", opset=opset)
    fn = _REG.lookup("", op, opset).build(KernelContext(node))
    return fn(*inputs)


def _reference(inputs: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    res: Any = ReferenceEvaluator(_model("Resize", inputs, attrs, 19)).run(None, {"x": inputs[0]})
    return np.asarray(res[0])


def _check_ref(inputs: list[Any], attrs: dict[str, Any], tol: float = 1e-4) -> None:
    want = _reference(inputs, attrs)
    for const in (True, False):
        got = _ours("Resize", inputs, attrs, 19, const)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


_CTMS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", _CTMS)
def test_resize_modes_match_reference(mode: str, ctm: str) -> None:
    x = _RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
    roi = np.array([0, 0, 0.1, -0.2, 1, 1, 0.8, 1.1], np.float32)
    roi_in = roi if ctm == "tf_crop_and_resize" else None
    attrs: dict[str, Any] = {
        "mode": mode,
        "coordinate_transformation_mode": ctm,
        "extrapolation_value": -3.0,
    }
    for scales in ([1, 1, 1.7, 0.6], [1, 1, 0.5, 3.0]):
        _check_ref([x, roi_in, np.array(scales, np.float32)], attrs)
    _check_ref([x, roi_in, None, np.array([1, 2, 9, 4], np.int64)], attrs)
    if mode != "nearest":
        anti = {**attrs, "antialias": 1, "exclude_outside": 1}
        _check_ref([x, roi_in, np.array([1, 1, 0.6, 0.45], np.float32)], anti)
    else:
        for nm in ("round_prefer_ceil", "floor", "ceil"):
            _check_ref(
                [x, roi_in, None, np.array([1, 2, 11, 3], np.int64)], {**attrs, "nearest_mode": nm}
            )


@pytest.mark.slow  # onnx's reference Resize is pure Python per element before onnx 1.20
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_large_axes_axes_attr_and_policy(mode: str) -> None:
    # long axes take the banded-GEMM (innermost) and gathered-taps (outer) paths
    x = _RNG.standard_normal((2, 150, 170)).astype(np.float32)
    _check_ref([x, None, None, np.array([61, 333], np.int64)], {"mode": mode, "axes": [1, 2]})
    _check_ref([x, None, np.array([2.5, 0.4], np.float32)], {"mode": mode, "axes": [2, 1]})
    for policy in ("not_larger", "not_smaller"):
        a = {"mode": mode, "axes": [1, 2], "keep_aspect_ratio_policy": policy}
        _check_ref([x, None, None, np.array([40, 300], np.int64)], a)


def _check_ort(op: str, inputs: list[Any], attrs: dict[str, Any], opset: int) -> None:
    import onnxruntime as ort

    m = _model(op, inputs, attrs, opset)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": inputs[0]})[0]
    got = _ours(op, inputs, attrs, opset)
    assert got.shape == want.shape and got.dtype == want.dtype
    # integers: we round (as the ONNX reference), onnxruntime truncates
    atol = 1 if got.dtype.kind in "iu" else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize10_and_upsample_match_ort(mode: str) -> None:
    x = _RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    for scales in ([1, 1, 2, 3], [1, 1, 0.6, 0.6], [1, 1, 1.5, 2.5]):
        s = np.array(scales, np.float32)
        _check_ort("Resize", [x, s], {"mode": mode}, 10)
        if min(scales) >= 1:
            _check_ort("Upsample", [x, s], {"mode": mode}, 9)
            _check_ort("Upsample", [x], {"mode": mode, "scales": [float(v) for v in scales]}, 7)


def test_resize_integer_and_nearest_repeat_match_ort() -> None:
    x8 = _RNG.integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    s8 = np.array([1, 1, 1.7, 0.6], np.float32)
    for mode in ("nearest", "linear"):  # onnxruntime fails on uint8 cubic
        _check_ort("Resize", [x8, None, s8], {"mode": mode}, 13)
    _check_ref([x8, None, s8], {"mode": "cubic"}, tol=1)
    x = _RNG.standard_normal((1, 4, 6, 5)).astype(np.float32)
    two = np.array([1, 1, 2, 3], np.float32)
    _check_ort("Resize", [x, None, two], {"mode": "nearest"}, 13)
    y = _ours("Resize", [x, None, two], {"mode": "nearest"}, 13)
    assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 3, axis=3))


def test_resize_runtime_scales_across_shapes() -> None:
    attrs = {"mode": "linear"}
    node_inputs: list[Value | None] = [Value("x"), None, Value("s")]
    node = Node("Resize", node_inputs, [Value("y")], attrs, name="n", opset=19)
    fn = _REG.lookup("", "Resize", 19).build(KernelContext(node))
    for shape, scales in (((1, 1, 4, 4), [1, 1, 2, 2]), ((1, 2, 3, 5), [1, 1, 0.5, 1.5])):
        x = _RNG.standard_normal(shape).astype(np.float32)
        s = np.array(scales, np.float32)
        want = _reference([x, None, s], attrs)
        for _ in range(2):  # second call hits the per-shape plan cache
            np.testing.assert_allclose(fn(x, None, s), want, rtol=1e-5, atol=1e-5)
