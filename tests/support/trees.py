"""Random tree-ensemble attributes for hand-built TreeEnsemble{Regressor,Classifier} nodes,
the nodes and their inputs (the ML kernel tests and the native tier's tests share them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

ML = "ai.onnx.ml"
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_trees(
    rng: np.random.RandomState, n_targets: int, prefix: str, depths: Sequence[int]
) -> dict[str, Any]:
    """Attributes of one tree per entry of ``depths`` (its maximum depth): mixed node modes,
    random missing-value tracks, leaves stopping early at random, each leaf weighting a
    random subset of the ``n_targets`` targets; ``prefix`` names the weight attributes
    (``target`` or ``class``)."""
    names = ["treeids", "nodeids", "featureids", "modes", "values"]
    names += ["truenodeids", "falsenodeids", "missing_value_tracks_true"]
    a: dict[str, list[Any]] = {f"nodes_{k}": [] for k in names}
    w: dict[str, list[Any]] = {
        f"{prefix}_{k}": [] for k in ("treeids", "nodeids", "ids", "weights")
    }
    for t, depth0 in enumerate(depths):
        count = [0]

        def make(depth: int, t: int = t, count: list[int] = count) -> int:
            nid = count[0]
            count[0] += 1
            leaf = depth == 0 or rng.rand() < 0.2
            row = [t, nid, int(rng.randint(3)), "LEAF" if leaf else MODES[rng.randint(6)]]
            row += [float(rng.choice([-1.0, 0.0, 0.5, 1.0])), 0, 0, int(rng.rand() < 0.5)]
            pos = len(a["nodes_treeids"])
            for k, v in zip(a, row):
                a[k].append(v)
            if leaf:
                for c in rng.choice(n_targets, rng.randint(1, n_targets + 1), replace=False):
                    for k, v in zip(w, (t, nid, int(c), float(np.float32(rng.randn())))):
                        w[k].append(v)
            else:
                a["nodes_truenodeids"][pos] = make(depth - 1)
                a["nodes_falsenodeids"][pos] = make(depth - 1)
            return nid

        make(depth0)
    return {**a, **w}


def random_regressor(
    rng: np.random.RandomState, seed: int, aggregate: str, depths: Sequence[int]
) -> onnx.NodeProto:
    """A TreeEnsembleRegressor X[N, 3] -> Y[N, 3] of ``random_trees``, its targets combined
    by ``aggregate``; odd seeds add base values."""
    attrs = random_trees(rng, 3, "target", depths)
    attrs.update(n_targets=3, aggregate_function=aggregate, post_transform="NONE")
    if seed % 2:
        attrs["base_values"] = [0.5, -1.0, 2.0]
    return helper.make_node("TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, **attrs)


def random_classifier(
    rng: np.random.RandomState, seed: int, transform: str, depths: Sequence[int]
) -> tuple[onnx.NodeProto, int]:
    """A TreeEnsembleClassifier X[N, 3] -> (L[N], Y[N, classes]) of ``random_trees``, post
    transform ``transform``, and its number of classes: 2 or 3 by seed, seed 2 with one
    weight column (the binary case), seed 3 with base values."""
    n_classes = 2 + seed % 2
    attrs = random_trees(rng, 1 if seed == 2 else n_classes, "class", depths)
    attrs.update(classlabels_int64s=list(range(10, 10 + n_classes)), post_transform=transform)
    if seed == 3:
        attrs["base_values"] = [0.1] * n_classes
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["L", "Y"], domain=ML, **attrs)
    return node, n_classes


def tree_inputs(rng: np.random.RandomState, n: int) -> np.ndarray:
    """X float32[n, 3] for those trees: values on their split thresholds, 15% NaN."""
    x = rng.choice([-1.0, 0.0, 0.25, 0.5, 1.0], size=(n, 3)).astype(np.float32)
    x[rng.rand(n, 3) < 0.15] = np.nan
    return x
