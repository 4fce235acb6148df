"""Big batches in chunks of rows (tfrt_py/row_split.py): graphs whose rows are independent
run a big batch chunk by chunk with the answers of one whole call and of onnxruntime, on
every call path (plain, a deadline, the caller's output buffers, asyncio); graphs that
mix rows -- each way the static check refuses -- are never split, so a big batch still
answers as onnxruntime does."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py import row_split
from tfrt_py.errors import InputError

_RNG = np.random.default_rng(54)
C, HW = 4, 6


def _model(nodes: list[Any], inits: dict[str, np.ndarray], out_shape: list[Any],
           extra_inputs: tuple[Any, ...] = (), opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C, HW, HW])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    g = helper.make_graph(nodes, "g", [x, *extra_inputs], [y],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _cnn() -> onnx.ModelProto:
    """Conv + Relu, a second Conv with a residual Add, a pool and a Gemm: rows apart."""
    w1 = (_RNG.standard_normal((8, C, 3, 3)) * 0.2).astype(np.float32)
    w2 = (_RNG.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    fc = (_RNG.standard_normal((8, 5)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a2"]),
        helper.make_node("GlobalAveragePool", ["a2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"]),
    ]
    return _model(nodes, {"w1": w1, "w2": w2, "fc": fc}, ["N", 5])


def _small_chunks(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Chunks of ``rows`` rows for this test's models (their largest value: 8 x 6 x 6
    floats a row)."""
    monkeypatch.setattr(row_split, "CHUNK_BYTES", rows * 8 * HW * HW * 4)


def _spy_chunks(monkeypatch: pytest.MonkeyPatch, model: tfrt_py.Model) -> list[int]:
    """The rows of each call the executor gets."""
    seen: list[int] = []
    rt = model.runtime
    for name in ("run", "run_call"):
        real = getattr(rt, name)

        def spy(feeds: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            seen.append(feeds["x"].shape[0])
            return _real(feeds, *a, **k)

        monkeypatch.setattr(rt, name, spy)
    return seen


def _ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def test_a_big_batch_runs_in_chunks_with_the_whole_calls_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _small_chunks(monkeypatch, 2)
    m = _cnn()
    model = tfrt_py.load(m, executor="sync", threads=1)
    assert "calls of more than 2 rows run as chunks of at most 2" in model.describe()
    seen = _spy_chunks(monkeypatch, model)
    x = _RNG.standard_normal((5, C, HW, HW)).astype(np.float32)
    got = model.run({"x": x})["y"]
    assert seen == [1, 2, 2]  # balanced chunks
    np.testing.assert_allclose(got, _ort(m, {"x": x}), rtol=1e-4, atol=1e-5)
    seen.clear()
    monkeypatch.setenv("TFRT_PY_ROW_SPLIT", "0")
    whole = model.run({"x": x})["y"]
    assert seen == [5]
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
    monkeypatch.delenv("TFRT_PY_ROW_SPLIT")
    seen.clear()
    assert model.run({"x": x[:2]})["y"].shape == (2, 5) and seen == [2]  # few rows: whole


def test_every_call_path_splits_with_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deadline (``run_call`` for each chunk), the caller's output buffer (each chunk
    writes its rows in place), and ``run_async``."""
    _small_chunks(monkeypatch, 3)
    m = _cnn()
    model = tfrt_py.load(m, executor="sync", threads=1)
    seen = _spy_chunks(monkeypatch, model)
    x = _RNG.standard_normal((7, C, HW, HW)).astype(np.float32)
    want = _ort(m, {"x": x})
    np.testing.assert_allclose(model.run({"x": x}, timeout=60)["y"], want, rtol=1e-4, atol=1e-5)
    assert seen == [2, 2, 3]
    buf = np.full((7, 5), np.nan, np.float32)
    out = model.run({"x": x}, {"y": buf})
    assert out["y"] is buf
    np.testing.assert_allclose(buf, want, rtol=1e-4, atol=1e-5)
    got = asyncio.run(model.run_async({"x": x}))["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert len(seen) == 9


def test_calls_the_split_cannot_serve_run_whole_and_report_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A buffer of other rows and a feed of the wrong rank are the whole call's errors;
    a list feed runs whole."""
    _small_chunks(monkeypatch, 2)
    model = tfrt_py.load(_cnn(), executor="sync", threads=1)
    seen = _spy_chunks(monkeypatch, model)
    x = _RNG.standard_normal((5, C, HW, HW)).astype(np.float32)
    with pytest.raises(InputError):
        model.run({"x": x}, {"y": np.zeros((4, 5), np.float32)})
    with pytest.raises(InputError):
        model.run({"x": x[:, :, :, 0]})
    assert seen == [5, 5]
    assert model.run({"x": x})["y"].shape == (5, 5)  # still usable


def test_a_row_free_input_is_passed_whole_to_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    _small_chunks(monkeypatch, 2)
    w = (_RNG.standard_normal((8, C, 3, 3)) * 0.2).astype(np.float32)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "b"], ["y"])]  # fmt: skip
    m = _model(nodes, {"w": w}, ["N", 8, HW, HW], (b,))
    model = tfrt_py.load(m, executor="sync", threads=1)
    assert "chunks" in model.describe()
    feeds = {"x": _RNG.standard_normal((5, C, HW, HW)).astype(np.float32),
             "b": _RNG.standard_normal((8, 1, 1)).astype(np.float32)}  # fmt: skip
    np.testing.assert_allclose(model.run(feeds)["y"], _ort(m, feeds), rtol=1e-4, atol=1e-5)


