"""One-group float32 convs as pixel rows times the packed filters (kernels/nn/conv_packed.py,
the product ``gemm_indirect``'s): the route taken on native threads where it serves, each
epilogue, strides, dilations, asymmetric pads, several images, filters not a whole
panel, large planes, against onnxruntime, on the process's path and on AVX2's (rows
put back by ``_finish``); the routes it leaves to others."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.kernels.test_conv_cols import _model, check_against_onnxruntime
from tests.support.forced_isa import run_on_path
from tests.support.spies import record_calls
from tfrt_py.concurrency import native_threads
from tfrt_py.concurrency import threads as tfrt_threads
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import conv_blocked, conv_packed

pytestmark = pytest.mark.skipif(not jit_enabled(), reason=why_off() or "numba kernels off")

_RNG = np.random.default_rng(41)


def _need_route() -> None:
    if not gemm_packed.available():
        pytest.skip("no packed gemm kernel on this host (portable path, or packed gemm off)")
    if not (native_threads.ready() and native_threads.max_threads() > 1):
        pytest.skip("native threads are not there: the route needs them")
    if tfrt_threads.threads() < 2:
        pytest.skip("one intra-op thread: the route splits over two or more")


CASES = [
    # (x shape, w shape, Conv attributes): ResNet-18's last stage, SqueezeNet's 13x13
    # fire module with filters not a whole panel, a strided conv with asymmetric pads,
    # dilation, several images, a 5x3 kernel
    ((1, 256, 7, 7), (512, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 64, 13, 13), (200, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 64, 27, 27), (96, 64, 3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    ((3, 32, 12, 12), (70, 32, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((2, 40, 11, 9), (64, 40, 5, 3), {"pads": [2, 1, 2, 1]}),
    # past FEW_PIXELS with whole panels of filters: an odd plane of two images, a stem-like
    # 7x7/2 of 3 channels
    ((2, 16, 17, 19), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 40, 40), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    # 1x1 convs over few pixels whose filters fill their panels (pointwise_pays), stride 1
    # and 2
    ((1, 256, 7, 7), (512, 256, 1, 1), {}),
    ((2, 128, 14, 13), (160, 128, 1, 1), {"strides": [2, 2]}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CASES)
@pytest.mark.parametrize(
    ("act", "residual"), [("Relu", True), ("Clip", False), ("HardSwish", True)]
)
def test_few_pixel_convs_match_onnxruntime_on_the_packed_route(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any, attrs: dict[str, Any],
    act: str, residual: bool,
) -> None:  # fmt: skip
    _need_route()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.1).astype(np.float32)
    check_against_onnxruntime(x, w, attrs, act, residual, _RNG, threads=2)
    plan = plans[-1]
    assert plan.route == "packed" and plan.packed is not None
    assert len(plan.packed.parts) >= 2  # split over the threads
    # a tap is a filter row (KW*C floats in a run) where the columns are undilated
    kh, kw = w_shape[2], w_shape[3]
    dilated = attrs.get("dilations", [1, 1])[1] != 1
    assert len(plan.packed.toff) == (kh * kw if dilated else kh)


def test_nan_passes_relu_and_every_output_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN input reaches the outputs whose windows read it (ReLU keeps NaN, as
    onnxruntime's); a scratch left full of NaN by an earlier call on the same thread
    leaks into no other output (the padding is written on every call)."""
    _need_route()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal((1, 64, 7, 7)).astype(np.float32)
    w = (_RNG.standard_normal((128, 64, 3, 3)) * 0.1).astype(np.float32)
    m = _model(x, w, {"pads": [1, 1, 1, 1]}, "Relu", False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = tfrt_py.load(m, executor="sync", threads=2)
    bad = x.copy()
    bad[0, 5, 3, 3] = np.nan
    got = model.run({"x": bad})["y"]
    want = sess.run(None, {"x": bad})[0]
    assert np.isnan(got).sum() == np.isnan(want).sum() == 128 * 9
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(model.run({"x": x})["y"], sess.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    assert plans[-1].route == "packed"


@pytest.mark.parametrize(
    ("x_shape", "w_shape"),
    [((1, 16, 56, 56), (40, 16, 3, 3)),  # many pixels, filters a part of their panels
     ((1, 3, 12, 12), (64, 3, 3, 3)),  # K under MIN_K: a stem
     ((1, 256, 7, 7), (40, 256, 1, 1)),  # 1x1, filters fill less of their panels than pixels
     ((1, 64, 20, 20), (64, 64, 1, 1))],  # 1x1 over many pixels: the input read as it is
)  # fmt: skip
def test_other_convs_keep_their_routes(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any
) -> None:
    _need_route()
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.1).astype(np.float32)
    pads = [1, 1, 1, 1] if w_shape[2] == 3 else [0, 0, 0, 0]
    m = _model(x, w, {"pads": pads}, "Relu", False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = tfrt_py.load(m, executor="sync", threads=2)
    np.testing.assert_allclose(model.run({"x": x})["y"], sess.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    assert plans and plans[-1].route != "packed"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_runs_in_chunks(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """A batch whose rows times K pass ``CHUNK_TAP_FLOATS`` runs in chunks (here two
    images, and one left over), each chunk's images answered as onnxruntime answers (a
    residual read and written per chunk)."""
    if not gemm_packed.available():
        pytest.skip("no packed gemm kernel on this host (portable path, or packed gemm off)")
    if not native_threads.ready():
        pytest.skip("numba's threads are not there: the route needs them")
    x_shape, w_shape = (5, 64, 7, 7), (96, 64, 3, 3)
    per_image = 49 * 64 * 9
    monkeypatch.setattr(conv_packed, "CHUNK_TAP_FLOATS", 2 * per_image + 1)
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.1).astype(np.float32)
    check_against_onnxruntime(x, w, {"pads": [1, 1, 1, 1]}, "Relu", True, _RNG, threads=threads)
    pp = plans[-1].packed
    assert plans[-1].route == "packed" and pp is not None
    assert pp.xt_shape[0] == 2 and pp.last is not None and pp.last.xt_shape[0] == 1


def test_the_plan_refuses_what_it_does_not_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    if not gemm_packed.available():
        pytest.skip("no packed gemm kernel on this host (portable path, or packed gemm off)")
    if not native_threads.ready():
        pytest.skip("numba's threads are not there: the route needs them")
    p = np.zeros(35, np.float32)
    args = ((1, 1), (1, 1), (1, 1), 1, p, 2)
    assert conv_packed.plan((1, 64, 7, 7), 64, (3, 3), (1, 64, 7, 7), *args) is not None
    assert conv_packed.plan((1, 64, 7, 7), 40, (3, 3), (1, 40, 7, 7), *args) is not None
    # past FEW_PIXELS: whole panels of filters only
    assert conv_packed.plan((1, 64, 40, 40), 64, (3, 3), (1, 64, 40, 40), *args) is not None
    assert conv_packed.plan((1, 64, 40, 40), 40, (3, 3), (1, 40, 40, 40), *args) is None
    assert conv_packed.plan((1, 4, 7, 7), 64, (3, 3), (1, 64, 7, 7), *args) is None
    # one image's padded input past MAX_IMAGE_FLOATS (42 * 42 * 64 floats here)
    monkeypatch.setattr(conv_packed, "MAX_IMAGE_FLOATS", 42 * 42 * 64 - 1)
    assert conv_packed.plan((1, 64, 40, 40), 64, (3, 3), (1, 64, 40, 40), *args) is None
    # a batch whose taps are few but whose inputs are big runs in chunks whose padded
    # inputs stay under it (a 3x3/8 conv: 25 pixels an image read from 42 x 42)
    monkeypatch.setattr(conv_packed, "MAX_IMAGE_FLOATS", 3 * 42 * 42 * 64)
    strided = ((8, 8), (1, 1), (1, 1), 1, p, 2)
    pp = conv_packed.plan((16, 64, 40, 40), 64, (3, 3), (16, 64, 5, 5), *strided)
    assert pp is not None and pp.xt_shape[0] == 3 and pp.last is not None
    neg = ((1, 1), (-1, 0), (1, 1), 1, p, 2)
    assert conv_packed.plan((1, 64, 7, 7), 64, (3, 3), (1, 64, 5, 6), *neg) is None


def test_a_model_call_compiles_no_second_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up compiles the signature a model's call uses (read-only packed filters
    and bias): a first call compiles nothing more."""
    _need_route()
    kernel = conv_packed.PACKED_CONV.get()
    x = _RNG.standard_normal((1, 64, 7, 7)).astype(np.float32)
    w = (_RNG.standard_normal((96, 64, 3, 3)) * 0.1).astype(np.float32)
    model = tfrt_py.load(_model(x, w, {"pads": [1, 1, 1, 1]}, "Relu", False), executor="sync",
                         threads=2)  # fmt: skip
    before = len(kernel.signatures)
    model.run({"x": x})
    assert len(kernel.signatures) == before


def test_one_thread_takes_the_route_in_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model loaded with one thread: the same route, one part, the same answers."""
    if not gemm_packed.available():
        pytest.skip("no packed gemm kernel on this host (portable path, or packed gemm off)")
    if not native_threads.ready():
        pytest.skip("numba's threads are not there: the route needs them")
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal((1, 128, 14, 14)).astype(np.float32)
    w = (_RNG.standard_normal((256, 128, 3, 3)) * 0.1).astype(np.float32)
    m = _model(x, w, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "Relu", True)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    r = _RNG.standard_normal((1, 256, 7, 7)).astype(np.float32)
    model = tfrt_py.load(m, executor="sync", threads=1)
    feeds = {"x": x, "r": r}
    np.testing.assert_allclose(model.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    plan = plans[-1]
    assert plan.route == "packed" and plan.packed is not None and len(plan.packed.parts) == 1


_AVX2_CHILD = """
import numpy as np
from tests.kernels.test_conv_cols import check_against_onnxruntime
from tfrt_py.kernels.lib import gemm_indirect, gemm_packed
from tfrt_py.kernels.nn import conv_blocked

assert gemm_packed.path()[0] == "avx2", gemm_packed.path()
assert gemm_indirect.available() and not gemm_indirect.nchw_stores()
plans = []
run = conv_blocked.run_blocked
conv_blocked.run_blocked = lambda plan, *a, **k: (plans.append(plan), run(plan, *a, **k))[1]
rng = np.random.default_rng(5)
for x_shape, w_shape, act in [((2, 24, 9, 11), (40, 24, 3, 3), "HardSwish"),
                              ((1, 16, 20, 20), (48, 16, 3, 3), "Relu")]:
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) * 0.1).astype(np.float32)
    check_against_onnxruntime(x, w, {"pads": [1, 1, 1, 1]}, act, True, rng, threads=1)
    assert plans[-1].route == "packed" and plans[-1].packed.nchw == 0, plans[-1]
print("avx2 rows ok")
"""


def test_the_avx2_path_puts_rows_back_in_a_fresh_process() -> None:
    """``TFRT_PY_ISA=avx2``: the 6 x 16 kernel stores rows and ``_finish`` puts them back
    (bias, residual, the activation), across images and filters past a panel."""
    if not native_threads.ready():
        pytest.skip("numba's threads are not there: the route needs them")
    run_on_path("avx2", _AVX2_CHILD, "avx2 rows ok")


def test_pointwise_pays_where_filters_fill_more_of_their_panels() -> None:
    """A 1x1 conv takes the route over few pixels where its filters fill more of the
    kernel's panels than its pixels would fill ``conv_cols``' (49 pixels: 49 of 64), and
    only with ``POINTWISE_PANELS`` panels of filters or more."""
    shape = gemm_packed.tile()
    if shape is None:
        pytest.skip("no packed gemm kernel on this host (portable path, or packed gemm off)")
    nr = shape.nr
    most = conv_packed.POINTWISE_PANELS * nr
    assert conv_packed.pointwise_pays(most, 49)
    assert not conv_packed.pointwise_pays(most - nr, 49)  # too few panels of filters
    assert not conv_packed.pointwise_pays(most + 8, 4 * nr)  # the pixels fill whole panels
    assert not conv_packed.pointwise_pays(most, conv_packed.POINTWISE_PIXELS + 1)
