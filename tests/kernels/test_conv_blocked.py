"""The blocked convolution (kernels/nn/conv_blocked.py): blocks of output rows, each an
im2col straight from the unpadded input + a GEMM + the fused epilogue, split over the
intra-op threads. Checked against onnxruntime on the geometries its im2col handles
(padding, strides, dilations, SAME pads, 1x1 with and without the copy), with every
epilogue, a batch, an ``outputs=`` buffer, and against the whole-image path when the
blocked one is not taken."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import tfrt_py
from tests.support.one_input import one_input_model
from tests.support.spies import record_calls
from tfrt_py.concurrency import native_threads, threads
from tfrt_py.kernels.lib import gemm, gemm_cols, gemm_packed
from tfrt_py.kernels.lib.jit import jit_enabled
from tfrt_py.kernels.nn import conv_blocked, conv_depthwise, conv_im2col, conv_pointwise

_RNG = np.random.default_rng(11)

pytestmark = pytest.mark.skipif(not jit_enabled(), reason="numba is not installed")


def _r(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


_model = one_input_model


def _ort(m: Any, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The plans the blocked path ran with, call by call. Grouped convs are kept off the
    direct kernel (``conv_depthwise``), which takes few channels per group by default."""
    monkeypatch.setattr(conv_depthwise, "GROUPED_DIRECT_MAX_CHANNELS", 0)
    return record_calls(monkeypatch, conv_blocked, "run_blocked")


