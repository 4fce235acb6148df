"""Non-strict Loop and Scan in the dataflow executor (``dataflow_control``).

Non-strictness is shown by order, never by time: the outer value a Loop/Scan body captures
comes from ``Slow``, an async kernel that only finishes once ``Release`` has run, and
``Release`` is a sync kernel that is either downstream of the Loop/Scan (zero iterations:
the node must complete without its capture) or inside the body, independent of the
capture (iteration 0 must start before the capture arrives). A strict Loop/Scan would wait
for ``Slow`` forever (``fail_after`` turns that deadlock into a failure). Async tests run on
asyncio, uvloop and trio; models without async kernels also run on the sync executor and
agree with it and with NumPy. The ready queue pops in a seeded random order (conftest).
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest

import tfrt_py
from tests.support.dataflow import F32, Calls, _agree
from tests.support.executors import load_on
from tfrt_py.compiler import model_cost
from tfrt_py.concurrency import AsyncValue, HostContext
from tfrt_py.errors import ExecutionError
from tfrt_py.executors import compile_program
from tfrt_py.executors.dataflow import DataflowExecutor
from tfrt_py.ir import Graph, GraphBuilder, Node, Value, tensor_type
from tfrt_py.kernels import default_registry

I64 = np.int64
VEC = tensor_type(F32, (2,))


def _v(name: str, ty: Any = VEC) -> Value:
    return Value(name, ty)


def _node(op: str, ins: list[Value | None], outs: list[Value], **attrs: Any) -> Node:
    domain = attrs.pop("domain", "")
    opset = 1 if domain else 17
    return Node(op, ins, list(outs), attrs, name=attrs.pop("name", outs[0].name), domain=domain,
                opset=opset)  # fmt: skip


def _body(name: str, inputs: list[Value], outputs: list[Value], nodes: list[Node]) -> Graph:
    return Graph(name, inputs=inputs, outputs=outputs, nodes=nodes, opsets={"": 17, "app": 1})


class Order:
    """What ran, in order, and the gate ``Slow`` waits on: the first ``Release`` (from any
    thread) sets it and records who did."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[str] = []
        self.gate: AsyncValue[None] = AsyncValue()
        self.fail_slow = False

    def record(self, what: str) -> None:
        with self.lock:
            self.events.append(what)

    def release(self, who: str) -> None:
        with self.lock:
            if self.gate.is_available():
                return
            self.events.append(f"released by {who}")
        self.gate.set(None)

    def kernels(self) -> dict[tuple[str, str], Any]:
        async def slow(x: np.ndarray) -> np.ndarray:
            await self.gate
            self.record("slow done")
            if self.fail_slow:
                raise OSError("capture source down")
            return x - 1

        def release(x: np.ndarray, who: str = "") -> np.ndarray:
            self.release(who)
            return x

        def after(x: np.ndarray) -> np.ndarray:
            self.record("after")
            return x

        return {("app", "Slow"): slow, ("app", "Release"): release, ("app", "After"): after}


def _loop_model() -> Graph:
    """``s = Slow(x)``; ``acc = Loop(M, acc0=x)`` whose body is ``Release(acc_in) + s``
    (Release does not depend on the capture ``s``; the Add does, then ``After``);
    ``y = Release(acc)`` downstream. Outputs y and s."""
    b = GraphBuilder("nonstrict_loop")
    x = b.input("x", F32, (2,))
    m = b.input("M", I64, ())
    s = b.op("Slow", x, domain="app", name="slow", output_types=[VEC])
    it, c, acc_in = _v("it", tensor_type(I64, ())), _v("c", tensor_type(np.bool_, ())), _v("a")
    p, added, acc_out, c_out = _v("p"), _v("added"), _v("acc_out"), _v("c_out", c.type)
    body = _body(
        "body",
        [it, c, acc_in],
        [c_out, acc_out],
        [
            _node("Release", [acc_in], [p], domain="app", who="body"),
            _node("Add", [p, s], [added]),
            _node("After", [added], [acc_out], domain="app"),
            _node("Identity", [c], [c_out]),
        ],
    )
    acc = b.op("Loop", m, None, x, body=body, name="loop", output_types=[VEC])
    b.output(b.op("Release", acc, domain="app", who="downstream"), "y")
    b.output(s, "s")
    return b.build()


