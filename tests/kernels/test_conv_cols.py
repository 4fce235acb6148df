"""The one-group float32 conv on the gemm_cols kernel (kernels/nn/conv_cols.py,
kernels/lib/gemm_cols.py): the kernel against a float64 product (partial panels, taps at
offsets, every epilogue flag, NaN through ReLU/Clip, nothing written past N), each form
of the conv (GRID, IM2COL, DIRECT) against onnxruntime with the route checked, the AVX2
tile in a fresh process, and the BLAS route when the kernel is switched off."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.forced_isa import run_on_path
from tests.support.spies import record_calls
from tests.support.x86_loops import fma_loops
from tfrt_py.kernels.lib import gemm_cols, gemm_packed
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import conv_blocked, conv_cols, conv_packed

pytestmark = pytest.mark.skipif(not jit_enabled(), reason=why_off() or "numba kernels off")


@pytest.fixture(autouse=True)
def _no_packed_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about conv_cols' route: the convs it serves where conv_packed's
    route is not there (no indirect kernel, too few filters for a panel) keep it here
    (conv_packed's own tests: tests/kernels/test_conv_packed.py)."""
    monkeypatch.setattr(conv_packed, "plan", lambda *args, **kwargs: None)


_RNG = np.random.default_rng(29)


def _need_kernel() -> None:
    if not gemm_cols.available():
        pytest.skip("no gemm_cols kernel on this host (portable path, or packed gemm off)")


def _call(a: np.ndarray, c: np.ndarray, toff: np.ndarray, k: int, n: int, flags: int,
          bias: np.ndarray, res: np.ndarray, lohi: np.ndarray, ldy: int) -> np.ndarray:  # fmt: skip
    m = a.shape[0]
    y = np.full((m, ldy), 7.0, np.float32)
    fn = gemm_cols.kernel()
    cf = c.ravel()
    fn(a, 0, a.shape[1], cf, 0, c.shape[1], toff, y, 0, ldy, m, k, n, bias, res, 0,
       res.shape[1], lohi, flags, gemm_cols.panel_width())  # fmt: skip
    return y


def _want(a: Any, c: Any, toff: Any, k: int, n: int, flags: int, bias: Any, res: Any,
          lohi: Any) -> np.ndarray:  # fmt: skip
    cf = c.ravel().astype(np.float64)
    ldc = c.shape[1]
    acc = np.zeros((a.shape[0], n))
    for t, off in enumerate(toff):
        rows = np.stack([cf[off + r * ldc : off + r * ldc + n] for r in range(k)])
        acc += a[:, t * k : (t + 1) * k].astype(np.float64) @ rows
    if flags & gemm_cols.FLAG_BIAS:
        acc += bias[:, None]
    if flags & gemm_cols.FLAG_RESIDUAL:
        acc += res[:, :n]
    if flags & gemm_cols.FLAG_RELU:
        acc = np.where(acc < 0, 0, acc)
    if flags & gemm_cols.FLAG_CLIP:
        acc = np.where(acc < lohi[0], lohi[0], np.where(acc > lohi[1], lohi[1], acc))
    return acc


