"""benchmarks/detection.py's check that tfrt_py's detections are onnxruntime's (issue 35,
item 4): outputs found by shape and dtype in any order, near-equal scores ranked either way,
a real difference reported (no torch here: the exports are the benchmark's own)."""

from __future__ import annotations

import numpy as np

from benchmarks import detection


def _dets(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 250, (n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + 60], axis=1)
    scores = np.sort(rng.uniform(0.03, 0.04, n).astype(np.float32))[::-1].copy()
    labels = rng.integers(1, 91, n)
    return boxes, scores, labels


def test_the_same_detections_in_another_order_and_output_layout_pass() -> None:
    boxes, scores, labels = _dets(300, 1)
    want = [boxes, labels, scores]  # Faster R-CNN's order
    perm = np.arange(300)
    perm[[10, 11]] = perm[[11, 10]]  # two scores within rounding, ranked the other way
    got = [boxes[perm] + 1e-4, scores[perm], labels[perm]]  # RetinaNet's order
    assert detection._check(got, want) == ""


def test_other_detections_fail() -> None:
    boxes, scores, labels = _dets(300, 1)
    want = [boxes, scores, labels]
    moved = boxes.copy()
    moved[:20] += 50.0
    assert "differ" in detection._check([moved, scores, labels], want)
    relabeled = labels.copy()
    relabeled[:20] = 0
    assert "differ" in detection._check([boxes, scores, relabeled], want)
    assert "detections against" in detection._check([boxes[:299], scores[:299], labels[:299]],
                                                     want)  # fmt: skip
    assert "scores differ" in detection._check([boxes, scores + 0.01, labels], want)