def _mixing_cases() -> list[tuple[str, list[Any], dict[str, np.ndarray], list[Any]]]:
    """Graphs whose rows mix (or may): each refused by the static check."""
    w = (_RNG.standard_normal((8, C, 3, 3)) * 0.2).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    flat = helper.make_node("Flatten", ["c"], ["f"])
    per_row = 8 * HW * HW
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    return [
        ("softmax over rows", [conv, flat, helper.make_node("Softmax", ["f"], ["y"], axis=0)],
         {"w": w}, ["N", per_row]),
        ("batch statistics", [helper.make_node(
            "BatchNormalization", ["x", "s", "o", "mu", "var"], ["y", "m2", "v2"],
            training_mode=1)],
         {"s": np.ones(C, np.float32), "o": np.zeros(C, np.float32),
          "mu": np.zeros(C, np.float32), "var": np.ones(C, np.float32)}, ["N", C, HW, HW]),
        ("rows reversed by a constant shape", [conv, flat, helper.make_node(
            "Reshape", ["f", "shape"], ["y"])], {"w": w, "shape": i64([-1, per_row // 2])},
         ["M", per_row // 2]),
        ("rows shifted by pads", [conv, helper.make_node("Pad", ["c", "pads"], ["y"])],
         {"w": w, "pads": i64([1, 0, 0, 0, -1, 0, 0, 0])}, ["N", 8, HW, HW]),
        ("a running sum over rows", [conv, helper.make_node("CumSum", ["c", "ax"], ["y"])],
         {"w": w, "ax": i64(0)}, ["N", 8, HW, HW]),
        ("rows reversed by a slice", [conv, helper.make_node(
            "Slice", ["c", "st", "en", "ax1", "step"], ["y"])],
         {"w": w, "st": i64([-1]), "en": i64([-(2**62)]), "ax1": i64([0]), "step": i64([-1])},
         ["N", 8, HW, HW]),
        ("a product over rows", [conv, flat, helper.make_node("Transpose", ["f"], ["ft"]),
                                 helper.make_node("MatMul", ["f", "ft"], ["y"])],
         {"w": w}, ["N", "N"]),
        ("layer norm over everything", [conv, helper.make_node(
            "LayerNormalization", ["c", "s8"], ["y"], axis=0)],
         {"w": w, "s8": np.ones((8, HW, HW), np.float32)}, ["N", 8, HW, HW]),
    ]  # fmt: skip


@pytest.mark.parametrize("case", _mixing_cases(), ids=lambda c: c[0])
def test_graphs_that_mix_rows_are_never_split(monkeypatch: pytest.MonkeyPatch, case: Any) -> None:
    _small_chunks(monkeypatch, 2)
    _name, nodes, inits, out_shape = case
    m = _model(nodes, inits, out_shape)
    model = tfrt_py.load(m, executor="sync", threads=1)
    assert "rows: calls run whole" in model.describe()
    seen = _spy_chunks(monkeypatch, model)
    x = _RNG.standard_normal((6, C, HW, HW)).astype(np.float32)
    got = model.run({"x": x})["y"]
    assert seen == [6]
    if _name == "batch statistics":  # the spec's Y (onnxruntime's training mode is not it)
        mean, var = x.mean(axis=(0, 2, 3), keepdims=True), x.var(axis=(0, 2, 3), keepdims=True)
        want = (x - mean) / np.sqrt(var + 1e-5)
    else:
        want = _ort(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_check_names_why_a_graph_is_refused() -> None:
    w = (_RNG.standard_normal((8, C, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Reshape", ["c", "s"], ["y"])]  # fmt: skip
    model = tfrt_py.load(_model(nodes, {"w": w}, ["N", 8, HW, HW]), executor="sync", threads=1)
    split, why = row_split.plan(model.graph)
    assert split is None and "Shape" in why
    # rows of a few bytes (an MLP's): no split, whose check would cost every small call
    m = _model([helper.make_node("Relu", ["x"], ["y"])], {}, ["N", C, HW, HW])
    split, why = row_split.plan(tfrt_py.load(m, executor="sync", threads=1).graph)
    assert split is None and "a chunk would hold" in why


def test_calls_on_more_than_one_thread_run_whole() -> None:
    """Chunks pay on one thread only (row_split.plan): a model loaded with two runs whole,
    and says why."""
    from tfrt_py.concurrency.threads import threads

    two = tfrt_py.load(_cnn(), executor="sync", threads=2)
    if threads() < 2:
        pytest.skip("this host gives a call one thread (one CPU)")
    assert "rows: calls run whole (calls run on 2 threads" in two.describe()


def test_a_pre_activation_batch_norm_keeps_the_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BatchNormalization no conv takes (fuse_vision's BatchNormAct) keeps rows apart:
    the batch still runs in chunks."""
    _small_chunks(monkeypatch, 2)
    w = (_RNG.standard_normal((8, 2 * C, 3, 3)) * 0.2).astype(np.float32)
    stats = {k: _RNG.uniform(0.5, 1.5, 2 * C).astype(np.float32) for k in ("s", "b", "m", "v")}
    nodes = [
        helper.make_node("Concat", ["x", "x"], ["cat"], axis=1),
        helper.make_node("BatchNormalization", ["cat", "s", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    m = _model(nodes, {"w": w, **stats}, ["N", 8, HW, HW])
    model = tfrt_py.load(m, executor="sync", threads=1)
    assert "BatchNormAct" in [n.op_type for n in model.prepared.graph.nodes]
    seen = _spy_chunks(monkeypatch, model)
    x = _RNG.standard_normal((4, C, HW, HW)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], _ort(m, {"x": x}), rtol=1e-4, atol=1e-5)
    assert seen == [2, 2]