@pytest.mark.parametrize(
    ("m", "k", "n", "taps"),
    [(1, 1, 1, 1), (13, 37, 45, 1), (14, 5, 32, 1), (29, 64, 100, 1), (64, 16, 70, 9),
     (15, 3, 33, 4), (30, 200, 17, 1)],
)  # fmt: skip
@pytest.mark.parametrize("flags", [0, 1, 1 | 4, 1 | 4 | 2, 1 | 8, 4 | 8])
def test_the_kernel_matches_a_float64_product(
    m: int, k: int, n: int, taps: int, flags: int
) -> None:
    _need_kernel()
    ldc = n + 3
    toff = np.array([t * 2 + (t % 3) for t in range(taps)], np.int64)
    rows = k + (int(toff.max()) // ldc) + 2
    a = _RNG.standard_normal((m, taps * k)).astype(np.float32)
    c = _RNG.standard_normal((rows, ldc)).astype(np.float32)
    bias = _RNG.standard_normal(m).astype(np.float32)
    res = _RNG.standard_normal((m, n)).astype(np.float32)
    lohi = np.array([-0.5, 0.75], np.float32)
    y = _call(a, c, toff, k, n, flags, bias, res, lohi, n + 5)
    want = _want(a, c, toff, k, n, flags, bias, res, lohi)
    scale = 1.0 + float(np.abs(want).max())
    np.testing.assert_allclose(y[:, :n], want, rtol=0, atol=2e-5 * scale * np.sqrt(taps * k))
    assert (y[:, n:] == 7.0).all()  # the partial panel's masked stores write nothing past N


@pytest.mark.parametrize("path", ["avx512", "avx2"])
def test_each_build_prefetches_the_rows_ahead(path: str) -> None:
    """Every build's k loop prefetches the panel's row ``PREFETCH_ROWS`` ahead: the rows a
    tile reads are ``ldc`` apart, as many streams as K, which hardware prefetchers miss
    (SqueezeNet's 128x55x55 -> 16 squeeze conv 1.5x faster with them on an AVX-512 Xeon)."""
    import llvmlite.binding as llvm

    from tfrt_py.concurrency.llvm_jit import compile_ir
    from tfrt_py.kernels.lib import gemm_packed

    if path not in gemm_packed.host_paths():
        pytest.skip(f"this host has no {path} path (it has {', '.join(gemm_packed.host_paths())})")
    text = gemm_cols._build({"avx512": gemm_packed.P32, "avx2": gemm_packed.P16}[path])
    compile_ir(text, host_cpu=True, opt=3)  # it builds
    assert "llvm.prefetch" in text
    target = llvm.Target.from_triple(llvm.get_process_triple())
    tm = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    asm = tm.emit_assembly(llvm.parse_assembly(text))
    assert "prefetcht0" in asm


def test_nan_passes_relu_and_clip_and_inf_saturates() -> None:
    _need_kernel()
    a = np.ones((3, 2), np.float32)
    c = np.array([[np.nan, 1.0, -np.inf, 5.0], [0.0, -3.0, 0.0, 0.0]], np.float32)
    z = np.zeros(3, np.float32)
    lohi = np.array([0.0, 6.0], np.float32)
    toff = np.zeros(1, np.int64)
    relu = _call(a, c, toff, 2, 4, gemm_cols.FLAG_RELU, z, np.zeros((3, 4), np.float32), lohi, 4)
    clip = _call(a, c, toff, 2, 4, gemm_cols.FLAG_CLIP, z, np.zeros((3, 4), np.float32), lohi, 4)
    assert np.isnan(relu[:, 0]).all() and np.isnan(clip[:, 0]).all()
    np.testing.assert_array_equal(relu[0, 1:], [0.0, 0.0, 5.0])
    np.testing.assert_array_equal(clip[0, 1:], [0.0, 0.0, 5.0])


def _model(x: np.ndarray, w: np.ndarray, attrs: dict[str, Any], act: str, residual: bool) -> Any:
    inits: dict[str, Any] = {"w": w, "b": _RNG.standard_normal((w.shape[0],)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    last = "c"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
        last = "s"
    if act == "Clip":
        inits["lo"], inits["hi"] = np.float32(-0.5), np.float32(1.5)
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(act, [last], ["y"]))
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    consts = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, "g", inputs, out, consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def check_against_onnxruntime(
    x: np.ndarray, w: np.ndarray, attrs: dict[str, Any], act: str, residual: bool,
    rng: np.random.Generator, threads: int | None = None,
) -> None:  # fmt: skip
    """``_model``'s conv loaded by tfrt_py (sync, ``threads``) answers as onnxruntime does,
    on two calls (the second on the plan and scratch the first made); a residual input of
    the output's shape from ``rng``."""
    m = _model(x, w, attrs, act, residual)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x}
    if residual:
        shape = sess.run(None, {"x": x, "r": np.zeros((1,), np.float32)})[0].shape
        feeds["r"] = rng.standard_normal(shape).astype(np.float32)
    model = tfrt_py.load(m, executor="sync", threads=threads)
    for _ in range(2):
        np.testing.assert_allclose(model.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4,
                                   atol=1e-4)  # fmt: skip


CASES = [
    # (x shape, w shape, Conv attributes, the form conv_cols takes)
    ((1, 16, 20, 20), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}, conv_cols.GRID),
    ((2, 8, 17, 23), (20, 8, 5, 3), {"pads": [2, 0, 1, 2], "dilations": [2, 1]}, conv_cols.GRID),
    ((1, 12, 9, 9), (40, 12, 1, 1), {"pads": [1, 1, 1, 1]}, conv_cols.GRID),
    # pads wider than the kernel's reach: rows' gap widened to keep each output row whole
    ((1, 16, 9, 9), (24, 16, 3, 3), {"pads": [3, 3, 3, 3]}, conv_cols.GRID),
    ((1, 16, 12, 11), (24, 16, 3, 3), {"pads": [0, 3, 2, 0]}, conv_cols.GRID),
    # a 7x7 plane: fewer filters than pixels (blocks of rows), then more (ResNet-18's last
    # stage: blocks of filters where there are threads), stride 1 and stride 2
    ((1, 64, 7, 7), (40, 64, 3, 3), {"pads": [1, 1, 1, 1]}, conv_cols.GRID),
    ((1, 64, 7, 7), (200, 64, 3, 3), {"pads": [1, 1, 1, 1]}, conv_cols.GRID),
    # strided, 16 channels or more: GRID over the input's phases into 28-wide rows, or
    # with no grid to crop (1x1/2: one phase); narrow rows, dilated: IM2COL
    ((1, 16, 57, 56), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, conv_cols.GRID),
    ((1, 32, 14, 14), (40, 32, 1, 1), {"strides": [2, 2]}, conv_cols.GRID),
    ((2, 24, 10, 10), (130, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, conv_cols.IM2COL),
    (
        (1, 16, 16, 16),
        (24, 16, 3, 3),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [2, 2]},
        conv_cols.IM2COL,
    ),
    # 1x1 stride-1 unpadded: the input itself (DIRECT), two images, a partial panel
    # (13x13), more filters than pixels (blocks of filters), long planes
    ((2, 24, 14, 14), (48, 24, 1, 1), {}, conv_cols.DIRECT),
    ((1, 40, 13, 13), (30, 40, 1, 1), {}, conv_cols.DIRECT),
    ((1, 64, 5, 5), (100, 64, 1, 1), {}, conv_cols.DIRECT),
    ((1, 8, 41, 40), (16, 8, 1, 1), {}, conv_cols.DIRECT),
    ((1, 8, 29, 30), (16, 8, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, conv_cols.IM2COL),
    # 3-channel stems and narrow outputs stay on IM2COL
    ((1, 3, 40, 40), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, conv_cols.IM2COL),
    ((1, 24, 20, 20), (32, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, conv_cols.IM2COL),
]


@pytest.mark.parametrize(
    ("side", "k", "pads", "pw", "shift"),
    [(56, 3, (1, 1), 57, 0), (28, 5, (2, 2), 30, 0), (20, 3, (0, 2), 22, 2), (9, 1, (1, 1), 11, 1)],
)  # fmt: skip
def test_grid_rows_share_their_padding(
    side: int, k: int, pads: tuple[int, int], pw: int, shift: int
) -> None:
    """GRID's padded rows are W + max(left, right) wide (a row's right pad is the next
    row's left; wider where pads outreach the kernel, so an output row stays inside its
    grid row): a 56-wide 3x3 "same" conv computes 57 columns a row, not 58. Tap (0, 0)
    reads at the gap less the left pad."""
    _need_kernel()
    pl, pr = pads
    ow = side + pl + pr - (k - 1)
    cp = conv_cols.plan((1, 8, side, side), 16, (k, k), (1, 16, side, ow), (1, 1), (1, pl),
                        (1, 1), 0, np.zeros(8, np.float32), 1)  # fmt: skip
    assert cp is not None and cp.mode == conv_cols.GRID
    assert int(cp.pads[2]) == pw and int(cp.toff[0]) == shift
    assert int(cp.toff[-1]) == (k - 1) * pw + (k - 1) + shift


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "mode"), CASES)
@pytest.mark.parametrize(
    ("act", "residual"), [("Relu", True), ("Clip", False), ("HardSwish", True)]
)
@pytest.mark.compiles
def test_each_form_matches_onnxruntime_on_the_cols_route(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any, attrs: dict[str, Any],
    mode: int, act: str, residual: bool,
) -> None:  # fmt: skip
    _need_kernel()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.2).astype(np.float32)
    check_against_onnxruntime(x, w, attrs, act, residual, _RNG)
    assert plans and plans[-1].route == "cols" and plans[-1].cols.mode == mode


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [((2, 24, 10, 10), (130, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
     ((1, 16, 17, 19), (24, 16, 3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 0]}),
     ((1, 16, 15, 14), (20, 16, 5, 3), {"strides": [3, 2], "pads": [2, 1, 2, 1]}),
     ((1, 16, 23, 23), (24, 16, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
     ((1, 3, 40, 40), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
     ((1, 16, 9, 12), (8, 16, 2, 2), {"strides": [2, 2]}),
     # column stride 2 fills both column phases from one pass over a row (a pair of
     # columns at a time): an odd width whose last column no tap reads, an even left pad,
     # a left pad of two, and row stride 1
     ((1, 16, 15, 15), (8, 16, 2, 2), {"strides": [2, 2]}),
     ((1, 16, 17, 18), (24, 16, 5, 5), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),
     ((1, 16, 14, 15), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 2, 1, 0]}),
     ((1, 16, 11, 16), (24, 16, 3, 3), {"strides": [1, 2], "pads": [1, 1, 1, 1]})],
)  # fmt: skip
def test_any_strided_geometry_over_phases_matches_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any, attrs: dict[str, Any]
) -> None:
    """The phase form on every strided shape it can take (its size gates lowered): odd
    planes, asymmetric pads, unequal strides, a 7x7/2 stem of 3 channels, 2x2/2 (no grid
    to crop), with a residual and ReLU."""
    _need_kernel()
    monkeypatch.setattr(conv_cols, "PHASE_MIN_CHANNELS", 1)
    monkeypatch.setattr(conv_cols, "PHASE_MIN_WIDTH", 1)
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.2).astype(np.float32)
    check_against_onnxruntime(x, w, attrs, "Relu", True, _RNG)
    assert plans and plans[-1].route == "cols" and plans[-1].cols.mode == conv_cols.GRID
    assert tuple(plans[-1].cols.pads[4:]) != (1, 1)


