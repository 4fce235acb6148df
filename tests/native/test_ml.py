"""The native tier on real exporters' classic-ML models (issue 14): every model of
``tests/data/ml_zoo`` (made by ``benchmarks/zoo_build.py --small``: skl2onnx, onnxmltools'
LightGBM and XGBoost; dynamic batch dims) agrees with onnxruntime on every executor --
labels exactly, scores to float32 tolerance -- including second calls at other batch
sizes, big batches split over threads, and auto's measured choice."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.paths import DATA as TEST_DATA
from tests.support.trees import ML, random_classifier, random_regressor, tree_inputs

ZOO = str(TEST_DATA / "ml_zoo")
MODELS = sorted(f[:-5] for f in os.listdir(ZOO) if f.endswith(".onnx"))
#: Models whose ops do not all lower (KNN: Scan, TopK, Equal): native declines.
DECLINED = {"sklearn_knn"}
BATCHES = (1, 37, 5, 1, 300)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)


def _path(name: str) -> str:
    return os.path.join(ZOO, name + ".onnx")


TREES = ("forest", "boost", "lightgbm", "rf_", "gb_")


def _feeds(sess: Any, n: int, seed: int, name: str = "") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = sess.get_inputs()[0].shape[1]
    x = rng.standard_normal((n, f)).astype(np.float32)
    if n > 3 and any(t in name for t in TREES):
        x[1, :] = np.nan  # missing values: the trees' missing-value tracks
    return {"X": x}


def assert_same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert list(got) == list(want), what
    for k, w in want.items():
        g = got[k]
        if isinstance(w, list):  # ZipMap: one dict per row
            assert isinstance(g, list) and len(g) == len(w), (what, k)
            for dg, dw in zip(g, w):
                assert list(dg) == list(dw), (what, k)
                np.testing.assert_allclose(list(dg.values()), list(dw.values()), rtol=1e-4,
                                           atol=1e-5, err_msg=f"{what} {k}")  # fmt: skip
            continue
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (what, k, g.shape, w.shape)
        if w.dtype.kind in "OUS":
            assert g.astype(str).tolist() == w.astype(str).tolist(), (what, k)
        elif w.dtype.kind == "f":
            assert g.dtype == w.dtype, (what, k)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what} {k}")
        else:
            assert g.dtype == w.dtype, (what, k)
            np.testing.assert_array_equal(g, w, err_msg=f"{what} {k}")


@pytest.mark.parametrize("executor", ["sync", "native", "auto"])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.compiles
def test_zoo_model_agrees_with_onnxruntime(name: str, executor: str) -> None:
    if executor == "native" and name in DECLINED:
        with pytest.raises(tfrt_py.errors.TfrtError):
            tfrt_py.load(_path(name), executor="native")
        return
    model = tfrt_py.load(_path(name), executor=executor, native="eager")
    if executor != "sync":
        assert model.executor == ("sync" if name in DECLINED else "native"), model.describe()
    if model.native is not None:
        assert model.native.form == "rows", model.describe()
        assert model.native.state == "ready", model.native.error
    sess = ort.InferenceSession(_path(name), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for i, n in enumerate(BATCHES):
        feeds = _feeds(sess, n, i, name)
        want = dict(zip(names, sess.run(None, feeds)))
        for call in range(3 if executor == "auto" else 2):  # auto: the trial's candidates
            assert_same(model.run(feeds), want, f"{name} {executor} batch {n} call {call}")
    if model.native is not None:
        assert model.native.error is None, model.native.error


@pytest.mark.compiles
def test_auto_measures_and_says_so() -> None:
    name = "sklearn_random_forest"
    model = tfrt_py.load(_path(name), native="eager")
    sess = ort.InferenceSession(_path(name), providers=["CPUExecutionProvider"])
    for n in (1, 300):
        feeds = _feeds(sess, n, 0)
        for _ in range(20):
            model.run(feeds)
    text = model.describe()
    assert "measured (batch 1+ rows)" in text and "native " in text and "sync " in text, text
    assert "measured (batch 256+ rows)" in text and "native threads" in text, text
    assert "every batch size" in text


@pytest.mark.compiles
def test_explicit_native_never_measures() -> None:
    model = tfrt_py.load(_path("sklearn_svc_proba"), executor="native", native="eager")
    sess = ort.InferenceSession(_path("sklearn_svc_proba"), providers=["CPUExecutionProvider"])
    for _ in range(10):
        model.run(_feeds(sess, 4, 0))
    assert "measured (" not in model.describe()  # no tier measurement on explicit native


@pytest.mark.compiles
def test_bad_feeds_raise_like_sync() -> None:
    native = tfrt_py.load(_path("lightgbm_classifier"), executor="native", native="eager")
    sync = tfrt_py.load(_path("lightgbm_classifier"), executor="sync")
    for feeds in ({"X": np.zeros((2, 3), np.float32)}, {}, {"X": np.zeros((2, 8), np.int8)}):
        try:
            want: Any = sync.run(feeds)
        except tfrt_py.errors.TfrtError as e:
            with pytest.raises(type(e)):
                native.run(feeds)
            continue
        assert_same(native.run(feeds), want, "converted feed")
    x = np.random.default_rng(3).standard_normal((9, 16)).astype(np.float32)[:, ::2]
    assert_same(native.run({"X": x}), sync.run({"X": x}), "strided feed")


# -- hand-built forests: every node mode, missing-value tracks, aggregates, base values ----

#: Eleven trees of different depths (more than one group of lanes).
_DEPTHS = [1 + t % 5 for t in range(11)]


def _hand_model(node: Any, outs: list[Any]) -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    g = helper.make_graph([node], "g", [x], outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 3)])  # fmt: skip
    m.ir_version = 9
    return m.SerializeToString()


#: Random ensembles per case: the first seed in ``make test``, the others (each a native
#: compile of a new ensemble, ~4 s) in ``make test-slow``.
_SEEDS = [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3))]


def _hand_feeds(rng: np.random.RandomState, n: int) -> dict[str, np.ndarray]:
    return {"X": tree_inputs(rng, n)}


@pytest.mark.parametrize("seed", _SEEDS[:3])
@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.compiles
def test_hand_built_regressor(seed: int, aggregate: str) -> None:
    from onnx import TensorProto, helper

    rng = np.random.RandomState(seed)
    node = random_regressor(rng, seed, aggregate, _DEPTHS)
    data = _hand_model(node, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])])
    model = tfrt_py.load(data, executor="native", native="eager")
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for n in (1, 50):
        feeds = _hand_feeds(rng, n)
        assert_same(model.run(feeds), {"Y": sess.run(None, feeds)[0]}, f"{aggregate} {n}")


@pytest.mark.parametrize("seed", _SEEDS)
@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.compiles
def test_hand_built_classifier(seed: int, transform: str) -> None:
    from onnx import TensorProto, helper

    rng = np.random.RandomState(seed)
    node, n_classes = random_classifier(rng, seed, transform, _DEPTHS)
    outs = [helper.make_tensor_value_info("L", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_classes])]  # fmt: skip
    data = _hand_model(node, outs)
    model = tfrt_py.load(data, executor="native", native="eager")
    sync = tfrt_py.load(data, executor="sync")
    for n in (1, 50):
        feeds = _hand_feeds(rng, n)
        assert_same(model.run(feeds), sync.run(feeds), f"{transform} {n}")