def _scan_model() -> Graph:
    """``s = Slow(x)``; ``Scan(state0=x, xs)`` whose body is ``st + Release(x_t) * s``,
    scan output the state; ``y = Release(final state)`` downstream."""
    b = GraphBuilder("nonstrict_scan")
    x = b.input("x", F32, (2,))
    xs = b.input("xs", F32, ("T", 2))
    s = b.op("Slow", x, domain="app", name="slow", output_types=[VEC])
    st_in, x_t, p, prod, st_out, y_t = (_v(n) for n in ("st", "xt", "p", "prod", "st2", "yt"))
    body = _body(
        "body",
        [st_in, x_t],
        [st_out, y_t],
        [
            _node("Release", [x_t], [p], domain="app", who="body"),
            _node("Mul", [p, s], [prod]),
            _node("Add", [st_in, prod], [st_out]),
            _node("After", [st_out], [y_t], domain="app"),
        ],
    )
    final, ys = b.op(
        "Scan", x, xs, body=body, num_scan_inputs=1, n_outputs=2, name="scan",
        output_types=[VEC, tensor_type(F32, ("T", 2))],
    )  # fmt: skip
    b.output(b.op("Release", final, domain="app", who="downstream"), "y")
    b.output(ys, "ys")
    b.output(s, "s")
    return b.build()


async def _call(model: tfrt_py.Model, feeds: dict[str, np.ndarray], how: str) -> Any:
    """``run_async`` on this loop, or ``run`` on a daemon thread (async kernels then run on
    the host's background loop); a deadlock (a strict Loop/Scan) fails after 10 s."""
    with anyio.fail_after(10):
        if how == "run_async":
            return await model.run_async(feeds)
        done: AsyncValue[Any] = AsyncValue()

        def call() -> None:
            try:
                done.set(model.run(feeds))
            except Exception as e:  # noqa: BLE001 - re-raised by the awaiting test
                done.set_error(e)

        threading.Thread(target=call, daemon=True).start()  # a deadlock must not block exit
        return await done


X = np.array([1.0, 2.0], F32)


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["run_async", "run"])
async def test_zero_trip_loop_completes_without_its_capture(
    anyio_backend: Any, how: str, host: HostContext
) -> None:
    order = Order()
    model = load_on("async", _loop_model(), host=host, custom_kernels=order.kernels())
    assert "1 non-strict Loop/Scan" in model.describe()
    out = await _call(model, {"x": X, "M": np.array(0, I64)}, how)
    # The Loop's consumer ran (and released Slow) before the capture existed.
    assert order.events == ["released by downstream", "slow done"]
    np.testing.assert_array_equal(out["y"], X)
    np.testing.assert_array_equal(out["s"], X - 1)


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["run_async", "run"])
async def test_loop_body_starts_before_its_capture_arrives(
    anyio_backend: Any, how: str, host: HostContext
) -> None:
    order = Order()
    model = load_on("async", _loop_model(), host=host, custom_kernels=order.kernels())
    out = await _call(model, {"x": X, "M": np.array(3, I64)}, how)
    # Iteration 0's Release (independent of s) ran before Slow finished; the part that
    # reads s ran after it; iterations 1 and 2 after that.
    assert order.events == ["released by body", "slow done", "after", "after", "after"]
    np.testing.assert_array_equal(out["y"], X + 3 * (X - 1))


@pytest.mark.anyio
@pytest.mark.parametrize("steps", [0, 3])
async def test_scan_is_non_strict(anyio_backend: Any, steps: int, host: HostContext) -> None:
    order = Order()
    model = load_on("async", _scan_model(), host=host, custom_kernels=order.kernels())
    xs = np.arange(2 * steps, dtype=F32).reshape(steps, 2)
    out = await _call(model, {"x": X, "xs": xs}, "run_async")
    if steps:
        assert order.events == ["released by body", "slow done", *["after"] * steps]
    else:
        assert order.events == ["released by downstream", "slow done"]
    states = X + np.cumsum(xs * (X - 1), axis=0)
    np.testing.assert_allclose(out["y"], states[-1] if steps else X)
    np.testing.assert_allclose(out["ys"], states.reshape(steps, 2))


@pytest.mark.anyio
@pytest.mark.parametrize("model_fn", [_loop_model, _scan_model])
async def test_capture_error_forwards_and_names_the_failing_node(
    anyio_backend: Any, model_fn: Any, host: HostContext
) -> None:
    """Slow fails while iteration 0 waits for it: the call names ``slow``, the body part
    that reads the capture never runs, nor does anything downstream."""
    order = Order()
    order.fail_slow = True
    model = load_on("async", model_fn(), host=host, custom_kernels=order.kernels())
    feeds: dict[str, np.ndarray] = {"x": X, "M": np.array(3, I64), "xs": np.ones((3, 2), F32)}
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in model.inputs}}
    with pytest.raises(ExecutionError, match="'slow' \\(Slow\\) failed: OSError"):
        await _call(model, feeds, "run_async")
    assert order.events == ["released by body", "slow done"]
    order = Order()  # the model is still usable
    model = load_on("async", model_fn(), host=host, custom_kernels=order.kernels())
    out = await _call(model, feeds, "run_async")
    assert out["s"].tolist() == (X - 1).tolist()


