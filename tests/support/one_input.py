"""A float32 graph of one input ``x`` and one output ``y``, built from nodes, and
onnxruntime's answer to it with its graph optimizations off (the nodes as written: the
reference a load-time pass is checked against)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

__all__ = ["one_input_model", "ort_as_written"]


def one_input_model(
    nodes: list[Any], x: np.ndarray, inits: dict[str, np.ndarray], opset: int = 17
) -> onnx.ModelProto:
    """``nodes`` reading ``x`` (its shape) and the constants ``inits``, writing ``y``."""
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def ort_as_written(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's first output for ``{"x": x}``, its graph optimizations off."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"x": x})[0]
    return out
