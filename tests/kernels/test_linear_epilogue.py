"""The fused Linear's compiled bias + Relu epilogue (``kernels/linalg/bias_act_jit.py``):
the same values as the unfused MatMul/Add/Relu, bit for bit, on the sync interpreter's
generated code and on the async executor's kernel call, NaN and -0.0 included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.lib.jit import jit_enabled
from tfrt_py.kernels.linalg.bias_act_jit import MIN_ELEMENTS, bias_relu

pytestmark = pytest.mark.skipif(not jit_enabled(), reason="numba is not installed")


def _mlp(bias_shape: tuple[int, ...], relu: bool) -> bytes:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal(bias_shape).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
    ]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y" if relu else "a", TensorProto.FLOAT, ["n", 64])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize(("bias_shape", "relu"), [((64,), True), ((1, 64), False)])
def test_epilogue_matches_the_unfused_graph(
    executor: str, bias_shape: tuple[int, ...], relu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tfrt_py.kernels.fused.linear as fk

    compiled = bias_relu()
    calls: list[int] = []

    def counting(y: np.ndarray, b: np.ndarray, r: bool) -> None:
        calls.append(y.size)
        compiled(y, b, r)

    monkeypatch.setattr(fk, "bias_relu", lambda: counting)  # what the Linear gets at load
    # the NumPy product and this epilogue: the path without the packed one-thread product
    # (float64, weights over 1 MiB; tested below and in test_linear_packed)
    monkeypatch.setattr(fk, "serial_for", lambda *a: None)
    data = _mlp(bias_shape, relu)
    fused = tfrt_py.load(data, executor=executor)
    plain = tfrt_py.load(data, executor=executor, optimize=False)
    assert any(n.op_type == "Linear" for n in fused.prepared.graph.nodes)
    rng = np.random.default_rng(4)
    for rows in (300, 2, 300):  # above and below MIN_ELEMENTS outputs, a planned call again
        x = rng.standard_normal((rows, 16)).astype(np.float32)
        x[0, :] = np.nan
        x[1, :] = 0.0
        got, want = fused.run({"x": x}), plain.run({"x": x})
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
            np.testing.assert_array_equal(np.signbit(got[k]), np.signbit(want[k]))
    assert 300 * 64 >= MIN_ELEMENTS > 2 * 64
    assert calls and set(calls) == {300 * 64}  # the epilogue ran, on the big calls only


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 7, 300])
def test_one_thread_products_run_on_the_packed_weight(
    relu: bool, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 Linear whose product stays on one thread runs on its weight packed at load
    (``linear_par.Serial``), bias and ReLU as the rows are stored: the unfused graph's
    values to float32 rounding, a NaN row NaN, and the packed kernel really ran."""
    from tfrt_py.kernels.lib import linear_par

    ran: list[int] = []
    real = linear_par._LINEAR_SERIAL.get()

    def spy(a: np.ndarray, *rest: object) -> None:
        # the packed kernel, called by Serial.run or straight from the plan's code
        assert real is not None
        real(a, *rest)
        ran.append(a.shape[0])

    monkeypatch.setattr(linear_par._LINEAR_SERIAL, "get", lambda: None if real is None else spy)
    data = _mlp((64,), relu)
    fused = tfrt_py.load(data, executor="sync", threads=1)
    plain = tfrt_py.load(data, executor="sync", optimize=False)
    if linear_par.serial_for([], None, np.ones((16, 64), np.float32)) is None:
        pytest.skip("no packed kernel here (numba missing, or a CPU without AVX2 and FMA)")
    x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
    x[0, :] = np.nan
    for _ in range(2):
        ran.clear()
        got, want = fused.run({"x": x}), plain.run({"x": x})
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, equal_nan=True)
            assert np.isnan(got[k][0]).all()
        assert ran == [rows]


def test_bias_relu_is_numpys_add_and_maximum() -> None:
    fn = bias_relu()
    rng = np.random.default_rng(5)
    for dt in (np.float32, np.float64):
        y = rng.standard_normal((70, 33)).astype(dt)
        y[3, 4], y[5, 6] = np.nan, -0.0
        y[7, 8] = -0.0  # with a bias of -0.0 there: -0.0 + -0.0 is -0.0, and Relu makes it +0.0
        for b, relu in [
            (np.where(np.arange(33) == 8, dt(-0.0), rng.standard_normal(33)).astype(dt), True),
            (rng.standard_normal(33).astype(dt), False),
            (np.zeros(0, dt), True),  # a Linear without bias: the Relu alone
        ]:
            want = np.add(y, b) if b.size else y.copy()
            if relu:
                np.maximum(want, dt(0), out=want)
            got = y.copy()
            fn(got, b, relu)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_a_strided_outputs_buffer_takes_the_numpy_steps(executor: str) -> None:
    """The compiled pass works on C-contiguous outputs only; a caller's strided
    ``outputs=`` buffer gets the same values through NumPy's add and maximum (first
    call and planned calls)."""
    data = _mlp((64,), True)
    model = tfrt_py.load(data, executor=executor)
    plain = tfrt_py.load(data, executor=executor, optimize=False)
    x = np.random.default_rng(6).standard_normal((300, 16)).astype(np.float32)
    want = plain.run({"x": x})["y"]
    for _ in range(3):
        big = np.full((300, 128), np.nan, np.float32)
        buf = big[:, ::2]
        got = model.run({"x": x}, outputs={"y": buf})["y"]
        assert got is buf
        # a first call without a plan may run the packed product (float32 rounding)
        np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-6)
        assert np.isnan(big[:, 1::2]).all()  # nothing written between the columns