@pytest.mark.parametrize("act", ["Relu", "Clip", "Identity"])
def test_grid_crop_without_bias_keeps_nan_and_finishes_every_row(
    monkeypatch: pytest.MonkeyPatch, act: str
) -> None:
    """GRID's crop (``_crop_grid``) without a bias: the ReLU/Clip of its one pass keeps a
    NaN (a NaN pixel poisons the outputs whose windows hold it), saturates infinities, and
    every output row of every channel is written (the output is pre-filled with a
    sentinel)."""
    _need_kernel()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal((1, 8, 21, 19)).astype(np.float32)
    x[0, 3, 5, 7], x[0, 1, 0, 0], x[0, 2, 20, 18] = np.nan, np.inf, -np.inf
    w = (_RNG.standard_normal((24, 8, 3, 3)) * 0.2).astype(np.float32)
    m = _model(x, w, {"pads": [1, 1, 1, 1]}, act, residual=False)
    m.graph.node[0].input.pop()  # no bias
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    model = tfrt_py.load(m, executor="sync")
    for _ in range(2):
        got = model.run({"x": x}, outputs={"y": np.full(want.shape, 7.0, np.float32)})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.isnan(want).any() and plans[-1].route == "cols"
    assert plans[-1].cols.mode == conv_cols.GRID and plans[-1].epi.act in ("Relu", "Clip", "")


