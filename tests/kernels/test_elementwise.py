"""Elementwise kernels: the behaviours NumPy does not give for free (dtype rules, integer
division, Erf without SciPy, Cast rules, out=/in-place aliasing, bfloat16)."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tfrt_py.ir import Node, Value
from tfrt_py.ir.types import tensor_type
from tfrt_py.kernels import KernelContext, default_registry


def kernel(
    op: str,
    n_inputs: int = 1,
    attrs: dict[str, Any] | None = None,
    opset: int = 22,
    dtypes: list[Any] | None = None,
    consts: dict[int, np.ndarray] | None = None,
) -> Any:
    """Build op's compute function for a node with n_inputs inputs."""
    consts = consts or {}
    inputs: list[Value | None] = []
    for i in range(n_inputs):
        if i in consts:
            inputs.append(Value(f"x{i}", const=consts[i]))
        else:
            dt = dtypes[i] if dtypes and i < len(dtypes) else None
            inputs.append(Value(f"x{i}", tensor_type(dt) if dt is not None else None))
    node = Node(op, inputs, [Value("y")], attrs or {}, name="n", opset=opset)
    return default_registry().lookup("", op, opset).build(KernelContext(node))


def ort_run(op: str, inputs: list[np.ndarray], opset: int = 22, **attrs: Any) -> np.ndarray:
    """op run by onnxruntime on a one-node model."""
    import onnxruntime as ort

    names = [f"x{i}" for i in range(len(inputs))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(inputs[0].dtype), None)
    graph = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "g", vis, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_div_truncates_toward_zero(dtype: Any) -> None:
    a = np.array([7, -7, 7, -7, 6, -6, 0], dtype=dtype)
    b = np.array([2, 2, -2, -2, 3, -3, 5], dtype=dtype)
    expected = np.array([int(x / y) for x, y in zip(a.tolist(), b.tolist())], dtype=dtype)
    for dts in (None, [np.dtype(dtype)] * 2):  # dtype unknown / known at load
        y = kernel("Div", 2, dtypes=dts)(a, b)
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, expected)


def test_pow_keeps_base_dtype() -> None:
    pw = kernel("Pow", 2, opset=15)
    x = np.array([1, 2, 3], dtype=np.int32)
    y = pw(x, np.array([4.0, 5.0, 6.0], dtype=np.float32))
    assert y.dtype == np.int32 and y.tolist() == [1, 32, 729]
    f = np.array([1.5, 2.0], dtype=np.float32)
    y = pw(f, np.array([2, 3], dtype=np.int64))
    assert y.dtype == np.float32 and y.tolist() == [2.25, 8.0]
    y = pw(np.array([2, 1], dtype=np.int64), np.array([-1, -2], dtype=np.int64))
    assert y.dtype == np.int64 and y.tolist() == [0, 1]
    sq = kernel("Pow", 2, dtypes=[np.dtype(np.float16)], consts={1: np.array(2.0, np.float32)})
    y = sq(np.array([3.0], np.float16), None)
    assert y.dtype == np.float16 and y.tolist() == [9.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pow_constant_cube_matches_onnxruntime_and_runs_in_place(dtype: Any) -> None:
    """x**3 with a constant exponent is two multiplies (GPT-2's GELU; libm's pow is ~300x
    slower), as onnxruntime computes it; ``out`` may be the base's buffer."""
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(dtype) * 3
    e = np.array(3.0, dtype)
    cube = kernel("Pow", 2, dtypes=[np.dtype(dtype)], consts={1: e})
    want = ort_run("Pow", [x, e], opset=15)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(cube(x, e), want, rtol=tol)
    buf = x.copy()
    assert cube(buf, e, out=buf) is buf
    np.testing.assert_allclose(buf, want, rtol=tol)


def test_erf_accuracy_without_scipy() -> None:
    xs = np.concatenate([np.linspace(-7, 7, 2001), [0.0, -1e-300, 1e-10, np.inf, -np.inf]])
    ref = np.array([math.erf(v) for v in xs])
    erf = kernel("Erf")
    y64 = erf(xs)
    assert y64.dtype == np.float64
    assert np.max(np.abs(y64 - ref) / np.maximum(np.spacing(np.abs(ref)), 1e-300)) <= 1.0
    y32 = erf(xs.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, ref, rtol=1e-6, atol=1e-7)
    assert np.isnan(erf(np.array([np.nan], np.float32)))[0]
    small = np.array([[-0.5, 0.25], [2.0, 1e-8]], dtype=np.float16)  # per-element path
    ys = erf(small)
    assert ys.dtype == np.float16 and ys.shape == (2, 2)
    np.testing.assert_allclose(ys, [[math.erf(v) for v in row] for row in small.tolist()], 1e-3)


@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("Selu", {}, 22),
        ("Elu", {"alpha": 0.5}, 22),
        ("Celu", {"alpha": 2.0}, 22),
        ("HardSwish", {}, 22),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 22),
        ("Mish", {}, 22),
        ("Softplus", {}, 22),
        ("Softsign", {}, 22),
        ("Sigmoid", {}, 22),
        ("LeakyRelu", {"alpha": 1.5}, 22),
        ("ThresholdedRelu", {"alpha": 0.5}, 22),
        ("Shrink", {"bias": 0.5, "lambd": 1.0}, 22),
        ("Gelu", {"approximate": "tanh"}, 20),
        ("Gelu", {}, 20),
    ],
)
def test_activations_match_onnxruntime(op: str, attrs: dict[str, Any], opset: int) -> None:
    x = np.linspace(-6, 6, 49, dtype=np.float32).reshape(7, 7)
    expected = ort_run(op, [x], opset=opset, **attrs)
    fn = kernel(op, attrs=attrs, opset=opset)
    np.testing.assert_allclose(fn(x), expected, rtol=1e-5, atol=1e-6)
    # in place: out aliases x, as the executor does for inplace kernels
    buf = x.copy()
    assert fn(buf, out=buf) is buf
    np.testing.assert_allclose(buf, expected, rtol=1e-5, atol=1e-6)
    # float16 keeps its dtype; bfloat16 too (computed via float32)
    assert fn(x.astype(np.float16)).dtype == np.float16
    yb = fn(x.astype(ml_dtypes.bfloat16))
    assert yb.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(yb.astype(np.float32), expected, rtol=2e-2, atol=2e-2)


