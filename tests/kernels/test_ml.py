"""Tests of the ai.onnx.ml kernels: scikit-learn models converted by skl2onnx and
hand-built ONNX-ML graphs, run through tfrt_py and compared with onnxruntime."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.jit_paths import spy_compiled
from tests.support.trees import ML, random_classifier, random_regressor, tree_inputs
from tfrt_py.ir import Node, Value
from tfrt_py.kernels import KernelContext, default_registry
from tfrt_py.kernels.ml import tree_jit

sklearn = pytest.importorskip("sklearn")
skl2onnx = pytest.importorskip("skl2onnx")

from sklearn import ensemble, linear_model, preprocessing, svm, tree  # noqa: E402
from sklearn.datasets import make_classification, make_regression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402

# -- helpers ------------------------------------------------------------------------------


def _ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _ours(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    return list(tfrt_py.load(model).run(feeds).values())


def _assert_same(model: onnx.ModelProto, feeds: dict[str, Any], tol: float = 1e-5) -> None:
    expected, got = _ort(model, feeds), _ours(model, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, list):  # ZipMap: list of dicts
            assert len(g) == len(e)
            for dg, de in zip(g, e):
                assert dg.keys() == de.keys()
                np.testing.assert_allclose(list(dg.values()), list(de.values()), tol, tol)
            continue
        g = np.asarray(g)
        if e.dtype.kind in "OU":
            assert g.astype(str).tolist() == e.astype(str).tolist()
            continue
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


def _skl(est: Any, x: np.ndarray, zipmap: bool | None = None) -> onnx.ModelProto:
    from skl2onnx import to_onnx

    opts = None
    if zipmap is not None:
        final = est.steps[-1][1] if hasattr(est, "steps") else est
        opts = {id(final): {"zipmap": zipmap}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, x[:1], options=opts, target_opset={"": 17, ML: 3})


def _model(node: onnx.NodeProto, inputs: list[Any], outputs: list[Any], ml: int) -> Any:
    g = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml)]
    )
    m.ir_version = 9
    return m


@pytest.fixture(scope="module")
def cls3() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(120, 6, n_informative=4, n_classes=3, random_state=0)
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def cls2() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(120, 6, random_state=1)
    return x.astype(np.float32), y


# -- scikit-learn models vs onnxruntime ---------------------------------------------------


@pytest.mark.parametrize("zipmap", [False, True])
def test_random_forest_classifier(cls3: Any, zipmap: bool) -> None:
    x, y = cls3
    est = ensemble.RandomForestClassifier(8, max_depth=6, random_state=0).fit(x, y)
    _assert_same(_skl(est, x, zipmap), {"X": x[:40]})


@pytest.mark.parametrize("labels", [None, [3, 7], ["no", "yes"]])
def test_gradient_boosting_binary_labels(cls2: Any, labels: Any) -> None:
    """One weight class, two labels: onnxruntime's binary score and label rules."""
    x, y = cls2
    yy = y if labels is None else np.asarray(labels)[y]
    est = ensemble.GradientBoostingClassifier(n_estimators=10, random_state=0).fit(x, yy)
    _assert_same(_skl(est, x, False), {"X": x[:40]})


def test_tree_regressors() -> None:
    xr, yr = make_regression(120, 6, n_targets=2, random_state=0)
    xr = xr.astype(np.float32)
    est = tree.DecisionTreeRegressor(max_depth=5).fit(xr, yr)  # two targets
    _assert_same(_skl(est, xr), {"X": xr[:30]})
    est = ensemble.GradientBoostingRegressor(n_estimators=10).fit(xr, yr[:, 0])
    _assert_same(_skl(est, xr), {"X": xr[:1]})  # one row


def test_scaler_logistic_regression_zipmap(cls3: Any) -> None:
    x, y = cls3
    est = make_pipeline(preprocessing.StandardScaler(), linear_model.LogisticRegression())
    est.fit(x, np.array(["a", "b", "c"])[y])
    _assert_same(_skl(est, x, True), {"X": x[:20]})


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_normalizer_binarizer_pipeline(cls2: Any, norm: str) -> None:
    x, y = cls2
    est = make_pipeline(
        preprocessing.Normalizer(norm),
        preprocessing.Binarizer(threshold=0.1),
        linear_model.LogisticRegression(),
    )
    est.fit(x, y)
    _assert_same(_skl(est, x, False), {"X": x[:20]})