@pytest.mark.parametrize(
    ("n", "m", "oh", "ow", "threads"),
    [(1, 512, 7, 7, 2), (2, 200, 7, 7, 2), (1, 64, 56, 56, 2), (1, 64, 3, 40, 2),
     (1, 5, 2, 2, 4), (3, 64, 7, 7, 1), (1, 512, 7, 7, 3)],
)  # fmt: skip
def test_blocks_cover_every_output_row_and_filter_once(
    n: int, m: int, oh: int, ow: int, threads: int
) -> None:
    """Per image, the blocks tile (output rows x filters) exactly once: rows split where
    there are more pixels than filters, filters (at the kernel's tile rows) where there
    are fewer (or fewer rows than two a thread); one block per image on one thread."""
    blocks = conv_cols._blocks(n, m, oh, ow, threads)
    assert blocks.shape[1] == 5
    q = gemm_cols.tile_rows()
    for i in range(n):
        seen = np.zeros((oh, m), np.int64)
        for _, r0, r1, m0, m1 in blocks[blocks[:, 0] == i]:
            assert r1 > r0 and m1 > m0
            seen[r0:r1, m0:m1] += 1
        assert (seen == 1).all()
        mine = blocks[blocks[:, 0] == i]
        assert len(mine) <= max(1, threads)
        by_filters = threads > 1 and (m > oh * ow or oh < 2 * threads)
        if threads == 1:
            assert len(mine) == 1
        elif by_filters:
            assert (mine[:, 1] == 0).all() and (mine[:, 2] == oh).all()
            if q:
                assert (mine[:-1, 4] % q == 0).all()
        else:
            assert (mine[:, 3] == 0).all() and (mine[:, 4] == m).all()


