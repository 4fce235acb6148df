"""Streamed execution (``load(path, memory_budget=...)``): same outputs as a normal load,
load-time errors (budget too small, weight file missing or short) on both load paths, the
stage plan, the transfer schedule and the run_batches pipeline."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import ExecutionError, InputError, ModelLoadError
from tfrt_py.ir import GraphBuilder
from tfrt_py.streaming import last_stats, transfer
from tfrt_py.streaming.pipeline import StreamedProgram

H = 32
LAYER_BYTES = H * H * 4 + H * 4  # weight + bias, each 64-byte aligned (128 and 4096 are)


def _streamed(sm: tfrt_py.Model) -> StreamedProgram:
    """The streaming executor serving ``sm``."""
    rt = sm.runtime
    assert isinstance(rt, StreamedProgram)
    return rt


def save_mlp(
    tmp_path: Any, layers: int = 6, tie: bool = False, extra: list[Any] | None = None
) -> tuple[str, str]:
    """An MLP (MatMul + Add + Relu per layer) saved with every initializer as external data
    in ``weights.bin``. ``tie``: the last layer reuses layer 0's weight. Returns (path, output)."""
    rng = np.random.default_rng(7)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = "w0" if tie and i == layers - 1 else f"w{i}"
        if w == f"w{i}":
            arr = (rng.standard_normal((H, H)) / 4).astype(np.float32)
            inits.append(numpy_helper.from_array(arr, w))
        inits.append(numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), f"b{i}"))
        nodes += [
            helper.make_node("MatMul", [x, w], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", H])]
    for node, out in extra or []:
        nodes.append(node)
        outputs.append(out)
    g = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", H])],
        outputs, inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(str(tmp_path), "mlp.onnx")
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)  # fmt: skip
    return path, x


def feeds(n: int, rows: int = 5) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(n)
    return [{"x": rng.standard_normal((rows, H)).astype(np.float32)} for _ in range(n)]


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for k in want:
        # float32 rounding: the stages and the reference may take different product
        # kernels (NumPy's gemm, the packed one-thread kernel)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_streamed_outputs_equal_normal_load(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    assert sm.executor == "stream" and ref.executor != "stream"
    assert [str(s) for s in sm.inputs] == [str(s) for s in ref.inputs]
    batch = feeds(7)
    for f in batch[:2]:
        assert_same(sm.run(f), ref.run(f))
    out = list(sm.run_batches(batch, window=3))
    assert len(out) == 7
    for got, f in zip(out, batch):
        assert_same(got, ref.run(f))
    stats = last_stats(sm)
    assert stats is not None and stats.batches == 7 and stats.windows == 3
    assert stats.steps == 3 * len(_streamed(sm).stages)


def test_run_with_outputs_buffer(tmp_path: Any) -> None:
    path, y = save_mlp(tmp_path)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    f = feeds(1)[0]
    buf = np.empty((5, H), np.float32)
    got = sm.run(f, outputs={y: buf})
    assert got[y] is buf
    np.testing.assert_allclose(buf, ref.run(f)[y], rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
async def test_async_forms_equal_normal_load(tmp_path: Any, anyio_backend: Any) -> None:
    path, _ = save_mlp(tmp_path)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    batch = feeds(5)
    assert_same(await sm.run_async(batch[0]), ref.run(batch[0]))
    out = [r async for r in sm.run_batches_async(batch, window=2)]
    for got, f in zip(out, batch):
        assert_same(got, ref.run(f))

    async def agen() -> AsyncIterator[dict[str, np.ndarray]]:
        for f in batch:
            yield f

    out = [r async for r in sm.run_batches_async(agen(), window=4)]
    assert len(out) == 5
    for got, f in zip(out, batch):
        assert_same(got, ref.run(f))
    plain = [r async for r in ref.run_batches_async(batch)]  # a model that does not stream
    assert_same(plain[-1], ref.run(batch[-1]))


def test_weights_that_fit_load_normally(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    m = tfrt_py.load(path, memory_budget=10 * LAYER_BYTES)
    assert m.executor != "stream"
    f = feeds(3)
    assert_same(list(m.run_batches(f))[2], m.run(f[2]))


def test_budget_smaller_than_a_stage_fails_at_load_saying_how_much(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    with pytest.raises(ModelLoadError) as e:
        tfrt_py.load(path, memory_budget=LAYER_BYTES // 2)
    msg = str(e.value)
    assert "memory_budget" in msg and "'mm0'" in msg
    assert f"memory_budget >= {H * H * 4:,} bytes" in msg
    # The amount the message names is enough (no overlap: the two regions overlap).
    sm = tfrt_py.load(path, memory_budget=H * H * 4)
    f = feeds(3)
    for got, want in zip(sm.run_batches(f), tfrt_py.load(path).run_batches(f)):
        assert_same(got, want)
    assert _streamed(sm).arena.nbytes <= H * H * 4


def test_bad_budget_is_a_value_error(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    for bad in (0, -5, 1.5, "1MB"):
        with pytest.raises(ValueError, match="memory_budget must be a positive"):
            tfrt_py.load(path, memory_budget=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("budget", [None, 3 * LAYER_BYTES])
def test_missing_weight_file_fails_at_load_naming_the_tensor(tmp_path: Any, budget: Any) -> None:
    path, _ = save_mlp(tmp_path)
    os.remove(os.path.join(str(tmp_path), "weights.bin"))
    with pytest.raises(ModelLoadError, match=r"tensor 'w0'.*not found.*weights\.bin"):
        tfrt_py.load(path, memory_budget=budget)


@pytest.mark.parametrize("budget", [None, 3 * LAYER_BYTES])
def test_short_weight_file_fails_at_load_naming_the_tensor(tmp_path: Any, budget: Any) -> None:
    path, _ = save_mlp(tmp_path, layers=3)
    wfile = os.path.join(str(tmp_path), "weights.bin")
    size = os.path.getsize(wfile)
    os.truncate(wfile, size - 8)  # the last tensor (b2) loses its last 2 floats
    with pytest.raises(ModelLoadError, match=r"tensor 'b2'.*too short"):
        tfrt_py.load(path, memory_budget=budget)


def test_streamed_load_does_not_map_or_read_the_weights(tmp_path: Any) -> None:
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/self/maps")
    path, _ = save_mlp(tmp_path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert os.path.join(str(tmp_path), "weights.bin") not in maps
    assert all(c.const is None or c.const.nbytes < 1000 for c in sm.graph.constants)
    del sm


def test_stage_plan_fits_the_budget_and_describe_shows_it(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path, layers=8)
    budget = 4 * LAYER_BYTES + 100
    sm = tfrt_py.load(path, memory_budget=budget)
    stages = _streamed(sm).stages
    assert len(stages) == 4  # two layers per stage: half the budget each
    assert all(st.nbytes <= budget // 2 for st in stages)
    assert _streamed(sm).arena.nbytes <= budget
    text = sm.describe()
    assert "executor: stream" in text
    for st in stages:
        assert f"stage {st.index}: " in text
    assert "MFLOP per batch" in text and "weight arena" in text
    list(sm.run_batches(feeds(2)))
    assert "last run: 2 batch(es)" in sm.describe()


def test_tied_weight_read_by_two_stages(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path, layers=6, tie=True)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    names = [[w.value.name for w in st.weights] for st in _streamed(sm).stages]
    assert sum("w0" in n for n in names) == 2
    for got, f in zip(sm.run_batches(feeds(3)), feeds(3)):
        assert_same(got, ref.run(f))


def test_outputs_viewing_the_arena_are_copied_out(tmp_path: Any) -> None:
    """A Reshape of a weight (a view into the arena) read by a later stage and returned."""
    extra = [(helper.make_node("Flatten", ["w1"], ["w1flat"], name="flat", axis=0),
              helper.make_tensor_value_info("w1flat", TensorProto.FLOAT, [1, H * H]))]  # fmt: skip
    path, _ = save_mlp(tmp_path, extra=extra)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    f = feeds(4)
    for got, want in zip(sm.run_batches(f, window=2), ref.run_batches(f)):
        assert_same(got, want)
        assert not np.may_share_memory(got["w1flat"], _streamed(sm).arena.buf)


def _probe_model(tmp_path: Any, seen: dict[str, Any]) -> tfrt_py.Model:
    """Stage 0 holds a custom kernel that waits for the transfer of stage 1 to start."""
    probe = helper.make_node("Probe", ["x"], ["xp"], name="probe", domain="app")
    path, _ = save_mlp(tmp_path, layers=4)
    m = onnx.load(path, load_external_data=False)
    m.graph.node.insert(0, probe)
    m.graph.node[1].input[0] = "xp"
    m.opset_import.append(helper.make_opsetid("app", 1))
    onnx.save(m, path)

    def kernel(x: np.ndarray) -> np.ndarray:
        seen["overlapped"] = seen["started"].wait(seen["timeout"])
        return x

    return tfrt_py.load(
        path, memory_budget=3 * LAYER_BYTES, custom_kernels={("app", "Probe"): kernel}
    )


@pytest.mark.parametrize("overlap", [True, False])
def test_next_stage_is_read_while_this_one_computes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    seen: dict[str, Any] = {"started": threading.Event(), "timeout": 30.0 if overlap else 0.3}
    sm = _probe_model(tmp_path, seen)
    stage1 = {w.ref.name for w in _streamed(sm).stages[1].weights}
    real = transfer.pread_full

    def spy(fd: int, dst: memoryview, offset: int, name: str) -> None:
        if name in stage1:
            seen["started"].set()
        real(fd, dst, offset, name)

    monkeypatch.setattr(transfer, "pread_full", spy)
    sm.run_batches(feeds(1), overlap=overlap).__next__()
    assert seen["overlapped"] is overlap


def test_weight_file_truncated_after_load_fails_the_run_naming_the_tensor(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path, layers=4)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    wfile = os.path.join(str(tmp_path), "weights.bin")
    with open(wfile, "rb") as f:
        data = f.read()
    os.truncate(wfile, LAYER_BYTES * 2)
    with pytest.raises(ExecutionError, match=r"transfer.*tensor 'w2'.*truncated"):
        sm.run(feeds(1)[0])
    with open(wfile, "wb") as f:
        f.write(data)
    f0 = feeds(1)[0]
    assert_same(sm.run(f0), tfrt_py.load(path).run(f0))  # the model is still usable


def test_bad_feeds_and_unfinished_iterators(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    with pytest.raises(InputError, match="'x'"):
        list(sm.run_batches([{"x": np.zeros((2, H + 1), np.float32)}]))
    with pytest.raises(InputError, match="mapping"):
        list(sm.run_batches([np.zeros((2, H), np.float32)]))  # type: ignore[list-item]
    # An unfinished iterator holds no lock: a run on the same thread preempts it, and the
    # iterator then reloads its weights and carries on (tests/security/test_stream_runs.py
    # has the threaded cases).
    ref = tfrt_py.load(path)
    batch = feeds(3)
    it = sm.run_batches(batch, window=1)
    first = next(it)
    f0 = feeds(1)[0]
    assert_same(sm.run(f0), ref.run(f0))
    for got, f in zip([first, *it], batch):
        assert_same(got, ref.run(f))
    with pytest.raises(ValueError, match="window"):
        list(sm.run_batches(feeds(1), window=0))


def test_threads_share_one_streamed_model(tmp_path: Any) -> None:
    path, _ = save_mlp(tmp_path)
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    batch = feeds(6)
    errors: list[BaseException] = []

    def work(f: dict[str, np.ndarray]) -> None:
        try:
            for _ in range(3):
                assert_same(sm.run(f), ref.run(f))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(f,)) for f in batch]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_weight_captured_by_a_nested_graph(tmp_path: Any) -> None:
    """An If branch reads a streamed weight from the outer scope: its stage loads it."""
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["r1", "wif"], ["t"], name="then_mm")], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )  # fmt: skip
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["r1"], ["e"], name="else_neg")], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )  # fmt: skip
    extra = [
        (helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0), None),
        (helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"), None),
        (helper.make_node("If", ["c"], ["y_if"], name="if", then_branch=then_g,
                          else_branch=else_g),
         helper.make_tensor_value_info("y_if", TensorProto.FLOAT, None)),
    ]  # fmt: skip
    path, _ = save_mlp(tmp_path, layers=4, extra=[e for e in extra if e[1] is not None])
    m = onnx.load(path, load_external_data=False)
    for node, _out in extra[:2]:
        m.graph.node.insert(len(m.graph.node) - 1, node)
    wif = (np.random.default_rng(3).standard_normal((H, H)) / 4).astype(np.float32)
    m.graph.initializer.append(numpy_helper.from_array(wif, "wif"))
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "zero"))
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="more.bin", size_threshold=1024)  # fmt: skip
    ref = tfrt_py.load(path)
    sm = tfrt_py.load(path, memory_budget=3 * LAYER_BYTES)
    holder = [st for st in _streamed(sm).stages if any(w.value.name == "wif" for w in st.weights)]
    assert [n.op_type for n in holder[0].nodes if n.op_type == "If"] == ["If"]
    f = [{"x": np.abs(a["x"])} for a in feeds(2)] + [{"x": -np.abs(a["x"])} for a in feeds(2)]
    for got, want in zip(sm.run_batches(f, window=3), ref.run_batches(f)):
        assert_same(got, want)


def test_memory_budget_with_an_in_memory_graph_is_refused() -> None:
    """A Graph holds its weights in memory: nothing to stream, so the budget cannot hold."""
    b = GraphBuilder("g")
    x = b.input("x", np.float32, (1, 4))
    b.output(b.op("Relu", x), "y")
    with pytest.raises(ValueError, match="memory_budget streams ONNX external-data"):
        tfrt_py.load(b.build(), memory_budget=1 << 20)