@pytest.mark.anyio
async def test_cancelling_while_iteration_0_waits_for_a_capture(
    anyio_backend: Any, host: HostContext
) -> None:
    order = Order()
    kernels = order.kernels()
    started: AsyncValue[None] = AsyncValue()

    def release(x: np.ndarray, who: str = "") -> np.ndarray:
        order.record(f"release {who}")
        if who == "body" and not started.is_available():
            started.set(None)  # but never the gate: Slow waits until cancelled
        return x

    kernels[("app", "Release")] = release
    model = load_on("async", _loop_model(), host=host, custom_kernels=kernels)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(model.run_async, {"x": X, "M": np.array(2, I64)})
            await started
            tg.cancel_scope.cancel()
    assert order.events == ["release body"]  # nothing reading s, nothing downstream
    order.release("test")
    out = await _call(model, {"x": X, "M": np.array(2, I64)}, "run_async")
    np.testing.assert_array_equal(out["y"], X + 2 * (X - 1))


# -- sync kernels only: every executor, agreement with NumPy ----------------------------------


def _check_kernels(calls: Calls, failing: str) -> dict[tuple[str, str], Any]:
    def check(x: np.ndarray, tag: str = "") -> np.ndarray:
        calls.hit(tag)
        if tag == failing:
            raise ValueError(tag)
        return x

    def body_check(x: np.ndarray, it: np.ndarray) -> np.ndarray:
        calls.hit("body")
        if failing == f"body{int(it)}":
            raise ValueError("body")
        return x

    return {("app", "Check"): check, ("app", "BodyCheck"): body_check}


def _checked_loop() -> Graph:
    """``cap = Check[boom](x + x)``; ``Loop(M, acc0=x)``: ``acc = BodyCheck(acc + cap, i)``
    (BodyCheck fails on iteration k when ``failing`` is ``bodyk``);
    ``y = Check[downstream](acc)``."""
    b = GraphBuilder("checked_loop")
    x = b.input("x", F32, (2,))
    m = b.input("M", I64, ())
    cap = b.op("Check", b.op("Add", x, x), domain="app", name="boom", tag="boom")
    it, c, acc_in = _v("it", tensor_type(I64, ())), _v("c", tensor_type(np.bool_, ())), _v("a")
    added, acc_out, c_out = _v("added"), _v("acc_out"), _v("c_out", c.type)
    body = _body(
        "body",
        [it, c, acc_in],
        [c_out, acc_out],
        [
            _node("Add", [acc_in, cap], [added]),
            _node("BodyCheck", [added, it], [acc_out], domain="app", name="body_check"),
            _node("Identity", [c], [c_out]),
        ],
    )
    acc = b.op("Loop", m, None, x, body=body, name="loop")
    b.output(b.op("Check", acc, domain="app", name="downstream", tag="downstream"), "y")
    return b.build()


@pytest.mark.parametrize(
    ("failing", "trips", "named"),
    [("boom", 0, "boom"), ("boom", 3, "boom"), ("body0", 3, "loop"), ("body1", 3, "loop")],
)
def test_loop_errors_agree(
    executor: str, failing: str, trips: int, named: str, host: HostContext
) -> None:
    """A failing capture source fails the call naming it (also when the Loop runs zero
    iterations and never reads it: every kernel runs, as in the sync executor); a body
    failure names the Loop, on iteration 0 (the nested dataflow run) or later."""
    calls = Calls()
    graph = _checked_loop()
    kernels = _check_kernels(calls, failing)
    model = load_on(executor, graph, host=host, custom_kernels=kernels)
    with pytest.raises(ExecutionError, match=f"'{named}'"):
        model.run({"x": X, "M": np.array(trips, I64)})
    if trips:  # the Loop needed the failed value: nothing downstream ran
        assert calls["downstream"] == 0


