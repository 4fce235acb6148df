"""onnxruntime as the reference for 8-bit integer products, on every host.

onnxruntime's u8 x s8 kernels (MLAS's U8S8 on AVX2, and on AVX-512 without VNNI) sum pairs of
products in int16 with ``vpmaddubsw``, which saturates: ``255*127 + 255*127`` comes out
32767. On such a host onnxruntime is no exact reference for the products tfrt_py computes
exactly (``kernels/lib/qgemm_packed``: no path saturates); its docs advise
``reduce_range`` there. ``u8s8_saturates()`` asks this host's onnxruntime;
``qdq_session`` then evaluates a QDQ model with onnxruntime's graph optimizations off (each
DequantizeLinear, float op and QuantizeLinear apart: the arithmetic the spec gives), and a
test comparing a QOperator kernel's u8 x s8 sums with onnxruntime's skips that comparison
with this module's reason.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

#: Why a comparison with onnxruntime's u8 x s8 sums is left out on a saturating host.
SATURATES = (
    "onnxruntime's u8 x s8 kernels saturate pairs of products in int16 on this CPU (no VNNI): "
    "not an exact reference here"
)


@functools.cache
def u8s8_saturates() -> bool:
    """Whether this host's onnxruntime gives 32767 for ``[255, 255] @ [[127], [127]]``."""
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 2])
    b = numpy_helper.from_array(np.full((2, 16), 127, np.int8), "b")
    y = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "sat",
                              [a], [y], initializer=[b])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"a": np.full((4, 2), 255, np.uint8)})[0]
    return int(got[0, 0]) != 2 * 255 * 127


def qdq_session(model: Any) -> ort.InferenceSession:
    """An onnxruntime session over a QDQ ``model`` (a path or bytes): optimized as a user's
    is, except on a host where its fused integer kernels saturate (``u8s8_saturates``),
    where the QDQ nodes run apart."""
    so = ort.SessionOptions()
    if u8s8_saturates():
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
