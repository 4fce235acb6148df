"""``encode_maps``: a map input read by a DictVectorizer (skl2onnx's DictVectorizer
pipelines) becomes the DictVectorizer's ``[1, vocabulary]`` row as the feeds are checked,
so the sync interpreter plans the model and the native tier compiles it. Checked against
the unencoded nodes (labels exactly, scores within float32 rounding) on the sync
interpreter and the native tier, and against onnxruntime, on the maps an endpoint meets:
known and unknown keys, an empty map, NumPy scalar keys, a NaN value, integer keys; the
model still declares the map; anything but a map, or a value that is no number, is an
``InputError`` and the model stays usable."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.errors import InputError

ML = "ai.onnx.ml"
KEYS = [f"f{i}" for i in range(40)]
UNENCODED = set(PASSES) - {"encode_maps"}


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


@pytest.mark.parametrize("executor", ["sync", "native"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_encoded_input_gives_the_nodes_outputs(case: dict[str, Any], executor: str) -> None:
    model = _model(**case)
    encoded = tfrt_py.load(model, executor=executor, native="eager")
    plain = tfrt_py.load(model, executor="sync", optimize=UNENCODED)
    report = encoded.describe()
    assert "encode_maps: 1 map inputs" in report, report
    ops = report.split("ops as loaded")[0].split("ops:")[1]
    assert "DictVectorizer" not in ops, ops
    assert encoded.inputs[0].type.startswith("map<") and encoded.inputs[0].dtype is None
    assert encoded.executor == executor  # the native tier took the model (a map: never)
    for m in _maps(case.get("int_keys", False)) * 2:  # twice: the planned or compiled path
        _close(encoded.run({"m": m}), plain.run({"m": m}))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_encoded_input_matches_onnxruntime(case: dict[str, Any]) -> None:
    model = _model(**case)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = tfrt_py.load(model)
    for m in _maps(case.get("int_keys", False))[1:]:  # onnxruntime refuses an empty map
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"m": m})))
        _close(ours.run({"m": m}), want, rtol=1e-5)


@pytest.mark.parametrize("executor", ["sync", "native"])
def test_numpy_keys_and_a_nan_value_are_read_as_the_nodes_read_them(executor: str) -> None:
    model = _model(head="SOFTMAX", post=True)
    encoded = tfrt_py.load(model, executor=executor, native="eager")
    plain = tfrt_py.load(model, executor="sync", optimize=UNENCODED)
    np_keys = {np.str_("f1"): 1.5, np.str_("f3"): -2.0, "zz": 4.0}
    _close(encoded.run({"m": np_keys}), plain.run({"m": np_keys}))
    _close(encoded.run({"m": np_keys}), plain.run({"m": {"f1": 1.5, "f3": -2.0}}))
    got, want = encoded.run({"m": {"f2": float("nan")}}), plain.run({"m": {"f2": float("nan")}})
    assert np.isnan(got["probs"]).all() and np.isnan(want["probs"]).all()


@pytest.mark.parametrize("executor", ["sync", "native"])
def test_anything_but_a_map_of_numbers_is_an_input_error(executor: str) -> None:
    m = tfrt_py.load(_model(head="SOFTMAX"), executor=executor, native="eager")
    good = m.run({"m": {"f1": 1.0}})
    bad_inputs = (
        ({"f1": "not a number"}, "no number"),
        ([{"f1": 1.0}], "expected a map"),
        ("f1", "expected a map"),
        (np.zeros((2, len(KEYS)), np.float32), "dim 0"),
    )
    for bad, says in bad_inputs:
        with pytest.raises(InputError, match=says):
            m.run({"m": bad})
        _close(m.run({"m": {"f1": 1.0}}), good)  # the model stays usable


def test_a_map_input_read_by_another_node_too_stays_a_map() -> None:
    model = _model(head="SOFTMAX")
    g = model.graph
    g.node.append(helper.make_node("DictVectorizer", ["m"], ["vec2"], domain=ML,
                                   string_vocabulary=KEYS[:3]))  # fmt: skip
    g.output.append(helper.make_tensor_value_info("vec2", TensorProto.FLOAT, [1, 3]))
    m = tfrt_py.load(model, executor="sync")
    assert "encode_maps: nothing to encode" in m.describe()
    np.testing.assert_array_equal(m.run({"m": {"f1": 2.0}})["vec2"], [[0.0, 2.0, 0.0]])
