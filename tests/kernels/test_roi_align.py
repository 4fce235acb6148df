"""RoiAlign against onnxruntime with the compiled kernel (``kernels/image/roi_align_jit.py``)
and the NumPy path (``jit``): a Faster R-CNN's shapes (150 ROIs over 256x10x10, 7x7 bins,
2x2 samples), adaptive grids, both coordinate modes, ROIs partly or wholly outside the map,
degenerate ROIs, a batch of two maps; and where the compiled kernel must not run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.jit_paths import spy_compiled
from tfrt_py.concurrency import native_threads
from tfrt_py.kernels.image import vision

_RNG = np.random.default_rng(21)


def _model(opset: int, **attrs: Any) -> Any:
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], **attrs)
    g = helper.make_graph(
        [node], "roi", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                        helper.make_tensor_value_info("rois", TensorProto.FLOAT, None),
                        helper.make_tensor_value_info("idx", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _rois(n: int, side: float, spill: float = 0.0) -> np.ndarray:
    """``n`` ROIs (x0, y0, x1, y1) in a ``side`` square, ``spill`` of it beyond its edges;
    a few of no extent."""
    lo = _RNG.uniform(-spill * side, side, (n, 2))
    ext = _RNG.uniform(0, side * (1 + spill), (n, 2))
    ext[::17] = 0.0
    return np.concatenate([lo, lo + ext], axis=1).astype(np.float32)


CASES = [  # (map shape, ROIs, opset, attrs)
    ((1, 256, 10, 10), _rois(150, 320, 0.1), 16,
     dict(output_height=7, output_width=7, sampling_ratio=2, spatial_scale=1 / 32)),
    ((2, 16, 25, 19), _rois(40, 100, 0.3), 16,
     dict(output_height=5, output_width=3, sampling_ratio=0, spatial_scale=0.25)),
    ((2, 8, 12, 12), _rois(30, 12, 0.5), 10,
     dict(output_height=2, output_width=4, sampling_ratio=3, spatial_scale=1.0)),
    ((1, 24, 6, 7), _rois(20, 7, 0.2), 16,
     dict(output_height=3, output_width=3, sampling_ratio=0, spatial_scale=1.0,
          coordinate_transformation_mode="output_half_pixel")),
]  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "rois", "opset", "attrs"), CASES)
def test_roi_align_avg_matches_onnxruntime(
    jit: str, monkeypatch: pytest.MonkeyPatch, shape: Any, rois: np.ndarray, opset: int,
    attrs: dict[str, Any], threads: int,
) -> None:  # fmt: skip
    """One thread: the serial kernel; two: the ROIs in parts on native threads (where they
    are ready; else the serial kernel)."""
    serial = spy_compiled(monkeypatch, vision, "roi_align_avg")
    split = spy_compiled(monkeypatch, vision, "roi_align_par")
    x = _RNG.standard_normal(shape).astype(np.float32)
    idx = _RNG.integers(0, shape[0], len(rois)).astype(np.int64)
    m = _model(opset, **attrs)
    feeds = {"x": x, "rois": rois, "idx": idx}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    got = tfrt_py.load(m, executor="sync", threads=threads).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert bool(serial or split) == (jit == "jit"), "a compiled kernel runs when numba may"
    if jit == "jit" and threads == 2 and native_threads.ready():
        assert split and not serial


@pytest.mark.parametrize("case", ["nan", "batch", "big map"])
def test_roi_align_keeps_the_numpy_path_where_the_kernel_cannot_run(
    jit: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A ROI with a NaN corner and a batch index out of range (the NumPy path's answer or
    error, as before), and a big map with one small ROI (its channels-last copy would cost
    more than the sampling)."""
    ran = spy_compiled(monkeypatch, vision, "roi_align_avg")
    ran_split = spy_compiled(monkeypatch, vision, "roi_align_par")
    m = _model(16, output_height=2, output_width=2, sampling_ratio=2)
    x = _RNG.standard_normal((1, 4, 64 if case == "big map" else 8, 64)).astype(np.float32)
    rois = np.array([[1, 1, 5, 6], [0, 2, 3, 3]], np.float32)
    idx = np.zeros(2, np.int64)
    if case == "nan":
        rois[1, 2] = np.nan
    if case == "batch":
        idx[1] = 3
    model = tfrt_py.load(m, executor="sync")
    try:
        model.run({"x": x, "rois": rois, "idx": idx})
    except tfrt_py.errors.TfrtError:
        assert case != "big map"
    assert not ran and not ran_split
