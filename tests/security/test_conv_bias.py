"""A Conv's bias of the wrong length, from a stranger's request or model: the compiled conv
paths (numba's depthwise and blocked kernels, depthwise_ir's) read one bias value a filter
without bounds checks, so a bias input one value long was read past its end and answered
(onnxruntime refuses it). Now a request's short or long bias is an ``ExecutionError``
naming the node on every executor, the model keeps serving, and a constant bias of the
wrong length is a ``ModelLoadError``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import ExecutionError, ModelLoadError

C = 8


def _model(tmp_path: Path, group: int, bias_const: np.ndarray | None = None) -> str:
    """A 3x3 conv of C filters (depthwise when ``group`` is C) whose bias is an input, or
    the constant ``bias_const``."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((C, C // group, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 16, 16])]
    if bias_const is None:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m"]))
    else:
        inits.append(numpy_helper.from_array(bias_const, "b"))
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "conv_bias", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)  # fmt: skip
    path = str(tmp_path / f"conv_bias_{group}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _reference(x: np.ndarray, path: str, b: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"x": x, "b": b})[0]
    return out


@pytest.mark.parametrize("executor", ["sync", "async", "auto"])
@pytest.mark.parametrize("group", [C, 1], ids=["depthwise", "dense"])
@pytest.mark.compiles
def test_a_bias_input_of_the_wrong_length_is_refused_and_the_model_serves_on(
    tmp_path: Path, executor: str, group: int
) -> None:
    path = _model(tmp_path, group)
    model = tfrt_py.load(path, executor=executor)
    x = np.random.default_rng(1).standard_normal((1, C, 16, 16)).astype(np.float32)
    for n in (1, C - 1, C + 1):
        with pytest.raises(ExecutionError, match="bias of shape"):
            model.run({"x": x, "b": np.ones(n, np.float32)})
    b = np.arange(C, dtype=np.float32)
    got = model.run({"x": x, "b": b})["y"]
    np.testing.assert_allclose(got, _reference(x, path, b), rtol=1e-4, atol=1e-4)


def test_a_constant_bias_of_the_wrong_length_fails_at_load(tmp_path: Path) -> None:
    path = _model(tmp_path, C, bias_const=np.ones(C - 3, np.float32))
    with pytest.raises(ModelLoadError, match="bias of 5 values for 8 filters"):
        tfrt_py.load(path, executor="sync")