def test_checked_loop_agrees_when_nothing_fails(executor: str, host: HostContext) -> None:
    model = load_on(
        executor, _checked_loop(), host=host, custom_kernels=_check_kernels(Calls(), "")
    )
    for trips in (0, 1, 4):
        out = model.run({"x": X, "M": np.array(trips, I64)})
        np.testing.assert_allclose(out["y"], X + trips * 2 * X)


def _nested_model() -> Graph:
    """Produced captures at two levels, cond-driven outer Loop with a scan output, an inner
    Loop capturing both a body value and an outer produced value, and a Scan (reversed
    input, output on axis 1) capturing a produced value."""
    b = GraphBuilder("nested_control")
    x = b.input("x", F32, (2,))
    m = b.input("M", I64, ())
    go = b.input("go", np.bool_, ())
    w = b.op("Tanh", x, name="w")  # captured by the outer body and the inner body
    k = b.op("Mul", x, b.const(np.array([0.5, -0.25], F32)), name="k")
    scalar = tensor_type(I64, ())
    boolean = tensor_type(np.bool_, ())
    # inner Loop: 2 trips of v += w * h, h from the outer body
    i_it, i_c, v_in, i_co, v_out, wh = (
        _v("i_it", scalar), _v("i_c", boolean), _v("v_in"), _v("i_co", boolean), _v("v_out"),
        _v("wh"),
    )  # fmt: skip
    h = _v("h")
    inner = _body(
        "inner",
        [i_it, i_c, v_in],
        [i_co, v_out],
        [
            _node("Mul", [w, h], [wh]),
            _node("Add", [v_in, wh], [v_out]),
            _node("Identity", [i_c], [i_co]),
        ],
    )
    two = Value("two", const=np.array(2, I64))
    limit = Value("limit", const=np.array(40.0, F32))
    o_it, o_c, acc_in, o_co, acc_out, tot = (
        _v("o_it", scalar), _v("o_c", boolean), _v("acc_in"), _v("o_co", boolean), _v("acc_out"),
        _v("tot", tensor_type(F32, ())),
    )  # fmt: skip
    inner_out = _v("inner_out")
    outer = _body(
        "outer",
        [o_it, o_c, acc_in],
        [o_co, acc_out, h],
        [
            _node("Add", [acc_in, k], [h]),
            _node("Loop", [two, None, acc_in], [inner_out], body=inner),
            _node("Add", [inner_out, h], [acc_out]),
            _node("ReduceSum", [acc_out], [tot], keepdims=0),
            _node("Less", [tot, limit], [o_co]),
        ],
    )
    outer.constants += [two, limit]
    acc, hs = b.op("Loop", m, go, x, body=outer, n_outputs=2, name="outer_loop")
    # Scan over hs reversed along axis 0, output stacked on axis 1
    st, h_t, st2, y_t = _v("st"), _v("h_t"), _v("st2"), _v("y_t")
    scan_body = _body(
        "scan_body",
        [st, h_t],
        [st2, y_t],
        [_node("Mul", [h_t, k], [y_t]), _node("Add", [st, y_t], [st2])],
    )
    final, ys = b.op(
        "Scan", acc, hs, body=scan_body, num_scan_inputs=1, n_outputs=2, name="scan",
        scan_input_directions=[1], scan_output_axes=[1],
    )  # fmt: skip
    b.output(acc, "acc")
    b.output(hs, "hs")
    b.output(final, "final")
    b.output(ys, "ys")
    return b.build()


def _nested_numpy(x: np.ndarray, trips: int, go: bool) -> dict[str, np.ndarray]:
    w, k = np.tanh(x), x * np.array([0.5, -0.25], F32)
    acc, hs, i = x, [], 0
    while go and i < trips:
        h = acc + k
        v = acc
        for _ in range(2):
            v = v + w * h
        acc = v + h
        hs.append(h)
        go = bool(acc.sum() < 40.0)
        i += 1
    hs_arr = np.stack(hs) if hs else np.empty((0, 2), F32)
    ys = [h * k for h in hs_arr[::-1]]
    final = acc + sum(ys, np.zeros(2, F32))
    ys_arr = np.stack(ys, axis=1) if ys else np.empty((2, 0), F32)
    return {"acc": acc, "hs": hs_arr, "final": final, "ys": ys_arr}


FEEDS: list[dict[str, np.ndarray]] = [
    {"x": X, "M": np.array(5, I64), "go": np.array(True)},  # cond stops it first
    {"x": np.array([-0.5, 0.25], F32), "M": np.array(3, I64), "go": np.array(True)},
    {"x": X, "M": np.array(0, I64), "go": np.array(True)},  # zero trips
    {"x": X, "M": np.array(4, I64), "go": np.array(False)},  # cond false at start
]


