"""The sync interpreter: no allocation per call, per-signature plans and their cache, the
memory plan; and, on every executor (the ``executor`` fixture), thread safety, output
ownership, caller buffers, feed validation after the fast path, errors that name the node,
run_async."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import tfrt_py
from tests.support.agreement import assert_agrees_with_unoptimized
from tests.support.executors import load_on
from tests.support.models import build
from tests.support.paths import ROOT as REPO_ROOT
from tests.support.spies import record_calls
from tfrt_py.errors import ExecutionError, InputError
from tfrt_py.executors import interpreter as interp_mod
from tfrt_py.executors.interpreter import SyncInterpreter
from tfrt_py.executors.plan import MemoryPlan
from tfrt_py.feeds import FeedChecker
from tfrt_py.ir import GraphBuilder

F32 = np.float32
ROOT = str(REPO_ROOT)


def _mlp(batch: int | str = 1, hidden: int = 256, executor: str = "sync") -> tfrt_py.Model:
    """M2's shape: x[1,64] -> Gemm 64xH + Relu -> Gemm HxH + Relu -> Gemm Hx10 ->
    Softmax (H = 256 in M2)."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("mlp")
    h = b.input("x", F32, (batch, 64))
    for i, (n_in, n_out) in enumerate(((64, hidden), (hidden, hidden), (hidden, 10))):
        w = b.const((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(F32))
        bias = b.const((rng.standard_normal(n_out) * 0.1).astype(F32))
        h = b.op("Gemm", h, w, bias)
        if i < 2:
            h = b.op("Relu", h)
    b.output(b.op("Softmax", h, axis=-1), "probs")
    return load_on(executor, b.build())


def _feed(seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 64)).astype(F32)}


def measure_steady_state_allocations() -> tuple[int, int, int]:
    """(net bytes retained, peak bytes above the start, output bytes) over 1000 calls of a
    warmed-up model, traced by tracemalloc. tracemalloc sees every thread of the process,
    so ``test_steady_state_allocates_only_the_outputs`` runs this in a fresh interpreter:
    threads other tests leave behind (pools, JIT compilers, jax/torch) must not count."""
    model = _mlp(hidden=1024)  # intermediates of 4 KB: any one allocated per call shows
    feeds = _feed()
    out_bytes = model.run(feeds)["probs"].nbytes
    tracemalloc.start()
    try:
        for _ in range(3):  # warm-up under tracing: plan made, arena in the free list
            model.run(feeds)
        gc.collect()
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(1000):
            model.run(feeds)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, peak - before, out_bytes


