"""The native tier's dynamic shapes (issue 14): rows mode for an independent batch dim,
signature mode (bounded) for anything else, and what declines rows mode."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tfrt_py
from tests.support.spies import record_calls
from tfrt_py.concurrency.threads import configure
from tfrt_py.ir import Graph, GraphBuilder
from tfrt_py.native.runtime import tier as tier_mod

F32 = np.float32
RNG = np.random.default_rng(14)


def _mlp(batch: str | int = "N") -> Graph:
    b = GraphBuilder("mlp")
    x = b.input("x", F32, (batch, 6))
    w = b.const(RNG.standard_normal((6, 5)).astype(F32))
    h = b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(RNG.standard_normal(5).astype(F32))))
    b.output(b.op("Softmax", h, axis=-1), "p")
    b.output(b.op("ReduceSum", h, b.const(np.array([1], np.int64)), keepdims=0), "s")
    return b.build()


def _softmax_over_batch() -> Graph:
    b = GraphBuilder("mix")
    x = b.input("x", F32, ("N", 4))
    b.output(b.op("Softmax", x, axis=0), "y")
    return b.build()


def _sequence() -> Graph:
    b = GraphBuilder("seq")
    x = b.input("x", F32, (2, "S"))
    b.output(b.op("ReduceMax", b.op("Tanh", x), axes=[1], keepdims=1), "y")
    return b.build()


def _check(native: tfrt_py.Model, sync: tfrt_py.Model, x: np.ndarray) -> None:
    got, want = native.run({"x": x}), sync.run({"x": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)


def test_rows_mode_serves_every_batch_size_with_one_function() -> None:
    g = _mlp()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "rows"
    path = native.native.compiled.path
    for n in (1, 2, 17, 1, 0, 400):
        _check(native, sync, RNG.standard_normal((n, 6)).astype(F32))
    assert native.native.compiled.path == path  # nothing recompiled


@pytest.mark.compiles
def test_a_batch_mixing_op_falls_back_to_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _softmax_over_batch()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "signature"
    for n in (3, 5, 3, 12, 40):
        _check(native, sync, RNG.standard_normal((n, 4)).astype(F32))
    # one function for the box of batch sizes 2..16, one for 17..128 (generic.py)
    assert "N in 2..16" in native.describe() and "N in 17..128" in native.describe()
    assert len(native.native.sigs) == 2


def _shape_arithmetic() -> Graph:
    """An export's shape arithmetic: Flatten as Shape -> Gather -> Unsqueeze -> Concat ->
    Reshape, and a factor chosen by Equal/Where on the batch size."""
    b = GraphBuilder("shapes")
    x = b.input("x", F32, ("N", 3, 4))
    n = b.op("Gather", b.op("Shape", x), b.const(np.array(0, np.int64)), axis=0)
    n1 = b.op("Unsqueeze", n, b.const(np.array([0], np.int64)))
    flat = b.op("Reshape", x, b.op("Concat", n1, b.const(np.array([-1], np.int64)), axis=0))
    one = b.op("Equal", n1, b.const(np.array([1], np.int64)))
    scale = b.op("Where", one, b.const(np.array([2.0], F32)), b.const(np.array([0.5], F32)))
    b.output(b.op("Mul", b.op("Relu", flat), scale), "y")
    return b.build()


def test_shape_arithmetic_is_folded_per_signature() -> None:
    """Values computed from the feeds' shapes alone are constants for one signature: the
    model lowers in signature mode (Shape, Equal and Where have no native lowering, and
    used to decline it; rows mode cannot fold them, the batch changes them), one function
    per batch size, each agreeing with the interpreter (batch 1 takes the other factor)."""
    from tfrt_py.native.lower.graph import blockers

    g = _shape_arithmetic()
    assert blockers(g) == []
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "signature"
    for n in (2, 1, 5, 1):
        _check(native, sync, RNG.standard_normal((n, 3, 4)).astype(F32))
    assert "N=1" in native.describe() and "N in 2..16" in native.describe()


def test_signatures_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_mod, "MAX_SIGNATURES", 2)
    g = _sequence()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "signature"
    for s in (1, 2, 3, 4, 2):
        _check(native, sync, RNG.standard_normal((2, s)).astype(F32))
    assert len(native.native.sigs) == 2


def test_background_signature_compiles_while_the_interpreter_serves() -> None:
    g = _sequence()
    native = tfrt_py.load(g, executor="native")
    sync = tfrt_py.load(g, executor="sync")
    x = RNG.standard_normal((2, 7)).astype(F32)
    _check(native, sync, x)  # served by the interpreter, compile queued
    assert native.native.wait(120)
    job = native.native.job((2, 7))
    assert job is not None and job.state == "ready", job  # a one-input signature lowers
    _check(native, sync, x)
    assert "compiled: S in 2..16" in native.describe()


def test_auto_picks_native_for_a_dynamic_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    g = _mlp()
    model = tfrt_py.load(g, native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert model.executor == "native" and model.native.measure
    x = RNG.standard_normal((3, 6)).astype(F32)
    for _ in range(12):
        _check(model, sync, x)
    assert "measured (batch 2+ rows)" in model.describe()


def test_a_new_batch_size_every_call_is_decided_per_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows mode measures native code against the interpreter once per power-of-two class
    of batch sizes, however the sizes in it vary, and calls one native entry for all of
    them: with a trial per exact size, a new size every call never finished one, and every
    call ran both tiers and compared their answers (a LinearSVC under random batches of
    1..2000 rows: 7x onnxruntime's time)."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    g = _mlp()
    model = tfrt_py.load(g, native="eager")
    sync = tfrt_py.load(g, executor="sync")
    tier = model.native
    assert tier.form == "rows" and tier.measure
    for n in range(40, 64):  # 24 sizes, each once, all in the class of 32+ rows
        _check(model, sync, RNG.standard_normal((n, 6)).astype(F32))
    assert ("rows", 6) in tier.choices, tier.choices
    assert len(tier._natives) == 1
    assert "measured (batch 32+ rows)" in model.describe()


def test_a_native_answer_that_disagrees_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first native call of a signature is checked against the interpreter; a wrong
    answer (simulated) keeps that batch class on the interpreter, and says so."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    real = tier_mod.native_entry

    def wrong(*args: object, **kw: object) -> object:
        entry = real(*args, **kw)  # type: ignore[arg-type]
        return lambda feeds, *xs: {k: v + 1 for k, v in entry(feeds, *xs).items()}

    monkeypatch.setattr(tier_mod, "native_entry", wrong)
    g = _mlp()
    model = tfrt_py.load(g, native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = RNG.standard_normal((2, 6)).astype(F32)
    for _ in range(5):
        _check(model, sync, x)
    assert "disagrees with the sync interpreter" in model.describe()


@pytest.mark.parametrize("batch", ["N", 3])
def test_read_only_feeds_take_the_fast_entry(
    batch: str | int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Feeds that are read-only views (Ray Data's batches, np.frombuffer over a request)
    reach the compiled code as they are: after the first call of a signature no call goes
    back to the slow path (which validates and copies every feed)."""
    g = _mlp(batch)
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = RNG.standard_normal((3, 6)).astype(F32)
    x.flags.writeable = False
    _check(native, sync, x)
    tier = native.native
    slow_calls = record_calls(monkeypatch, tier, "_check", lambda *a: 1)
    for _ in range(3):
        _check(native, sync, x)
    assert slow_calls == []
    assert not x.flags.writeable