GEOMETRIES = [
    # (x shape, w shape, Conv attributes)
    ((1, 16, 40, 40), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 64, 64), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 8, 37, 41), (24, 8, 3, 3), {"strides": [2, 2]}),
    ((1, 8, 30, 30), (16, 8, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ((1, 8, 29, 30), (16, 8, 4, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}),
    # column stride 2 over wide rows: the im2col reads even/odd column planes (an odd
    # width, row dilation, asymmetric pads)
    ((1, 4, 23, 37), (8, 4, 3, 3), {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 2, 0, 1]}),
    # stride 1 with output rows as wide as the input's: each tap's im2col row is one
    # shifted run of the plane (dilated, asymmetric pads, a 5x5, a 1x7)
    ((1, 8, 20, 20), (16, 8, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 8, 19, 21), (16, 8, 3, 3), {"pads": [0, 1, 2, 1]}),
    ((1, 6, 18, 17), (16, 6, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 6, 9, 30), (16, 6, 1, 7), {"pads": [0, 3, 0, 3]}),
    ((1, 32, 28, 28), (64, 32, 1, 1), {}),  # 1x1 stride 1: the input is the im2col matrix
    ((1, 32, 28, 28), (64, 32, 1, 1), {"strides": [2, 2]}),
    ((2, 16, 24, 24), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # a batch
    # grouped (RegNet's 8 channels per group): blocks of groups
    ((1, 48, 28, 28), (48, 8, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),
    ((2, 32, 21, 21), (64, 8, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 0], "group": 4}),
    ((1, 32, 14, 14), (16, 16, 1, 1), {"group": 2}),  # grouped 1x1: no copy
    # more filters than output pixels: filter blocks on native threads (conv_pointwise),
    # a 1x1 over the input, a 3x3 over one im2col per image
    ((1, 96, 7, 7), (576, 96, 1, 1), {}),
    ((2, 64, 7, 7), (128, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), GEOMETRIES)
@pytest.mark.parametrize("epilogue", ["bias", "bias_relu", "residual_clip", "silu", "none"])
def test_blocked_conv_matches_onnxruntime(
    plans: list[Any], x_shape: Any, w_shape: Any, attrs: dict[str, Any], epilogue: str
) -> None:
    x = _r(*x_shape)
    inits = {"w": _r(*w_shape) * 0.3, "b": _r(w_shape[0])}
    ins = ["x", "w"] if epilogue == "none" else ["x", "w", "b"]
    nodes = [helper.make_node("Conv", ins, ["c"], **attrs)]
    if epilogue == "bias_relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "residual_clip":
        nodes.append(helper.make_node("Conv", ins, ["d"], **attrs))
        nodes.append(helper.make_node("Add", ["c", "d"], ["a"]))
        inits["lo"], inits["hi"] = np.array(-0.5, np.float32), np.array(1.0, np.float32)
        nodes.append(helper.make_node("Clip", ["a", "lo", "hi"], ["y"]))
    elif epilogue == "silu":
        nodes.append(helper.make_node("Sigmoid", ["c"], ["s"]))
        nodes.append(helper.make_node("Mul", ["c", "s"], ["y"]))
    else:
        nodes[0].output[0] = "y"
    m = _model(nodes, x, inits)
    want = _ort(m, x)
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):  # the first call probes, the second runs the planned code
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    filter_blocks_only = w_shape[0] > want.shape[2] * want.shape[3] and attrs.get("group", 1) == 1
    if filter_blocks_only and not native_threads.ready():
        # without native threads: conv_cols' one block where the kernel is there (a 3x3
        # or a 1x1 over 7x7: its columns pay against BLAS), else the whole-image path
        cols = gemm_cols.available()
        assert (bool(plans) and plans[-1].route == "cols") if cols else not plans
    else:
        assert plans, "the blocked path did not run"
    out = np.full(want.shape, np.nan, np.float32)
    got = model.run({"x": x}, outputs={"y": out})["y"]
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "group", "span"),
    [
        ((1, 32, 56, 56), (64, 32, 3, 3), 1, (3, 4, 56)),  # blocks of output rows
        ((1, 208, 28, 28), (208, 8, 3, 3), 26, (1, 2, 26)),  # blocks of groups
    ],
)
def test_a_large_conv_is_split_over_the_threads(
    plans: list[Any], x_shape: Any, w_shape: Any, group: int, span: tuple[int, int, int]
) -> None:
    """A conv past the split threshold runs as ``gemm.PARTS_PER_THREAD`` blocks per thread
    of the budget, covering every output row (one group) or every group; the result does
    not depend on the split."""
    if threads.threads() < 2:
        pytest.skip("one thread in this process's budget: nothing to split")
    x = _r(*x_shape)
    inits = {"w": _r(*w_shape) * 0.1, "b": _r(w_shape[0])}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("Relu", ["c"], ["y"])]  # fmt: skip
    m = _model(nodes, x, inits)
    got = tfrt_py.load(m, executor="sync").run({"x": x})["y"]
    np.testing.assert_allclose(got, _ort(m, x), rtol=1e-4, atol=1e-4)
    plan = plans[-1]
    assert plan.split and len(plan.blocks) == gemm.PARTS_PER_THREAD * threads.threads()
    first, last, end = span
    assert plan.blocks[0][first] == 0 and plan.blocks[-1][last] == end


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "pads"),
    [
        ((1, 144, 28, 28), (32, 144, 1, 1), [0, 0, 0, 0]),  # MobileNet v2's projection
        ((1, 16, 28, 28), (32, 16, 3, 3), [1, 1, 1, 1]),
    ],
)
def test_a_conv_between_the_native_and_the_pool_thresholds_runs_on_native_threads(
    plans: list[Any], x_shape: Any, w_shape: Any, pads: list[int]
) -> None:
    """A one-group conv of 1-4M multiply-adds is past the native split's threshold
    (``gemm.NATIVE_SPLIT_MIN_MACS``) but below the Python pool's: it runs as blocks of
    output rows on native threads. It used to take the one-block path on the caller,
    which was checked first (144 -> 32 over 28x28: 98 µs on one thread, 65 on two)."""
    x = _r(*x_shape)
    macs = w_shape[0] * w_shape[1] * w_shape[2] * w_shape[3] * x_shape[2] * x_shape[3]
    assert gemm.NATIVE_SPLIT_MIN_MACS <= macs < conv_blocked._SPLIT_MIN_MACS
    inits = {"w": _r(*w_shape) * 0.1, "b": _r(w_shape[0])}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]  # fmt: skip
    m = _model(nodes, x, inits)
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-4, atol=1e-4)
    assert plans
    parallel = native_threads.ready() and threads.threads() > 1
    if plans[-1].packed is not None:  # a 3x3 conv of whole panels of filters (conv_packed)
        assert plans[-1].route == "packed" and (len(plans[-1].packed.parts) > 1) == parallel
    elif plans[-1].cols is not None:  # float32 on the gemm_cols kernel (conv_cols)
        assert plans[-1].route == "cols" and (len(plans[-1].cols.blocks) > 1) == parallel
    elif parallel:
        assert plans[-1].route == "rows" and len(plans[-1].par_blocks) > 1
    else:
        assert plans[-1].route == "whole"


