"""Depthwise convs on small planes (a detector's heads: 512x5x5, 256x3x3, 256x2x2, and
planes smaller than the kernel) take the compiled kernel and match onnxruntime.

They took NumPy's tap loop below 400 output-pixel taps a channel; SSDLite's 3x3 over
512x5x5 then cost 167 µs against onnxruntime's 10 (12 µs compiled). Every geometry here runs
with the compiled kernels on and off (``jit``), the kernel's plan checked where it ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.spies import record_calls
from tfrt_py.kernels.lib.jit import jit_enabled

_RNG = np.random.default_rng(11)

# (plane (h, w), kernel, stride, pads, dilation, channel multiplier)
CASES = [
    ((5, 5), 3, 1, [1, 1, 1, 1], 1, 1),
    ((3, 3), 3, 1, [1, 1, 1, 1], 1, 1),
    ((2, 2), 3, 1, [1, 1, 1, 1], 1, 1),
    ((1, 1), 3, 1, [1, 1, 1, 1], 1, 1),
    ((1, 4), 3, 1, [1, 1, 1, 1], 1, 2),
    ((10, 10), 3, 2, [1, 1, 1, 1], 1, 1),
    ((5, 5), 3, 2, [1, 1, 1, 1], 1, 1),
    ((3, 3), 3, 2, [1, 1, 1, 1], 1, 1),
    ((2, 2), 3, 2, [1, 1, 1, 1], 1, 1),
    ((7, 7), 5, 1, [2, 2, 2, 2], 1, 1),
    ((3, 4), 5, 1, [2, 2, 2, 2], 1, 1),
    ((5, 5), 5, 2, [2, 2, 2, 2], 1, 1),
    ((4, 4), 7, 1, [3, 3, 3, 3], 1, 1),
    ((3, 3), 3, 1, [0, 0, 0, 0], 1, 1),
    ((4, 5), 3, 1, [2, 0, 1, 2], 1, 1),
    ((6, 6), 3, 1, [2, 2, 2, 2], 2, 1),
    ((5, 5), 3, 3, [1, 1, 1, 1], 1, 2),
]


def _case(
    plane: tuple[int, int], k: int, stride: int, pads: list[int], dil: int, mult: int, n: int
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A depthwise conv over 24 channels, then Clip to [0, 6] (ReLU6, fused into it)."""
    c = 24
    x = _RNG.standard_normal((n, c, *plane)).astype(np.float32)
    w = _RNG.standard_normal((c * mult, 1, k, k)).astype(np.float32)
    b = _RNG.standard_normal(c * mult).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=pads,
                         strides=[stride, stride], dilations=[dil, dil]),
        helper.make_node("Clip", ["y", "lo", "hi"], ["z"]),
    ]  # fmt: skip
    inits = {"w": w, "b": b, "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), {"x": x}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("plane", "k", "stride", "pads", "dil", "mult"), CASES)
def test_small_plane_depthwise_takes_the_compiled_kernel(
    jit: str, monkeypatch: pytest.MonkeyPatch, plane: Any, k: int, stride: int,
    pads: list[int], dil: int, mult: int, n: int,
) -> None:  # fmt: skip
    from tfrt_py.kernels.nn import conv_depthwise

    ran = record_calls(monkeypatch, conv_depthwise, "run_depthwise")
    m, feeds = _case(plane, k, stride, pads, dil, mult, n)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):  # the first call probes, the second runs the planned code
        np.testing.assert_allclose(model.run(feeds)["z"], want, rtol=1e-5, atol=1e-5)
    assert bool(ran) == jit_enabled(), "the compiled kernel runs exactly when numba may"
