"""The ``fuse_ml`` pass: skl2onnx's nearest-neighbour distance Scan becomes one
``PairwiseSqDist`` (same values as the Scan, bit for bit); look-alike Scans are left alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import spy_compiled
from tests.support.paths import DATA
from tests.support.spies import record_calls
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.kernels.fused import ml as fused_ml
from tfrt_py.kernels.fused.ml import CHUNK_ELEMENTS, pairwise_sq_dist
from tfrt_py.kernels.ml.pairwise_jit import MAX_K

KNN = str(DATA / "ml_zoo" / "sklearn_knn.onnx")
NO_ML = set(PASSES) - {"fuse_ml"}


def _report(model: tfrt_py.Model) -> str:
    return next(r.summary for r in model.prepared.reports if r.name == "fuse_ml")


def _ops(model: tfrt_py.Model) -> list[str]:
    return [n.op_type for n in model.prepared.graph.nodes]


def _features(model: tfrt_py.Model) -> int:
    """The KNN model's number of features (its input's second dim)."""
    shape = model.inputs[0].shape
    assert shape is not None and isinstance(shape[1], int)
    return shape[1]


def test_the_exported_knn_scan_is_fused_with_the_scans_values(jit: str) -> None:
    fused = tfrt_py.load(KNN, executor="sync")
    plain = tfrt_py.load(KNN, executor="sync", optimize=NO_ML)
    assert _report(fused).startswith("1 pairwise-distance Scan(s) -> PairwiseSqDist")
    assert "Scan" not in _ops(fused) and "PairwiseSqDist" in _ops(fused)
    assert "Scan" in _ops(plain)
    rng = np.random.default_rng(0)
    features = _features(fused)
    for n in (1, 7, 300):  # 300 rows: several chunks of the training rows
        x = {"X": rng.standard_normal((n, features)).astype(np.float32)}
        got, want = fused.run(x), plain.run(x)
        assert list(got) == list(want)
        for k in want:
            if isinstance(want[k], list):  # ZipMap
                assert got[k] == want[k]
            else:
                np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(500, 1, 20), (37, 300, 20), (3, 2, 1), (0, 4, 3), (5, 0, 3), (2 * CHUNK_ELEMENTS + 1, 1, 1),
     (9, 13, 7), (9, 13, 8), (9, 13, 9), (4, 50, 100), (4, 50, 128), (4, 50, 129)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pairwise_sq_dist_is_the_scans_arithmetic(
    m: int, n: int, k: int, dtype: type, jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bit for bit the Scan body's values, compiled (NumPy's pairwise summation order
    replayed, up to MAX_K features) and NumPy; the compiled kernel serves what it takes."""
    calls = spy_compiled(monkeypatch, fused_ml, "pairwise_sq_dist_f")
    rng = np.random.default_rng(m + n + k)
    y: np.ndarray = rng.standard_normal((m, k)).astype(dtype)
    x: np.ndarray = (3 * rng.standard_normal((n, k))).astype(dtype)
    want: np.ndarray = np.empty((m, n), dtype)
    for i in range(m):  # the Scan body, one row per iteration
        want[i] = np.add.reduce(np.square(x - y[i]), axis=1, dtype=dtype)
    got = pairwise_sq_dist(y, x)
    assert got.shape == (m, n) and got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    compiled = jit == "jit" and m * n > 0 and k <= MAX_K
    assert bool(calls) == compiled