@pytest.mark.parametrize("probability", [False, True])
def test_svc(cls3: Any, probability: bool) -> None:
    x, y = cls3
    est = svm.SVC(probability=probability, random_state=0).fit(x, y)
    _assert_same(_skl(est, x, False), {"X": x[:20]}, tol=1e-4)


def test_one_hot_encoder_strings() -> None:
    from skl2onnx.common.data_types import StringTensorType

    rng = np.random.RandomState(0)
    s = np.array(["red", "green", "blue"])[rng.randint(0, 3, size=(30, 2))].astype(object)
    ohe = preprocessing.OneHotEncoder(handle_unknown="ignore").fit(s)
    from skl2onnx import to_onnx

    model = to_onnx(ohe, initial_types=[("X", StringTensorType([None, 2]))], target_opset=17)
    x = s[:6].copy()
    x[0, 0] = "unseen"
    _assert_same(model, {"X": x})


def _one_node(op: str, x_type: int, **attrs: Any) -> onnx.ModelProto:
    """A model of one ai.onnx.ml node ``X -> Y`` (Y float32, shapes left to the op)."""
    node = helper.make_node(op, ["X"], ["Y"], domain=ML, **attrs)
    g = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("X", x_type, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)]
    )


@pytest.mark.parametrize("shape", [(5,), (5, 2), (1, 1), (40, 3)])
def test_one_hot_encoder_string_edges_match_onnxruntime(shape: tuple[int, ...]) -> None:
    """Empty strings, non-ASCII text and values unseen at fit time, in every input rank,
    a few elements (a Python loop) and many (one map over the lookup, one scatter)."""
    model = _one_node("OneHotEncoder", TensorProto.STRING, zeros=1,
                      cats_strings=["", "café", "red", "日本"])  # fmt: skip
    pool = np.array(["", "café", "red", "日本", "unseen", "Red", " red"], dtype=object)
    x = pool[np.arange(int(np.prod(shape))) % len(pool)].reshape(shape)
    _assert_same(model, {"X": x})


def test_one_hot_encoder_strict_and_odd_elements() -> None:
    """``zeros=0`` refuses an unseen string; None in an object array is an unseen value."""
    strict = _build("OneHotEncoder", {"cats_strings": ["a", "b"], "zeros": 0}, 1)
    np.testing.assert_array_equal(strict(np.array([["b"]], dtype=object)), [[[0.0, 1.0]]])
    with pytest.raises(ValueError, match="not among the categories"):
        strict(np.array(["a", "zz"], dtype=object))
    loose = _build("OneHotEncoder", {"cats_strings": ["a", "b"]}, 1)
    np.testing.assert_array_equal(loose(np.array([None, "a"], dtype=object)), [[0, 0], [1, 0]])
    many = np.array([None, "a", "b", "zz"] * 10, dtype=object)  # the vectorized form
    np.testing.assert_array_equal(loose(many), [[0, 0], [1, 0], [0, 1], [0, 0]] * 10)
    with pytest.raises(ValueError, match="not among the categories"):
        strict(many)
    with pytest.raises(TypeError):
        loose(np.array([1.0, 2.0], np.float32))


# -- hand-built tree ensembles --------------------------------------------------------------


#: Four trees of depth 4 at most: mixed node modes, missing-value tracks.
_DEPTHS = [4] * 4


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor_random(seed: int, aggregate: str, jit: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """On the compiled walk (``tree_jit``) and NumPy's; each walk checked to have run."""
    walks = spy_compiled(monkeypatch, tree_jit, "walker")
    rng = np.random.RandomState(seed)
    node = random_regressor(rng, seed, aggregate, _DEPTHS)
    x_info = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    y_info = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])
    x = tree_inputs(rng, 50)
    _assert_same(_model(node, [x_info], [y_info], 3), {"X": x})
    assert bool(walks) == (jit == "jit")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
def test_tree_ensemble_classifier_random(seed: int, transform: str, jit: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    walks = spy_compiled(monkeypatch, tree_jit, "walker")
    rng = np.random.RandomState(seed)
    node, n_classes = random_classifier(rng, seed, transform, _DEPTHS)
    x_info = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    outs = [
        helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_classes]),
    ]
    x = tree_inputs(rng, 50)
    _assert_same(_model(node, [x_info], outs, 3), {"X": x})
    assert bool(walks) == (jit == "jit")