@pytest.mark.parametrize("budget", [1, 2])
def test_threaded_rows_follow_the_thread_budget(
    budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big batch tries the rows split over threads only when the process's budget has
    more than one thread (a Ray actor or pre-forked worker with one CPU must not take
    two), and the split answer agrees with the interpreter's."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    monkeypatch.delenv("TFRT_PY_THREADS", raising=False)
    g = _mlp()
    sync = tfrt_py.load(g, executor="sync")
    try:
        model = tfrt_py.load(g, native="eager", threads=budget)
        x = RNG.standard_normal((300, 6)).astype(F32)
        for _ in range(16):
            _check(model, sync, x)
    finally:
        configure(None)
    measured = [ln for ln in model.describe().splitlines() if "measured (batch 256+" in ln]
    assert len(measured) == 1
    assert ("native threads" in measured[0]) == (budget > 1)


# -- issue 32: which signatures compile, warm-up, the compile server ---------------------------


def _auto(monkeypatch: pytest.MonkeyPatch, **kw: object) -> tfrt_py.Model:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    model = tfrt_py.load(_sequence(), **kw)  # type: ignore[arg-type]
    assert model.native is not None and model.native.form == "signature"
    return model


def test_auto_compiles_only_the_boxes_that_are_hot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls count per box of dims, whatever their exact lengths: a box whose lengths
    keep coming compiles one function for all of them once hot; a box that sees a few
    calls compiles nothing (the interpreter's one plan serves it)."""
    model = _auto(monkeypatch)
    sync = tfrt_py.load(_sequence(), executor="sync")
    tier = model.native
    for s in (19, 42, 100):  # a few calls in the box 17..128
        _check(model, sync, RNG.standard_normal((2, s)).astype(F32))
    for k in range(tier_mod.HOT_CALLS - 1):  # lengths of 2..16, one call short of hot
        _check(model, sync, RNG.standard_normal((2, 2 + k % 15)).astype(F32))
    assert len(tier.sigs) == 0
    counted = tier._counts[("box", ((1, 16),))]
    x = RNG.standard_normal((2, 5)).astype(F32)
    _check(model, sync, x)
    assert list(tier.sigs) == [("box", ((1, 16),))]
    # the box's signatures no longer reach its count (each call asked for the job again)
    assert counted not in tier.table.values()
    assert tier.wait(120)
    for s in range(2, 17):
        _check(model, sync, RNG.standard_normal((2, s)).astype(F32))
    assert len(tier._natives) == 1  # one native entry for every length of the box
    assert "one numba function per hot box of dims" in model.describe()


def test_calls_under_a_deadline_compile_their_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls with a deadline (every offloaded ``run_async`` is one) count towards their
    box's compile as plain calls do -- a model only ever called so stayed interpreted --
    and while the interpreter serves them, it runs them under their deadline."""
    import asyncio

    model = _auto(monkeypatch)
    sync = tfrt_py.load(_sequence(), executor="sync")
    tier = model.native
    calls = record_calls(monkeypatch, tier.interp, "run_call", lambda feeds, outs, call: call)
    for k in range(tier_mod.HOT_CALLS):
        x = RNG.standard_normal((2, 2 + k % 15)).astype(F32)
        np.testing.assert_allclose(model.run({"x": x}, timeout=60)["y"], sync.run({"x": x})["y"],
                                   rtol=2e-5, atol=1e-6)  # fmt: skip
    assert list(tier.sigs) == [("box", ((1, 16),))]
    assert len(calls) == tier_mod.HOT_CALLS and all(c is not None for c in calls)
    assert tier.wait(120)
    for s in (3, 11, 16):
        x = RNG.standard_normal((2, s)).astype(F32)
        got = asyncio.run(model.run_async({"x": x}, timeout=60))
        np.testing.assert_allclose(got["y"], sync.run({"x": x})["y"], rtol=2e-5, atol=1e-6)
    assert len(tier._natives) == 1  # the box's compiled function served them


def test_warmup_prepares_signatures_before_load_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _auto(monkeypatch, warmup=[{"x": (2, 7)}, {"x": np.ones((2, 9), F32)}])
    tier = model.native
    states = {k: j.state for k, j in tier.sigs.items()}
    assert states == {("box", ((1, 16),)): "ready"}, states  # one box holds both
    assert tier.choices  # the measured choice was made during the warm-up, not on a call
    assert "warmup: 2 signature(s)" in model.describe()
    sync = tfrt_py.load(_sequence(), executor="sync")
    _check(model, sync, RNG.standard_normal((2, 7)).astype(F32))


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ({"y": (2, 3)}, "unknown input"),
        ({"x": (2, -1)}, "negative"),
        (["x"], "maps input names"),
        ({"x": (2, 3, 4)}, "rank 3"),
    ],
)
def test_bad_warmup_items_are_clear_errors(item: object, match: str) -> None:
    with pytest.raises(tfrt_py.errors.InputError, match=match):
        tfrt_py.load(_sequence(), executor="sync", warmup=[item])  # type: ignore[list-item]


def test_a_background_compile_runs_in_the_compile_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfrt_py.native.runtime import worker

    monkeypatch.delenv("TFRT_PY_COMPILE_SERVER", raising=False)
    before = worker.server().compiles
    model = tfrt_py.load(_sequence(), executor="native")
    x = RNG.standard_normal((2, 13)).astype(F32)
    model.run({"x": x})
    assert model.native.wait(120)
    job = model.native.job((2, 13))
    assert job.state == "ready", job.error
    assert job.server_seconds is not None and worker.server().compiles == before + 1
    assert job.compiled.cache_hit  # this process loaded what the child compiled
    _check(model, tfrt_py.load(_sequence(), executor="sync"), x)


def test_without_the_compile_server_the_compile_runs_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TFRT_PY_COMPILE_SERVER", "0")
    model = tfrt_py.load(_sequence(), executor="native")
    x = RNG.standard_normal((2, 15)).astype(F32)
    model.run({"x": x})
    assert model.native.wait(120)
    job = model.native.job((2, 15))
    assert job.state == "ready" and job.server_seconds is None


def _pending_input(pid: int) -> int:
    """Bytes written to process ``pid``'s stdin and not yet read by it (Linux)."""
    import fcntl
    import struct
    import termios

    with open(f"/proc/{pid}/fd/0", "rb", buffering=0) as f:
        return int(struct.unpack("i", fcntl.ioctl(f, termios.FIONREAD, b"\0\0\0\0"))[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
@pytest.mark.compiles
def test_a_killed_compile_server_fails_the_job_and_the_next_compile_starts_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child dies mid-compile: that signature stays on the interpreter (right answers,
    the reason in ``describe()``), and the next compile starts a new child. The child is
    stopped first and killed once the request sits unread in its stdin, so it cannot have
    answered: the kill lands inside the compile on every run."""
    import os
    import signal
    import time

    from tfrt_py.native.runtime import worker

    monkeypatch.delenv("TFRT_PY_COMPILE_SERVER", raising=False)
    srv = worker.server()
    model = tfrt_py.load(_sequence(), executor="native")
    sync = tfrt_py.load(_sequence(), executor="sync")
    model.run({"x": RNG.standard_normal((2, 16)).astype(F32)})  # the child is up and idle
    assert model.native.wait(120)
    pid = srv.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        x = RNG.standard_normal((2, 17)).astype(F32)
        model.run({"x": x})
        job = model.native.job((2, 17))
        deadline = time.monotonic() + 120
        while _pending_input(pid) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.state == "compiling"
    finally:
        os.kill(pid, signal.SIGKILL)
    assert model.native.wait(120)
    assert job.state == "failed" and "compile server stopped" in (job.error or "")
    _check(model, sync, x)  # served by the interpreter
    y = RNG.standard_normal((2, 19)).astype(F32)
    model.run({"x": y})
    assert model.native.wait(120)
    assert model.native.job((2, 19)).state == "ready"
    assert srv.pid is not None and srv.pid != pid
    _check(model, sync, y)


def test_a_compile_server_that_died_idle_has_its_pipes_closed_before_the_next_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child that died between compiles (killed, OOM) is replaced at the next compile;
    the old child's pipes are closed then, not left to the garbage collector (which warns
    about an unclosed file, in whatever code runs when it collects)."""
    import os
    import signal

    from tfrt_py.native.runtime import worker

    monkeypatch.delenv("TFRT_PY_COMPILE_SERVER", raising=False)
    srv = worker.server()
    model = tfrt_py.load(_sequence(), executor="native")
    model.run({"x": RNG.standard_normal((2, 23)).astype(F32)})
    assert model.native.wait(120)
    old = srv._proc
    assert old is not None and old.stdin is not None and old.stdout is not None
    os.kill(old.pid, signal.SIGKILL)
    old.wait(30)
    model.run({"x": RNG.standard_normal((2, 200)).astype(F32)})  # another box
    assert model.native.wait(120)
    assert model.native.job((2, 200)).state == "ready"
    assert srv._proc is not old
    assert old.stdin.closed and old.stdout.closed


def test_a_new_cache_dir_gets_a_new_compile_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """The child fills the cache this process loads from: after ``$TFRT_PY_CACHE_DIR``
    changes, the next compile starts a child for the new dir (the old one would fill the
    old dir, and this process would compile the module again itself)."""
    from tfrt_py.native.runtime import worker

    monkeypatch.delenv("TFRT_PY_COMPILE_SERVER", raising=False)
    srv = worker.server()
    model = tfrt_py.load(_sequence(), executor="native")
    model.run({"x": RNG.standard_normal((2, 21)).astype(F32)})
    assert model.native.wait(120)
    first = srv.pid
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(tmp_path))
    model.run({"x": RNG.standard_normal((2, 200)).astype(F32)})  # another box
    assert model.native.wait(120)
    job = model.native.job((2, 200))
    assert job.state == "ready" and job.compiled.cache_hit, job.error
    assert srv.pid != first and str(tmp_path) in job.compiled.path
