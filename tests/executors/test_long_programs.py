"""Programs from strangers that are long: the sync interpreter's first call stays linear in
the nodes (issue 33, N2: a 25k-node graph's first call took 11 s, 100k nodes 230 s, and
``timeout=`` did not cover the planning).

What made it quadratic, each guarded here: the planner scanning every placed buffer
(``test_planner.py``), a fused chain of thousands of steps inlined into the generated code,
one closure parameter per bound name (a call matching each keyword against every
parameter), hashing code objects for the line -> node table, and planning at all past
``MAX_PLANNED_INSTRS`` instructions. No test times anything: each checks the structure
that made the cost, and the answers.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.errors import DeadlineExceeded, ExecutionError
from tfrt_py.executors import interpreter, plan_codegen
from tfrt_py.kernels.fused import chain

F32 = TensorProto.FLOAT
X = np.linspace(-1, 1, 4, dtype=np.float32)


def _info(name: str, shape: Any = (4,)) -> Any:
    return helper.make_tensor_value_info(name, F32, list(shape))


def _model(nodes: list[Any], out: str, domains: tuple[str, ...] = ()) -> bytes:
    graph = helper.make_graph(nodes, "long", [_info("v0")], [_info(out)])
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def _dag(n: int) -> tuple[bytes, np.ndarray]:
    """v[i+1] = v[i] +/- v[i-1]: every value read twice, so nothing fuses; and its answer."""
    nodes = [helper.make_node("Add", ["v0", "v0"], ["v1"], name="n0")]
    vals = [X, X + X]
    for i in range(1, n):
        op = "Add" if i % 2 else "Sub"
        nodes.append(helper.make_node(op, [f"v{i}", f"v{i - 1}"], [f"v{i + 1}"], name=f"n{i}"))
        vals.append(vals[i] + vals[i - 1] if op == "Add" else vals[i] - vals[i - 1])
    return _model(nodes, f"v{n}"), vals[n]


def _sync(source: bytes, **kw: Any) -> tfrt_py.Model:
    return tfrt_py.load(source, executor="sync", **kw)


def test_a_program_too_long_to_plan_runs_unplanned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "MAX_PLANNED_INSTRS", 50)
    source, want = _dag(200)
    model = _sync(source)
    for _ in range(2):
        np.testing.assert_allclose(model.run({"v0": X})[f"v{200}"], want, rtol=1e-6)
    buf = np.empty(4, np.float32)
    assert model.run({"v0": X}, outputs={"v200": buf})["v200"] is buf
    np.testing.assert_allclose(buf, want, rtol=1e-6)
    assert "memory: not planned: 199 instructions" in model.describe(), model.describe()
    assert not model.runtime.plans()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="runs unplanned"):
        model.memory_plan({"v0": (4,)})


def test_an_unplanned_program_drops_values_after_their_last_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run holds only live values: each intermediate is gone once read for the last time."""
    monkeypatch.setattr(interpreter, "MAX_PLANNED_INSTRS", 5)
    alive: list[int] = []
    made: list[Any] = []

    class Probe:
        """app::Probe: y = x + 1, and counts how many of its earlier outputs still live."""

        def __call__(self, x: np.ndarray) -> np.ndarray:
            import weakref

            alive.append(sum(r() is not None for r in made))
            y = x + 1
            made.append(weakref.ref(y))
            return y

    nodes = [helper.make_node("Probe", [f"v{i}"], [f"v{i + 1}"], domain="app") for i in range(12)]
    model = _sync(_model(nodes, "v12", ("app",)), custom_kernels={("app", "Probe"): Probe()})
    np.testing.assert_allclose(model.run({"v0": X})["v12"], X + 12, rtol=1e-6)
    assert max(alive) <= 1, alive  # only the input it reads; the older ones were dropped


def test_a_long_fused_chain_is_called_not_inlined() -> None:
    n = chain.MAX_INLINE_STEPS * 4
    nodes = [helper.make_node("Neg" if i % 2 else "Relu", [f"v{i}"], [f"v{i + 1}"])
             for i in range(n)]  # fmt: skip
    model = _sync(_model(nodes, f"v{n}"))
    want = X.copy()
    for i in range(n):
        want = -want if i % 2 else np.maximum(want, 0)
    np.testing.assert_array_equal(model.run({"v0": X})[f"v{n}"], want)
    (plan,) = model.runtime._plans.values()  # type: ignore[attr-defined]
    assert plan.gen.source.count("\n") < 150  # one call for the chain, not a line per step


@pytest.mark.parametrize("max_binds", [plan_codegen.MAX_CLOSURE_BINDS, 10])
def test_generated_code_binds_names_as_cells_or_globals(
    monkeypatch: pytest.MonkeyPatch, max_binds: int
) -> None:
    """Past ``MAX_CLOSURE_BINDS`` names the generated module binds them as globals; the
    answers and the node named by an error are the same either way."""
    monkeypatch.setattr(plan_codegen, "MAX_CLOSURE_BINDS", max_binds)
    source, want = _dag(40)
    model = _sync(source)
    for _ in range(3):  # the plain run, then the generated code
        np.testing.assert_allclose(model.run({"v0": X})["v40"], want, rtol=1e-6)
    (plan,) = model.runtime._plans.values()  # type: ignore[attr-defined]
    assert plan.gen.source.startswith("def _make():") == (max_binds == 10)

    def fail(x: np.ndarray) -> np.ndarray:
        if x[0] > 100:
            raise RuntimeError("too big")
        return x

    nodes = [helper.make_node("Add", ["v0", "v0"], ["v1"], name="first"),
             helper.make_node("Check", ["v1"], ["v2"], domain="app", name="the_check"),
             helper.make_node("Neg", ["v2"], ["v3"], name="last")]  # fmt: skip
    checked = _sync(_model(nodes, "v3", ("app",)), custom_kernels={("app", "Check"): fail})
    checked.run({"v0": X})
    checked.run({"v0": X})  # planned now
    with pytest.raises(ExecutionError, match="the_check"):
        checked.run({"v0": X + 100})


def test_the_deadline_covers_the_first_calls_planning() -> None:
    """A first call whose deadline passed in its last kernel raises DeadlineExceeded
    instead of planning (and answering) past it; the model then plans and answers."""
    release = threading.Event()

    def slow(x: np.ndarray) -> np.ndarray:
        release.wait(0.5)  # past the call's deadline, inside the last kernel
        return x * 2

    nodes = [helper.make_node("Relu", ["v0"], ["v1"]),
             helper.make_node("Slow", ["v1"], ["v2"], domain="app", name="slow")]  # fmt: skip
    model = _sync(_model(nodes, "v2", ("app",)), custom_kernels={("app", "Slow"): slow})
    with pytest.raises(DeadlineExceeded):
        model.run({"v0": X}, timeout=0.05)
    assert not model.runtime.plans()  # type: ignore[attr-defined]
    release.set()
    np.testing.assert_array_equal(model.run({"v0": X}, timeout=30)["v2"], np.maximum(X, 0) * 2)
    assert len(model.runtime.plans()) == 1  # type: ignore[attr-defined]