def test_few_pixels_split_by_filters_on_native_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """512 filters over 7x7 (ResNet-18's last stage) on two threads: conv_cols' blocks of
    filters (before: BLAS's filter blocks after an im2col, or the whole-image product on
    one thread), matching onnxruntime."""
    _need_kernel()
    from tfrt_py.concurrency import native_threads
    from tfrt_py.concurrency import threads as tfrt_threads

    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal((1, 128, 7, 7)).astype(np.float32)
    w = (_RNG.standard_normal((512, 128, 3, 3)) * 0.05).astype(np.float32)
    m = _model(x, w, {"pads": [1, 1, 1, 1]}, "Relu", True)
    r = _RNG.standard_normal((1, 512, 7, 7)).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        model = tfrt_py.load(m, executor="sync", threads=threads)
        for _ in range(2):
            np.testing.assert_allclose(model.run({"x": x, "r": r})["y"],
                                       sess.run(None, {"x": x, "r": r})[0], rtol=1e-4,
                                       atol=1e-4)  # fmt: skip
        cp = plans[-1].cols
        assert plans[-1].route == "cols" and cp is not None and cp.mode == conv_cols.GRID
        pool = tfrt_threads.threads() > 1 and native_threads.max_threads() > 1
        if threads == 2 and native_threads.ready() and pool:
            assert cp.parallel and len(cp.blocks) == 2
            assert (cp.blocks[:, 2] == 7).all() and cp.blocks[0, 4] == cp.blocks[1, 3]


