"""The public API: names, load sources, specs, feeds, ownership of outputs, threads. What
an executor does (feeds, ownership, threads, run_async, custom kernels) is checked on every
executor (the ``executor`` fixture)."""

from __future__ import annotations
import __future__

import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.executors import load_on
from tests.support.threads import threads_disagreeing
from tfrt_py.errors import InputError
from tfrt_py.ir import GraphBuilder


def _affine_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    b = numpy_helper.from_array(np.array([0.5, -0.5], np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "b"], ["y"], name="add"),
            helper.make_node("Identity", ["w"], ["w_out"], name="id"),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [3, 2]),
        ],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_public_names_are_exactly_all() -> None:
    # Submodules appear as attributes once imported, and ``from __future__ import
    # annotations`` binds a feature object; every other public name is in __all__.
    public = {
        n
        for n in dir(tfrt_py)
        if not n.startswith("_")
        and not isinstance(getattr(tfrt_py, n), (types.ModuleType, __future__._Feature))
    }
    exported = set(tfrt_py.__all__) - {"__version__", "errors", "ir"}
    assert public == exported
    assert all(hasattr(tfrt_py, n) for n in tfrt_py.__all__)


def test_load_from_path_bytes_proto_and_graph_agree(tmp_path: object) -> None:
    proto = _affine_model()
    path = f"{tmp_path}/affine.onnx"
    onnx.save(proto, path)
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    expected = x @ np.arange(6, dtype=np.float32).reshape(3, 2) + np.array([0.5, -0.5])
    for source in (path, proto.SerializeToString(), proto):
        y = tfrt_py.load(source).run({"x": x})["y"]
        np.testing.assert_allclose(y, expected, rtol=1e-6)
    b = GraphBuilder("built")
    xv = b.input("x", np.float32, ("N", 3))
    b.output(
        b.op(
            "Add",
            b.op("MatMul", xv, b.const(np.arange(6, dtype=np.float32).reshape(3, 2))),
            b.const(np.array([0.5, -0.5], np.float32)),
        ),
        "y",
    )
    np.testing.assert_allclose(tfrt_py.load(b.build()).run({"x": x})["y"], expected, rtol=1e-6)


def test_specs_and_output_order() -> None:
    m = tfrt_py.load(_affine_model())
    assert [(s.name, s.dtype, s.shape) for s in m.inputs] == [("x", np.dtype(np.float32), ("N", 3))]
    assert [s.name for s in m.outputs] == ["y", "w_out"]
    out = m.run({"x": np.zeros((4, 3), np.float32)})
    assert list(out) == ["y", "w_out"]
    assert out["y"].shape == (4, 2)
    assert m.executor == "sync"
    assert "executor: sync" in m.describe()


def test_user_owns_outputs_even_when_they_are_constants(executor: str) -> None:
    m = load_on(executor, _affine_model())
    x = np.ones((1, 3), np.float32)
    first = m.run({"x": x})
    first["w_out"][:] = 99.0
    first["y"][:] = 99.0
    again = m.run({"x": x})
    np.testing.assert_array_equal(again["w_out"], np.arange(6, dtype=np.float32).reshape(3, 2))
    assert again["y"][0, 0] != 99.0


def test_lossless_python_values_and_safe_casts_are_accepted(executor: str) -> None:
    m = load_on(executor, _affine_model())
    ref = m.run({"x": np.array([[1, 2, 3]], np.float32)})["y"]
    np.testing.assert_array_equal(m.run({"x": [[1.0, 2.0, 3.0]]})["y"], ref)
    np.testing.assert_array_equal(m.run({"x": [[1, 2, 3]]})["y"], ref)
    np.testing.assert_array_equal(m.run({"x": np.array([[1, 2, 3]], np.int8)})["y"], ref)
    with pytest.raises(InputError, match=r"'x'.*without loss.*float32"):
        m.run({"x": [[0.1, 2.0, 3.0]]})  # 0.1 is not a float32


