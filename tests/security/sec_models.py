"""Small hand-made ONNX models for the security tests (tests/security/): a model whose
weight ``w`` lives in external data at a location the test chooses, written the way a
hostile author would (the proto edited directly, not through onnx.save's checks), and a
second, well-behaved external weight ``v`` (``v.bin``) so a small budget streams."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

#: The weight's element count (float32): 64 floats, 256 bytes.
N = 64
NBYTES = N * 4
#: A budget that makes the model stream: less than its 2 * 256 + 4 bytes of weights, more
#: than a node's 256 plus the 4 resident bytes of ``b``.
STREAM_BUDGET = 384


def weight_bytes() -> bytes:
    """The legitimate ``w``: 0, 1, ..., N-1 as little-endian float32."""
    return np.arange(N, dtype="<f4").tobytes()


def write_weights(directory: str, w_name: str = "w.bin") -> None:
    """Write the legitimate ``w`` (as ``w_name``) and ``v`` (``v.bin``) into ``directory``."""
    os.makedirs(os.path.dirname(os.path.join(directory, w_name)), exist_ok=True)
    with open(os.path.join(directory, w_name), "wb") as f:
        f.write(weight_bytes())
    with open(os.path.join(directory, "v.bin"), "wb") as f:
        f.write(np.full(N, 2.0, "<f4").tobytes())


def _external(name: str, location: str, dims: tuple[int, ...], offset: Any, length: Any) -> Any:
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            e = t.external_data.add()
            e.key, e.value = key, str(value)
    return t


def external_model(
    location: str,
    *,
    dims: tuple[int, ...] = (N,),
    offset: Any = None,
    length: Any = None,
) -> onnx.ModelProto:
    """``y = concat(x + w, v) + b``: ``w`` float32 ``dims`` in external data at ``location``
    (``offset``/``length`` written verbatim when given), ``v`` in ``v.bin``, ``b`` embedded
    (a resident constant of a streamed load)."""
    inits = [
        _external("w", location, dims, offset, length),
        _external("v", "v.bin", (N,), None, None),
        helper.make_tensor("b", TensorProto.FLOAT, [1], [0.5]),
    ]
    nodes = [
        helper.make_node("Add", ["x", "w"], ["t"], name="add_w"),
        helper.make_node("Concat", ["t", "v"], ["u"], name="concat_v", axis=0),
        helper.make_node("Add", ["u", "b"], ["y"], name="add_b"),
    ]
    g = helper.make_graph(
        nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2 * N])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def save(model: onnx.ModelProto, directory: str, name: str = "model.onnx") -> str:
    """Write ``model`` (external data left as it is) into ``directory``; its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def expected(x: np.ndarray) -> np.ndarray:
    """What ``external_model`` computes with the legitimate weights."""
    w = x + np.arange(N, dtype=np.float32)
    return np.concatenate([w, np.full(N, 2.0, np.float32)]) + np.float32(0.5)
