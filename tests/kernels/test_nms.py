"""NonMaxSuppression against onnxruntime on detector-shaped inputs, with the compiled grid
kernel (``kernels/image/nms_jit.py``) and the NumPy paths (``jit``; ``nms_numpy``), and the
kernel and the pair path against the NumPy sweep on adversarial geometry (wide boxes among
small ones, boxes of no area, ties, far-apart clusters, cells finer than the boxes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.jit_paths import compiled_only, spy_compiled
from tfrt_py.kernels.image import nms_jit, nms_numpy, vision

_I64 = np.int64


def _model(center: int) -> Any:
    ins = [("boxes", TensorProto.FLOAT), ("scores", TensorProto.FLOAT),
           ("max_out", TensorProto.INT64), ("iou", TensorProto.FLOAT),
           ("score_thr", TensorProto.FLOAT)]  # fmt: skip
    node = helper.make_node("NonMaxSuppression", [n for n, _ in ins], ["sel"],
                            center_point_box=center)  # fmt: skip
    g = helper.make_graph(
        [node], "nms", [helper.make_tensor_value_info(n, t, None) for n, t in ins],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])


def _feeds(
    boxes: np.ndarray, scores: np.ndarray, max_out: int, iou: float, score_thr: float
) -> dict[str, np.ndarray]:
    f32 = np.float32
    return {"boxes": boxes, "scores": scores, "max_out": np.array([max_out], _I64),
            "iou": np.array([iou], f32), "score_thr": np.array([score_thr], f32)}  # fmt: skip


def _batched(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's batched NMS: 40 classes of 200 random boxes in a 320 square, each class
    offset into its own square; one score row."""
    n, classes = 200, 40
    xy = rng.uniform(0, 300, (classes * n, 2))
    wh = rng.uniform(2, 90, (classes * n, 2))
    boxes = np.concatenate([xy, np.minimum(xy + wh, 320)], axis=1)
    boxes += (np.repeat(np.arange(classes), n) * 321.0)[:, None]
    return boxes[None].astype(np.float32), rng.random((1, 1, classes * n), dtype=np.float32)