@pytest.mark.parametrize(("side", "cols"), [(7, True), (11, False), (13, True), (14, True)])
def test_few_pixel_convs_take_cols_where_its_columns_pay(
    monkeypatch: pytest.MonkeyPatch, side: int, cols: bool
) -> None:
    """More filters than pixels: conv_cols where the columns its kernel computes (extended
    rows, partial panels) cost less than the pixels at BLAS's share of its speed
    (``conv_blocked._cols_pays``; rows share their padding, ``conv_cols._shared_gap``):
    with 32-column panels (AVX-512) 7x7 (64 columns for 49 pixels), 13x13 (192 for 169)
    and 14x14 (224 for 196) take it, 11x11 (160 for 121) stays on BLAS; with 16-column
    panels 11x11 computes 144 and takes it too. The values match onnxruntime."""
    _need_kernel()
    if gemm_cols.panel_width() == 16:
        cols = True
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal((1, 32, side, side)).astype(np.float32)
    w = (_RNG.standard_normal((256, 32, 3, 3)) * 0.1).astype(np.float32)
    m = _model(x, w, {"pads": [1, 1, 1, 1]}, "Relu", False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = tfrt_py.load(m, executor="sync")
    np.testing.assert_allclose(model.run({"x": x})["y"], sess.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    taken = bool(plans) and plans[-1].route == "cols"
    assert taken == cols


@pytest.mark.compiles
def test_without_the_kernel_the_blas_route_gives_the_same_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _need_kernel()
    x = _RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = (_RNG.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32)
    m = _model(x, w, {"pads": [1, 1, 1, 1]}, "Relu", False)
    on = tfrt_py.load(m, executor="sync").run({"x": x})["y"]
    monkeypatch.setenv("TFRT_PY_PACKED_GEMM", "0")
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    off = tfrt_py.load(m, executor="sync").run({"x": x})["y"]
    assert plans and plans[-1].route != "cols"
    np.testing.assert_allclose(off, on, rtol=1e-4, atol=1e-4)


_AVX2_CHILD = """
import numpy as np
from tfrt_py.kernels.lib import gemm_cols, gemm_packed
assert gemm_packed.path()[0] == "avx2", gemm_packed.path()
assert gemm_cols.available() and gemm_cols.panel_width() == 16
rng = np.random.default_rng(1)
m, k, n, taps = 13, 21, 37, 3
a = rng.standard_normal((m, taps * k)).astype(np.float32)
c = rng.standard_normal((k + 4, n + 7)).astype(np.float32)
toff = np.array([0, 1, n + 8], np.int64)
y = np.full((m, n + 2), 7.0, np.float32)
b = rng.standard_normal(m).astype(np.float32)
gemm_cols.kernel()(a, 0, taps * k, c.ravel(), 0, n + 7, toff, y, 0, n + 2, m, k, n, b, y, 0,
                   n + 2, np.zeros(2, np.float32), 3, 16)
cf = c.ravel().astype(np.float64)
want = sum(a[:, t * k:(t + 1) * k] @ np.stack([cf[o + r * (n + 7):o + r * (n + 7) + n]
           for r in range(k)]) for t, o in enumerate(toff)) + b[:, None]
assert np.allclose(y[:, :n], np.maximum(want, 0), atol=1e-4), abs(y[:, :n] - want).max()
assert (y[:, n:] == 7.0).all()
print("avx2 ok")
"""


def test_the_avx2_tile_in_a_fresh_process() -> None:
    """``TFRT_PY_ISA=avx2`` builds the 6 x 16 tile (two k a step) with the tap loop."""
    run_on_path("avx2", _AVX2_CHILD, "avx2 ok")


_FIRST_PARALLEL_CHILD = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import tfrt_py
from tfrt_py.concurrency import native_threads
from tfrt_py.kernels.nn import conv_blocked

plans = []
run = conv_blocked.run_blocked
conv_blocked.run_blocked = lambda plan, *a, **k: (plans.append(plan), run(plan, *a, **k))[1]
rng = np.random.default_rng(0)
w = (rng.standard_normal((256, 64, 3, 3)) * 0.1).astype(np.float32)
g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 14, 14])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                      [numpy_helper.from_array(w, "w")])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
model = tfrt_py.load(m.SerializeToString(), executor="sync", threads=2)
x = rng.standard_normal((1, 64, 14, 14)).astype(np.float32)
model.run({"x": x})
if not native_threads.ready() or native_threads.max_threads() < 2:
    print("no native threads")
else:
    plan = plans[-1]
    if plan.route == "packed":  # conv_packed's few-pixel route: parts split too
        assert plan.packed is not None and len(plan.packed.parts) >= 2, plan
    else:
        assert plan.route == "cols" and plan.cols is not None and plan.cols.parallel, plan
    print("parallel ok")
"""


def test_a_models_first_parallel_conv_is_planned_on_native_threads() -> None:
    """A fresh process whose first parallel kernel is a cols (or packed) conv: its plan
    splits over the native threads (``max_threads`` read 1 before they were set up, so
    such a conv -- a one-conv model, or the stem of a CNN -- was planned serial and ran on
    one core)."""
    _need_kernel()
    env = {**os.environ, "TFRT_PY_COLD_START": "0"}
    env.pop("TFRT_PY_THREADS", None)
    done = subprocess.run([sys.executable, "-c", _FIRST_PARALLEL_CHILD], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if "no native threads" in done.stdout:
        pytest.skip("no native threads (numba's TBB layer) in a fresh process here")
    assert "parallel ok" in done.stdout


_SWITCHED_OFF_FIRST_CHILD = """
import os
import numpy as np
os.environ["TFRT_PY_PACKED_GEMM"] = "0"
from tfrt_py.kernels.nn import conv_cols
args = ((1, 16, 20, 20), 32, (3, 3), (1, 32, 20, 20), (1, 1), (1, 1), (1, 1), 0,
        np.zeros(35, np.float32))