@pytest.mark.compiles
def test_more_channels_than_pixels_takes_filter_blocks_or_the_whole_image_path(
    plans: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """512 filters over a 7x7 output, the packed kernels switched off (so conv_cols'
    filter blocks are not there): blocks of output rows would be a few pixels wide and
    each would pack the whole weight matrix again. With native threads the filters are
    split instead (one im2col, then a block of filters per thread with its epilogue);
    without them the whole-image GEMM serves it."""
    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")
    x = _r(1, 64, 7, 7)
    inits = {"w": _r(512, 64, 3, 3) * 0.1}
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], x, inits)
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-4, atol=1e-4)
    if native_threads.ready() and threads.threads() > 1:
        assert plans and all(p.native is not None for p in plans)
        blocks = plans[-1].native_blocks
        assert blocks[0][1] == 0 and blocks[-1][2] == 512 and len(blocks) > 1
    else:
        assert not plans


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((2, 64, 7, 7), (512, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
        # stride 2 over rows of 40: the im2col's even/odd column planes, per block
        ((1, 24, 40, 40), (512, 24, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ],
)
def test_filter_blocks_im2col_runs_in_channel_blocks_on_native_threads(
    plans: list[Any], x_shape: Any, w_shape: Any, attrs: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The im2col before the filter blocks runs in blocks of channels per image on native
    threads (it ran on the caller alone: 194 of a 256 -> 256 3x3 conv's 1425 µs over
    14x14); the blocks cover every channel of every image once, and the conv matches
    onnxruntime. The packed kernels are switched off: with them conv_cols' filter blocks
    take these convs (``test_conv_cols``)."""
    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")
    x = _r(*x_shape)
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], x,
               {"w": _r(*w_shape) * 0.1})  # fmt: skip
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, x), rtol=1e-4, atol=1e-4)
    if not (native_threads.ready() and threads.threads() > 1):
        pytest.skip("no native threads in this process: the whole-image path serves it")
    plan = plans[-1]
    assert plan.route == "filters" and plan.im2col_par is not None
    blocks = plan.im2col_blocks
    for i in range(x_shape[0]):
        mine = blocks[blocks[:, 0] == i]
        assert len(mine) > 1 and mine[0, 1] == 0 and mine[-1, 2] == x_shape[1]
        assert (mine[1:, 1] == mine[:-1, 2]).all()


@pytest.mark.parametrize(
    ("n", "m", "parts"), [(1, 512, 2), (2, 576, 2), (1, 72, 2), (3, 20, 4), (1, 5, 8)]
)
def test_filter_blocks_cover_every_filter_once(n: int, m: int, parts: int) -> None:
    """Per image, consecutive non-empty blocks from filter 0 to ``m``, at most ``parts``,
    on multiples of 16 where there are enough filters for that."""
    blocks = conv_pointwise.filter_blocks(n, m, parts)
    for i in range(n):
        mine = blocks[blocks[:, 0] == i]
        assert 1 <= len(mine) <= parts
        assert mine[0, 1] == 0 and mine[-1, 2] == m
        assert (mine[1:, 1] == mine[:-1, 2]).all() and (mine[:, 2] > mine[:, 1]).all()
        if m >= 16 * parts:
            assert (mine[:-1, 2] % 16 == 0).all()


def _im2col_reference(
    x: np.ndarray, n: int, kh: int, kw: int, s: tuple[int, int], d: tuple[int, int],
    pads: tuple[int, int], out: tuple[int, int], c0: int, c1: int, oh0: int, oh1: int,
) -> np.ndarray:  # fmt: skip
    """cols[(c - c0, i, j), (oh - oh0) * OW + ow] from the definition, in NumPy."""
    ow_ = out[1]
    cols = np.zeros(((c1 - c0) * kh * kw, (oh1 - oh0) * ow_), x.dtype)
    r = 0
    for c in range(c0, c1):
        for i in range(kh):
            for j in range(kw):
                for oh in range(oh0, oh1):
                    ih = oh * s[0] - pads[0] + i * d[0]
                    if not 0 <= ih < x.shape[2]:
                        continue
                    for ow in range(ow_):
                        iw = ow * s[1] - pads[1] + j * d[1]
                        if 0 <= iw < x.shape[3]:
                            cols[r, (oh - oh0) * ow_ + ow] = x[n, c, ih, iw]
                r += 1
    return cols


@pytest.mark.parametrize(
    ("shape", "kernel", "strides", "dil", "pads", "out", "rows"),
    [
        ((2, 3, 7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (7, 9), (0, 7)),  # same: one run
        ((1, 3, 7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (7, 9), (2, 5)),  # a block of rows
        ((1, 2, 6, 8), (5, 3), (1, 1), (1, 1), (2, 1), (6, 8), (0, 6)),
        ((1, 2, 9, 8), (3, 3), (1, 1), (2, 2), (2, 2), (9, 8), (4, 9)),
        ((1, 2, 5, 11), (1, 7), (1, 1), (1, 1), (0, 3), (5, 11), (1, 4)),
        ((1, 2, 8, 8), (3, 3), (1, 1), (1, 1), (0, 0), (6, 6), (0, 6)),  # valid: row runs
        ((1, 2, 9, 40), (3, 3), (2, 2), (1, 1), (1, 1), (5, 20), (0, 5)),  # stride 2
        # stride 2, blocks of rows: only the rows a block reads are split into even and
        # odd columns (the rest of the planes are never written)
        ((1, 2, 23, 40), (3, 3), (2, 2), (1, 1), (1, 1), (12, 20), (3, 7)),
        ((1, 2, 30, 40), (7, 7), (2, 2), (1, 1), (3, 3), (15, 20), (5, 9)),
        ((1, 2, 30, 40), (7, 7), (2, 2), (1, 1), (3, 3), (15, 20), (13, 15)),
        ((1, 2, 21, 40), (3, 3), (2, 2), (2, 1), (2, 1), (11, 20), (6, 11)),
    ],
)
@pytest.mark.compiles
def test_compiled_im2col_matches_its_definition(
    shape: Any, kernel: Any, strides: Any, dil: Any, pads: Any, out: Any, rows: Any
) -> None:
    """Every path of the compiled im2col (one shifted run per tap when the output rows
    are as wide as the input's, a run per output row otherwise, even/odd column planes at
    stride 2) against the definition, for whole images and blocks of rows and channels."""
    im2col = conv_im2col.IM2COL.get()
    x = _r(*shape)
    geo = np.array([*kernel, *strides, *dil, *pads, out[1]], np.int64)
    n = shape[0] - 1
    c0, c1 = (1, shape[1]) if shape[1] > 2 else (0, shape[1])
    oh0, oh1 = rows
    kh, kw = kernel
    want = _im2col_reference(x, n, kh, kw, strides, dil, pads, out, c0, c1, oh0, oh1)
    got = np.full(want.shape, np.nan, np.float32)
    im2col(x, n, got, geo, c0, c1, oh0, oh1)
    np.testing.assert_array_equal(got, want)