def test_nested_control_flow_agrees_with_numpy(executor: str, host: HostContext) -> None:
    graph = _nested_model()
    model = load_on(executor, graph, host=host)
    if executor == "async":  # outer Loop and Scan, and (in its body) the inner Loop
        reg = default_registry()
        df = DataflowExecutor(
            compile_program(graph, reg), reg, expensive=model_cost(graph).expensive
        )
        assert len(df.ctrls) == 2
        body = df.ctrls[0].body
        assert isinstance(body, DataflowExecutor) and len(body.ctrls) == 1
    ref = tfrt_py.load(graph, executor="sync")
    for feed in FEEDS:
        expected = _nested_numpy(feed["x"], int(feed["M"]), bool(feed["go"]))
        out = model.run(feed)
        _agree([ref.run(feed), out])
        for name, value in expected.items():
            np.testing.assert_allclose(out[name], value, rtol=1e-5, err_msg=name)


@pytest.mark.anyio
async def test_nested_control_flow_run_async_agrees(anyio_backend: Any, host: HostContext) -> None:
    graph = _nested_model()
    model = load_on("async", graph, host=host)
    ref = tfrt_py.load(graph, executor="sync")
    for feed in FEEDS:
        _agree([ref.run(feed), await model.run_async(feed)])


def test_expensive_loop_runs_later_iterations_on_the_pool(host: HostContext) -> None:
    """An expensive non-strict Loop continued from an event-loop thread hands iterations
    1.. to the pool; results still agree (from run_async on asyncio)."""
    graph = _nested_model()
    reg = default_registry()
    df = DataflowExecutor(
        compile_program(graph, reg), reg, expensive=lambda n: n.op_type in ("Loop", "Scan")
    )
    ref = tfrt_py.load(graph, executor="sync")
    for feed in FEEDS:
        inputs = [feed[v.name] for v in graph.inputs]
        got = anyio.run(df.run_async, inputs, host)
        _agree([ref.run(feed), dict(zip([v.name for v in graph.outputs], got))])


def test_plans_without_produced_captures_stay_strict(host: HostContext) -> None:
    """A Loop whose captures are all inputs or constants gets no gates; graphs without
    control flow get none either (the run loop never sees control flow)."""
    b = GraphBuilder("strict_loop")
    x = b.input("x", F32, (2,))
    it, c, a, co, ao = _v("it", tensor_type(I64, ())), _v("c"), _v("a"), _v("co"), _v("ao")
    body = _body("body", [it, c, a], [co, ao], [
        _node("Add", [a, x], [ao]), _node("Identity", [c], [co]),
    ])  # fmt: skip
    b.output(b.op("Loop", b.const(np.array(3, I64)), None, x, body=body), "y")
    reg = default_registry()
    graph = b.build()
    df = DataflowExecutor(compile_program(graph, reg), reg, expensive=model_cost(graph).expensive)
    plan = df.schedule
    assert not plan.ctrls and not plan.gate_of and len(plan.kinds) == plan.n_nodes + 1
    (y,) = df.run([X], host)
    np.testing.assert_array_equal(y, X * 4)


@pytest.mark.anyio
async def test_a_long_chain_of_non_strict_loops(anyio_backend: Any, host: HostContext) -> None:
    """300 Loops in a chain, each capturing a produced value: a Loop whose first iteration
    completes while it launches is released by its launcher, not by a nested drain, so the
    chain does not nest Python frames per Loop."""
    b = GraphBuilder("loop_chain")
    x = b.input("x", F32, (2,))
    cap = b.op("Neg", x, name="cap")
    acc = b.op("Add", x, cap)  # every capture has arrived when the first Loop launches
    for k in range(300):
        it, c, a, co, ao = _v("it", tensor_type(I64, ())), _v("c"), _v("a"), _v("co"), _v("ao")
        body = _body(f"body{k}", [it, c, a], [co, ao], [
            _node("Sub", [a, cap], [ao]), _node("Identity", [c], [co]),
        ])  # fmt: skip
        acc = b.op("Loop", b.const(np.array(2, I64)), None, acc, body=body)
    b.output(acc, "y")
    graph = b.build()
    model = load_on("async", graph, host=host)
    assert "300 non-strict Loop/Scan" in model.describe()
    expected = 600 * X
    np.testing.assert_allclose((await model.run_async({"x": X}))["y"], expected)
    np.testing.assert_allclose(model.run({"x": X})["y"], expected)