def _mlp3(relu: bool) -> bytes:
    """A transformer-style Linear: (batch, seq, 16) @ (16, 64) + bias [+ Relu]."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y" if not relu else "a"]),
    ]
    if relu:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 64])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("relu", [True, False])
def test_rank3_linear_runs_inline_as_one_product(
    relu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A (batch, seq, hidden) Linear on planned calls is one 2-D product written in the
    plan (a small one straight to np.matmul, not through the kernel's splitting
    matmul_into), the unfused graph's values (to rounding: one product of batch x seq rows
    rounds differently from NumPy's per-batch products), into a strided outputs= buffer
    too."""
    import tfrt_py.kernels.fused.linear as fk

    split_calls: list[int] = []
    real = fk.matmul_into

    def counting(*a: object, **kw: object) -> object:
        split_calls.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fk, "matmul_into", counting)
    data = _mlp3(relu)
    fused = tfrt_py.load(data, executor="sync")
    plain = tfrt_py.load(data, executor="sync", optimize=False)
    assert any(n.op_type == "Linear" for n in fused.prepared.graph.nodes)
    rng = np.random.default_rng(8)
    for shape in ((2, 40, 16), (1, 3, 16), (2, 40, 16)):
        x = rng.standard_normal(shape).astype(np.float32)
        want = plain.run({"x": x})["y"]
        for _ in range(2):  # the first call of a signature plans it; the second is planned
            split_calls.clear()
            np.testing.assert_allclose(fused.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
        assert split_calls == []
        big = np.full((*shape[:2], 128), np.nan, np.float32)
        got = fused.run({"x": x}, outputs={"y": big[..., ::2]})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.isnan(big[..., 1::2]).all()


def _wide_linear(shape: list[str | int], act: str) -> bytes:
    """A Linear big enough to split over the threads (256 rows x 192 @ 192 x 768), bias
    and an activation (decomposed erf GELU, or Relu)."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((192, 768)) * 0.1).astype(np.float32)
    b = rng.standard_normal(768).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    else:
        for name, v in (("s2", 2.0**0.5), ("one", 1.0), ("half", 0.5)):
            inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
        nodes += [
            helper.make_node("Div", ["a", "s2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["p"]),
            helper.make_node("Mul", ["a", "p"], ["q"]),
            helper.make_node("Mul", ["q", "half"], ["y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("act", ["Gelu", "Relu"])
@pytest.mark.parametrize("shape", [["n", 192], [2, "s", 192], [256, 192]], ids=str)
def test_a_split_linear_finishes_each_block_of_rows(
    executor: str, act: str, shape: list[str | int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bias and activation run per block of rows inside ``gemm.matmul_into`` or the
    packed product's row split (``linear_par.Serial.split_rows``, where the packed kernel
    runs), on the thread that computed the block: the same values as the unfused graph, on
    the generated plan code and on the kernel call, and with a strided outputs= buffer."""
    from tfrt_py.kernels.lib import gemm, linear_par

    seen: list[int] = []
    real = gemm.matmul_into
    real_rows = linear_par.Serial.split_rows

    def spy(a: np.ndarray, b: np.ndarray, out: object = None, epilogue: object = None) -> object:
        if epilogue is not None:
            seen.append(a.shape[0])
        return real(a, b, out, epilogue)  # type: ignore[arg-type]

    def spy_rows(self: linear_par.Serial, a: np.ndarray, out: np.ndarray) -> bool:
        done = real_rows(self, a, out)
        if done:
            seen.append(a.shape[0])
        return done

    import tfrt_py.kernels.fused.linear as fk

    monkeypatch.setattr(fk, "matmul_into", spy)
    monkeypatch.setattr(linear_par.Serial, "split_rows", spy_rows)
    data = _wide_linear(shape, act)
    fused = tfrt_py.load(data, executor=executor)
    plain = tfrt_py.load(data, executor=executor, optimize=False)
    assert any(n.op_type == "Linear" for n in fused.prepared.graph.nodes)
    seen.clear()  # the generic plan's shape probes ran the kernel at load, on a few rows
    rng = np.random.default_rng(9)
    x_shape = (256, 192) if len(shape) == 2 else (2, 128, 192)
    x = rng.standard_normal(x_shape).astype(np.float32)
    want = plain.run({"x": x})["y"]
    for _ in range(3):  # the probe, then planned calls
        np.testing.assert_allclose(fused.run({"x": x})["y"], want, rtol=2e-6, atol=2e-6)
    assert seen and all(r == 256 for r in seen)
    buf = np.full((*want.shape[:-1], 2 * want.shape[-1]), np.nan, np.float32)
    got = fused.run({"x": x}, outputs={"y": buf[..., ::2]})["y"]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
