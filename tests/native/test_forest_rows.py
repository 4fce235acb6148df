"""The many-row forest walk (``kernels.trees.forest_rows_*``: trees outside, rows inside,
eight rows a lane group) gives the per-row walk's accumulators bit for bit: every
comparison kind, every aggregate, several targets, NaN tracks, float32 and float64, row
counts around the lane width; and a model's batch of tiles takes it and still matches
onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.trees import ML, random_regressor, tree_inputs

pytest.importorskip("numba", reason="the native tier's kernels are numba functions")

#: Eleven trees of depths 1..5: a full lane group of trees plus three (the per-row walk's
#: tail) and leaves that stop early.
_DEPTHS = [1 + t % 5 for t in range(11)]


def _model(node: Any, n_out: int = 3) -> bytes:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_out])
    g = helper.make_graph([node], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 3)])  # fmt: skip
    m.ir_version = 9
    return m.SerializeToString()


def _packed(node: Any, dtype: Any) -> Any:
    import onnx

    from tfrt_py.frontends.onnx.importer import import_model
    from tfrt_py.kernels import default_registry
    from tfrt_py.kernels.base import KernelContext
    from tfrt_py.kernels.ml.tree_ops import parse_spec_v3
    from tfrt_py.native.lower.ml_pack import pack_forest

    graph = import_model(onnx.load_from_string(_model(node)), None, default_registry().has)
    spec = parse_spec_v3(KernelContext(graph.nodes[0]), "target", 3)
    return pack_forest(spec, np.dtype(dtype))


def _only(node: Any, mode: str) -> Any:
    """``node`` with every branch ``mode``: the single-comparison kinds 0 and 1."""
    for a in node.attribute:
        if a.name == "nodes_modes":
            a.strings[:] = [m if m == b"LEAF" else mode.encode() for m in a.strings]
    return node


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["mixed", "BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.compiles
def test_many_row_walk_is_the_per_row_walk(mode: str, dtype: Any) -> None:
    from tfrt_py.native.kernels import trees

    rng = np.random.RandomState(7)
    node = random_regressor(rng, 0, "SUM", _DEPTHS)
    p = _packed(node if mode == "mixed" else _only(node, mode), dtype)
    assert p.kind == {"mixed": 2, "BRANCH_LEQ": 0, "BRANCH_LT": 1}[mode]
    row = (trees.forest_leq, trees.forest_lt, trees.forest_mixed)[p.kind]
    many = (trees.forest_rows_leq, trees.forest_rows_lt, trees.forest_rows_mixed)[p.kind]
    tables = (p.nodes, p.nodes.view(dtype), p.roots, p.depth, p.n_internal, p.lptr, p.ltgt,
              p.lval)  # fmt: skip
    c = 3
    for nr in (1, 7, 8, 9, 17, 64):
        x = np.concatenate([np.zeros(5, dtype), tree_inputs(rng, nr).astype(dtype).ravel()])
        for agg in (0, 1, 2):
            want = np.full(nr * c + 2, -7, dtype)
            want_has = np.ones(nr * c + 2, np.bool_)
            for r in range(nr):
                row(x, 5 + 3 * r, *tables, want, 2 + r * c, want_has, 2 + r * c, c, agg)
            got = np.full(nr * c + 2, -7, dtype)
            got_has = np.ones(nr * c + 2, np.bool_)
            many(x, 5, 3, nr, *tables, got, 2, got_has, 2, c, agg)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8),
                                          err_msg=f"{mode} {nr} rows agg {agg}")  # fmt: skip
            np.testing.assert_array_equal(got_has, want_has)
            assert (got[:2] == -7).all() and got_has[:2].all()  # nothing before the offsets


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.compiles
def test_a_batch_of_tiles_matches_onnxruntime(aggregate: str, monkeypatch: Any) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    rng = np.random.RandomState(3)
    data = _model(random_regressor(rng, 1, aggregate, _DEPTHS))
    model = tfrt_py.load(data, executor="native", native="eager")
    assert model.native is not None and model.native.form == "rows"
    # the tiles walk many rows at once (the import line names it in every module)
    assert "forest_rows_" in model.native.lowered.source.split("def rows")[1]
    assert "tiles of 64 rows" in model.describe()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for n in (64, 150, 1):
        feeds = {"X": tree_inputs(rng, n)}
        np.testing.assert_allclose(model.run(feeds)["Y"], sess.run(None, feeds)[0], rtol=1e-5,
                                   atol=1e-6, err_msg=f"{aggregate} {n}")  # fmt: skip


@pytest.mark.parametrize("string_labels", [False, True])
@pytest.mark.compiles
def test_a_classifier_with_zipmap_takes_the_tiles(string_labels: bool, monkeypatch: Any) -> None:
    """A default skl2onnx classifier ends in ZipMap (and may have string labels): its
    batches take the many-row walk too, and its dicts and labels are onnxruntime's."""
    from tests.support.trees import random_classifier

    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    rng = np.random.RandomState(5)
    node, n_classes = random_classifier(rng, 1, "SOFTMAX", _DEPTHS)
    classes: list[Any] = list(range(10, 10 + n_classes))
    if string_labels:
        classes = [f"c{k}" for k in range(n_classes)]
        for a in list(node.attribute):
            if a.name == "classlabels_int64s":
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute("classlabels_strings", classes))
    key = "classlabels_strings" if string_labels else "classlabels_int64s"
    zipmap = helper.make_node("ZipMap", ["Y"], ["Z"], domain=ML)
    zipmap.attribute.append(helper.make_attribute(key, classes))
    label_type = TensorProto.STRING if string_labels else TensorProto.INT64
    value = TensorProto.STRING if string_labels else TensorProto.INT64
    z_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(value, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    )
    g = helper.make_graph([node, zipmap], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                          [helper.make_tensor_value_info("L", label_type, [None]),
                           helper.make_value_info("Z", z_type)])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 3)])  # fmt: skip
    m.ir_version = 9
    data = m.SerializeToString()
    model = tfrt_py.load(data, executor="native", native="eager")
    assert model.native is not None and model.native.form == "rows"
    assert "forest_rows_" in model.native.lowered.source.split("def rows")[1]
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for n in (150, 1):
        feeds = {"X": tree_inputs(rng, n)}
        got = model.run(feeds)
        want_l, want_z = sess.run(None, feeds)
        assert np.asarray(got["L"]).astype(str).tolist() == want_l.astype(str).tolist()
        assert len(got["Z"]) == n and [list(d) for d in got["Z"]] == [list(d) for d in want_z]
        np.testing.assert_allclose(
            [list(d.values()) for d in got["Z"]],
            [list(d.values()) for d in want_z],
            rtol=1e-5,
            atol=1e-6,
        )
