"""``fuse_dict``: ``DictVectorizer -> [Normalizer L1 | L2] -> LinearClassifier |
LinearRegressor [-> Normalizer of the scores]`` (skl2onnx's DictVectorizer pipelines)
becomes one ``tfrt_py.fused::DictLinear``. Checked against the unfused nodes (labels
exactly, scores within float32 rounding) and against onnxruntime, on the maps an endpoint
meets: known and unknown keys, an empty map, NumPy scalar keys, a NaN value, integer keys,
many maps in a list (tfrt_py's own: onnxruntime takes one map); and a value that is no
number fails as the unfused nodes fail."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.compiler.fuse_dict import SPARSE_MIN_WIDTH
from tfrt_py.compiler.pipeline import PASSES

ML = "ai.onnx.ml"
KEYS = [f"f{i}" for i in range(SPARSE_MIN_WIDTH + 40)]  # wide enough to fuse


def _model(norm: str | None = None, head: str = "softmax", post: bool = False,
           int_keys: bool = False, labels: str = "ints", width: int = len(KEYS)
           ) -> onnx.ModelProto:  # fmt: skip
    """map -> DictVectorizer (the first ``width`` keys) -> [Normalizer] -> LinearClassifier
    (post transform ``head``) | LinearRegressor (``head="regressor"``) -> [L1 Normalizer
    of the scores]."""
    rng = np.random.default_rng(7)
    vocab = {"int64_vocabulary": list(range(0, 2 * width, 2))} if int_keys else {
        "string_vocabulary": KEYS[:width]}  # fmt: skip
    nodes = [helper.make_node("DictVectorizer", ["m"], ["vec"], domain=ML, **vocab)]
    y = "vec"
    if norm:
        nodes.append(helper.make_node("Normalizer", [y], ["normed"], domain=ML, norm=norm))
        y = "normed"
    coefs = rng.standard_normal(3 * width).astype(np.float32).tolist()
    if head == "regressor":
        nodes.append(helper.make_node("LinearRegressor", [y], ["pred"], domain=ML,
                                      coefficients=coefs, intercepts=[0.5, 0.0, -1.0],
                                      targets=3))  # fmt: skip
        outs = [helper.make_tensor_value_info("pred", TensorProto.FLOAT, [None, 3])]
    else:
        label_attr: dict[str, Any] = {"classlabels_ints": [4, 5, 6]}
        if labels == "strings":
            label_attr = {"classlabels_strings": ["a", "b", "c"]}
        nodes.append(helper.make_node(
            "LinearClassifier", [y], ["label", "scores"], domain=ML, coefficients=coefs,
            intercepts=[0.1, -0.2, 0.05], post_transform=head, **label_attr,
        ))  # fmt: skip
        scores = "scores"
        if post:
            nodes.append(helper.make_node("Normalizer", [scores], ["probs"], domain=ML,
                                          norm="L1"))  # fmt: skip
            scores = "probs"
        label_t = TensorProto.STRING if labels == "strings" else TensorProto.INT64
        outs = [helper.make_tensor_value_info("label", label_t, [None]),
                helper.make_tensor_value_info(scores, TensorProto.FLOAT, [None, 3])]  # fmt: skip
    key_t = TensorProto.INT64 if int_keys else TensorProto.STRING
    m_type = helper.make_map_type_proto(key_t, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "dicts", [helper.make_value_info("m", m_type)], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                              helper.make_opsetid(ML, 3)])  # fmt: skip
    model.ir_version = 9
    return model


def _maps(int_keys: bool) -> list[dict[Any, float]]:
    """An empty map, one key, and maps of known keys with unknown ones among them."""
    rng = np.random.default_rng(0)
    known: list[Any] = list(range(0, 2 * len(KEYS), 2)) if int_keys else KEYS
    unknown: list[Any] = [1, 3, -2, 10**9] if int_keys else ["unseen", "", "F1", "fü"]
    got: list[dict[Any, float]] = [{}, {known[0]: 0.0}, {known[-1]: 2.5}, {unknown[0]: 1.0}]
    for n in (1, 3, 8, 20):
        picked = [known[int(i)] for i in rng.choice(len(known), n, replace=False)]
        picked += unknown[: n % 3]
        got.append({k: float(rng.standard_normal() * 3) for k in picked})
    return got


CASES: list[dict[str, Any]] = [
    {"head": "SOFTMAX", "post": True},
    {"head": "SOFTMAX"},
    {"head": "NONE", "norm": "L2"},
    {"head": "LOGISTIC", "norm": "L1", "labels": "strings"},
    {"head": "regressor", "norm": "L2"},
    {"head": "SOFTMAX", "post": True, "int_keys": True},
]
IDS = [str(sorted(c.items())) for c in CASES]


def _close(got: dict[str, Any], want: dict[str, Any], rtol: float = 2e-6) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if np.asarray(v).dtype.kind in "iuOU":
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], v, rtol=rtol, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_fused_node_gives_the_unfused_nodes_outputs(case: dict[str, Any]) -> None:
    model = _model(**case)
    fused = tfrt_py.load(model, executor="sync")
    unfused = tfrt_py.load(model, executor="sync", optimize=set(PASSES) - {"fuse_dict"})
    report = fused.describe()
    assert "fuse_dict: 1 DictVectorizers" in report, report
    ops = report.split("ops as loaded")[0].split("ops:")[1]
    assert "DictLinear" in ops and "DictVectorizer" not in ops, ops
    maps = _maps(case.get("int_keys", False))
    for m in maps:
        _close(fused.run({"m": m}), unfused.run({"m": m}))
    _close(fused.run({"m": maps}), unfused.run({"m": maps}))  # a list of maps: one row each


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_fused_node_matches_onnxruntime(case: dict[str, Any]) -> None:
    model = _model(**case)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = tfrt_py.load(model)
    for m in _maps(case.get("int_keys", False))[1:]:  # onnxruntime refuses an empty map
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"m": m})))
        _close(ours.run({"m": m}), want, rtol=1e-5)


def test_numpy_keys_and_a_nan_value_are_read_as_the_unfused_nodes_read_them() -> None:
    model = _model(head="SOFTMAX", post=True)
    fused = tfrt_py.load(model, executor="sync")
    unfused = tfrt_py.load(model, executor="sync", optimize=set(PASSES) - {"fuse_dict"})
    np_keys = {np.str_("f1"): 1.5, np.str_("f3"): -2.0, "zz": 4.0}
    _close(fused.run({"m": np_keys}), unfused.run({"m": np_keys}))
    plain_keys = {"f1": 1.5, "f3": -2.0}
    _close(fused.run({"m": np_keys}), unfused.run({"m": plain_keys}))
    got, want = fused.run({"m": {"f2": float("nan")}}), unfused.run({"m": {"f2": float("nan")}})
    assert np.isnan(got["probs"]).all() and np.isnan(want["probs"]).all()


def test_a_value_that_is_no_number_fails_as_the_unfused_nodes_fail() -> None:
    model = _model(head="SOFTMAX")
    for optimize in (None, set(PASSES) - {"fuse_dict"}):
        m = tfrt_py.load(model, executor="sync", optimize=optimize)
        with pytest.raises(tfrt_py.errors.TfrtError):
            m.run({"m": {"f1": "not a number"}})
        assert m.run({"m": {"f1": 1.0}})["label"].shape == (1,)  # the model stays usable


def test_a_small_vocabulary_stays_on_the_dense_nodes() -> None:
    model = _model(head="SOFTMAX", post=True, width=SPARSE_MIN_WIDTH)
    m = tfrt_py.load(model, executor="sync")
    assert "fuse_dict: nothing to fuse" in m.describe()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _maps(False)[1:]:
        feed = {k: v for k, v in feed.items() if k not in KEYS[SPARSE_MIN_WIDTH:]}
        if not feed:
            continue
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"m": feed})))
        _close(m.run({"m": feed}), want, rtol=1e-5)


def test_a_mul_between_keeps_the_nodes_apart() -> None:
    model = _model(head="SOFTMAX")
    g = model.graph
    g.initializer.append(onnx.numpy_helper.from_array(np.full(len(KEYS), 2, np.float32), "two"))
    g.node.insert(1, helper.make_node("Mul", ["vec", "two"], ["vec2"]))
    g.node[2].input[0] = "vec2"
    report = tfrt_py.load(model, executor="sync").describe()
    assert "fuse_dict: nothing to fuse" in report, report