def test_prelu_broadcast_and_inplace() -> None:
    x = np.array([[-2.0, -1.0, 0.0, 3.0]] * 2, dtype=np.float32)
    slope = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    fn = kernel("PRelu", 2, opset=16)
    expected = np.where(x < 0, x * slope, x)
    np.testing.assert_array_equal(fn(x, slope), expected)
    buf = x.copy()
    fn(buf, slope, out=buf)
    np.testing.assert_array_equal(buf, expected)


def test_variadic_broadcast_growing_shape() -> None:
    a, b = np.ones((1,), np.int32), np.full((3, 1), 2, np.int32)
    c = np.arange(4, dtype=np.int32)
    y = kernel("Sum", 3)(a, b, c)
    assert y.shape == (3, 4) and y.dtype == np.int32
    np.testing.assert_array_equal(y, a + b + c)
    m = kernel("Mean", 3)(a.astype(np.float16), b.astype(np.float16), c.astype(np.float16))
    assert m.dtype == np.float16
    np.testing.assert_allclose(m, (a + b + c) / 3, rtol=1e-3)
    assert kernel("Max", 1)(c) is c  # one input: returned as is (the executor copies)


def test_clip_forms() -> None:
    x = np.array([-5.0, 0.5, 5.0], dtype=np.float16)
    const = kernel(
        "Clip", 3, opset=13, consts={1: np.array(-1, np.float16), 2: np.array(1, np.float16)}
    )
    y = const(x, None, None)
    assert y.dtype == np.float16 and y.tolist() == [-1.0, 0.5, 1.0]
    dynamic = kernel("Clip", 3, opset=13)
    assert dynamic(x, np.float16(2), np.float16(1)).tolist() == [1.0, 1.0, 1.0]  # min > max
    assert dynamic(x, None, np.array(0, np.float16)).tolist() == [-5.0, 0.0, 0.0]
    old = kernel("Clip", 1, attrs={"min": -1.0}, opset=6, dtypes=[np.dtype(np.float16)])
    assert old(x).dtype == np.float16 and old(x).tolist() == [-1.0, 0.5, 5.0]
    i = np.array([-100, 7, 100], dtype=np.int8)
    ci = kernel("Clip", 3, opset=13, consts={1: np.array(-10, np.int8), 2: np.array(10, np.int8)})
    assert ci(i, None, None).tolist() == [-10, 7, 10] and ci(i, None, None).dtype == np.int8


def test_cast_rules() -> None:
    f8 = kernel("Cast", attrs={"to": TensorProto.FLOAT8E4M3FN}, opset=21)
    x = np.array([1e6, -np.inf, np.nan, 0.3], dtype=np.float32)
    y = f8(x)
    assert y.dtype == ml_dtypes.float8_e4m3fn
    assert y.astype(np.float32)[:2].tolist() == [448.0, -448.0] and np.isnan(y.astype(float)[2])
    f8ns = kernel("Cast", attrs={"to": TensorProto.FLOAT8E4M3FN, "saturate": 0}, opset=21)
    assert np.isnan(f8ns(x).astype(np.float32)[0])
    s = np.array(["1.5", "-INF", "nan", b"1e-5"], dtype=object)
    y = kernel("Cast", attrs={"to": TensorProto.FLOAT}, opset=21)(s)
    assert y.dtype == np.float32 and y[0] == 1.5 and y[1] == -np.inf and np.isnan(y[2])
    y = kernel("Cast", attrs={"to": TensorProto.INT64}, opset=21)(np.array(["12", "3.7"], object))
    assert y.tolist() == [12, 3]
    y = kernel("Cast", attrs={"to": TensorProto.STRING}, opset=21)(np.array([1.5], np.float32))
    assert y.dtype == object and y.tolist() == ["1.5"]
    e8 = kernel("Cast", attrs={"to": TensorProto.FLOAT8E8M0}, opset=25)
    y = e8(np.array([0.25, 1.1, 3.0], np.float32))
    assert y.astype(np.float32).tolist() == [0.25, 2.0, 4.0]  # round_mode "up"
    old = kernel("Cast", attrs={"to": "INT32"}, opset=1)
    assert old(np.array([2.9, -2.9])).tolist() == [2, -2]
    like = kernel("CastLike", 2, opset=21)
    assert like(np.array([1.5]), np.zeros(0, np.float16)).dtype == np.float16


