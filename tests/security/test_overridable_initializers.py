"""An initializer that is also a graph input (issue 12, item 5). ONNX IR >= 4 lets the
caller override it; tfrt_py does what onnxruntime does, checked against onnxruntime here:
the name is not in ``model.inputs`` but in ``model.overridable_initializers``; fed, the fed
value is used; not fed, the initializer; no load-time pass folds through it. Before IR 4
such an input is a plain constant, and feeding it is an unknown input (as in ORT)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import InputError, ModelLoadError

N = 16


def _model(ir_version: int, declared_b: Any = (TensorProto.FLOAT, [N])) -> onnx.ModelProto:
    """``y = x @ W + 2 * b``; ``W`` and ``b`` are initializers, ``b`` also a graph input.
    ``2 * b`` is what constant folding would precompute if ``b`` were a constant."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((N, N)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
        helper.make_node("Mul", ["b", "two"], ["b2"], name="double_b"),
        helper.make_node("Add", ["m", "b2"], ["y"], name="add"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", N]),
        helper.make_tensor_value_info("b", *declared_b),
    ]
    g = helper.make_graph(
        nodes, "over", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N])],
        [w, b, two],
    )  # fmt: skip
    opset = 13 if ir_version >= 4 else 9
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)  # fmt: skip


def _session(m: onnx.ModelProto) -> Any:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # ORT warns that the initializer is also an input
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _feeds() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((3, N)).astype(np.float32), rng.standard_normal(N).astype(np.float32)


@pytest.mark.parametrize("load_kw", [{"executor": "sync"}, {"executor": "async"}, {}])
def test_overridable_initializer_matches_onnxruntime(load_kw: dict[str, Any]) -> None:
    m = _model(ir_version=8)
    sess = _session(m)
    model = tfrt_py.load(m, **load_kw)
    assert [s.name for s in model.inputs] == [i.name for i in sess.get_inputs()] == ["x"]
    assert [s.name for s in model.overridable_initializers] == ["b"]
    assert [i.name for i in sess.get_overridable_initializers()] == ["b"]
    x, b = _feeds()
    for _ in range(2):  # the second call takes the planned fast path where there is one
        (want,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
        (want_fed,) = sess.run(None, {"x": x, "b": b})
        got_fed = model.run({"x": x, "b": b})["y"]
        np.testing.assert_allclose(got_fed, want_fed, rtol=1e-5, atol=1e-5)
    assert not np.allclose(want, want_fed)  # the override really changed the result


@pytest.mark.anyio
async def test_overridable_initializer_run_async(anyio_backend: Any) -> None:
    m = _model(ir_version=8)
    sess = _session(m)
    model = tfrt_py.load(m, executor="async")
    x, b = _feeds()
    np.testing.assert_allclose(
        (await model.run_async({"x": x, "b": b}))["y"], sess.run(None, {"x": x, "b": b})[0],
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    np.testing.assert_allclose(
        (await model.run_async({"x": x}))["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
    )


def test_before_ir_4_the_initializer_is_a_constant_as_in_onnxruntime() -> None:
    m = _model(ir_version=3)
    sess = _session(m)
    model = tfrt_py.load(m)
    assert [s.name for s in model.inputs] == [i.name for i in sess.get_inputs()] == ["x"]
    assert model.overridable_initializers == sess.get_overridable_initializers() == []
    x, b = _feeds()
    np.testing.assert_allclose(
        model.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
    )
    with pytest.raises(InputError, match=r"unknown input\(s\) \['b'\]"):
        model.run({"x": x, "b": b})
    with pytest.raises(Exception, match="Invalid input name: b"):
        sess.run(None, {"x": x, "b": b})


def test_a_fed_override_is_checked_like_any_feed() -> None:
    model = tfrt_py.load(_model(ir_version=8))
    x, _ = _feeds()
    with pytest.raises(InputError, match="'b'"):
        model.run({"x": x, "b": np.zeros(N + 1, np.float32)})
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        model.run({"b": np.zeros(N, np.float32)})
    with pytest.raises(InputError, match=r"unknown input\(s\) \['c'\]"):
        model.run({"x": x, "c": np.zeros(N, np.float32)})


def test_a_declaration_that_contradicts_the_initializer_fails_at_load() -> None:
    with pytest.raises(ModelLoadError, match=r"initializer 'b' has shape \[16\].*declares \[4\]"):
        tfrt_py.load(_model(ir_version=8, declared_b=(TensorProto.FLOAT, [4])))
    with pytest.raises(ModelLoadError, match=r"initializer 'b' is float32.*declares float64"):
        tfrt_py.load(_model(ir_version=8, declared_b=(TensorProto.DOUBLE, [N])))


def test_streamed_model_keeps_the_override_resident(tmp_path: Any) -> None:
    """With external data and a small budget, W streams; b is memory-mapped as its default
    (never a streamed weight) and can still be overridden."""
    m = _model(ir_version=8)
    path = os.path.join(str(tmp_path), "over.onnx")
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)  # fmt: skip
    model = tfrt_py.load(path, memory_budget=N * N * 4 + 26)  # W streams; b is 64 bytes
    assert model.executor == "stream"
    assert [s.name for s in model.overridable_initializers] == ["b"]
    sess = _session(onnx.load(path))
    x, b = _feeds()
    np.testing.assert_allclose(
        model.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        model.run({"x": x, "b": b})["y"], sess.run(None, {"x": x, "b": b})[0],
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
