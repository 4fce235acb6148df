"""The ``channels_last`` pass: a QOperator CNN's integer ops run NHWC between one transpose
in and one out, with the same values as the NCHW graph (both exact integer arithmetic) and
as onnxruntime; and com.microsoft QLinearConv(channels_last=1) itself against onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.contrib import check_node
from tests.support.ort_quant import SATURATES, u8s8_saturates
from tfrt_py.kernels.lib import qgemm_packed

RNG = np.random.default_rng(7)
MS = "com.microsoft"


def _kernel_or_skip() -> None:
    from tfrt_py.compiler.channels_last import _integer_kernel_possible

    if qgemm_packed.available() is None or not _integer_kernel_possible():
        pytest.skip(f"no integer conv kernel here ({qgemm_packed.path()[1]}): the pass is off")


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(a, name)


def _qoperator_cnn() -> onnx.ModelProto:
    """x (u8 NCHW) -> conv 3x3 -> depthwise 3x3 stride 2 -> 1x1 conv -> + residual (QLinearAdd)
    -> QLinearGlobalAveragePool: the ops a quantized MobileNet block is made of."""
    c = 8
    inits: list[onnx.TensorProto] = []
    nodes = []

    def q(name: str, v: float, z: int) -> list[str]:
        inits.append(_init(f"{name}_s", np.array(v, np.float32)))
        inits.append(_init(f"{name}_z", np.array(z, np.uint8)))
        return [f"{name}_s", f"{name}_z"]

    def conv(name: str, x: str, xq: list[str], cin: int, cout: int, k: int, stride: int,
             group: int, yq: list[str]) -> str:  # fmt: skip
        w = RNG.integers(-128, 128, (cout, cin // group, k, k)).astype(np.int8)
        inits.append(_init(f"{name}_w", w))
        inits.append(_init(f"{name}_ws", RNG.uniform(0.002, 0.01, cout).astype(np.float32)))
        inits.append(_init(f"{name}_wz", np.zeros(cout, np.int8)))
        inits.append(_init(f"{name}_b", RNG.integers(-2000, 2000, cout).astype(np.int32)))
        p = k // 2
        nodes.append(helper.make_node(
            "QLinearConv", [x, *xq, f"{name}_w", f"{name}_ws", f"{name}_wz", *yq, f"{name}_b"],
            [name], name=name, group=group, strides=[stride, stride], pads=[p, p, p, p],
            kernel_shape=[k, k]))  # fmt: skip
        return name

    xq = q("x", 0.02, 128)
    a = conv("conv_a", "x", xq, 3, c, 3, 1, 1, q("a", 0.05, 100))
    b = conv("conv_b", a, ["a_s", "a_z"], c, c, 3, 2, c, q("b", 0.05, 90))
    d = conv("conv_c", b, ["b_s", "b_z"], c, c, 1, 1, 1, q("c", 0.05, 110))
    sq, gq = q("s", 0.06, 120), q("g", 0.03, 128)
    add_in = [d, "c_s", "c_z", b, "b_s", "b_z", *sq]
    nodes.append(helper.make_node("QLinearAdd", add_in, ["sum"], domain=MS, name="add"))
    pool_in = ["sum", *sq, *gq]
    nodes.append(helper.make_node("QLinearGlobalAveragePool", pool_in, ["y"], domain=MS))
    xin = helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3, 12, 12])
    yout = helper.make_tensor_value_info("y", TensorProto.UINT8, None)
    graph = helper.make_graph(nodes, "qcnn", [xin], [yout], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])  # fmt: skip
    model.ir_version = 9
    return model


def _passes_without(name: str) -> set[str]:
    from tfrt_py.compiler.pipeline import PASSES

    return set(PASSES) - {name}


@pytest.mark.compiles
def test_a_quantized_cnn_runs_channels_last_with_the_same_values() -> None:
    _kernel_or_skip()
    import onnxruntime as ort

    model = _qoperator_cnn()
    x = RNG.integers(0, 256, (2, 3, 12, 12)).astype(np.uint8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    nchw = tfrt_py.load(model, optimize=_passes_without("channels_last"))
    for ex in ("sync", "async"):
        m = tfrt_py.load(model, executor=ex)
        report = m.describe()
        assert "channels_last: 5 integer ops channels-last" in report, report
        assert "transposes: 1 in, 1 out" in report, report  # the output is NCHW again
        got = m.run({"x": x})["y"]
        np.testing.assert_array_equal(got, nchw.run({"x": x})["y"])
        if u8s8_saturates():  # (its QLinearConv's sums: the NCHW run above is the reference)
            continue
        # onnxruntime's vectorized QLinearAdd rounds a few sums the other way (1 unit)
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1


def test_the_pass_leaves_float_models_alone() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    w = _init("w", np.ones((2, 2, 1, 1), np.float32))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[w])  # fmt: skip
    m = tfrt_py.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "channels_last: nothing to do" in m.describe()


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("group", [1, 4])
def test_ms_qlinearconv_channels_last_matches_onnxruntime(dt: Any, group: int) -> None:
    if dt == np.uint8 and u8s8_saturates():
        pytest.skip(SATURATES)
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, (2, 7, 9, 4)).astype(dt)
    w = RNG.integers(-128, 128, (4, 4 // group, 3, 3)).astype(np.int8)
    inputs = [x, np.array(0.02, np.float32), np.array(info.max // 2, dt), w,
              RNG.uniform(0.002, 0.01, 4).astype(np.float32), np.zeros(4, np.int8),
              np.array(0.07, np.float32), np.array(info.min + 3, dt),
              RNG.integers(-900, 900, 4).astype(np.int32)]  # fmt: skip
    attrs = {"channels_last": 1, "group": group, "pads": [1, 0, 1, 2], "strides": [1, 2],
             "kernel_shape": [3, 3]}  # fmt: skip
    try:
        check_node("QLinearConv", inputs, attrs, consts=(tuple(range(1, 9)),), domain=MS)
    except Exception as e:  # onnxruntime's own limits, not ours
        if "onnxruntime" in type(e).__module__:
            pytest.skip(f"onnxruntime refuses this com.microsoft QLinearConv: {e}")
        raise


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize(
    "k,s,p,d,ceil", [(3, 2, 1, 1, 0), (2, 2, 0, 1, 0), (3, 1, 1, 1, 0), (3, 2, 0, 1, 1),
                     (3, 2, 1, 2, 0), (5, 3, 2, 1, 1)],
)  # fmt: skip
def test_nhwc_max_pool_matches_onnxruntime(dt: Any, k: int, s: int, p: int, d: int,
                                           ceil: int) -> None:  # fmt: skip
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max + 1, (2, 9, 11, 5)).astype(dt)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "dilations": [d, d],
             "ceil_mode": ceil}  # fmt: skip
    check_node("NhwcMaxPool", [x], attrs)
