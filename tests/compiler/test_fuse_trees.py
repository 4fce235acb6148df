"""The ``fuse_trees`` pass: skl2onnx's IsolationForest (a regressor per tree, LabelEncoders
and a path-length formula per tree, a Sum) becomes one tree ensemble with the formula in
its leaves, matching onnxruntime; graphs outside the pattern are left alone and still
right."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.compiler.pipeline import PASSES

sklearn_ensemble = pytest.importorskip("sklearn.ensemble", reason="scikit-learn fits the models")
skl2onnx = pytest.importorskip("skl2onnx", reason="skl2onnx writes the models")

NO_TREES = set(PASSES) - {"fuse_trees"}


def _report(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "fuse_trees")


def _ops(model: tfrt_py.Model) -> Counter[str]:
    return Counter(n.op_type for n in model.prepared.graph.nodes)


def _isolation_forest(seed: int, **kw: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    fitted = sklearn_ensemble.IsolationForest(random_state=seed, **kw).fit(x)
    return skl2onnx.to_onnx(fitted, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})


def _ort(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "kw",
    [
        {"n_estimators": 20},
        {"n_estimators": 10, "max_samples": 40, "bootstrap": True},
    ],
)
def test_an_isolation_forest_becomes_one_ensemble_matching_onnxruntime(kw: dict) -> None:
    proto = _isolation_forest(3, **kw)
    model = tfrt_py.load(proto)
    n = kw["n_estimators"]
    assert _report(model) == f"{n} leaf computation(s) folded into trees, 1 Sum(s) of trees merged"
    ops = _ops(model)
    assert ops["TreeEnsembleRegressor"] == 1
    assert not ops["LabelEncoder"] and not ops["Sum"] and not ops["Gather"]
    plain = tfrt_py.load(proto, optimize=NO_TREES)
    assert _ops(plain)["LabelEncoder"] == 2 * n
    sess = _ort(proto)
    rng = np.random.default_rng(7)
    for rows in (1, 5, 257):
        x = (rng.standard_normal((rows, 6)) * 2).astype(np.float32)
        x[0, :2] = [25.0, -25.0]  # an outlier: short paths
        want = dict(zip(["label", "scores"], sess.run(None, {"X": x})))
        got = model.run({"X": x})
        np.testing.assert_array_equal(got["label"], want["label"])
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=1e-6)
        # scores near 0 (0.5 - 2**-depth) keep float32's absolute error, not a relative one
        np.testing.assert_allclose(plain.run({"X": x})["scores"], got["scores"], atol=1e-6)


# -- hand-built graphs: what the pass must not take ---------------------------------------


def _tree(name: str, x: str, y: str, leaf_weights: tuple[float, float] = (1.0, 2.0)) -> Any:
    """A one-tree regressor: x[:, 0] <= 0.5 -> leaf 1 (weight leaf_weights[0]) else leaf 2."""
    return helper.make_node(
        "TreeEnsembleRegressor", [x], [y], domain="ai.onnx.ml", name=name, n_targets=1,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
        target_weights=list(leaf_weights),
    )  # fmt: skip


def _model(nodes: list[Any], outputs: list[str], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    )


def _check(proto: onnx.ModelProto) -> tfrt_py.Model:
    model = tfrt_py.load(proto)
    sess = _ort(proto)
    x = np.array([[0.1, 3.0], [0.9, -1.0], [0.5, 0.0], [np.nan, 1.0]], np.float32)
    want = sess.run(None, {"X": x})
    got = model.run({"X": x})
    for o, w in zip([o.name for o in sess.get_outputs()], want):
        np.testing.assert_allclose(got[o], w, rtol=1e-6)
    return model


def test_the_leaf_formula_folds_and_runs_as_the_graph_did() -> None:
    proto = _model(
        [_tree("t", "X", "y"), helper.make_node("Mul", ["y", "k"], ["m"]),
         helper.make_node("Log", ["m"], ["out"])],
        ["out"], {"k": np.array([3.0], np.float32)},
    )  # fmt: skip
    model = _check(proto)
    assert _report(model).startswith("1 leaf computation(s) folded")
    assert list(_ops(model)) == ["TreeEnsembleRegressor"]


def test_two_values_leaving_the_leaf_formula_keep_it_computed() -> None:
    proto = _model(
        [_tree("t", "X", "y"), helper.make_node("Mul", ["y", "k"], ["a"]),
         helper.make_node("Exp", ["a"], ["b"])],
        ["a", "b"], {"k": np.array([3.0], np.float32)},
    )  # fmt: skip
    model = _check(proto)
    assert _report(model) == "nothing to fuse" and _ops(model)["Mul"] == 1


def test_a_per_column_constant_is_not_a_row_formula() -> None:
    proto = _model(
        [_tree("t", "X", "y"), helper.make_node("Mul", ["y", "k"], ["out"])],
        ["out"], {"k": np.array([[2.0, 3.0]], np.float32)},  # broadcasts (N, 1) to (N, 2)
    )  # fmt: skip
    model = _check(proto)
    assert _report(model) == "nothing to fuse" and _ops(model)["Mul"] == 1


def test_a_sum_with_a_tree_read_elsewhere_and_another_input() -> None:
    """Trees read only by the Sum merge; the one also read elsewhere and the plain input
    stay, added to the merged trees."""
    proto = _model(
        [_tree("t0", "X", "y0"), _tree("t1", "X", "y1", (5.0, -1.0)),
         _tree("t2", "X", "y2", (0.25, 8.0)), helper.make_node("Neg", ["y2"], ["n2"]),
         helper.make_node("Slice", ["X", "s0", "s1", "ax"], ["r"]),
         helper.make_node("Sum", ["y0", "y1", "y2", "r"], ["out"])],
        ["out", "n2"],
        {"s0": np.array([1], np.int64), "s1": np.array([2], np.int64),
         "ax": np.array([1], np.int64)},
    )  # fmt: skip
    model = _check(proto)
    ops = _ops(model)
    assert ops["TreeEnsembleRegressor"] == 2 and ops["Sum"] == 1
    sum_node = next(n for n in model.prepared.graph.nodes if n.op_type == "Sum")
    assert len(sum_node.inputs) == 3  # merged t0+t1, t2, the slice


def test_trees_over_column_selections_merge_with_their_features_mapped() -> None:
    """skl2onnx feeds each tree ``Gather(X, columns, axis=1)``; the merged ensemble reads X,
    so each split's feature id goes through its tree's columns."""
    proto = _model(
        [helper.make_node("Gather", ["X", "c1"], ["x1"], axis=1),
         helper.make_node("Gather", ["X", "c10"], ["x10"], axis=1),
         _tree("t0", "x1", "y0"), _tree("t1", "x10", "y1", (5.0, -1.0)),
         helper.make_node("Sum", ["y0", "y1"], ["out"])],
        ["out"], {"c1": np.array([1], np.int64), "c10": np.array([0, 1], np.int64)},
    )  # fmt: skip
    model = _check(proto)  # rows whose columns fall on different sides of 0.5
    assert dict(_ops(model)) == {"TreeEnsembleRegressor": 1}
    tree = model.prepared.graph.nodes[0]
    assert tree.inputs[0] is model.prepared.graph.inputs[0]
    assert [int(f) for f in tree.attrs["nodes_featureids"]][::3] == [1, 0]


def test_trees_over_different_inputs_are_not_merged() -> None:
    proto = _model(
        [_tree("t0", "X", "y0"), helper.make_node("Neg", ["X"], ["nx"]),
         _tree("t1", "nx", "y1"), helper.make_node("Sum", ["y0", "y1"], ["out"])],
        ["out"], {},
    )  # fmt: skip
    model = _check(proto)
    assert _ops(model)["TreeEnsembleRegressor"] == 2 and _ops(model)["Sum"] == 1


@pytest.mark.parametrize(
    "fault",
    [
        {"target_treeids": [7, 7]},  # weights of a tree that has no nodes
        {"n_targets": "one"},
        {"nodes_modes": ["BRANCH_LEQ", "LEAF"]},  # lengths differ
        {"target_weights": [1.0]},
        {"nodes_featureids": [5, 0, 0]},  # beyond the selected columns
    ],
)
def test_a_malformed_tree_is_left_to_its_kernel(fault: dict) -> None:
    """A stranger's tree with attributes the rewrite cannot read is not rewritten: the
    load or the call fails with the kernel's own tfrt_py error, or it runs as the graph
    says."""
    trees = [_tree("t0", "xs", "y0"), _tree("t1", "X", "y1")]
    for k, v in fault.items():
        del trees[0].attribute[[a.name for a in trees[0].attribute].index(k)]
        trees[0].attribute.append(helper.make_attribute(k, v))
    proto = _model(
        [helper.make_node("Gather", ["X", "c"], ["xs"], axis=1), *trees,
         helper.make_node("Sum", ["y0", "y1"], ["out"])],
        ["out"], {"c": np.array([1], np.int64)},
    )  # fmt: skip
    try:
        model = tfrt_py.load(proto)
    except tfrt_py.errors.TfrtError:
        return
    assert _ops(model)["TreeEnsembleRegressor"] == 2
    try:
        out = model.run({"X": np.zeros((2, 2), np.float32)})["out"]
    except tfrt_py.errors.TfrtError:
        return
    assert out.shape[0] == 2
