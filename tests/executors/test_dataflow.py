"""The dataflow executor ("async") against the topological interpreter ("sync") and NumPy.

Every test that runs a model runs it on every executor (the ``executor`` fixture) and the
results agree; models with ``async def`` kernels run on the async executor only, and the
sync executor must refuse them at load. The ready queue pops in a seeded random order
(``TFRT_PY_SCHEDULE_SEED``), so no test depends on scheduling order. No timing assertions.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfrt_py
from tests.support.dataflow import F32, Calls, N, _agree, _branchy
from tests.support.executors import load_on
from tests.support.models.control_flow import if_loop
from tfrt_py.compiler import model_cost
from tfrt_py.concurrency import AsyncValue, HostContext
from tfrt_py.errors import ExecutionError, UnsupportedOpError
from tfrt_py.executors import compile_program
from tfrt_py.executors.dataflow import SCHEDULE_SEED_ENV, DataflowExecutor
from tfrt_py.ir import Graph, GraphBuilder, Node, Value, tensor_type
from tfrt_py.kernels import KernelContext, KernelFlags, KernelRegistry, default_registry

# -- models agree across executors -----------------------------------------------------------


def test_control_flow_model_agrees(executor: str, host: HostContext) -> None:
    case = if_loop()
    model = load_on(executor, case.model, host=host)
    ref = tfrt_py.load(case.model, executor="sync")
    for feed in case.feeds:
        _agree([ref.run(feed), model.run(feed)])


def test_parallel_branches_agree_across_executors(
    executor: str, host: HostContext, request: pytest.FixtureRequest
) -> None:
    graph = _branchy()
    model = load_on(executor, graph, host=host)
    x = np.random.default_rng(0).standard_normal((1, N)).astype(F32)
    expected = tfrt_py.load(graph, executor="sync").run({"x": x})
    _agree([expected, model.run({"x": x}), asyncio.run(model.run_async({"x": x}))])
    if executor == "async":  # the wide Adds (maybe fused with their neighbours) are expensive
        n_expensive = re.search(r"(\d+) expensive", model.describe())
        assert n_expensive is not None and int(n_expensive.group(1)) >= 2


@pytest.mark.anyio
async def test_run_async_agrees_on_every_loop(
    executor: str, host: HostContext, anyio_backend: Any
) -> None:
    case = if_loop()
    model = load_on(executor, case.model, host=host)
    for feed in case.feeds:
        _agree([model.run(feed), await model.run_async(feed)])


def test_cost_classification() -> None:
    reg = default_registry()
    b = GraphBuilder("costs")
    x = b.input("x", F32, (1, 1024))
    big = b.op(
        "Gemm",
        x,
        b.const(np.zeros((1024, 1024), F32)),
        output_types=[tensor_type(F32, (1, 1024))],
    )
    small = b.op("MatMul", b.input("s", F32, (1, 16)), b.const(np.zeros((16, 16), F32)))
    unknown = b.op("MatMul", b.input("u", F32, None), b.const(np.zeros((256, 256), F32)))
    b.output(b.op("Relu", big), "a")
    b.output(small, "b")
    b.output(unknown, "c")
    graph = b.build()
    cost = model_cost(graph, reg)
    nodes = {n.op_type + str(i): n for i, n in enumerate(graph.nodes)}
    assert cost.expensive(nodes["Gemm0"])
    assert not cost.expensive(nodes["MatMul1"])
    assert cost.expensive(nodes["MatMul2"])  # heuristic: big constant weight
    assert not cost.expensive(nodes["Relu3"])


def test_programs_without_control_flow_have_no_gates() -> None:
    branchy = _branchy()
    plan = DataflowExecutor(
        compile_program(branchy, default_registry()),
        default_registry(),
        expensive=model_cost(branchy).expensive,
    ).schedule
    assert not plan.ifs and not plan.ctrls and not plan.gate_of and not plan.sources
    assert len(plan.kinds) == plan.n_nodes + 1
    cf = tfrt_py.load(if_loop().model, executor="sync")
    cf_plan = DataflowExecutor(
        cf.prepared.program, default_registry(), expensive=model_cost(cf.graph).expensive
    ).schedule
    # the If, and power_loop (captures the If's output); doubling_loop captures constants
    assert len(cf_plan.ifs) == 1 and len(cf_plan.ctrls) == 1


# -- random DAGs: dataflow == topological order == NumPy ------------------------------------

UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Relu": lambda a: np.maximum(a, 0),
    "Neg": np.negative,
    "Tanh": np.tanh,
    "Abs": np.abs,
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Max": np.maximum,
    "Min": np.minimum,
}


def _registry(is_async: bool) -> KernelRegistry:
    """Default kernels plus t::Halve, as an ``async def`` or a plain function."""
    reg = default_registry().copy()

    async def halve_async(a: np.ndarray) -> np.ndarray:
        await anyio.sleep(0)
        return a * F32(0.5)

    def build(ctx: KernelContext) -> Any:
        return halve_async if is_async else (lambda a: a * F32(0.5))

    reg.add("Halve", build, domain="t", flags=KernelFlags(pure=False, is_async=is_async))
    return reg


ASYNC_REG, SYNC_REG = _registry(True), _registry(False)


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[int, list[tuple[str, list[int]]], list[int], int]:
    n_in = draw(st.integers(1, 3))
    nodes: list[tuple[str, list[int]]] = []
    for k in range(draw(st.integers(1, 20))):
        avail = n_in + k
        op = draw(st.sampled_from([*UNARY, *BINARY, "MatMul", "MatMul", "Halve"]))
        arity = 2 if op in BINARY else 1
        pick = st.integers(max(0, avail - 5), avail - 1) | st.integers(0, avail - 1)
        nodes.append((op, [draw(pick) for _ in range(arity)]))
    used = {i for _, ins in nodes for i in ins}
    n_total = n_in + len(nodes)
    outs = [i for i in range(n_in, n_total) if i not in used]
    extra = draw(st.lists(st.integers(n_in, n_total - 1), max_size=2))
    return n_in, nodes, sorted(set(outs) | set(extra)), draw(st.integers(0, 2**16))


@settings(derandomize=True, max_examples=40, deadline=None)
@given(random_dags())
def test_random_dags_dataflow_equals_topological_equals_numpy(dag: Any) -> None:
    n_in, nodes, outs, seed = dag
    rng = np.random.default_rng(seed)
    b = GraphBuilder("dag")
    values: list[Value] = [b.input(f"x{i}", F32, (2, 8)) for i in range(n_in)]
    feeds = [rng.standard_normal((2, 8)).astype(F32) for _ in range(n_in)]
    ref = list(feeds)
    for op, ins in nodes:
        args = [values[i] for i in ins]
        if op == "MatMul":
            w = (rng.standard_normal((8, 8)) * 0.3).astype(F32)
            values.append(b.op("MatMul", args[0], b.const(w)))
            ref.append(ref[ins[0]] @ w)
        elif op == "Halve":
            values.append(b.op("Halve", args[0], domain="t"))
            ref.append(ref[ins[0]] * F32(0.5))
        else:
            values.append(b.op(op, *args))
            fn: Any = UNARY.get(op) or BINARY[op]
            ref.append(fn(*[ref[i] for i in ins]))
    for k, i in enumerate(outs):
        b.output(values[i], f"y{k}")
    graph = b.build()
    topo = compile_program(graph, SYNC_REG).run(feeds)
    df = DataflowExecutor(
        compile_program(graph, ASYNC_REG),
        ASYNC_REG,
        expensive=lambda n: n.op_type == "MatMul",  # MatMuls go through the pool
        schedule_seed=seed,
    )
    with HostContext(num_workers=2, name="dag") as host:
        flowed = df.run(feeds, host)
        awaited = asyncio.run(df.run_async(feeds, host))
    for k, i in enumerate(outs):
        np.testing.assert_allclose(topo[k], ref[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(flowed[k], topo[k])
        np.testing.assert_array_equal(awaited[k], topo[k])


# -- errors ----------------------------------------------------------------------------------


def _failing_model(calls: Calls) -> tuple[Graph, dict[tuple[str, str], Any]]:
    """x -> Check (fails when x[0,0] < 0) -> Add -> After (counts) -> y;  x -> Side -> z."""

    def check(x: np.ndarray) -> np.ndarray:
        calls.hit("check")
        if x[0, 0] < 0:
            raise ValueError("negative input")
        return x

    def after(x: np.ndarray) -> np.ndarray:
        calls.hit("after")
        return x + 1

    def side(x: np.ndarray) -> np.ndarray:
        calls.hit("side")
        return x * 2

    b = GraphBuilder("failing")
    x = b.input("x", F32, (1, 4))
    c = b.op("Check", x, domain="app", name="the_check")
    b.output(b.op("After", b.op("Add", c, x), domain="app"), "y")
    b.output(b.op("Side", x, domain="app"), "z")
    kernels = {("app", "Check"): check, ("app", "After"): after, ("app", "Side"): side}
    return b.build(), kernels


def test_error_names_the_node_and_downstream_kernels_do_not_run(
    executor: str, host: HostContext
) -> None:
    calls = Calls()
    graph, kernels = _failing_model(calls)
    model = load_on(executor, graph, host=host, custom_kernels=kernels)
    with pytest.raises(ExecutionError, match="the_check") as info:
        model.run({"x": -np.ones((1, 4), F32)})
    assert (info.value.node_name, info.value.op_type) == ("the_check", "Check")
    assert isinstance(info.value.__cause__, ValueError)
    assert calls["after"] == 0  # its input was an error: it never ran
    out = model.run({"x": np.ones((1, 4), F32)})  # still usable
    np.testing.assert_array_equal(out["y"], np.full((1, 4), 3, F32))
    np.testing.assert_array_equal(out["z"], np.full((1, 4), 2, F32))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_independent_failures_report_the_first_in_program_order(
    executor: str, seed: int, monkeypatch: pytest.MonkeyPatch, host: HostContext
) -> None:
    monkeypatch.setenv(SCHEDULE_SEED_ENV, str(seed))

    def fail(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("no")

    b = GraphBuilder("two_failures")
    x = b.input("x", F32, (2,))
    first = b.op("Fail", b.op("Relu", x), domain="app", name="first")
    second = b.op("Fail", x, domain="app", name="second")
    b.output(b.op("Add", first, second), "y")
    m = load_on(executor, b.build(), host=host, custom_kernels={("app", "Fail"): fail})
    with pytest.raises(ExecutionError, match="'first'"):
        m.run({"x": np.ones(2, F32)})


@pytest.mark.anyio
async def test_async_kernel_error_propagates(anyio_backend: Any, host: HostContext) -> None:
    async def fetch(x: np.ndarray) -> np.ndarray:
        await anyio.sleep(0)
        raise OSError("backend down")

    b = GraphBuilder("fetch_fails")
    x = b.input("x", F32, (2,))
    b.output(b.op("Relu", b.op("Fetch", x, domain="app", name="fetch")), "y")
    m = load_on("async", b.build(), host=host, custom_kernels={("app", "Fetch"): fetch})
    for call in (m.run_async, lambda f: anyio.to_thread.run_sync(m.run, f)):
        with pytest.raises(ExecutionError, match="'fetch' \\(Fetch\\) failed: OSError"):
            await call({"x": np.ones(2, F32)})


# -- async kernels ---------------------------------------------------------------------------


def _async_pair_model() -> tuple[Graph, dict[tuple[str, str], Any]]:
    """Two async kernels on parallel branches; Wait only finishes once Signal has run, so
    the call completes only if both are in flight at once."""
    gate: dict[str, AsyncValue[None]] = {}

    async def signal(x: np.ndarray) -> np.ndarray:
        await anyio.sleep(0)
        gate["av"].set(None)
        return x + 1

    async def wait(x: np.ndarray) -> np.ndarray:
        await gate["av"]
        return x * 3

    b = GraphBuilder("async_pair")
    x = b.input("x", F32, (2,))
    s = b.op("Signal", x, domain="app")
    w = b.op("Wait", x, domain="app")
    b.output(b.op("Add", s, w), "y")
    b.output(b.op("Tanh", x), "t")
    kernels = {("app", "Signal"): signal, ("app", "Wait"): wait}
    return b.build(), kernels, gate  # type: ignore[return-value]


@pytest.mark.anyio
async def test_async_kernels_overlap(anyio_backend: Any, host: HostContext) -> None:
    graph, kernels, gate = _async_pair_model()  # type: ignore[misc]
    with pytest.raises(UnsupportedOpError, match="async executor"):
        tfrt_py.load(graph, executor="sync", custom_kernels=kernels)
    model = tfrt_py.load(graph, custom_kernels=kernels, host=host)
    assert model.executor == "async" and "auto: 2 async" in model.describe()
    x = np.arange(2, dtype=F32)
    expected = {"y": (x + 1) + x * 3, "t": np.tanh(x)}
    with anyio.fail_after(10):
        gate["av"] = AsyncValue()
        _agree([expected, await model.run_async({"x": x})])
        gate["av"] = AsyncValue()  # from a worker thread: the host's background loop
        _agree([expected, await anyio.to_thread.run_sync(model.run, {"x": x})])


def test_async_kernels_from_plain_sync_code_and_inside_a_running_loop(host: HostContext) -> None:
    graph, kernels, gate = _async_pair_model()  # type: ignore[misc]
    model = tfrt_py.load(graph, custom_kernels=kernels, host=host)
    x = np.ones(2, F32)
    gate["av"] = AsyncValue()
    first = model.run({"x": x})

    async def blocking_call_inside_a_coroutine() -> dict[str, np.ndarray]:
        gate["av"] = AsyncValue()
        return model.run({"x": x})

    _agree([first, asyncio.run(blocking_call_inside_a_coroutine())])


def test_async_kernel_inside_a_branch_is_refused_at_load() -> None:
    async def fetch(x: np.ndarray) -> np.ndarray:
        return x

    out = Value("out")
    inner = Graph("then", outputs=[out], opsets={"": 17})
    x = Value("x", tensor_type(F32, (2,)))
    inner.nodes.append(Node("Fetch", [x], [out], name="nested_fetch", domain="app", opset=1))
    other = Value("other")
    alt = Graph("else", outputs=[other], nodes=[Node("Neg", [x], [other], name="n", opset=17)])
    b = GraphBuilder("nested")
    b._graph.inputs.append(x)
    cond = b.input("c", np.bool_, ())
    b.output(b.op("If", cond, then_branch=inner, else_branch=alt), "y")
    with pytest.raises(UnsupportedOpError, match="nested_fetch"):
        tfrt_py.load(b.build(), custom_kernels={("app", "Fetch"): fetch})


@pytest.mark.anyio
async def test_if_is_non_strict(anyio_backend: Any, host: HostContext) -> None:
    """The else branch captures Slow's output; Slow waits for Mark, which needs the If's
    output. A strict If would wait for Slow forever; a non-strict one takes the then branch
    as soon as ``cond`` is known."""
    gate: list[AsyncValue[None]] = []

    async def slow(x: np.ndarray) -> np.ndarray:
        await gate[0]
        return x - 1

    def mark(y: np.ndarray) -> np.ndarray:
        gate[0].set(None)
        return y

    b = GraphBuilder("non_strict")
    x = b.input("x", F32, (2,))
    cond = b.input("c", np.bool_, ())
    s = b.op("Slow", x, domain="app")
    then_y, else_y = Value("then_y"), Value("else_y")
    one = Value("one", const=np.ones(2, F32))
    then_g = Graph("then", outputs=[then_y], constants=[one], opsets={"": 17})
    then_g.nodes.append(Node("Add", [x, one], [then_y], name="then_add", opset=17))
    else_g = Graph("else", outputs=[else_y], opsets={"": 17})
    else_g.nodes.append(Node("Neg", [s], [else_y], name="else_neg", opset=17))
    picked = b.op("If", cond, then_branch=then_g, else_branch=else_g)
    b.output(b.op("Mark", picked, domain="app"), "y")
    b.output(s, "s")
    kernels = {("app", "Slow"): slow, ("app", "Mark"): mark}
    model = load_on("async", b.build(), host=host, custom_kernels=kernels)
    x_val = np.array([1.0, 2.0], F32)
    with anyio.fail_after(10):
        gate[:] = [AsyncValue()]
        out = await model.run_async({"x": x_val, "c": np.array(True)})
    np.testing.assert_array_equal(out["y"], x_val + 1)
    np.testing.assert_array_equal(out["s"], x_val - 1)


@pytest.mark.parametrize("failing", ["cond_source", "else_only"])
def test_if_errors_agree(executor: str, failing: str, host: HostContext) -> None:
    """A failure feeding the cond, or feeding only the branch not taken: the call fails
    naming that node on every executor (every kernel runs, as in the sync executor)."""

    def check(x: np.ndarray, tag: str = "") -> np.ndarray:
        if tag == failing:
            raise ValueError(tag)
        return x

    b = GraphBuilder("if_errors")
    x = b.input("x", F32, (2,))
    cond = b.op(
        "Check", b.input("c", np.bool_, ()), domain="app", name="cond_source", tag="cond_source"
    )
    only_else = b.op("Check", x, domain="app", name="else_only", tag="else_only")
    then_y, else_y = Value("then_y"), Value("else_y")
    then_g = Graph("then", outputs=[then_y], opsets={"": 17})
    then_g.nodes.append(Node("Neg", [x], [then_y], name="then_neg", opset=17))
    else_g = Graph("else", outputs=[else_y], opsets={"": 17})
    else_g.nodes.append(Node("Abs", [only_else], [else_y], name="else_abs", opset=17))
    b.output(b.op("If", cond, then_branch=then_g, else_branch=else_g), "y")
    model = load_on(executor, b.build(), host=host, custom_kernels={("app", "Check"): check})
    with pytest.raises(ExecutionError, match=f"'{failing}'"):
        model.run({"x": np.ones(2, F32), "c": np.array(True)})