assert conv_cols.plan(*args, 1) is None
del os.environ["TFRT_PY_PACKED_GEMM"]
assert conv_cols.plan(*args, 1) is not None
print("back on")
"""


def test_planning_while_switched_off_leaves_the_kernels_for_later() -> None:
    """``$TFRT_PY_PACKED_GEMM=0`` is read on each call: a plan made while it is set takes
    BLAS, and once it is unset the next plan takes the kernel again (planning compiled
    the kernels first, whose set-up then failed for the rest of the process)."""
    _need_kernel()
    env = {**os.environ, "TFRT_PY_COLD_START": "0"}
    done = subprocess.run([sys.executable, "-c", _SWITCHED_OFF_FIRST_CHILD], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "back on" in done.stdout, done.stderr[-3000:]


_COMPILES_CHILD = """
import numpy as np
from numba.core import event
import tfrt_py
from tfrt_py.kernels.nn import conv_blocked, conv_cols
from tfrt_py.kernels.nn.conv_direct import Epilogue

seen = []
class Compiles(event.Listener):
    def on_start(self, ev):
        pass
    def on_end(self, ev):
        d = ev.data["dispatcher"]
        seen.append((d.py_func.__name__, str(ev.data["args"])))
event.register("numba:compile", Compiles())

rng = np.random.default_rng(0)
x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
# 24 filters, a part of a panel: conv_cols' conv, not conv_packed's
w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
w.flags.writeable = False  # as a model's initializer
b = rng.standard_normal(24).astype(np.float32)
b.flags.writeable = False
plan = conv_blocked.plan_blocked(x.shape, w.shape, (1, 24, 20, 20), (1, 1), (1, 1), (1, 1),
                                 np.dtype(np.float32), Epilogue())
assert plan is not None and plan.route == "cols", plan.route
taps = conv_cols.taps_first(w)
y = conv_blocked.run_blocked(plan, x, w.reshape(1, 24, -1), b, None, None, w_taps=taps)
y = conv_blocked.run_blocked(plan, x, w.reshape(1, 24, -1), b, None, None, w_taps=taps)
names = [n for n, _ in seen]
print("compiled", names)
assert "_blocked_par" not in names, names  # the BLAS route's kernel: not this conv's
assert not any("float64" in a for _, a in seen), seen  # nothing for another dtype
cols = [a for n, a in seen if n == "_cols_par"]
assert len(cols) == 1, cols  # warmed with the signature the call then uses
from tfrt_py.kernels.nn import conv_im2col, conv_direct, conv_depthwise, conv_depthwise_same
from tfrt_py.kernels.lib import gelu_jit, sigmoid_jit
# the serial im2col and epilogue of the BLAS routes: not this conv's
assert conv_im2col.IM2COL._compiled is None and conv_blocked._EPILOGUE_COLS._compiled is None

# a split 3x3 depthwise conv runs its parallel kernel: neither its serial form nor the
# generic depthwise kernel, nor the Sigmoid/GELU passes it has no use for, compile
xd = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
wd = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
wd.flags.writeable = False
bd = np.zeros(64, np.float32)
bd.flags.writeable = False
dplan = conv_depthwise.plan_depthwise(xd.shape, wd.shape, (1, 64, 28, 28), (1, 1),
                                      (1, 1, 1, 1), (1, 1), Epilogue(act="Relu"),
                                      np.dtype(np.float32))
assert dplan is not None and dplan.par is not None and dplan.split
yd = conv_depthwise.run_depthwise(dplan, xd, wd, bd, np.empty((1, 64, 28, 28), np.float32),
                                  None, Epilogue(act="Relu"))
xp = np.pad(xd, ((0, 0), (0, 0), (1, 1), (1, 1)))
want = sum(xp[:, :, i:i + 28, j:j + 28] * wd[None, :, 0, i, j, None, None]
           for i in range(3) for j in range(3))
assert np.allclose(yd, np.maximum(want, 0), atol=1e-4)
from tfrt_py.kernels.lib import depthwise_ir
from tfrt_py.kernels.nn import conv_depthwise_grid
same, same_par = conv_depthwise_same.kernels(3)
if depthwise_ir.function() is not None:  # the grid module's kernel first, where it is built
    assert same_par._compiled is None
    same, same_par = conv_depthwise_grid.GRID, conv_depthwise_grid.GRID_PAR
