"""QuantizeLinear's compiled per-tensor pass (``lib/quant.quantize_codes``: float32 to
uint8/int8 with a constant scale and zero point, the input Q of every QDQ model) gives the
NumPy path's codes bit for bit -- ties rounded half to even, saturation at both ends, huge
values, infinities, NaN -- and onnxruntime's on finite inputs."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.lib import quant
from tfrt_py.kernels.lib.jit import jit_enabled

F32 = np.float32


def _model(scale: float, zp: Any, const: bool) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(scale, F32), "s"),
             numpy_helper.from_array(np.array(zp), "z")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])]
    if not const:  # the scale fed at run time: the NumPy path
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, []))
        inits = inits[1:]
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    y = helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(np.array(zp).dtype), None
    )
    m = helper.make_model(helper.make_graph([node], "g", inputs, [y], initializer=inits),
                          opset_imports=[helper.make_opsetid("", 19)])  # fmt: skip
    m.ir_version = 9
    return m


def _inputs(scale: float) -> np.ndarray:
    rng = np.random.default_rng(7)
    ties = (np.arange(-300, 300) + 0.5).astype(F32) * F32(scale)  # x / scale exactly k + 0.5
    edges = np.array([0.0, -0.0, 1e30, -1e30, 4194304.5, -4194304.5, 3e38, np.inf, -np.inf,
                      np.nan], F32)  # fmt: skip
    return np.concatenate([ties, edges, rng.standard_normal(997).astype(F32) * 50])


@pytest.mark.parametrize("zp", [np.uint8(0), np.uint8(128), np.uint8(255), np.int8(-128),
                                np.int8(0), np.int8(127)])  # fmt: skip
@pytest.mark.parametrize("scale", [0.5, 0.0137, 3.0])
def test_the_compiled_pass_gives_the_numpy_paths_codes(zp: Any, scale: float) -> None:
    if jit_enabled():
        assert quant._QUANTIZE.get() is not None  # the compiled pass is the one under test
    x = _inputs(scale)
    # NumPy's path warns on NaN, inf and overflow (the compiled one on nothing); without
    # numba both models take it
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = tfrt_py.load(_model(scale, zp, True)).run({"x": x})["y"]
        numpy_path = tfrt_py.load(_model(scale, zp, False))
        want = numpy_path.run({"x": x, "s": np.array(scale, F32)})["y"]
    assert got.dtype == want.dtype == np.array(zp).dtype
    np.testing.assert_array_equal(got, want)
    finite = np.isfinite(x)
    sess = ort.InferenceSession(_model(scale, zp, True).SerializeToString(),
                                providers=["CPUExecutionProvider"])  # fmt: skip
    np.testing.assert_array_equal(got[finite], sess.run(None, {"x": x[finite]})[0])
