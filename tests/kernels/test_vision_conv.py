"""The vision conv work: the direct depthwise kernel and conv epilogues
(``kernels/nn/conv_direct.py``) and the ``fuse_conv`` pass, against onnxruntime, with the
compiled (numba) paths on and off (``TFRT_PY_JIT``), on the sync and async executors.

Graphs are built with onnx.helper here (no torch); the helpers stay in this file.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.spies import record_calls
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.kernels.lib.jit import ENV_JIT, jit_enabled
from tfrt_py.kernels.nn.conv_direct import ACTIVATIONS, Epilogue, apply_epilogue

_RNG = np.random.default_rng(7)
_F32 = TensorProto.FLOAT
_F64 = TensorProto.DOUBLE


def _r(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: list[str],
    inits: dict[str, np.ndarray],
    opset: int = 17,
) -> onnx.ModelProto:
    elem = {np.dtype(np.float32): _F32, np.dtype(np.float64): _F64}
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, elem[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, elem[next(iter(inputs.values())).dtype], None)
         for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs (onnx's reference evaluator for float64: ORT has no float64
    Conv)."""
    if any(v.dtype == np.float64 for v in feeds.values()):
        from onnx.reference import ReferenceEvaluator

        return list(ReferenceEvaluator(m).run(None, feeds))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(
    m: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    executor: str = "sync",
    optimize: Any = None,
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> tfrt_py.Model:
    want = _ort(m, feeds)
    model = tfrt_py.load(m, executor=executor, optimize=optimize)
    for _ in range(2):  # the first call probes, the second runs the planned code
        got = list(model.run(feeds).values())
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return model


def _report(model: tfrt_py.Model, name: str) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == name)


# -- depthwise and grouped Conv ------------------------------------------------------------

# (x shape, group, w shape, attrs): depthwise on big and small planes,
# channel multiplier 2, strides 1/2/3 and mixed, dilations, asymmetric pads, auto_pad,
# batch > 1, grouped with several channels per group (im2col).
DW_CASES = [
    ((1, 8, 32, 32), 8, (8, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 6, 30, 31), 6, (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 29, 27), 4, (4, 1, 5, 5), {"pads": [2, 1, 0, 2], "strides": [3, 3]}),
    ((1, 4, 33, 30), 4, (4, 1, 3, 5), {"pads": [0, 2, 1, 1], "strides": [2, 1]}),
    ((1, 5, 40, 40), 5, (5, 1, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 5, 41, 37), 5, (5, 1, 3, 3), {"dilations": [3, 2], "strides": [1, 2]}),
    ((1, 3, 28, 28), 3, (6, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 26, 26), 4, (4, 1, 7, 7), {"auto_pad": "SAME_UPPER"}),
    ((1, 4, 25, 26), 4, (4, 1, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 4, 50, 50), 4, (4, 1, 3, 3), {"auto_pad": "VALID"}),
    ((1, 16, 6, 6), 16, (16, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 20, 20), 2, (8, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 1, 60), 4, (4, 1, 1, 3), {"pads": [0, 1, 0, 1]}),
    # stride 2 over rows wide enough that a row's even and odd columns are copied in one
    # loop: an even width with the left pad, an odd one without, a 5x5 kernel
    ((1, 3, 40, 70), 3, (3, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 2, 33, 67), 2, (2, 1, 5, 5), {"pads": [2, 0, 1, 2], "strides": [2, 2]}),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("x_shape", "group", "w_shape", "attrs"), DW_CASES)