def test_symbolic_dims_must_agree_across_inputs(executor: str) -> None:
    b = GraphBuilder("two")
    a = b.input("a", np.float32, ("N", 2))
    c = b.input("c", np.float32, ("N", 2))
    b.output(b.op("Add", a, c), "s")
    m = load_on(executor, b.build())
    with pytest.raises(InputError, match=r"'c'.*'N'.*is 3.*'a' has 'N' = 2"):
        m.run({"a": np.zeros((2, 2), np.float32), "c": np.zeros((3, 2), np.float32)})
    assert (
        m.run({"a": np.ones((3, 2), np.float32), "c": np.ones((3, 2), np.float32)})["s"].sum() == 12
    )


def test_custom_kernel_gets_inputs_and_attributes(executor: str) -> None:
    b = GraphBuilder("custom")
    x = b.input("x", np.float32, (2,))
    b.output(b.op("Scale", x, domain="app", factor=3.0), "y")
    seen = {}

    def scale(x: np.ndarray, factor: float) -> np.ndarray:
        seen["factor"] = factor
        return x * np.float32(factor)

    m = load_on(executor, b.build(), custom_kernels={("app", "Scale"): scale})
    np.testing.assert_array_equal(m.run({"x": np.array([1, 2], np.float32)})["y"], [3, 6])
    assert seen == {"factor": 3.0}


def test_concurrent_runs_from_threads_agree(executor: str) -> None:
    m = load_on(executor, _affine_model())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(8)]
    expected = [m.run({"x": x})["y"] for x in xs]
    assert threads_disagreeing(lambda x: m.run({"x": x})["y"], xs, expected, calls=200) == []


@pytest.mark.anyio
async def test_run_async_matches_run(executor: str, anyio_backend: str) -> None:
    m = load_on(executor, _affine_model())
    x = np.ones((2, 3), np.float32)
    out = await m.run_async({"x": x})
    np.testing.assert_array_equal(out["y"], m.run({"x": x})["y"])


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _two_branch(n: int) -> tfrt_py.ir.Graph:
    b = GraphBuilder("branches")
    x = b.input("x", np.float32, (n, n))
    w = np.eye(n, dtype=np.float32)
    left = b.op("MatMul", x, b.const(w), name="left")
    right = b.op("MatMul", x, b.const(2 * w), name="right")
    b.output(b.op("Add", left, right), "y")
    return b.build()


def test_auto_picks_async_for_parallel_expensive_kernels_and_says_why() -> None:
    m = tfrt_py.load(_two_branch(512))
    assert m.executor == "async"
    assert "parallel branches pay for the pool hops" in m.describe()
    assert "µs on async with 2 lane(s)" in m.describe()
    x = np.ones((512, 512), np.float32)
    np.testing.assert_array_equal(m.run({"x": x})["y"], 3 * x)


def test_auto_keeps_sync_where_big_kernels_have_dims_the_data_sets() -> None:
    """The same parallel products, and a third whose rows a feed decides (a Slice to a
    computed end, as a detector resizes to computed sizes): the cost model counts such a
    dim as 1, so auto does not bet on the branches and says why."""
    b = GraphBuilder("data_sized")
    x = b.input("x", np.float32, (512, 512))
    k = b.input("k", np.int64, (1,))
    w = np.eye(512, dtype=np.float32)
    both = b.op("Add", b.op("MatMul", x, b.const(w)), b.op("MatMul", x, b.const(2 * w)))
    rows = b.op("Slice", x, b.const(np.array([0], np.int64)), k)
    b.output(both, "y")
    b.output(b.op("MatMul", rows, b.const(3 * w)), "z")
    m = tfrt_py.load(b.build())
    assert m.executor == "sync"
    assert "dims that depend on the data" in m.describe()
    x_in = np.ones((512, 512), np.float32)
    out = m.run({"x": x_in, "k": np.array([7], np.int64)})
    np.testing.assert_array_equal(out["y"], 3 * x_in)
    assert out["z"].shape == (7, 512)


def test_auto_keeps_tiny_models_on_the_sync_interpreter() -> None:
    m = tfrt_py.load(_two_branch(4))
    assert m.executor == "sync"
    assert "the pool hops would cost more" in m.describe()