def _scan_model(
    *,
    body_op: str = "Sub",
    swap: bool = False,
    keepdims: int = 0,
    axes: int = 1,
    axes_input: bool = False,
    read_state: bool = True,
) -> bytes:
    """skl2onnx's distance Scan (or a variation of it): outputs the distances and the
    state."""
    opset = 18 if axes_input else 15
    a, b = ("row", "state_in") if swap else ("state_in", "row")
    nodes = [
        helper.make_node("Identity", ["state_in"], ["state_out"]),
        helper.make_node(body_op, [a, b], ["diff"]),
    ]
    rss = "ReduceSumSquare"
    if axes_input:
        axes_value = numpy_helper.from_array(np.array([axes], np.int64))
        nodes.append(helper.make_node("Constant", [], ["axes"], value=axes_value))
        nodes.append(helper.make_node(rss, ["diff", "axes"], ["red"], keepdims=keepdims))
    else:
        nodes.append(helper.make_node(rss, ["diff"], ["red"], axes=[axes], keepdims=keepdims))
    nodes.append(helper.make_node("Identity", ["red"], ["scan_out"]))
    body = helper.make_graph(
        nodes,
        "body",
        [helper.make_tensor_value_info("state_in", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("state_out", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, None)],
    )  # fmt: skip
    y = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    outs = ["S", "D"]
    graph = helper.make_graph(
        [helper.make_node("Scan", ["X", "Y"], outs, body=body, num_scan_inputs=1)],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("D", TensorProto.FLOAT, None)]
        + ([helper.make_tensor_value_info("S", TensorProto.FLOAT, ["n", 4])] if read_state else []),
        [numpy_helper.from_array(y, "Y")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("kw", "fused"),
    [
        ({}, True),
        ({"swap": True}, True),
        ({"axes": -1}, True),
        ({"axes_input": True}, True),
        ({"read_state": False}, True),
        ({"body_op": "Add"}, False),
        ({"keepdims": 1}, False),
        ({"axes": 0}, False),
    ],
)
def test_only_the_distance_scan_is_fused_and_answers_agree(kw: dict, fused: bool) -> None:
    data = _scan_model(**kw)
    model = tfrt_py.load(data, executor="sync")
    assert ("PairwiseSqDist" in _ops(model)) is fused
    assert ("Scan" in _ops(model)) is not fused
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    got = model.run({"X": x})
    want = sess.run(None, {"X": x})
    for (name, g), w in zip(got.items(), want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=name)
    if kw.get("read_state", True):
        np.testing.assert_array_equal(got["S"], x)
        assert not np.shares_memory(got["S"], x)


def test_the_knn_model_reads_no_environment_per_call(
    jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled distance and TopK kernels are looked up at load: a call does not
    consult ``$TFRT_PY_JIT`` (a lookup on the hot path)."""
    from tfrt_py.kernels.lib import jit as jit_module

    model = tfrt_py.load(KNN, executor="sync")
    features = _features(model)
    x = {model.inputs[0].name: np.ones((3, features), np.float32)}
    model.run(x)
    reads = record_calls(monkeypatch, jit_module, "jit_enabled", lambda *a: 1)
    for _ in range(3):
        model.run(x)
    assert reads == []


def _label_lookup_model(
    *,
    classes: np.ndarray,
    target: list[int] | None = None,
    cast: bool = True,
    expose: bool = False,
    from_scores: bool = True,
) -> bytes:
    """skl2onnx's label lookup: ``ArrayFeatureExtractor(classes, ArgMax(S))`` (or of the
    indices fed directly), a Cast, then ``Reshape(., target)``; ``expose`` also makes the
    lookup a graph output."""
    target = [-1] if target is None else target
    nodes = []
    if from_scores:
        nodes.append(helper.make_node("ArgMax", ["S"], ["idx"], axis=1, keepdims=1))
    ml = "ai.onnx.ml"
    nodes.append(
        helper.make_node("ArrayFeatureExtractor", ["classes", "idx"], ["found"], domain=ml)
    )
    flat_in = "found"
    if cast:
        nodes.append(helper.make_node("Cast", ["found"], ["as_float"], to=TensorProto.FLOAT))
        flat_in = "as_float"
    nodes.append(helper.make_node("Reshape", [flat_in, "target"], ["label"]))
    elem = TensorProto.FLOAT if cast else helper.np_dtype_to_tensor_dtype(classes.dtype)
    outs = [helper.make_tensor_value_info("label", elem, None)]
    if expose:
        outs.append(helper.make_tensor_value_info("found", helper.np_dtype_to_tensor_dtype(
            classes.dtype), None))  # fmt: skip
    inp = (helper.make_tensor_value_info("S", TensorProto.FLOAT, ["n", 4]) if from_scores
           else helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 1]))  # fmt: skip
    graph = helper.make_graph(
        nodes, "lookup", [inp], outs,
        [numpy_helper.from_array(classes, "classes"),
         numpy_helper.from_array(np.array(target, np.int64), "target")],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ml, 3)]
    )
    model.ir_version = 8
    return model.SerializeToString()


CLASSES = np.array([3, 7, 11, 20], np.int64)


@pytest.mark.parametrize(
    ("kw", "gathered"),
    [
        ({}, True),
        ({"cast": False}, True),
        # a shape of its own: the same elements in the same order from (1, N) or (N, 1)
        ({"target": [1, -1]}, True),
        ({"target": [-1, 1]}, True),  # an isotonic calibrator's (CalibratedClassifierCV)
        ({"target": [0, -1]}, False),  # 0 copies a dim of the (1, N) layout
        ({"expose": True}, False),  # the lookup itself is read in its (1, N) layout
        ({"classes": np.arange(8, dtype=np.int64).reshape(2, 4)}, False),  # not a 1-D table
    ],
)
def test_only_a_flattened_label_lookup_becomes_a_gather(kw: dict, gathered: bool) -> None:
    data = _label_lookup_model(**{"classes": CLASSES, **kw})
    model = tfrt_py.load(data, executor="sync")
    plain = tfrt_py.load(data, executor="sync", optimize=NO_ML)
    ops = _ops(model)
    assert ("Gather" in ops) is gathered and ("ArrayFeatureExtractor" in ops) is not gathered
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for n in (1, 6):
        feeds = {"S": rng.standard_normal((n, 4)).astype(np.float32)}
        want = sess.run(None, feeds)
        got, unfused = model.run(feeds), plain.run(feeds)
        for (name, g), w in zip(got.items(), want):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            np.testing.assert_array_equal(g, w, err_msg=name)
            np.testing.assert_array_equal(unfused[name], w, err_msg=name)


@pytest.mark.parametrize("executor", ["sync", "native"])
def test_a_gathered_label_lookup_still_rejects_indices_out_of_range(executor: str) -> None:
    data = _label_lookup_model(classes=CLASSES, from_scores=False)
    model = tfrt_py.load(data, executor=executor, native="eager")
    assert "Gather" in _ops(model)
    good = {"idx": np.array([[0], [3], [-1]], np.int64)}
    want = CLASSES[[0, 3, -1]].astype(np.float32)
    np.testing.assert_array_equal(model.run(good)["label"], want)
    for bad in ([[4]], [[0], [-5]], [[2**40]]):
        with pytest.raises(tfrt_py.errors.TfrtError, match=r"out of (range|bounds)"):
            model.run({"idx": np.array(bad, np.int64)})
    np.testing.assert_array_equal(model.run(good)["label"], want)  # still usable
