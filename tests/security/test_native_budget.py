"""The native compile budget (issue 12): "auto" picked native for a 1000-node chain (18 s
and 682 MB to compile; 5000 nodes never finished). Above ``$TFRT_PY_NATIVE_BUDGET``
compile units, auto declines at once with the reason in describe(), and
executor="native" raises a tfrt_py error naming the limit and the variable."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.native import Declined
from tfrt_py.native.lower.budget import BUDGET_ENV, DEFAULT_BUDGET, OverBudget


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    monkeypatch.delenv(BUDGET_ENV, raising=False)


def _chain(n: int, fused: bool) -> bytes:
    """An n-node elementwise chain on x[4]: Tanh/Relu (fuses into one node of n steps) or
    Mul by a constant / Add to itself (every value read twice: n nodes)."""
    nodes, prev = [], "x"
    for i in range(n):
        out = f"h{i}" if i < n - 1 else "y"
        if fused:
            nodes.append(helper.make_node("Relu" if i % 2 else "Tanh", [prev], [out]))
        elif i % 2:
            nodes.append(helper.make_node("Add", [prev, prev], [out]))
        else:
            nodes.append(helper.make_node("Mul", [prev, "c"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.full(4, 0.5, np.float32), "c")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_a_2000_node_chain_is_over_budget(fused: bool) -> None:
    data = _chain(2000, fused)
    t0 = time.perf_counter()
    auto = tfrt_py.load(data)
    took = time.perf_counter() - t0
    assert auto.executor == "sync"
    assert auto.native is None
    text = auto.describe()
    assert "compile budget" in text and BUDGET_ENV in text, text
    assert took < 20, f"auto took {took:.1f} s to decline"
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    want = tfrt_py.load(data, executor="sync").run({"x": x})["y"]
    np.testing.assert_array_equal(auto.run({"x": x})["y"], want)
    with pytest.raises(OverBudget, match=f"budget is {DEFAULT_BUDGET}.*{BUDGET_ENV}"):
        tfrt_py.load(data, executor="native")


def test_the_budget_is_an_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _chain(40, fused=False)
    assert tfrt_py.load(data).executor == "native"  # under the default budget
    monkeypatch.setenv(BUDGET_ENV, "20")
    auto = tfrt_py.load(data)
    assert auto.executor == "sync"
    assert "budget is 20" in auto.describe()
    with pytest.raises(OverBudget, match="needs at least 40 compile units"):
        tfrt_py.load(data, executor="native")
    monkeypatch.setenv(BUDGET_ENV, "lots")
    assert tfrt_py.load(data).executor == "sync"
    with pytest.raises(Declined, match=f"{BUDGET_ENV} must be a positive integer"):
        tfrt_py.load(data, executor="native")


def test_a_native_model_shows_its_compile_units() -> None:
    model = tfrt_py.load(_chain(6, fused=False), native="eager")
    assert model.executor == "native"
    assert f"({model.native.lowered.units} compile units)" in model.describe()


def _softmaxes(n: int) -> bytes:
    """``n`` softmaxes over x[B, S, 16] (dims the native tier serves with boxes)."""
    nodes, prev = [], "x"
    for i in range(n):
        out = f"h{i}" if i < n - 1 else "y"
        nodes.append(helper.make_node("Softmax", [prev], [out], axis=-1))
        prev = out
    graph = helper.make_graph(
        nodes, "softmaxes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 16])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_executor_native_leaves_the_budget_to_each_box_of_a_dynamic_model(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """executor="native" on a model with dynamic dims loads (its load-time lowering is a
    probe: in a cold process, longer than the code that compiles; it refused Llama's
    decoder at 1,525 units of a 1,500 budget); each box meets the budget when it compiles,
    and one over it declines to the interpreter, saying why. "auto" still refuses."""
    data = _softmaxes(4)
    monkeypatch.setenv(BUDGET_ENV, "60")  # above the lower bound, below any box's units
    assert tfrt_py.load(data).executor == "sync"
    model = tfrt_py.load(data, executor="native", native="eager")
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    want = tfrt_py.load(data, executor="sync").run({"x": x})["y"]
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6)
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6)
    text = model.describe()
    assert "declined" in text and "budget is 60" in text, text
