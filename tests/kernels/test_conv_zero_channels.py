"""A Conv over zero input channels (weights of shape (M, 0, KH, KW)): every output is its
bias, as onnxruntime answers. The blocked route's planning divided by the weights'
channels and every executor answered an ``ExecutionError`` (ZeroDivisionError); the ctypes
route of a cold start's stand-in (``conv_cols_raw``) declines it (its kernel divides by K:
a SIGFPE, ``test_conv_cols_raw``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py


def _model(tmp_path: Path, k: int, stride: int, batch: int) -> str:
    w = np.zeros((4, 0, k, k), np.float32)
    b = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[k // 2] * 4,
                            strides=[stride, stride])  # fmt: skip
    graph = helper.make_graph(
        [node], "conv_no_channels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 0, 9, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    path = str(tmp_path / f"conv_{k}_{stride}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("executor", ["sync", "async", "auto"])
@pytest.mark.parametrize("k, stride", [(3, 1), (1, 1), (3, 2)])
def test_a_conv_over_no_channels_answers_its_bias(tmp_path: Path, executor: str, k: int,
                                                   stride: int) -> None:  # fmt: skip
    import onnxruntime as ort

    path = _model(tmp_path, k, stride, 2)
    x = np.zeros((2, 0, 9, 8), np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tfrt_py.load(path, executor=executor).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
