"""``concurrency.call_yield``: background Python (a box's lowering, the loading of its
machine code, a cold start's warm-up) steps aside while calls run, and ``Model.run``
says when calls run while such work is in flight."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.concurrency import call_yield
from tfrt_py.native.runtime import worker


class _Job:
    """What the worker runs: records whether each in-process phase ran as background."""

    in_process = False

    def __init__(self) -> None:
        self.state = "compiling"
        self.seen: dict[str, int] = {}

    def _prepare(self) -> bool:
        self.seen["prepare"] = call_yield.BACKGROUND[0]
        return True

    def source(self) -> str:  # pragma: no cover - no compile server here
        raise AssertionError("no server")

    def _compile(self) -> None:
        self.seen["compile"] = call_yield.BACKGROUND[0]
        self.state = "ready"

    def _fail(self, reason: str) -> None:  # pragma: no cover - must not happen
        raise AssertionError(reason)


def test_the_workers_in_process_phases_run_as_background_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A box's lowering (phase 1) and its in-process compile or load (phase 3) run inside
    ``background()``, so calls mark themselves and the phases yield to them; after the job,
    nothing is marked any more."""
    monkeypatch.setenv(worker.SERVER_ENV, "0")
    job = _Job()
    worker._phases(job)
    assert job.seen == {"prepare": 1, "compile": 1}
    assert call_yield.BACKGROUND[0] == 0


def _model() -> Any:
    k = 512
    w = numpy_helper.from_array(np.full((k, k), 1e-3, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"])]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return tfrt_py.load(m, executor="sync"), {"x": np.ones((256, k), np.float32)}


def _step(n: int) -> int:
    return n + 1


def test_background_python_pauses_while_a_model_call_runs() -> None:
    """With background work in flight, ``Model.run`` marks its call (``in_call``) and the
    background thread waits at its next Python call until the call ends, within its
    share of the time (without the mark it never paused: each product that released the
    GIL handed it to the background thread for a switch interval)."""
    model, feeds = _model()
    model.run(feeds)
    ready, stop = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def background() -> None:
        with call_yield.background() as y:
            got["traced"] = sys.gettrace() == y.trace
            got["yield"] = y
            ready.set()
            n = 0
            while not stop.is_set():
                n = _step(n)
            got["paused"] = y.paused

    t = threading.Thread(target=background)
    t.start()
    assert ready.wait(10)
    time.sleep(0.2)  # the background thread's share accrues
    # calls until the background thread has paused once (20 calls sufficed on a quiet
    # host; under a loaded test run the OS may not schedule it during them), at most 10 s
    deadline = time.monotonic() + 10.0
    for i in range(10_000):
        model.run(feeds)
        if i >= 20 and (got["yield"].paused > 0.0 or time.monotonic() > deadline):
            break
    stop.set()
    t.join(10)
    if not got["traced"]:
        pytest.skip("another tracer (a debugger's or coverage's) owns the trace hook")
    assert got["paused"] > 0.0, got
    assert call_yield.BACKGROUND[0] == 0


def test_a_stopped_yielder_takes_its_trace_off_at_the_next_call() -> None:
    """``stop`` (``cold_start.hurry``: someone waits for the warm-up) ends the yielding;
    the trace function does not stay on the background thread, costing each of its Python
    calls, until a model call happens to come."""
    got: dict[str, Any] = {}

    def background() -> None:
        with call_yield.background() as y:
            got["before"] = sys.gettrace() == y.trace
            y.stop()
            _step(0)
            got["after"] = sys.gettrace()

    t = threading.Thread(target=background)
    t.start()
    t.join(10)
    if not got["before"]:
        pytest.skip("another tracer (a debugger's or coverage's) owns the trace hook")
    assert got["after"] is None, got