def test_steady_state_allocates_only_the_outputs() -> None:
    # ``python -c`` imports from its working directory first: the repository root.
    code = (
        "from tests.executors import test_interpreter as t; "
        "print(*t.measure_steady_state_allocations())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    net, peak, out_bytes = map(int, done.stdout.split()[-3:])
    # Net: nothing retained across 1000 calls (a leak of one small object per call would
    # show as tens of KB). Peak: one call's output array and dict plus small temporaries
    # (Softmax's row max and sum, NumPy's errstate), never an arena or an intermediate
    # activation (4 KB each).
    assert net < 2048, net
    assert peak < out_bytes + 3000, peak


def test_calls_from_many_threads_agree(executor: str) -> None:
    model = _mlp(executor=executor)
    feeds = [_feed(seed) for seed in range(8)]
    expected = [model.run(f)["probs"].copy() for f in feeds]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(200):
                j = (k + i) % 8
                got = model.run(feeds[j])["probs"]
                np.testing.assert_allclose(got, expected[j], rtol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_outputs_are_the_callers_own(executor: str) -> None:
    model = _mlp(executor=executor)
    feeds = _feed()
    a = model.run(feeds)["probs"]
    b = model.run(feeds)["probs"]
    assert not np.shares_memory(a, b)
    expected = a.copy()
    a[...] = -1.0  # the caller may scribble on it; the next call is unaffected
    np.testing.assert_array_equal(model.run(feeds)["probs"], expected)


def test_outputs_fill_caller_buffers(executor: str) -> None:
    model = _mlp(executor=executor)
    feeds = _feed()
    expected = model.run(feeds)["probs"]
    buf = np.empty((1, 10), F32)
    for _ in range(2):  # the probe call, then the planned one
        got = model.run(feeds, outputs={"probs": buf})
        assert got["probs"] is buf
        np.testing.assert_allclose(buf, expected, rtol=1e-6)
    with pytest.raises(InputError, match="probs"):
        model.run(feeds, outputs={"probs": np.empty((2, 10), F32)})
    with pytest.raises(InputError, match="unknown output"):
        model.run(feeds, outputs={"nope": buf})


def test_feeds_and_constants_as_outputs_are_copied(executor: str) -> None:
    b = GraphBuilder("passthrough")
    x = b.input("x", F32, (2,))
    c = b.const(np.arange(2, dtype=F32))
    b.output(b.op("Identity", x), "x_out")  # the identity pass makes x itself the output
    b.output(b.op("Identity", c), "c_out")  # folded: the output is a constant
    b.output(b.op("Add", x, c), "sum")
    model = load_on(executor, b.build())
    x_val = np.ones(2, F32)
    for _ in range(2):
        got = model.run({"x": x_val})
        assert not np.shares_memory(got["x_out"], x_val)
        got["c_out"][...] = 7  # must not corrupt the model's constant
        np.testing.assert_array_equal(got["sum"], [1, 2])


def test_dynamic_batch_plans_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the generic plan (tests/executors/test_generic_plan.py), one plan per signature."""
    monkeypatch.setenv("TFRT_PY_GENERIC_PLAN", "0")
    case = build("dynamic_batch")
    model = tfrt_py.load(case.model)
    plain = tfrt_py.load(case.model, optimize=False)
    for _ in range(2):
        for feed in case.feeds:
            got, want = model.run(feed), plain.run(feed)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    sigs = {p.signature for p in _plans(model)}
    assert len(sigs) == len(case.feeds)
    assert "plan(s), one per input signature" in model.describe()


def _plans(model: tfrt_py.Model) -> list[MemoryPlan]:
    """The memory plans the model's sync interpreter has made, one per input signature."""
    rt = model.runtime
    assert isinstance(rt, SyncInterpreter)
    return rt.plans()


def test_plan_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFRT_PY_GENERIC_PLAN", "0")
    model = _mlp(batch="N")
    for batch in range(1, 12):
        model.run(_feed(batch=batch))
    assert len(_plans(model)) == 8
    model.run(_feed(batch=1))  # evicted signatures are simply planned again
    assert len(_plans(model)) == 8


def test_after_the_cache_filled_a_new_signature_is_planned_on_its_second_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Traffic of ever-new shapes must not make (and drop) a plan per call: once eight
    plans were made, a signature's first call only runs the program, its second plans."""
    monkeypatch.setenv("TFRT_PY_GENERIC_PLAN", "0")
    model = _mlp(batch="N")
    plain = _mlp(batch="N", executor="async")
    for batch in range(1, 9):
        model.run(_feed(batch=batch))
    first_eight = {p.signature for p in _plans(model)}
    assert len(first_eight) == 8
    probes = record_calls(monkeypatch, interp_mod, "run_env", lambda *a: 1)
    for batch in range(9, 40):  # new every call: answered, nothing planned
        np.testing.assert_allclose(model.run(_feed(3, batch))["probs"],
                                   plain.run(_feed(3, batch))["probs"], rtol=1e-5)  # fmt: skip
    assert {p.signature for p in _plans(model)} == first_eight
    assert probes == []  # they ran freeing values, not keeping every one for a probe
    for _ in range(2):  # seen before: planned, then served by its plan
        np.testing.assert_allclose(model.run(_feed(4, 20))["probs"],
                                   plain.run(_feed(4, 20))["probs"], rtol=1e-5)  # fmt: skip
    assert len({p.signature for p in _plans(model)} - first_eight) == 1


def test_a_stand_in_plans_only_a_signature_that_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cold start's stand-in (``per_signature=False``) lives seconds: once its calls cost
    more than plans, it still plans only a signature seen before; a new one runs freeing
    values (a probe keeping every value of a big batch costs far more than the call)."""
    monkeypatch.setenv("TFRT_PY_GENERIC_PLAN", "0")
    model = _mlp(batch="N")
    prep = model.prepared
    rt = SyncInterpreter(prep.program, prep.determined, FeedChecker(prep.graph.inputs),
                         per_signature=False)  # fmt: skip
    monkeypatch.setattr(interp_mod, "PLAN_S_PER_INSTR", 0.0)  # every call dearer than a plan
    batches = (2, 2, 3, 4, 5, 2, 2)
    want = [model.run(_feed(1, b))["probs"] for b in batches]
    probes = record_calls(monkeypatch, interp_mod, "run_env", lambda *a: 1)
    for b, w in zip(batches, want, strict=True):
        np.testing.assert_allclose(rt.run(_feed(1, b))["probs"], w, rtol=1e-6)
    assert probes == [1]  # batch 2's third call, once the plans paid (two unplanned calls)
    assert len(rt.plans()) == 1


def test_bad_feeds_fall_back_to_full_validation(executor: str) -> None:
    model = _mlp(executor=executor)
    feeds = _feed()
    model.run(feeds)
    model.run(feeds)  # the fast path is now the planned one
    with pytest.raises(InputError, match="expected float32"):
        model.run({"x": feeds["x"].astype(np.float64)})
    with pytest.raises(InputError, match="dim 1"):
        model.run({"x": np.zeros((1, 65), F32)})
    with pytest.raises(InputError, match="missing"):
        model.run({})
    with pytest.raises(InputError, match="unknown input"):
        model.run({"x": feeds["x"], "y": feeds["x"]})
    as_list = model.run({"x": feeds["x"].tolist()})["probs"]  # converted, then planned path
    np.testing.assert_allclose(as_list, model.run(feeds)["probs"], rtol=1e-6)


def test_kernel_error_names_the_node_and_model_stays_usable(executor: str) -> None:
    b = GraphBuilder("gather")
    idx = b.input("i", np.int64, (2,))
    table = b.const(np.arange(12, dtype=F32).reshape(4, 3))
    g = b.op("Gather", table, idx, axis=0, name="lookup")
    b.output(b.op("Relu", g), "y")
    model = load_on(executor, b.build())
    good = {"i": np.array([0, 3], np.int64)}
    for _ in range(2):
        np.testing.assert_array_equal(model.run(good)["y"], [[0, 1, 2], [9, 10, 11]])
    with pytest.raises(ExecutionError, match="lookup") as info:
        model.run({"i": np.array([0, 9], np.int64)})
    assert info.value.node_name == "lookup"
    np.testing.assert_array_equal(model.run(good)["y"], [[0, 1, 2], [9, 10, 11]])


def test_run_async_agrees_with_run(executor: str) -> None:
    model = _mlp(executor=executor)
    feeds = _feed()
    expected = model.run(feeds)["probs"]
    got = asyncio.run(model.run_async(feeds))["probs"]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_memory_plan_reports_the_arena() -> None:
    model = _mlp()
    plan = model.memory_plan({"x": (1, 64)})
    assert plan.arena_bytes >= plan.lower_bound_bytes > 0
    assert plan.buffers and all(b.offset % 64 == 0 for b in plan.buffers)
    assert plan.n_fresh == 1  # the Softmax output goes straight to the user
    with pytest.raises(InputError, match="no shape"):
        model.memory_plan({})


def test_every_test_model_agrees_planned_and_unoptimized() -> None:
    for name in ("mlp", "cnn", "transformer_erf", "recommender", "if_loop", "gru"):
        case = build(name)
        assert_agrees_with_unoptimized(tfrt_py.load(case.model), case)
