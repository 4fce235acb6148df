"""A decoder larger than its memory budget generates (issue 37, item 5), and a table read
only by Gathers of rows is read by rows, not streamed whole (``streaming/rows.py``):
same results as a normal load, errors that name the node, the model usable after."""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import DeadlineExceeded, ExecutionError
from tfrt_py.streaming import last_stats, rows
from tfrt_py.streaming.pipeline import StreamedProgram
from tfrt_py.streaming.rows import row_read_weights

from .support.models.decoder import decoder, reference_greedy

VOCAB, DIM = 300, 24  # the table: 300 rows of 96 bytes


def _external(model: onnx.ModelProto, tmp_path: Any, name: str) -> str:
    """``model`` saved with its weights in ``name.weights`` (shape constants of a few ints
    stay in the proto: onnxruntime reads those at load)."""
    path = os.path.join(str(tmp_path), name)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=name + ".weights", size_threshold=64)  # fmt: skip
    return path


def _weight_bytes(path: str) -> int:
    return os.path.getsize(path + ".weights")


def _streamed(m: tfrt_py.Model) -> StreamedProgram:
    rt = m.runtime
    assert isinstance(rt, StreamedProgram)
    return rt


@pytest.fixture
def any_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row-read every table, however small (the tests' tables are kilobytes)."""
    monkeypatch.setattr(rows, "MIN_ROW_READ_BYTES", 0)


def _embedding(tmp_path: Any, also_matmul: bool = False) -> str:
    """y = Gather(table, ids) @ w (+ ids-free use of the table with ``also_matmul``)."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    w = rng.standard_normal((DIM, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")]  # fmt: skip
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if also_matmul:
        nodes.append(helper.make_node("MatMul", ["x", "table"], ["z"], name="scores"))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    ins = [helper.make_tensor_value_info("ids", TensorProto.INT64, None)]
    if also_matmul:
        ins.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, VOCAB]))
    g = helper.make_graph(nodes, "embed", ins, outs, [numpy_helper.from_array(table, "table"),
                                                      numpy_helper.from_array(w, "w")])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return _external(m, tmp_path, "embed.onnx")


def test_a_streamed_decoder_generates_onnxruntimes_tokens_reading_its_embeddings_by_rows(
    tmp_path: Any, any_table: None
) -> None:
    proto = decoder(layers=2, heads=4, kv_heads=2, head_dim=8)
    blob = proto.SerializeToString()  # before onnx.save moves the weights out of ``proto``
    path = _external(proto, tmp_path, "decoder.onnx")
    budget = _weight_bytes(path) // 4
    m = tfrt_py.load(path, memory_budget=budget)
    assert m.executor == "stream"
    text = m.describe()
    assert "read by rows" in text, text
    sess = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    prompts = [[5, 9, 2, 40, 33], [7, 1, 3]]
    want = reference_greedy(sess, prompts, 6)
    np.testing.assert_array_equal(m.generate(prompts, max_new_tokens=6), want)
    np.testing.assert_array_equal(m.generate(prompts[0], max_new_tokens=6), want[0])
    tables = [st.gather.ref.nbytes for st in _streamed(m).stages if st.gather is not None]
    assert tables
    st = last_stats(m)  # one chained run for the whole generation: 6 steps
    assert st is not None and st.windows == 6, st
    assert 0 < st.row_bytes < st.windows * sum(tables) / 2, st  # rows, not the tables
    assert st.steps <= st.reads <= st.steps + 1, st  # at most the one read ahead at the end


def test_a_streamed_decoder_streams_tokens_like_generate(tmp_path: Any) -> None:
    proto = decoder(layers=2)
    path = _external(proto, tmp_path, "decoder.onnx")
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    whole = tfrt_py.load(path)
    want = whole.generate([3, 4, 5], max_new_tokens=5)
    assert list(m.stream([3, 4, 5], max_new_tokens=5)) == want[3:].tolist()

    async def tokens() -> list[int]:
        return [t async for t in m.generate_async([3, 4, 5], max_new_tokens=5)]

    assert anyio.run(tokens) == want[3:].tolist()
    st = last_stats(m)
    assert st is not None and st.windows == 5  # the async steps chained too


def test_an_abandoned_stream_does_not_hold_the_model(tmp_path: Any) -> None:
    """A stream left after two tokens keeps its run parked: other calls preempt it, and
    the stream, resumed, reads its weights again and gives generate's tokens."""
    path = _external(decoder(layers=2), tmp_path, "decoder.onnx")
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    want = tfrt_py.load(path).generate([3, 4, 5], max_new_tokens=6)[3:].tolist()
    it = m.stream([3, 4, 5], max_new_tokens=6)
    got = [next(it), next(it)]
    np.testing.assert_array_equal(m.generate([3, 4, 5], max_new_tokens=6)[3:], want)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(m.generate([3, 4, 5], max_new_tokens=6)))
    t.start()
    t.join(60)
    assert not t.is_alive() and done[0][3:].tolist() == want
    assert got + list(it) == want


