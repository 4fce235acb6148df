"""The sync interpreter's straight-line code for calls no plan serves
(``executors/straight.py``): the same outputs as ``Program.run_freeing`` on every program
of the test models, including outputs that are feeds or constants, omitted optional
inputs and outputs, and multi-output kernels; a failing kernel still raises the
``ExecutionError`` naming its node; a call with a deadline takes the checked loop; the
generated code holds no name of the model; long programs keep the loop."""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tests.support.models import MODELS, build
from tests.support.spies import record_calls
from tfrt_py.errors import ExecutionError
from tfrt_py.executors import interpreter as interp_mod
from tfrt_py.executors import straight as straight_mod
from tfrt_py.executors.interpreter import SyncInterpreter
from tfrt_py.executors.straight import straight_line
from tfrt_py.ir import GraphBuilder

F32 = np.float32


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(y, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_straight_code_gives_run_freeings_outputs(name: str) -> None:
    case = build(name)
    model = tfrt_py.load(case.model, executor="sync")
    program = model.prepared.program
    fn = straight_line(program)
    if fn is None:
        pytest.skip(f"{len(program.instrs)} instructions: over straight.MAX_INSTRS")
    for feeds in case.feeds:
        rt = model._runtime
        assert isinstance(rt, SyncInterpreter)
        args = rt._check(feeds)
        _same(fn(args), program.run_freeing(args))


def _passthrough() -> tfrt_py.Model:
    b = GraphBuilder("passthrough")
    x = b.input("x", F32, (2,))
    c = b.const(np.arange(2, dtype=F32))
    b.output(b.op("Identity", x), "x_out")
    b.output(b.op("Identity", c), "c_out")
    sizes = b.const(np.array([1, 1], np.int64))
    parts = b.op("Split", b.op("Add", x, c), sizes, n_outputs=2, axis=0)
    b.output(parts[0], "head")
    b.output(b.op("Clip", parts[1], None, b.const(np.array(1.5, F32))), "tail")
    return tfrt_py.load(b.build(), executor="sync")


def test_unplanned_calls_run_the_straight_code_and_own_their_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A map input has no signature, so no plan: here a graph's unplanned calls are forced
    (every call a first sight: the stand-in's rule), and the outputs that are a feed or a
    constant are still the caller's own copies."""
    model = _passthrough()
    rt = model._runtime
    assert isinstance(rt, SyncInterpreter)
    monkeypatch.setattr(rt, "_plan_now", lambda sig: False)
    made = record_calls(monkeypatch, interp_mod, "straight_line")
    x = np.array([1.0, 3.0], F32)
    for _ in range(3):
        got = model.run({"x": x})
        assert not np.shares_memory(got["x_out"], x)
        got["c_out"][...] = 7  # must not corrupt the model's constant
        np.testing.assert_array_equal(got["head"], [1.0])
        np.testing.assert_array_equal(got["tail"], [1.5])
    assert len(made) == 1  # made once, on the first unplanned call
    assert rt._straight is not None


def test_a_failing_kernel_is_named_and_the_model_stays_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = GraphBuilder("gather")
    idx = b.input("i", np.int64, (2,))
    table = b.const(np.arange(12, dtype=F32).reshape(4, 3))
    b.output(b.op("Relu", b.op("Gather", table, idx, axis=0, name="lookup")), "y")
    model = tfrt_py.load(b.build(), executor="sync")
    rt = model._runtime
    assert isinstance(rt, SyncInterpreter)
    monkeypatch.setattr(rt, "_plan_now", lambda sig: False)
    good = {"i": np.array([0, 3], np.int64)}
    np.testing.assert_array_equal(model.run(good)["y"], [[0, 1, 2], [9, 10, 11]])
    assert rt._straight is not None
    with pytest.raises(ExecutionError, match="lookup") as info:
        model.run({"i": np.array([0, 9], np.int64)})
    assert info.value.node_name == "lookup"
    np.testing.assert_array_equal(model.run(good)["y"], [[0, 1, 2], [9, 10, 11]])


def test_a_call_with_a_deadline_takes_the_checked_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _passthrough()
    rt = model._runtime
    monkeypatch.setattr(rt, "_plan_now", lambda sig: False)
    loops = record_calls(monkeypatch, type(model.prepared.program), "run_freeing")
    model.run({"x": np.ones(2, F32)})
    assert not loops
    got = model.run({"x": np.ones(2, F32)}, timeout=30)
    np.testing.assert_array_equal(got["head"], [1.0])
    assert len(loops) == 1


def test_the_code_names_nothing_of_the_model() -> None:
    b = GraphBuilder("__import__('os').system('x')")
    x = b.input("import os; os.system('echo hi')", F32, (2,))
    y = b.op("Relu", x, name="'''; raise SystemExit; '''")
    b.output(b.op("Neg", y, name="\n    return 0\n"), "__builtins__")
    model = tfrt_py.load(b.build(), executor="sync")
    fn = straight_line(model.prepared.program)
    assert fn is not None
    code = fn.__code__
    for n in (*code.co_names, *code.co_varnames):
        assert n == "inputs" or (n[0] in "sCK" and n[1:].isdigit()), n
    np.testing.assert_array_equal(fn([np.array([-1.0, 2.0], F32)])[0], [-0.0, -2.0])


def test_a_long_program_keeps_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(straight_mod, "MAX_INSTRS", 1)
    model = _passthrough()
    assert len(model.prepared.program.instrs) > 1
    assert straight_line(model.prepared.program) is None