assert same_par._compiled is not None and same._compiled is None
assert conv_direct._DEPTHWISE._compiled is None
assert sigmoid_jit._SIGMOID._compiled is None
assert gelu_jit._GELU._compiled is None and gelu_jit._GELU_INPLACE._compiled is None
# the serial form still runs when asked (compiled on its first call)
dplan.fn(xd, wd, bd, np.zeros((0, 0, 0, 0), np.float32), yd, dplan.tab, dplan.act,
         dplan.params, np.zeros(dplan.xp_len, np.float32), np.zeros(0, np.float32), 0, 1, 0, 64)
assert np.allclose(yd, np.maximum(want, 0), atol=1e-4)
assert same._compiled is not None
print("compiles ok")
"""


@pytest.mark.slow  # ~40 s: every kernel of the conv compiled from nothing
def test_a_conv_compiles_only_what_it_runs(tmp_path: Any) -> None:
    """A fresh numba cache (a new machine, a new container): planning and running a 3x3
    conv on the "cols" route compiles its kernel once, for the signature it calls (read-only
    weights, as a model's), and neither the BLAS routes' kernels nor a float64 variant; a
    split depthwise conv compiles its parallel kernel and not its serial form (until it is
    called), the generic kernel or unused activations (ResNet-18's first process compiled
    for 188 s before, 61 s after)."""
    _need_kernel()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {**os.environ, "TFRT_PY_COLD_START": "0", "NUMBA_CACHE_DIR": str(cache),
           "TFRT_PY_CACHE_DIR": str(cache)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _COMPILES_CHILD], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0 and "compiles ok" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-3000:]
    )


_EVERY_ROWS_LEFT_CHILD = """
import numpy as np
from tfrt_py.kernels.lib import gemm_cols
assert gemm_cols.available()
nr, mr = gemm_cols.panel_width(), gemm_cols.tile_rows()
rng = np.random.default_rng(3)
k = 11
for m in range(1, 2 * mr + 2):
    for n in (nr // 2 - 3, nr + nr // 2 + 3, 2 * nr):
        a = rng.standard_normal((m, k)).astype(np.float32)
        c = rng.standard_normal((k, n + 5)).astype(np.float32)
        y = np.full((m + 3, n + 2), 7.0, np.float32)  # three rows past M: never written
        b = rng.standard_normal(m + 3).astype(np.float32)
        gemm_cols.kernel()(a, 0, k, c.ravel(), 0, n + 5, np.zeros(1, np.int64), y, 0, n + 2, m,
                           k, n, b, y, 0, n + 2, np.zeros(2, np.float32), 1, nr)
        want = a.astype(np.float64) @ c[:, :n] + b[:m, None]
        assert np.allclose(y[:m, :n], want, atol=1e-4), (m, n, abs(y[:m, :n] - want).max())
        assert (y[:m, n:] == 7.0).all() and (y[m:] == 7.0).all(), (m, n)
print("rows ok")
"""


@pytest.mark.parametrize("path", ["avx512", "avx2"])
def test_every_count_of_rows_left_after_the_whole_tiles(path: str) -> None:
    """Every M from 1 to two tiles and one (the rows left run as tiles of their binary
    digits, ``SPLIT_LEFT``), in whole panels, a half-width and a wide partial panel, on
    each path the host has: every row right, nothing written past M or N."""
    run_on_path(path, _EVERY_ROWS_LEFT_CHILD, "rows ok")


def test_the_avx2_tiles_k_loop_keeps_its_accumulators_in_registers() -> None:
    """The 6 x 16 tile's build for a CPU with sixteen ymm registers (Zen 3: AVX2, no
    AVX-512): every k loop -- the whole tiles' (six broadcasts and twelve multiply-adds a
    step) and the rows left's (``gemm_cols.LEFT_PANELS_16``) -- holds its accumulators in
    registers. Two k steps an iteration spilled them all (36 stack moves a step; a 1x1
    conv ran at half onnxruntime's speed there), and 2 rows x 3 panels spilled 8; an
    AVX-512 host, with 32 registers, never showed it."""
    loops = fma_loops(gemm_cols._build(gemm_packed.P16))
    assert len(loops) > 10 and all(fmas <= 12 for fmas, _ in loops), loops  # a k step a pass
    assert max(moves for _, moves in loops) <= 1, loops