def test_a_step_past_the_deadline_ends_the_chain_and_the_model_runs_on(tmp_path: Any) -> None:
    path = _external(decoder(layers=2), tmp_path, "decoder.onnx")
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    with pytest.raises(DeadlineExceeded):
        m.generate([3, 4, 5], max_new_tokens=50, timeout=0.01)  # mid-generation, mostly
    want = tfrt_py.load(path).generate([3, 4, 5], max_new_tokens=4)
    np.testing.assert_array_equal(m.generate([3, 4, 5], max_new_tokens=4), want)


def test_rows_equal_gather_for_any_indices(
    tmp_path: Any, any_table: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _embedding(tmp_path)
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    assert any(st.gather is not None for st in _streamed(m).stages)
    ref = tfrt_py.load(path)
    rng = np.random.default_rng(0)
    cases = [np.array([[0]]), np.array([[VOCAB - 1, -1, -VOCAB]]), rng.integers(0, VOCAB, (3, 7)),
             np.arange(VOCAB)[::-1].reshape(2, -1), np.zeros((2, 0), np.int64),
             rng.integers(-VOCAB, VOCAB, (4, 50)).astype(np.int32)]  # fmt: skip
    for small in (False, True):
        if small:  # spans of a few rows, read in chunks of a few rows: every edge of the loop
            monkeypatch.setattr(rows, "GAP_BYTES", 3 * DIM * 4)
            monkeypatch.setattr(rows, "CHUNK", 5 * DIM * 4)
        for ids in cases:
            got, want = m.run({"ids": ids}), ref.run({"ids": ids})
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
            assert got["y"].shape == (*ids.shape, 8)


def test_an_index_out_of_range_names_the_gather_and_the_model_stays_usable(
    tmp_path: Any, any_table: None
) -> None:
    path = _embedding(tmp_path)
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    for bad in (VOCAB, -VOCAB - 1):
        with pytest.raises(ExecutionError, match=r"'embed'.*out of bounds"):
            m.run({"ids": np.array([[1, bad]])})
    ok = np.array([[1, 2]])
    np.testing.assert_allclose(m.run({"ids": ok})["y"], tfrt_py.load(path).run({"ids": ok})["y"],
                               rtol=1e-5)  # fmt: skip


def test_a_table_truncated_after_load_fails_the_gather_naming_it(
    tmp_path: Any, any_table: None
) -> None:
    path = _embedding(tmp_path)
    m = tfrt_py.load(path, memory_budget=_weight_bytes(path) // 4)
    wfile = path + ".weights"
    with open(wfile, "rb") as f:
        data = f.read()
    os.truncate(wfile, 0)
    with pytest.raises(ExecutionError, match=r"'embed'.*tensor 'table'.*truncated"):
        m.run({"ids": np.array([[3]])})
    with open(wfile, "wb") as f:
        f.write(data)
    assert m.run({"ids": np.array([[3]])})["y"].shape == (1, 1, 8)


def test_a_table_with_another_reader_is_streamed_whole(tmp_path: Any, any_table: None) -> None:
    path = _embedding(tmp_path, also_matmul=True)
    m = tfrt_py.load(path, memory_budget=29_000)  # the table (28,800 B) fits, the rest not
    assert all(st.gather is None for st in _streamed(m).stages)
    feeds = {"ids": np.array([[4, 5]]), "x": np.ones((2, VOCAB), np.float32)}
    got, want = m.run(feeds), tfrt_py.load(path).run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)


def test_small_tables_are_not_row_read_by_default(tmp_path: Any) -> None:
    path = _embedding(tmp_path)
    m = tfrt_py.load(path, memory_budget=29_000)  # the table (28,800 B) fits, the rest not
    prog = _streamed(m)
    assert all(st.gather is None for st in prog.stages)
    refs = {id(w.value): w.ref for st in prog.stages for w in st.weights}
    assert row_read_weights(prog.graph, refs, set()) == {}  # under MIN_ROW_READ_BYTES