def test_legacy_broadcast_axis() -> None:
    add = kernel("Add", 2, attrs={"broadcast": 1, "axis": 1}, opset=6)
    a = np.zeros((2, 3, 4), np.float32)
    b = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(add(a, b), a + b[:, None])


def test_zero_dim_and_out() -> None:
    x = np.array(-1.5, dtype=np.float32)
    for op in ("Elu", "Sigmoid", "Gelu", "HardSwish", "Shrink", "Mish"):
        y = kernel(op, opset=22 if op != "Gelu" else 20)(x)
        assert np.ndim(y) == 0 and np.asarray(y).dtype == np.float32, op
    out = np.empty(3, dtype=np.bool_)
    r = kernel("Less", 2)(np.array([1, 2, 3]), np.array(2), out=out)
    assert r is out and out.tolist() == [True, False, False]


def test_bitshift_and_mod() -> None:
    x = np.array([16, 1], dtype=np.uint8)
    assert kernel("BitShift", 2, {"direction": "RIGHT"}, opset=11)(x, np.uint8(2)).tolist() == [
        4,
        0,
    ]
    a = np.array([-7, 7], dtype=np.int32)
    b = np.array([3, -3], dtype=np.int32)
    assert kernel("Mod", 2, opset=13)(a, b).tolist() == [2, -2]
    assert kernel("Mod", 2, {"fmod": 1}, opset=13)(a, b).tolist() == [-1, 1]


def test_registered_ops() -> None:
    ops = {op for dom, op in default_registry().ops("")}
    for name in ("Gelu", "Swish", "CastLike", "BitwiseNot", "Where", "IsInf"):
        assert name in ops
    assert onnx.defs.has("Swish")


@pytest.mark.parametrize(
    ("op", "attrs"), [("HardSwish", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})]
)
def test_hard_activations_compiled_are_numpys_bits(
    monkeypatch: pytest.MonkeyPatch, op: str, attrs: dict[str, Any]
) -> None:
    """HardSwish and HardSigmoid over a contiguous float32 tensor take one compiled pass
    (``activation.ACT_FLAT``): NumPy's values bit for bit at the clamps' edges, the signed
    zeros, NaN and the infinities, in place and into ``out``; a strided input keeps
    NumPy's path."""
    from tfrt_py.kernels.elementwise import activation
    from tfrt_py.kernels.lib.jit import jit_enabled

    if not jit_enabled() or activation.ACT_FLAT.get() is None:
        pytest.skip("numba kernels off")
    edges = [-3.0, 3.0, -0.0, 0.0, np.nan, np.inf, -np.inf, 1e30, -1e-30, 2.9999998]
    x = np.concatenate([np.linspace(-8, 8, 1001), edges]).astype(np.float32)
    real = activation.ACT_FLAT._compiled
    passes: list[int] = []

    def counted(*args: Any) -> None:
        passes.append(args[0].size)
        real(*args)

    monkeypatch.setattr(activation.ACT_FLAT, "_compiled", counted)
    fast = kernel(op, attrs=attrs, dtypes=[np.float32])
    monkeypatch.setattr(activation.ACT_FLAT, "_compiled", None)
    monkeypatch.setattr(activation.ACT_FLAT, "_failed", True)  # NumPy's path from here
    slow = kernel(op, attrs=attrs, dtypes=[np.float32])
    with np.errstate(invalid="ignore"):  # inf * 0: NaN, as the compiled pass gives
        want = slow(x)
        want_strided = slow(x[::2])
    monkeypatch.setattr(activation.ACT_FLAT, "_failed", False)
    monkeypatch.setattr(activation.ACT_FLAT, "_compiled", real)
    got = fast(x)
    assert passes == [x.size]  # one compiled pass
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    buf = x.copy()
    assert fast(buf, out=buf) is buf
    np.testing.assert_array_equal(buf, want)
    out = np.empty_like(x)
    assert fast(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(fast(x[::2]), want_strided)