@pytest.mark.compiles
def test_grouped_conv_matches_onnxruntime(
    jit: str, x_shape: Any, group: int, w_shape: Any, attrs: dict[str, Any], bias: bool
) -> None:
    x, w, b = _r(*x_shape), _r(*w_shape), _r(w_shape[0])
    inits = {"w": w, **({"b": b} if bias else {})}
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], group=group,
                            **attrs)  # fmt: skip
    _check(_model([node], {"x": x}, ["y"], inits), {"x": x}, optimize=False)


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.compiles
def test_depthwise_float64_and_runtime_shapes(jit: str, executor: str) -> None:
    """float64, and one model called with two input sizes (two plans)."""
    w, b = _r(6, 1, 3, 3, dtype=np.float64), _r(6, dtype=np.float64)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=6, pads=[1, 1, 1, 1])
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", _F64, ["n", 6, "h", "w"])],
        [helper.make_tensor_value_info("y", _F64, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    for shape in ((1, 6, 40, 40), (3, 6, 17, 60)):
        x = _r(*shape, dtype=np.float64)
        _check(m, {"x": x}, executor=executor, rtol=1e-10, atol=1e-10)


_SPLIT_CASES = [
    ((1, 32, 64, 64), 1),
    ((1, 16, 60, 64), 2),
    ((3, 12, 64, 64), 1),
    ((2, 2, 200, 200), 1),
]


@pytest.mark.parametrize(("x_shape", "mult"), _SPLIT_CASES)
@pytest.mark.compiles
def test_depthwise_split_over_threads_with_residual_and_activation(
    jit: str, x_shape: Any, mult: int
) -> None:
    """Convs big enough to be split over the intra-op threads (channel blocks for one
    image, image blocks for several), with a fused residual Add and Relu."""
    from tfrt_py.concurrency.threads import configure
    from tfrt_py.kernels.nn.conv_depthwise import DEPTHWISE_SPLIT_MIN_MACS

    n, c, h, wd = x_shape
    assert n * c * mult * h * wd * 9 > DEPTHWISE_SPLIT_MIN_MACS
    x, w, b = _r(*x_shape), _r(c * mult, 1, 3, 3), _r(c * mult)
    r = _r(n, c * mult, h, wd)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["y", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["z"]),
    ]
    configure(2)
    try:
        model = _check(_model(nodes, {"x": x, "r": r}, ["z"], {"w": w, "b": b}), {"x": x, "r": r})
    finally:
        configure(None)
    assert "residual Adds" in _report(model, "fuse_conv")


# -- 3x3 stride-1 depthwise: taps in registers (conv_depthwise_same), straight from the --
# -- input on big planes (conv_depthwise3) -------------------------------------------------

# (x shape, channel multiplier): three rows, three columns (smaller planes:
# test_depthwise_small.py), odd sizes, MobileNet's 7x7
# and 14x14, a batch, a channel multiplier of 2; and a plane over SAME_3X3_MAX_PIXELS.
DW3_CASES = [
    ((1, 8, 3, 16), 1),
    ((1, 4, 3, 17), 1),
    ((1, 4, 15, 3), 1),
    ((2, 6, 5, 9), 1),
    ((1, 16, 7, 7), 2),
    ((1, 8, 14, 14), 1),
    ((1, 3, 29, 31), 1),
    ((1, 4, 2, 30), 1),
    ((1, 2, 57, 59), 1),
]


@pytest.fixture
def depthwise_plans(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The plans ``run_depthwise`` ran with, call by call."""
    from tfrt_py.kernels.nn import conv_depthwise

    return record_calls(monkeypatch, conv_depthwise, "run_depthwise")


@pytest.fixture(params=["grid", "loops"])
def dw_route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The float32 "same" depthwise convs' two routes: ``conv_depthwise_grid``'s vector
    kernel where it is built (the plans' first choice), and ``conv_depthwise_same``'s numba
    loops (with it off: float64, channel multipliers, hosts without the vector kernel)."""
    from tfrt_py.kernels.nn import conv_depthwise

    if request.param == "loops":
        monkeypatch.setattr(conv_depthwise, "grid_kind", lambda *a, **k: -1)
    return str(request.param)


def _check_route(plans: list[Any], route: str, mult: int, loops: Any) -> None:
    """Every plan ran the grid kernel (route ``grid``, one filter a channel, where it is
    built), else the numba loop ``loops`` (where numba is)."""
    from tfrt_py.kernels.lib import depthwise_ir
    from tfrt_py.kernels.nn.conv_depthwise_grid import GRID

    grid = GRID.get() if route == "grid" and mult == 1 and depthwise_ir.function() else None
    want = grid or loops
    if want is not None:
        assert plans and all(p.fn is want for p in plans)


def _depthwise(
    x: np.ndarray, mult: int, stride: int, residual: bool, act: str, k: int = 3
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A K x K (3x3) depthwise conv with K // 2 pixels of padding at ``stride`` over ``x``
    (channel multiplier ``mult``), then a residual Add and an activation (``none``, an op
    name, ``Clip`` to [0, 6] or ``SiLU`` as Sigmoid and Mul): the model and its feeds."""
    n, c, h, wd = x.shape
    w, b = _r(c * mult, 1, k, k), _r(c * mult)
    feeds, inits = {"x": x}, {"w": w, "b": b}
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, pads=[k // 2] * 4,
                            strides=[stride, stride])  # fmt: skip
    nodes, last = [conv], "y"
    if residual:
        oh, ow = (h - 1) // stride + 1, (wd - 1) // stride + 1
        feeds["r"] = _r(n, c * mult, oh, ow)
        nodes.append(helper.make_node("Add", [last, "r"], ["s"]))
        last = "s"
    if act == "Clip":
        inits["lo"], inits["hi"] = np.array(0.0, np.float32), np.array(6.0, np.float32)
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["z"]))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", [last], ["g"]),
                  helper.make_node("Mul", [last, "g"], ["z"])]  # fmt: skip
    elif act != "none":
        nodes.append(helper.make_node(act, [last], ["z"]))
    out = "z" if act != "none" else last
    return _model(nodes, feeds, [out], inits), feeds


@pytest.mark.parametrize("act", ["none", "Relu", "Clip", "HardSwish", "SiLU"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("x_shape", "mult"), DW3_CASES)
def test_3x3_stride_1_depthwise_reads_the_input_directly(
    depthwise_plans: list[Any], dw_route: str, x_shape: Any, mult: int, residual: bool, act: str
) -> None:
    """Every output of the kernels' steps (inner rows, first and last rows and columns,
    epilogue) against onnxruntime, with each activation and a residual; and the plan took
    the grid module's row kernel (route ``grid``, where it is built), else the register
    kernel (``conv_depthwise_same``) up to ``SAME_3X3_MAX_PIXELS`` a plane and
    ``conv_depthwise3``'s above it, not the padded grid, wherever numba is."""
    from tfrt_py.kernels.nn.conv_depthwise import SAME_3X3_MAX_PIXELS
    from tfrt_py.kernels.nn.conv_depthwise3 import DEPTHWISE3
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels

    x = _r(*x_shape)
    _, c, h, wd = x_shape
    x[0, 0, 1, 0], x[0, c - 1, h - 1, wd - 1] = np.inf, np.nan  # next to a masked wrap
    _check(*_depthwise(x, mult, 1, residual, act))
    same = kernels(3)[0].get()
    kernel = same if h * wd <= SAME_3X3_MAX_PIXELS else DEPTHWISE3.get()
    _check_route(depthwise_plans, dw_route, mult, kernel if same is not None else None)


# (x shape, channel multiplier, K): EfficientNet's 5x5 at 7x7 and 14x14 and ConvNeXt's 7x7
# at 7x7 and 14x14, a plane narrower or shorter than the kernel, a batch, a multiplier of 2.
SAME_CASES = [
    ((1, 8, 7, 7), 1, 5),
    ((1, 6, 14, 14), 1, 5),
    ((2, 4, 5, 9), 2, 5),
    ((1, 4, 3, 11), 1, 5),
    ((1, 8, 7, 7), 1, 7),
    ((1, 4, 14, 14), 1, 7),
    ((1, 4, 9, 3), 1, 7),
]


@pytest.mark.parametrize("act", ["none", "Relu", "Clip", "HardSwish", "SiLU"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("x_shape", "mult", "k"), SAME_CASES)
def test_5x5_and_7x7_stride_1_same_depthwise_keep_the_taps_in_registers(
    depthwise_plans: list[Any], dw_route: str, x_shape: Any, mult: int, k: int, residual: bool,
    act: str,
) -> None:  # fmt: skip
    """The K x K kernels with K // 2 of padding against onnxruntime: every output (a tap
    that wraps into the next row masked, never multiplied: an infinity there must not
    become a NaN), each activation, a residual; and the plan took ``conv_depthwise_same``'s
    kernel (the padded grid before: 1152x7x7 5x5 249 against 91 µs) wherever numba is."""
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels

    n, c, h, wd = x_shape
    x = _r(*x_shape)
    x[0, 0, 1, 0], x[0, c - 1, 0, wd - 1], x[n - 1, 0, h - 1, 0] = np.inf, -np.inf, np.nan
    _check(*_depthwise(x, mult, 1, residual, act, k))
    _check_route(depthwise_plans, dw_route, mult, kernels(k)[0].get())


@pytest.mark.compiles
def test_the_same_padding_kernel_in_float64_and_on_threads() -> None:
    """float64 convs (compiled on first use; ``conv_depthwise_same``'s loop) and the
    parallel form over channel blocks (one image) and image blocks (the plan's, where
    native threads are on: the grid kernel's where it is built), against a padded NumPy
    reference."""
    from tfrt_py.concurrency import native_threads
    from tfrt_py.concurrency.threads import configure
    from tfrt_py.kernels.lib import depthwise_ir
    from tfrt_py.kernels.nn import conv_depthwise as cdw
    from tfrt_py.kernels.nn.conv_depthwise_grid import GRID_PAR
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels
    from tfrt_py.kernels.nn.conv_direct import Epilogue

    for dt, threads, n in ((np.float64, 1, 1), (np.float32, 2, 1), (np.float32, 2, 3)):
        configure(threads)
        try:
            x = _r(n, 32, 14, 14, dtype=dt)
            w, b = _r(32, 1, 5, 5, dtype=dt), _r(32, dtype=dt)
            plan = cdw.plan_depthwise(x.shape, w.shape, (n, 32, 14, 14), (1, 1), (2, 2, 2, 2),
                                      (1, 1), Epilogue(), np.dtype(dt))  # fmt: skip
            if plan is None:
                pytest.skip("numba is not installed (or TFRT_PY_JIT=0)")
            if threads > 1 and native_threads.ready():
                grid = depthwise_ir.function() is not None
                assert plan.par is (GRID_PAR.get() if grid else kernels(5)[1].get())
            got = cdw.run_depthwise(plan, x, w, b, np.empty_like(x), None, Epilogue())
        finally:
            configure(None)
        xp = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
        want = b[None, :, None, None] + sum(
            xp[:, :, i : i + 14, j : j + 14] * w[None, :, 0, i, j, None, None]
            for i in range(5)
            for j in range(5)
        )
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# (x shape, channel multiplier) at stride 2: even and odd heights and widths (an odd one
# has a last output row/column with two taps), MobileNet's 14x14 and 28x28, a batch, a
# channel multiplier of 2.
DW3S2_CASES = [
    ((1, 8, 14, 14), 1),
    ((1, 4, 15, 17), 1),
    ((1, 4, 28, 28), 1),
    ((2, 6, 13, 16), 1),
    ((1, 16, 14, 15), 2),
    ((1, 3, 39, 39), 1),
]


@pytest.mark.parametrize("act", ["none", "Relu", "Clip", "HardSwish", "HardSigmoid", "SiLU"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("x_shape", "mult"), DW3S2_CASES)
def test_3x3_stride_2_depthwise_reads_the_input_directly(
    depthwise_plans: list[Any], dw_route: str, x_shape: Any, mult: int, residual: bool, act: str
) -> None:
    """The stride-2 kernel over the input's four phase planes (``conv_depthwise_same``):
    inside columns, first and last rows and columns (an odd size has a last output row
    or column with two taps), epilogue, against onnxruntime; an infinity and a NaN next
    to the padding (a padded tap adds nothing, no 0 * inf); and the plan took that kernel
    wherever numba is (``conv_depthwise3``'s up to 400 output pixels and the padded grid
    above before: 192x28x28 115 -> 54 µs, 96x112x112 352 -> 245, one thread, Zen 4)."""
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels

    _, c, h, wd = x_shape
    x = _r(*x_shape)
    x[0, 0, 0, 0], x[0, 0, h - 1, wd - 1], x[0, c - 1, 0, wd // 2] = np.inf, np.nan, -np.inf
    _check(*_depthwise(x, mult, 2, residual, act))
    _check_route(depthwise_plans, dw_route, mult, kernels(3, 2)[0].get())


# (x shape, channel multiplier) for EfficientNet's 5x5 stride-2 layers: even and odd
# sizes, a batch, a multiplier of 2.
DW5S2_CASES = [((1, 8, 14, 14), 1), ((1, 4, 15, 17), 1), ((2, 4, 28, 27), 1), ((1, 4, 9, 10), 2)]


@pytest.mark.parametrize("act", ["none", "Relu", "HardSwish", "SiLU"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("x_shape", "mult"), DW5S2_CASES)
def test_5x5_stride_2_depthwise_runs_over_phase_planes(
    depthwise_plans: list[Any], dw_route: str, x_shape: Any, mult: int, residual: bool, act: str
) -> None:
    """5x5, two pixels of padding, stride 2 (the padded grid before: 112x28x28 89 -> 53
    µs) against onnxruntime, with special values near the borders."""
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels

    n, c, h, wd = x_shape
    x = _r(*x_shape)
    x[0, 0, 1, 0], x[n - 1, c - 1, h - 1, wd - 2], x[0, 0, 2, wd - 1] = np.inf, np.nan, -np.inf
    _check(*_depthwise(x, mult, 2, residual, act, 5))
    _check_route(depthwise_plans, dw_route, mult, kernels(5, 2)[0].get())


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 4, 48, 48), (4, 1, 3, 3), {"pads": [1, 0, 1, 0], "strides": [2, 2]}),
        ((1, 4, 32, 32), (4, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
        ((1, 4, 16, 16), (4, 1, 3, 3), {"pads": [1, 0, 1, 1]}),
        ((1, 4, 16, 16), (4, 1, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
        ((1, 4, 16, 16), (4, 1, 5, 5), {"pads": [2, 1, 2, 1], "strides": [2, 2]}),
        ((1, 4, 16, 16), (4, 1, 5, 5), {"pads": [2, 1, 2, 1]}),
    ],
)
def test_other_depthwise_geometries_keep_the_padded_grid(
    depthwise_plans: list[Any], x_shape: Any, w_shape: Any, attrs: dict[str, Any]
) -> None:
    """Strides other than 1 and 2, other pads (at stride 2 too), dilations and a 5x5
    kernel with other pads take ``conv_direct._depthwise2d``."""
    from tfrt_py.kernels.nn.conv_depthwise3 import DEPTHWISE3
    from tfrt_py.kernels.nn.conv_depthwise_same import kernels

    x, w, b = _r(*x_shape), _r(*w_shape), _r(w_shape[0])
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=x_shape[1], **attrs)
    _check(_model([node], {"x": x}, ["y"], {"w": w, "b": b}), {"x": x}, optimize=False)
    compiled = {DEPTHWISE3.get(), *(kernels(k)[0].get() for k in (3, 5)),
                *(kernels(k, 2)[0].get() for k in (3, 5))}  # fmt: skip
    compiled -= {None}
    if compiled:
        assert depthwise_plans and all(p.fn not in compiled for p in depthwise_plans)


# -- grouped convs with few channels per group: compiled kernels -----------------------------

# (x shape, group, w shape, attrs): RegNet's 8 channels per group, ResNeXt's 4, a channel
# multiplier of 2 and of 1/2 per group, strides, dilations, asymmetric pads, a batch; 2
# and 3 channels a group.
GROUPED_DIRECT_CASES = [
    ((1, 48, 28, 28), 6, (48, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 104, 14, 14), 13, (104, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 16, 20, 20), 4, (8, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 14, 14), 3, (48, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    (
        (1, 12, 23, 19),
        3,
        (12, 4, 5, 3),
        {"pads": [2, 0, 1, 1], "strides": [1, 2], "dilations": [2, 1]},
    ),
    ((1, 32, 9, 9), 2, (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 14, 14), 12, (24, 2, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 18, 11, 11), 6, (36, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
]


@pytest.fixture
def direct_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The weight shapes the direct depthwise/grouped kernel ran with, call by call."""
    from tfrt_py.kernels.nn import conv_depthwise

    return record_calls(monkeypatch, conv_depthwise, "run_depthwise", lambda p, x, w, *r: w.shape)


@pytest.fixture
def blocked_routes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The routes ``conv_blocked.run_blocked`` ran, call by call."""
    from tfrt_py.kernels.nn import conv_blocked

    return record_calls(monkeypatch, conv_blocked, "run_blocked", lambda plan, *r: plan.route)


def _grouped_ran(w_shape: Any, group: int, direct_runs: list[Any], routes: list[str]) -> None:
    """The compiled kernel a grouped float32 conv takes ran: a product a group on
    ``conv_cols``' kernel from ``conv_cols_grouped.MIN_CHANNELS`` channels a group where it
    is there, else the direct kernel."""
    from tfrt_py.kernels.nn import conv_cols_grouped

    if conv_cols_grouped.serves(w_shape[1], group, np.dtype(np.float32)):
        assert routes and routes[-1] == "groups" and not direct_runs
    else:
        assert direct_runs and direct_runs[-1] == w_shape


@pytest.mark.parametrize("act", ["Relu", "none"])
@pytest.mark.parametrize(("x_shape", "group", "w_shape", "attrs"), GROUPED_DIRECT_CASES)
@pytest.mark.compiles
def test_grouped_conv_with_few_channels_per_group_runs_a_compiled_kernel(
    direct_runs: list[Any], blocked_routes: list[str], x_shape: Any, group: int, w_shape: Any,
    attrs: dict[str, Any], act: str,
) -> None:  # fmt: skip
    x, w, b = _r(*x_shape), _r(*w_shape) * 0.3, _r(w_shape[0])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, **attrs)]
    if act == "none":
        nodes[0].output[0] = "y"
    else:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    model = _check(_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}), {"x": x})
    if jit_enabled():
        _grouped_ran(w_shape, group, direct_runs, blocked_routes)
    out = np.full(model.run({"x": x})["y"].shape, np.nan, np.float32)
    np.testing.assert_array_equal(model.run({"x": x}, outputs={"y": out})["y"], out)
    np.testing.assert_allclose(out, _ort(_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}),
                                         {"x": x})[0], rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.compiles
def test_grouped_conv_split_over_threads_with_a_residual(
    direct_runs: list[Any], blocked_routes: list[str]
) -> None:
    """A grouped conv big enough to split runs as blocks of whole groups on the threads."""
    from tfrt_py.concurrency.threads import configure

    x, w, b, r = _r(1, 64, 40, 40), _r(64, 8, 3, 3) * 0.3, _r(64), _r(1, 64, 40, 40)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["y", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["z"]),
    ]
    configure(2)
    try:
        _check(_model(nodes, {"x": x, "r": r}, ["z"], {"w": w, "b": b}), {"x": x, "r": r})
    finally:
        configure(None)
    if jit_enabled():
        _grouped_ran((64, 8, 3, 3), 8, direct_runs, blocked_routes)


@pytest.mark.compiles
def test_grouped_1x1_and_wide_groups_keep_the_product(direct_runs: list[Any]) -> None:
    """A grouped 1x1 conv and groups wider than GROUPED_DIRECT_MAX_CHANNELS are products."""
    from tfrt_py.kernels.nn.conv_depthwise import GROUPED_DIRECT_MAX_CHANNELS as wide

    for w_shape, group in (((16, 8, 1, 1), 2), ((2 * (wide + 1), wide + 1, 3, 3), 2)):
        x = _r(1, w_shape[1] * group, 12, 12)
        node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, pads=[0, 0, 0, 0])
        _check(_model([node], {"x": x}, ["y"], {"w": _r(*w_shape)}), {"x": x})
    assert not direct_runs


# -- epilogues -----------------------------------------------------------------------------


def _act_ref(y: np.ndarray, epi: Epilogue) -> np.ndarray:
    y = y.astype(np.float64)
    a, b = epi.alpha, epi.beta
    if epi.act == "Relu":
        return np.maximum(y, 0)
    if epi.act == "Clip":
        return np.minimum(np.maximum(y, a), b)
    if epi.act == "HardSwish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    if epi.act == "HardSigmoid":
        return np.clip(a * y + b, 0, 1)
    if epi.act == "Sigmoid":
        return 1 / (1 + np.exp(-y))
    if epi.act == "SiLU":
        return y / (1 + np.exp(-y))
    if epi.act == "LeakyRelu":
        return np.where(y < 0, a * y, y)
    if epi.act == "Gelu":
        return y * 0.5 * (1 + np.vectorize(math.erf, otypes=[np.float64])(y / math.sqrt(2)))
    return y


_EPIS = [
    Epilogue(),
    Epilogue("Relu"),
    Epilogue("Clip", 0.0, 6.0),
    Epilogue("Clip", -np.inf, 0.5),
    Epilogue("HardSwish"),
    Epilogue("HardSigmoid", 0.2, 0.5),
    Epilogue("Sigmoid"),
    Epilogue("SiLU"),
    Epilogue("LeakyRelu", 0.1),
    Epilogue("Gelu"),
]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("epi", _EPIS, ids=lambda e: e.act or "none")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_apply_epilogue_matches_numpy(jit: str, epi: Epilogue, residual: bool, dtype: Any) -> None:
    y = _r(2, 5, 7, 3, dtype=dtype) * 4
    y[0, 0, 0, :2] = [np.nan, -0.0]
    b, r = _r(5, dtype=dtype), _r(2, 5, 7, 3, dtype=dtype)
    z = y + b.reshape(5, 1, 1) + (r if residual else 0)
    want = _act_ref(z, epi)
    got = apply_epilogue(y.copy(), b, r if residual else None, epi)
    # float32 Sigmoid/SiLU use MLAS's rational logistic (abs error <= 2.2e-7): SiLU
    # multiplies that error by |z|
    atol = 1e-6 if dtype == np.float64 or epi.act != "SiLU" else 3e-7 * (1 + np.abs(z))
    ok = np.abs(got - want) <= 1e-5 * np.abs(want) + atol
    assert (ok | np.isnan(want)).all(), (got[~ok], want[~ok])
    assert np.isnan(got[0, 0, 0, 0]) or epi.act in ("HardSigmoid",)  # NaN propagates


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("epi", _EPIS, ids=lambda e: e.act or "none")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_epilogue_short_maps_as_one_run_equal_the_row_path(
    jit: str, epi: Epilogue, residual: bool, dtype: Any
) -> None:
    """Maps shorter than ``SHORT_RUN`` pixels take the epilogue as passes over each image's
    whole run, longer ones row by row: the same values, bit for bit (a map of 256 pixels
    and its first 128)."""
    from tfrt_py.kernels.nn.conv_direct import SHORT_RUN

    assert 128 < SHORT_RUN <= 256
    y = _r(2, 5, 16, 16, dtype=dtype) * 4
    y[0, 0, 0, :2] = [np.nan, -0.0]
    b, r = _r(5, dtype=dtype), _r(2, 5, 16, 16, dtype=dtype)
    rows = apply_epilogue(y.copy(), b, r if residual else None, epi)
    half = np.ascontiguousarray(y[:, :, :8])
    rh = np.ascontiguousarray(r[:, :, :8]) if residual else None
    np.testing.assert_array_equal(apply_epilogue(half, b, rh, epi), rows[:, :, :8])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("epi", _EPIS, ids=lambda e: e.act or "none")
def test_apply_epilogue_one_value_per_channel(jit: str, epi: Epilogue, residual: bool) -> None:
    """A squeeze-excite block's 1x1 convs: (N, M, 1, 1), one flat pass (the compiled
    loop's own branch), the same values as per-row."""
    y = _r(3, 40, 1, 1) * 4
    b, r = _r(40), _r(3, 40, 1, 1)
    z = y + b.reshape(40, 1, 1) + (r if residual else 0)
    want = _act_ref(z, epi)
    got = apply_epilogue(y.copy(), b, r if residual else None, epi)
    atol = 1e-6 if epi.act != "SiLU" else 3e-7 * (1 + np.abs(z))
    assert (np.abs(got - want) <= 1e-5 * np.abs(want) + atol).all()
    wide = np.concatenate([y, y], axis=3)  # the per-row path on the same values
    wr = np.concatenate([r, r], axis=3) if residual else None
    np.testing.assert_array_equal(apply_epilogue(wide, b, wr, epi)[..., :1], got)


def test_activation_table_covers_the_epilogues() -> None:
    assert {e.act for e in _EPIS} == set(ACTIVATIONS)


# -- the fuse_conv pass --------------------------------------------------------------------


def _conv_nodes(act: str, pre: str = "c") -> tuple[list[onnx.NodeProto], str]:
    """Nodes of an activation reading ``pre``; (nodes, output name)."""
    mk = helper.make_node
    if act == "SiLU":
        return [mk("Sigmoid", [pre], ["s"]), mk("Mul", [pre, "s"], ["y"])], "y"
    if act == "Clip":
        return [mk("Clip", [pre, "lo", "hi"], ["y"])], "y"
    if act == "HardSigmoid":
        return [mk("HardSigmoid", [pre], ["y"], alpha=0.3, beta=0.4)], "y"
    if act == "LeakyRelu":
        return [mk("LeakyRelu", [pre], ["y"], alpha=0.2)], "y"
    if act == "Gelu":  # erf GELU as torch.onnx writes it (fuse_transformer names it)

        def const(name: str, v: float) -> onnx.NodeProto:
            return mk(
                "Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32))
            )

        return [
            const("g_s2", math.sqrt(2.0)), const("g_1", 1.0), const("g_h", 0.5),
            mk("Div", [pre, "g_s2"], ["g_d"]), mk("Erf", ["g_d"], ["g_e"]),
            mk("Add", ["g_e", "g_1"], ["g_a"]), mk("Mul", [pre, "g_a"], ["g_m"]),
            mk("Mul", ["g_m", "g_h"], ["y"]),
        ], "y"  # fmt: skip
    return [mk(act, [pre], ["y"])], "y"


_FUSE_ACTS = ["Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "SiLU", "LeakyRelu", "Gelu"]


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("residual", ["none", "tensor", "channel_const"])
@pytest.mark.parametrize("act", _FUSE_ACTS)
@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.compiles
def test_fuse_conv_matches_unfused_and_onnxruntime(
    jit: str, executor: str, residual: str, act: str, group: int
) -> None:
    x = _r(2, 8, 20, 20)
    inits: dict[str, np.ndarray] = {
        "w": _r(8, 8 // group, 3, 3),
        "b": _r(8),
        "lo": np.array(-0.5, np.float32),
        "hi": np.array(1.0, np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c0"], group=group, pads=[1] * 4)]
    if residual == "tensor":
        nodes.append(helper.make_node("Add", ["x", "c0"], ["c"]))
    elif residual == "channel_const":
        inits["k"] = _r(1, 8, 1, 1)
        nodes.append(helper.make_node("Add", ["c0", "k"], ["c"]))
    else:
        nodes[0].output[0] = "c"
    act_nodes, out = _conv_nodes(act)
    m = _model(nodes + act_nodes, {"x": x}, [out], inits)
    model = _check(m, {"x": x}, executor=executor)
    ops = [n.op_type for n in model.prepared.graph.nodes]
    assert ops == ["Conv"], ops
    assert model.prepared.graph.nodes[0].domain == "tfrt_py.fused"
    off = set(PASSES) - {"fuse_conv"}
    _check(m, {"x": x}, executor=executor, optimize=off)


@pytest.mark.compiles
def test_fuse_conv_folds_batch_normalization(jit: str) -> None:
    x = _r(1, 4, 12, 12)
    inits = {"w": _r(6, 4, 3, 3), "s": _r(6), "bb": _r(6), "m": _r(6),
             "v": np.abs(_r(6)) + 0.1}  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    model = _check(_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    assert "1 BatchNormalization and 0 channel scalings folded" in _report(model, "fuse_conv")
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv"]


@pytest.mark.compiles
def test_fuse_conv_two_convs_into_one_add(monkeypatch: pytest.MonkeyPatch) -> None:
    """ResNet's downsample: both inputs of the residual Add are conv outputs; the first
    conv's group takes the Add, the second conv stays a producer before it. (Both read
    ``x`` here, so merge_branches would make them one conv: it is off for this test.)"""
    monkeypatch.setenv("TFRT_PY_DISABLE_PASSES", "merge_branches")
    x = _r(1, 4, 10, 10)
    inits = {"w1": _r(8, 4, 3, 3), "w2": _r(8, 4, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w2"], ["d"]),
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1] * 4),
        helper.make_node("Add", ["c", "d"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    model = _check(_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    assert len(model.prepared.graph.nodes) == 2


def test_fuse_conv_leaves_shared_and_output_values() -> None:
    """A conv output that is also a graph output, or read twice, is not fused over."""
    x = _r(1, 3, 8, 8)
    inits = {"w": _r(4, 3, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = _check(_model(nodes, {"x": x}, ["y", "c"], inits), {"x": x})
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv", "Relu"]
    nodes2 = [*nodes, helper.make_node("Neg", ["c"], ["z"])]
    model = _check(_model(nodes2, {"x": x}, ["y", "z"], inits), {"x": x})
    assert _report(model, "fuse_conv") == "nothing to fuse"


def test_fuse_conv_keeps_computed_bias_and_bounds() -> None:
    """A computed Clip bound or bias is left to the unfused kernels."""
    x = _r(1, 3, 8, 8)
    inits = {"w": _r(4, 3, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
        helper.make_node("ReduceMax", ["x"], ["hi"], keepdims=0),
        helper.make_node("Clip", ["c", "", "hi"], ["y"]),
    ]
    model = _check(_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    assert "Clip" in [n.op_type for n in model.prepared.graph.nodes]


def test_fuse_conv_folds_a_channel_scaling(jit: str) -> None:
    """ConvNeXt's layer scale: Mul by a per-channel constant, then the residual Add."""
    x = _r(2, 6, 9, 9)
    inits = {"w": _r(6, 1, 7, 7), "b": _r(6), "g": _r(6, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], group=6, pads=[3] * 4),
        helper.make_node("Mul", ["c", "g"], ["m"]),
        helper.make_node("Add", ["x", "m"], ["y"]),
    ]
    model = _check(_model(nodes, {"x": x}, ["y"], inits), {"x": x})
    assert [n.op_type for n in model.prepared.graph.nodes] == ["Conv"]
    assert "1 channel scalings folded" in _report(model, "fuse_conv")


@pytest.mark.parametrize("op", ["Sigmoid", "Swish"])
@pytest.mark.parametrize("in_place", [False, True])
def test_sigmoid_and_swish_kernels(jit: str, op: str, in_place: bool) -> None:
    """The compiled float32 Sigmoid/SiLU (``kernels/lib/sigmoid_jit.py``) and the NumPy path:
    special values, exp's range edges, in place or not."""
    from tfrt_py.ir import Node, Value
    from tfrt_py.kernels import KernelContext, default_registry

    opset = 24 if op == "Swish" else 13
    node = Node(op, [Value("x")], [Value("y")], {}, name="n", opset=opset)
    fn = default_registry().lookup("", op, opset).build(KernelContext(node))
    x = (_r(3, 1500) * 30).astype(np.float32)
    x[0, :8] = [np.nan, np.inf, -np.inf, 88.5, -88.5, 87.0, -87.0, -0.0]
    xd = x.astype(np.float64)
    with np.errstate(all="ignore"):
        sig = 1 / (1 + np.exp(-xd))
        want = xd * sig if op == "Swish" else sig
    buf = x.copy()
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy: exp -> inf, -inf/inf
        got = fn(buf, out=buf) if in_place else fn(x)
    if in_place:
        assert got is buf
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


# -- MaxPool (kernels/nn/pool_direct.py) -----------------------------------------------------

POOL_CASES = [
    ((1, 8, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 111, 111), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 3, 30, 29), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 3, 33, 33), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 2, 20, 21), {"kernel_shape": [4, 4], "auto_pad": "SAME_UPPER", "strides": [3, 3]}),
    ((1, 2, 20, 20), {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3]}),  # a 4x4 output: below the compiled path's floor
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES)
def test_max_pool_matches_onnxruntime(
    jit: str, x_shape: Any, attrs: dict[str, Any], dtype: Any
) -> None:
    x = _r(*x_shape, dtype=dtype)
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    m = _model([node], {"x": x}, ["y"], {}, opset=12)
    # onnxruntime has float64 MaxPool (onnx's reference evaluator pads SAME_LOWER wrongly)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    model = tfrt_py.load(m)
    for _ in range(2):
        np.testing.assert_array_equal(model.run({"x": x})["y"], want)


@pytest.mark.parametrize(
    ("x_shape", "attrs"),
    [
        # windows wholly inside the padding (pads >= kernel): -inf on both paths
        ((1, 2, 20, 20), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [3, 3, 3, 3]}),
        # a tall window (more rows than the three the compiled row pass fuses)
        ((1, 3, 30, 30), {"kernel_shape": [5, 2], "strides": [1, 2], "pads": [2, 0, 2, 1]}),
        # ceil mode with begin pads and stride 2, width 3 (the vectorized column pass)
        (
            (2, 3, 31, 31),
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0], "ceil_mode": 1},
        ),
        # stride 2, width 3 over short rows of both parities (its even/odd column runs:
        # SqueezeNet's 27 and 13, rows of 5 and 4, a right pad only)
        ((1, 4, 27, 27), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ((1, 2, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 2, 6, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
        ((1, 2, 7, 4), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0]}),
        # 3x3 stride 2 over wide rows: the whole-plane passes in blocks of output rows
        # (six a block at 300 columns, the last one short), edge columns on both sides
        ((1, 2, 77, 300), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 0]}),
        ((1, 2, 40, 301), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ],
)
def test_max_pool_compiled_matches_numpy_fold(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, attrs: dict[str, Any]
) -> None:
    """The compiled separable pass (rows, then columns) against ``pool``'s NumPy fold on
    the geometries its fast loops do not cover."""
    if not jit_enabled():
        pytest.skip("numba is not installed")
    x = _r(*x_shape)
    x[0, 0, 2, 3] = np.nan
    x[0, -1, 1, 2] = np.nan  # an even column too (the de-interleaved runs)
    m = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], {"x": x}, ["y"], {}, opset=12)
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(ENV_JIT, flag)
        got[flag] = tfrt_py.load(m).run({"x": x})["y"]
    np.testing.assert_array_equal(got["1"], got["0"])


@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES[:3])
def test_max_pool_nan_like_numpy(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, attrs: dict[str, Any]
) -> None:
    """NaN wins its windows on both paths, as with np.maximum (onnxruntime skips NaN), and
    an all -inf window gives -inf (onnxruntime: the lowest float)."""
    if not jit_enabled():
        pytest.skip("numba is not installed")
    x = _r(*x_shape)
    x[0, 0, 1, 1] = x[0, -1, 5, 7] = np.nan
    x[0, -1, :4, :4] = -np.inf
    m = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], {"x": x}, ["y"], {}, opset=12)
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(ENV_JIT, flag)
        got[flag] = tfrt_py.load(m).run({"x": x})["y"]
    assert np.isnan(got["1"]).any()
    np.testing.assert_array_equal(got["1"], got["0"])
