"""Grouped float32 convs of 4+ channels a group on conv_cols' kernel, a product per (image,
group) pair in one compiled call (kernels/nn/conv_cols_grouped.py): every form (GRID at
stride 1 and over phases, IM2COL, DIRECT) against onnxruntime with the route and form
checked, on one thread and on two, with the bias, residual and activations; which convs
the direct depthwise kernel keeps; the weights' taps-first order a group."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.kernels.test_conv_cols import check_against_onnxruntime
from tests.support.forced_isa import run_on_path
from tests.support.spies import record_calls
from tfrt_py.kernels.lib import gemm_cols
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import conv_blocked, conv_cols, conv_cols_grouped
from tfrt_py.kernels.nn.conv_common import ConvNode, Spatial
from tfrt_py.kernels.nn.conv_depthwise import depthwise_conv_fn
from tfrt_py.kernels.nn.conv_direct import Epilogue

pytestmark = pytest.mark.skipif(not jit_enabled(), reason=why_off() or "numba kernels off")

_RNG = np.random.default_rng(31)


def _need_kernel() -> None:
    if not gemm_cols.available():
        pytest.skip("no gemm_cols kernel on this host (portable path, or packed gemm off)")


CASES = [
    # (x shape, w shape (M, C/group, KH, KW), attributes, the form a pair takes)
    # RegNetX's 16 channels a group at 7x7 and 14x14, two images
    ((1, 64, 7, 7), (64, 16, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, conv_cols.GRID),
    ((2, 48, 14, 14), (48, 16, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}, conv_cols.GRID),
    # ResNeXt's 4 and RegNetY's 8 a group; more filters than channels a group
    ((1, 32, 9, 11), (32, 4, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, conv_cols.GRID),
    ((1, 24, 10, 10), (48, 8, 3, 3), {"group": 3, "pads": [0, 1, 2, 1]}, conv_cols.GRID),
    # strided: over the phases whatever the rows' width (7 here), or IM2COL under 16
    # channels a group
    ((1, 64, 14, 14), (64, 16, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},
     conv_cols.GRID),
    ((1, 32, 13, 13), (32, 8, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},
     conv_cols.IM2COL),
    # dilated, and a grouped 1x1 conv (its planes read in place)
    ((1, 32, 12, 12), (32, 16, 3, 3), {"group": 2, "pads": [2, 2, 2, 2], "dilations": [2, 2]},
     conv_cols.GRID),
    ((2, 32, 6, 6), (64, 8, 1, 1), {"group": 4}, conv_cols.DIRECT),
]  # fmt: skip


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "mode"), CASES)
@pytest.mark.parametrize(("act", "residual"), [("Relu", True), ("Clip", False), ("Sigmoid", True)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.compiles
def test_each_form_matches_onnxruntime_on_the_groups_route(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any, attrs: dict[str, Any],
    mode: int, act: str, residual: bool, threads: int,
) -> None:  # fmt: skip
    _need_kernel()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.2).astype(np.float32)
    check_against_onnxruntime(x, w, attrs, act, residual, _RNG, threads=threads)
    assert plans and plans[-1].route == "groups", plans[-1:]
    assert plans[-1].grouped.cols.mode == mode


def _node(group: int, w_shape: tuple[int, ...], dtype: Any) -> ConvNode:
    w = np.ones(w_shape, dtype)
    return ConvNode(Spatial(None, None, None, None, "NOTSET"), group, w, None, np.dtype(dtype),
                    Epilogue())  # fmt: skip


def test_the_depthwise_kernel_keeps_convs_of_fewer_channels_a_group() -> None:
    """The direct depthwise kernel declines float32 groups of 4+ channels (this route takes
    them) and keeps 1-3 channels a group and float64's."""
    _need_kernel()
    assert depthwise_conv_fn(_node(4, (16, 4, 3, 3), np.float32)) is None
    assert depthwise_conv_fn(_node(8, (16, 2, 3, 3), np.float32)) is not None
    assert depthwise_conv_fn(_node(16, (16, 1, 3, 3), np.float32)) is not None
    assert depthwise_conv_fn(_node(4, (16, 4, 3, 3), np.float64)) is not None


def test_a_groups_weights_are_its_taps_first() -> None:
    """``taps_first`` orders each group's filters as conv_cols' GRID reads them: (tap,
    channel of the group)."""
    w = np.arange(2 * 3 * 2 * 2 * 2, dtype=np.float32).reshape(6, 2, 2, 2)  # 3 groups
    got = conv_cols_grouped.taps_first(w, 3)
    assert got.shape == (3, 2, 8) and not got.flags.writeable
    f = w[4]  # group 2, filter 0: (channel, kh, kw) -> (kh, kw, channel)
    np.testing.assert_array_equal(got[2, 0], f.transpose(1, 2, 0).reshape(-1))


_PATH_CHILD = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import onnxruntime as ort
import tfrt_py
from tfrt_py.kernels.nn import conv_blocked

routes = []
run = conv_blocked.run_blocked
conv_blocked.run_blocked = lambda plan, *a, **k: (routes.append(plan.route), run(plan, *a, **k))[1]
rng = np.random.default_rng(0)
for stride in (1, 2):
    w = (rng.standard_normal((64, 16, 3, 3)) * 0.2).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1],
                            strides=[stride, stride])
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tfrt_py.load(m, executor="sync").run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert routes and routes[-1] == "groups", routes
print("path ok")
"""


@pytest.mark.parametrize("path", ["avx2", "avx512"])
def test_each_isa_path_in_a_fresh_process(path: str) -> None:
    """The route on each kernel path the host has (``TFRT_PY_ISA``), stride 1 and 2."""
    run_on_path(path, _PATH_CHILD, "path ok")