def _build(op: str, attrs: dict[str, Any], opset: int, n_in: int = 1, n_out: int = 1) -> Any:
    node = Node(
        op,
        [Value(f"x{i}") for i in range(n_in)],
        [Value(f"y{i}") for i in range(n_out)],
        attrs,
        name="n",
        domain=ML,
        opset=opset,
    )
    return default_registry().lookup(ML, op, opset).build(KernelContext(node))


def test_tree_ensemble_v5_follows_spec_codes() -> None:
    """post_transform 1 is SOFTMAX and 2 LOGISTIC in ai.onnx.ml 5 (onnxruntime swaps them);
    BRANCH_MEMBER compares values exactly."""
    attrs = dict(
        nodes_featureids=[0, 0],
        nodes_splits=np.array([1.0, np.nan], np.float32),
        nodes_modes=np.array([0, 6], np.uint8),
        nodes_truenodeids=[0, 1],
        nodes_trueleafs=[1, 1],
        nodes_falsenodeids=[1, 2],
        nodes_falseleafs=[0, 1],
        leaf_targetids=[0, 1, 0],
        leaf_weights=np.array([1.0, 2.0, 3.0], np.float32),
        tree_roots=[0],
        n_targets=2,
        membership_values=np.array([2.0, 5.0, np.nan], np.float32),
    )
    x = np.array([[0.5], [2.0], [5.0], [4.5]], np.float32)
    raw = _build("TreeEnsemble", {**attrs, "post_transform": 0}, 5)(x)
    np.testing.assert_array_equal(raw, [[1, 0], [0, 2], [0, 2], [3, 0]])
    assert raw.dtype == np.float32
    soft = _build("TreeEnsemble", {**attrs, "post_transform": 1}, 5)(x)
    e = np.exp(raw - raw.max(axis=1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(axis=1, keepdims=True), rtol=1e-6)
    logi = _build("TreeEnsemble", {**attrs, "post_transform": 2}, 5)(x)
    np.testing.assert_allclose(logi, 1 / (1 + np.exp(-raw)), rtol=1e-6)
    out64 = _build("TreeEnsemble", {**attrs, "aggregate_function": 3}, 5)(x.astype(np.float64))
    assert out64.dtype == np.float64


def test_forest_large_batch_matches_small(cls3: Any) -> None:
    """Rows are walked in blocks; a big batch gives the same leaves as row by row."""
    x, y = cls3
    est = ensemble.RandomForestRegressor(60, max_depth=8, random_state=0).fit(x, y)
    model = _skl(est, x)
    big = np.tile(x, (10, 1))
    got = _ours(model, {"X": big})[0]
    rows = np.concatenate([_ours(model, {"X": big[i : i + 1]})[0] for i in range(0, 1200, 97)])
    np.testing.assert_allclose(got[::97], rows, rtol=1e-6)


# -- encoders and small kernels -----------------------------------------------------------


def test_label_encoder_numeric_nan_key_and_default() -> None:
    fn = _build(
        "LabelEncoder",
        {"keys_floats": [1.5, float("nan"), -2.0], "values_int64s": [1, 2, 3], "default_int64": 9},
        4,
    )
    x = np.array([[1.5, np.nan], [0.0, -2.0]], np.float32)
    out = fn(x)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [[1, 2], [9, 3]])


def test_label_encoder_v1_both_directions() -> None:
    fn = _build("LabelEncoder", {"classes_strings": ["a", "b"], "default_string": "?"}, 1)
    np.testing.assert_array_equal(fn(np.array(["b", "x"], dtype=object)), [1, -1])
    assert fn(np.array([0, 5], dtype=np.int64)).tolist() == ["a", "?"]