def _clusters(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two images, three classes, 600 boxes around eight centers, corners flipped at random,
    a tenth of them of no width, scores with ties."""
    centers = rng.uniform(0, 1000, (8, 2))[rng.integers(0, 8, (2, 600))]
    half = rng.uniform(1, 60, (2, 600, 2))
    half[:, ::10, 1] = 0.0
    c = centers + rng.normal(0, 15, centers.shape)
    boxes = np.concatenate([c - half, c + half], axis=2)[..., [1, 0, 3, 2]]
    flip = rng.random((2, 600)) < 0.3
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    scores = np.round(rng.random((2, 3, 600)), 1)
    return boxes.astype(np.float32), scores.astype(np.float32)


def _centers(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """center_point_box=1: (cx, cy, w, h), a few boxes covering everything."""
    b = np.concatenate([rng.uniform(0, 500, (1, 800, 2)), rng.uniform(1, 40, (1, 800, 2))], 2)
    b[0, :5, 2:] = 2000.0
    return b.astype(np.float32), rng.random((1, 2, 800), dtype=np.float32)


@pytest.mark.parametrize(
    ("make", "center", "max_out", "iou", "score_thr"),
    [
        (_batched, 0, 2**62, 0.55, -1.0),
        (_batched, 0, 100, 0.3, 0.5),
        (_clusters, 0, 50, 0.5, 0.15),
        (_clusters, 0, 10**6, 0.0, -1.0),
        (_clusters, 0, 10**6, 1.0, -1.0),
        (_centers, 1, 300, 0.45, 0.05),
    ],
)
def test_nms_matches_onnxruntime(
    jit: str, monkeypatch: pytest.MonkeyPatch, make: Any, center: int, max_out: int,
    iou: float, score_thr: float,
) -> None:  # fmt: skip
    ran = spy_compiled(monkeypatch, vision, "nms_greedy")
    paired = _spy_pairs(monkeypatch)
    boxes, scores = make(np.random.default_rng(3))
    feeds = _feeds(boxes, scores, max_out, iou, score_thr)
    m = _model(center)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    got = tfrt_py.load(m, executor="sync").run(feeds)["sel"]
    np.testing.assert_array_equal(got, want)
    assert len(want) > 10
    assert bool(ran) == (jit == "jit"), "the grid kernel runs exactly when numba may"
    if jit != "jit" and make is _batched:
        assert paired, "the NumPy path found the suppressing pairs (not the sweep)"


def _spy_pairs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records each call of the pair path that took the boxes (did not decline)."""
    took: list[bool] = []
    real = nms_numpy.greedy_pairs

    def spy(*args: Any) -> Any:
        got = real(*args)
        if got is not None:
            took.append(True)
        return got

    monkeypatch.setattr(vision, "greedy_pairs", spy)
    return took


def test_nms_falls_back_on_boxes_that_are_not_finite(
    jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN or an infinite corner has no grid cell: that image takes the NumPy loop."""
    ran = spy_compiled(monkeypatch, vision, "nms_greedy")
    boxes, scores = _clusters(np.random.default_rng(5))
    boxes[0, 3, 1], boxes[1, 7, 2] = np.nan, np.inf
    feeds = _feeds(boxes, scores, 40, 0.5, 0.0)
    got = tfrt_py.load(_model(0), executor="sync").run(feeds)["sel"]
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    np.testing.assert_array_equal(got, tfrt_py.load(_model(0), executor="sync").run(feeds)["sel"])
    assert not ran


def _corners(b: np.ndarray) -> tuple[np.ndarray, ...]:
    x0, x1 = np.minimum(b[:, 0], b[:, 2]), np.maximum(b[:, 0], b[:, 2])
    y0, y1 = np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 1], b[:, 3])
    return x0, y0, x1, y1, (x1 - x0) * (y1 - y0)


def _greedy_both(b: np.ndarray, thr: float, max_out: int, cell: float) -> tuple[Any, Any]:
    x0, y0, x1, y1, area = _corners(b)
    want = nms_numpy.greedy_sweep((x0, y0, x1, y1, area), thr, max_out)
    keep = np.empty(len(b), _I64)
    fn = nms_jit.nms_greedy()
    n = fn(x0, y0, x1, y1, area, thr, min(max_out, len(b)), cell, cell * 1.3,
           float(x0.min()), float(y0.min()), keep)  # fmt: skip
    return keep[:n].tolist(), want


def _adversarial(seed: int) -> np.ndarray:
    """Small boxes, big ones, huge ones (1e7 times wider), boxes of no area, duplicates and
    two clusters 1e6 apart, in score order."""
    rng = np.random.default_rng(seed)
    xy = np.concatenate([rng.uniform(0, 200, (300, 2)), rng.uniform(1e6, 1e6 + 50, (100, 2))])
    wh = rng.uniform(0, 30, (400, 2))
    wh[::9] *= 20.0
    wh[::13, 0] = 0.0
    wh[::37] *= 1e7  # too big for the coarsest grid level: the wide list
    b = np.concatenate([xy, xy + wh], axis=1)
    b[350:360] = b[340]
    return b


@compiled_only
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cell", [0.5, 7.0, 1e4])
def test_grid_kernel_is_the_greedy_rule(seed: int, cell: float) -> None:
    """Adversarial boxes (on coarser grid levels, too big for every level: the wide list) at
    cells much finer than, like and coarser than the boxes."""
    b = _adversarial(seed)
    for thr in (0.0, 0.3, 0.7):
        got, want = _greedy_both(b, thr, 10**9, cell)
        assert got == want
    got, want = _greedy_both(b, 0.3, 25, cell)
    assert got == want and len(got) == 25


@pytest.mark.parametrize("seed", range(6))
def test_pair_path_is_the_greedy_rule(seed: int) -> None:
    """The pair path keeps what the sweep keeps: adversarial boxes (long windows, visited a
    row each, beside short ones, visited a column at a time), every threshold edge, a cap."""
    boxes = _corners(_adversarial(seed))
    for thr, max_out in ((0.0, 10**9), (0.3, 10**9), (0.7, 10**9), (1.0, 10**9), (0.3, 40)):
        got = nms_numpy.greedy_pairs(boxes, thr, max_out)
        assert got == nms_numpy.greedy_sweep(boxes, thr, max_out)
        assert len(got) > 1


def test_pair_path_declines_past_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of more pairs than ``PAIR_BUDGET``, or than a small ``max_out``'s sweep reads,
    are the sweep's: the pair path answers None (and the kernel still answers right)."""
    boxes = _corners(_adversarial(0))
    assert nms_numpy.greedy_pairs(boxes, 0.3, 10**9) is not None
    assert nms_numpy.greedy_pairs(boxes, 0.3, 20) is None  # 400 boxes, ~13,000 pairs
    monkeypatch.setattr(nms_numpy, "PAIR_BUDGET", 100)
    assert nms_numpy.greedy_pairs(boxes, 0.3, 10**9) is None
