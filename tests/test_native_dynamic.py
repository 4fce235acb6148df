"""The native tier's dynamic shapes (issue 14): rows mode for an independent batch dim,
signature mode (bounded) for anything else, and what declines rows mode."""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tfrt_py.concurrency.threads import configure
from tfrt_py.ir import Graph, GraphBuilder
from tfrt_py.native import tier as tier_mod

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


def test_a_batch_mixing_op_falls_back_to_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _softmax_over_batch()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "signature"
    for n in (3, 5, 3):
        _check(native, sync, RNG.standard_normal((n, 4)).astype(F32))
    assert "(3, 4)" in native.describe() and "(5, 4)" in native.describe()


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
    from tfrt_py.native.lower import blockers

    g = _shape_arithmetic()
    assert blockers(g) == []
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    assert native.native.form == "signature"
    for n in (2, 1, 5, 1):
        _check(native, sync, RNG.standard_normal((n, 3, 4)).astype(F32))
    assert "(1, 3, 4)" in native.describe() and "(5, 3, 4)" in native.describe()


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
    _check(native, sync, x)
    assert "(2, 7)" in native.describe()


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
def test_read_only_feeds_take_the_fast_entry(batch: str | int) -> None:
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
    slow_calls = []
    check = tier._check
    tier._check = lambda feeds: slow_calls.append(1) or check(feeds)
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