def test_zipmap_and_dict_vectorizer() -> None:
    zm = _build("ZipMap", {"classlabels_int64s": [4, 5]}, 1)
    out = zm(np.array([[0.25, 0.75], [1.0, 0.0]], np.float32))
    assert out == [{4: 0.25, 5: 0.75}, {4: 1.0, 5: 0.0}]
    dv = _build("DictVectorizer", {"string_vocabulary": ["a", "b", "c"]}, 1)
    np.testing.assert_array_equal(dv({"c": 2.0, "a": 1.0, "zz": 5.0}), [[1.0, 0.0, 2.0]])


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("shape", [(1, 10), (7, 3), (2, 5000), (4,), (3, 0)])
def test_normalizer_matches_onnxruntime(norm: str, shape: tuple[int, ...], jit: str) -> None:
    """Every norm on one row, many rows, a long sparse row (a TF-IDF vocabulary), 1-D input
    and no columns; zero, negative and NaN rows; the compiled pass and NumPy's."""
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = (rng.standard_normal(shape) * (rng.random(shape) < 0.3)).astype(np.float32)
    if x.ndim == 2 and x.shape[0] > 2 and x.shape[1]:
        x[0] = 0.0
        x[1] = -np.abs(x[1]) - 1
        x[2, 0] = np.nan
    model = _one_node("Normalizer", TensorProto.FLOAT, norm=norm)
    want = _ort(model, {"X": x})[0]
    got = np.asarray(_ours(model, {"X": x})[0])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_normalizer_zero_row_and_out() -> None:
    fn = _build("Normalizer", {"norm": "L2"}, 1)
    x = np.array([[0, 0, 0], [3, -4, 0]], np.int64)
    out = np.empty((2, 3), np.float32)
    assert fn(x, out=out) is out
    np.testing.assert_allclose(out, np.array([[0.0, 0.0, 0.0], [0.6, -0.8, 0.0]]), rtol=1e-6)


def test_scaler_out_and_dtype() -> None:
    fn = _build("Scaler", {"offset": [1.0, 2.0], "scale": [2.0, 0.5]}, 1)
    x = np.array([[1.0, 4.0], [3.0, 0.0]])
    y = fn(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, [[0, 1], [4, -1]])
    out = np.empty((2, 2), np.float32)
    assert fn(x.astype(np.float32), out=out) is out
    np.testing.assert_allclose(out, y)


def test_one_hot_encoder_unknown_with_zeros_0_raises() -> None:
    fn = _build("OneHotEncoder", {"cats_int64s": [1, 2], "zeros": 0}, 1)
    np.testing.assert_array_equal(fn(np.array([2, 1])), [[0, 1], [1, 0]])
    with pytest.raises(ValueError):
        fn(np.array([3]))


def test_unknown_attribute_value_fails_at_load() -> None:
    with pytest.raises(tfrt_py.errors.UnsupportedOpError):
        _build("Normalizer", {"norm": "L3"}, 1)


def test_feature_vectorizer_pads_and_truncates() -> None:
    fn = _build("FeatureVectorizer", {"inputdimensions": [3, 1]}, 1, n_in=2)
    out = fn(np.array([[1, 2], [3, 4]], np.int64), np.array([[5.0, 6.0], [7.0, 8.0]]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 2, 0, 5], [3, 4, 0, 7]])


def test_model_level_sanity_labels_and_shapes(cls3: Any) -> None:
    x, y = cls3
    est = tree.DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, y)
    label, proba = _ours(_skl(est, x, False), {"X": x[:5]})
    assert label.dtype == np.int64 and label.shape == (5,)
    assert proba.dtype == np.float32 and proba.shape == (5, 3)
    np.testing.assert_array_equal(label, est.predict(x[:5]))


def test_cast_map_dense_and_sparse() -> None:
    dense = _build("CastMap", {"cast_to": "TO_FLOAT"}, 1)
    np.testing.assert_array_equal(dense({3: 1.5, 1: 2.0}), [[2.0, 1.5]])
    sparse = _build("CastMap", {"cast_to": "TO_INT64", "map_form": "SPARSE", "max_map": 4}, 1)
    out = sparse({3: 1.5, 1: 2.0})
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [[0, 2, 0, 1]])


@pytest.mark.parametrize(
    "labels",
    [[0, 1, 2], ["a"], ["x'}; import os #", "b\n", "{K0}"], [3, 3, 4], list(range(70))],
)
def test_zipmap_rows_make_the_same_dicts_as_dict_zip(labels: list[Any]) -> None:
    """The generated dict display (labels bound as variables: a label that looks like code
    is just a key), and the dict(zip) fallback for repeated or many labels."""
    from tfrt_py.kernels.ml.encode import zipmap_rows

    scores = np.random.default_rng(5).random((4, len(labels))).astype(np.float32)
    got = zipmap_rows(labels)(scores)
    want = [dict(zip(labels, r)) for r in scores.tolist()]
    assert got == want
    assert [list(d) for d in got] == [list(w) for w in want]  # key order too
    assert zipmap_rows(labels)(scores[:0]) == []
