"""String inputs on the native tier (issue 39): a string input read only by one-hot or
label encoders is mapped to ids once per call (``compiler/encode_strings.py`` makes the
``StringIds`` node, the native entry runs it), and the compiled function does the rest
(``native/lower/ops_encode.py``: OneHotEncoder on integer categories, LabelEncoder).
Checked against onnxruntime and the sync interpreter on the values a categorical column
meets: seen, unseen at fit time, empty, non-ASCII, bytes, None, numbers, a 100 kB string,
a fixed-width NumPy string array, at batch sizes the rows loop serves; ``zeros=0``
refuses an unknown value with the kernel's error and the model stays usable; an input
that is read otherwise keeps its strings."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.compiler.pipeline import PASSES

ML = "ai.onnx.ml"
COLORS = ["red", "green", "", "grün", "blue"]
SIZES = ["S", "M", "L"]
SEEN = {"color": [*COLORS, "violet", "RED", "grün ", "ß"], "size": [*SIZES, "XL", ""]}


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)


def _model(zeros: int = 1, color_out: bool = False) -> onnx.ModelProto:
    """color, size (strings [N, 1]), n (float [N, 2]), k (int64 [N, 1]) -> OneHotEncoders
    -> Concat -> LinearClassifier; ``color_out``: the color column is an output too."""
    rng = np.random.default_rng(0)
    width = len(COLORS) + len(SIZES) + 2 + 3
    nodes = [
        helper.make_node(
            "OneHotEncoder", ["color"], ["c1"], domain=ML, cats_strings=COLORS, zeros=zeros
        ),
        helper.make_node("OneHotEncoder", ["size"], ["s1"], domain=ML, cats_strings=SIZES),
        helper.make_node("OneHotEncoder", ["k"], ["k1"], domain=ML, cats_int64s=[3, -1, 7]),
        helper.make_node("Flatten", ["c1"], ["c2"], axis=1),
        helper.make_node("Flatten", ["s1"], ["s2"], axis=1),
        helper.make_node("Flatten", ["k1"], ["k2"], axis=1),
        helper.make_node("Concat", ["c2", "s2", "n", "k2"], ["feat"], axis=1),
        helper.make_node(
            "LinearClassifier",
            ["feat"],
            ["label", "scores"],
            domain=ML,
            coefficients=rng.standard_normal(3 * width).astype(np.float32).tolist(),
            intercepts=[0.1, 0.0, -0.1],
            classlabels_ints=[0, 1, 2],
            post_transform="SOFTMAX",
        ),
    ]
    inputs = [
        helper.make_tensor_value_info("color", TensorProto.STRING, [None, 1]),
        helper.make_tensor_value_info("size", TensorProto.STRING, [None, 1]),
        helper.make_tensor_value_info("n", TensorProto.FLOAT, [None, 2]),
        helper.make_tensor_value_info("k", TensorProto.INT64, [None, 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 3]),
    ]
    if color_out:
        outputs.append(helper.make_tensor_value_info("color", TensorProto.STRING, [None, 1]))
    graph = helper.make_graph(nodes, "columns", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ML, 3)])  # fmt: skip
    model.ir_version = 9
    return model


def _feeds(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for col, values in SEEN.items():
        a = np.empty((n, 1), dtype=object)
        a[:, 0] = [values[int(i)] for i in rng.integers(0, len(values), n)]
        out[col] = a
    out["n"] = rng.standard_normal((n, 2)).astype(np.float32)
    out["k"] = rng.choice([3, -1, 7, 5], (n, 1)).astype(np.int64)
    return out


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    np.testing.assert_array_equal(got["label"], want["label"])
    np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=1e-6)


@pytest.mark.compiles
def test_string_columns_run_in_compiled_code_and_match_onnxruntime() -> None:
    model = _model()
    m = tfrt_py.load(model, executor="native", native="eager")
    report = m.describe()
    assert m.executor == "native", report
    assert "encode_strings: 2 string inputs mapped to ids once, for their encoders" in report, (
        report
    )
    assert "nodes as one numba function" in report, report
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sync = tfrt_py.load(model, executor="sync")
    for i, n in enumerate((1, 37, 5, 300, 1)):
        feeds = _feeds(n, i)
        want = dict(zip(["label", "scores"], sess.run(None, feeds)))
        _same(m.run(feeds), want)
        _same(sync.run(feeds), want)


@pytest.mark.compiles
def test_feeds_of_other_forms_agree_with_the_interpreter() -> None:
    model = _model()
    m = tfrt_py.load(model, executor="native", native="eager")
    unencoded = tfrt_py.load(model, executor="sync", optimize=set(PASSES) - {"encode_strings"})
    feeds = _feeds(6, 9)
    as_bytes = dict(feeds, color=np.array([[s.encode()] for s in feeds["color"][:, 0]],
                                          dtype=object))  # fmt: skip
    fixed = dict(feeds, size=feeds["size"].astype(str))  # a NumPy '<U2' array
    odd = dict(
        feeds, color=np.array([[None], [3], ["red"], [1.5], [""], ["x" * 100_000]], dtype=object)
    )  # not strings, or a long one: unknown
    for f in (as_bytes, fixed, odd):
        _same(m.run(f), unencoded.run(f))


@pytest.mark.compiles
def test_an_unknown_value_under_zeros_0_is_refused_and_the_model_stays_usable() -> None:
    model = _model(zeros=0)
    m = tfrt_py.load(model, executor="native", native="eager")
    good = _feeds(4, 1)
    good["color"][:, 0] = ["red", "", "grün", "blue"]
    want = tfrt_py.load(model, executor="sync").run(good)
    _same(m.run(good), want)
    bad = dict(good, color=np.array([["red"], ["violet"], ["red"], ["red"]], dtype=object))
    with pytest.raises(tfrt_py.errors.ExecutionError, match="not among the categories"):
        m.run(bad)
    _same(m.run(good), want)


def test_a_string_input_read_otherwise_keeps_its_strings() -> None:
    m = tfrt_py.load(_model(color_out=True), executor="sync")
    report = m.describe()
    assert "encode_strings: 1 string inputs mapped to ids once, for their encoders" in report, (
        report
    )
    feeds = _feeds(3, 2)
    np.testing.assert_array_equal(m.run(feeds)["color"], feeds["color"])


def _ordinal_model() -> onnx.ModelProto:
    """What skl2onnx writes for an OrdinalEncoder before a linear model: a LabelEncoder per
    column (string keys to int64 codes; float keys to floats; int64 keys), Casts, a
    Concat, a LinearRegressor."""
    nodes = [
        helper.make_node(
            "LabelEncoder",
            ["color"],
            ["c1"],
            domain=ML,
            keys_strings=COLORS,
            values_int64s=[0, 1, 2, 3, 4],
            default_int64=-1,
        ),
        helper.make_node(
            "LabelEncoder",
            ["n"],
            ["n1"],
            domain=ML,
            keys_floats=[0.5, -1.0, 2.0, -0.0],
            values_floats=[1.0, 2.0, 4.0, 8.0],
            default_float=-7.0,
        ),
        helper.make_node(
            "LabelEncoder",
            ["k"],
            ["k1"],
            domain=ML,
            keys_int64s=[7, 3, -1],
            values_int64s=[10, 20, 30],
            default_int64=99,
        ),
        helper.make_node("Cast", ["c1"], ["c2"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["k1"], ["k2"], to=TensorProto.FLOAT),
        helper.make_node("Concat", ["c2", "n1", "k2"], ["feat"], axis=1),
        helper.make_node(
            "LinearRegressor",
            ["feat"],
            ["y"],
            domain=ML,
            coefficients=[0.5, -1.0, 0.25, 2.0, 0.125],
            intercepts=[1.0],
        ),
    ]
    inputs = [
        helper.make_tensor_value_info("color", TensorProto.STRING, [None, 1]),
        helper.make_tensor_value_info("n", TensorProto.FLOAT, [None, 2]),
        helper.make_tensor_value_info("k", TensorProto.INT64, [None, 2]),
    ]
    graph = helper.make_graph(
        nodes, "ordinal", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )
    model.ir_version = 9
    return model


@pytest.mark.compiles
def test_label_encoders_of_an_ordinal_encoding_run_in_compiled_code() -> None:
    model = _ordinal_model()
    m = tfrt_py.load(model, executor="native", native="eager")
    report = m.describe()
    assert m.executor == "native", report
    assert "encode_strings: 1 string inputs mapped to ids once" in report, report
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for n in (1, 9, 200):
        color = np.empty((n, 1), dtype=object)
        color[:, 0] = [SEEN["color"][int(i)] for i in rng.integers(0, len(SEEN["color"]), n)]
        feeds = {
            "color": color,
            "n": rng.choice(np.array([0.5, -1.0, np.nan, 2.0, 3.0, -0.0], np.float32), (n, 2)),
            "k": rng.choice(np.array([7, 3, -1, 0], np.int64), (n, 2)),
        }
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-6)


@pytest.mark.compiles
def test_a_category_mapper_becomes_a_label_encoder_of_ids() -> None:
    nodes = [
        helper.make_node("CategoryMapper", ["color"], ["c1"], domain=ML, cats_strings=COLORS,
                         cats_int64s=[10, 20, 30, 40, 50], default_int64=-5),
        helper.make_node("Cast", ["c1"], ["c2"], to=TensorProto.FLOAT),
        helper.make_node("LinearRegressor", ["c2"], ["y"], domain=ML, coefficients=[0.5],
                         intercepts=[1.0]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "mapper", [helper.make_tensor_value_info("color", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ML, 1)])  # fmt: skip
    model.ir_version = 9
    m = tfrt_py.load(model, executor="native", native="eager")
    report = m.describe()
    assert m.executor == "native" and "CategoryMapper" not in report.split("ops as loaded")[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, seed in ((1, 0), (40, 1)):
        feeds = {"color": _feeds(n, seed)["color"]}
        np.testing.assert_allclose(m.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-6)
