"""``activation_ir``'s float32 GELU, Sigmoid and SiLU, which the NumPy paths take once
they are built (a cold start's stand-ins): against NumPy's (``gelu_numpy``, the four
logistic passes) from 1e-12 to 1e4 and at NaN, the infinities, the signed zeros and the
clamps' edges; every length's masked tail (nothing written past it); in place; what
``gelu``/``logistic`` decline; and Gelu, Sigmoid and Swish nodes and a conv's Gelu and
SiLU epilogues built while the compiled kernels are held taking them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import activation_ir, gelu_numpy


@pytest.fixture(autouse=True)
def _unbuilt_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds (or loads) the kernels into a decision of its own, dropped after
    it: later tests in this process see the NumPy paths they expect."""
    monkeypatch.setattr(activation_ir._BUILT, "_done", [])


def _built() -> activation_ir.Kernels:
    got = activation_ir.build_once()
    if got is None:
        pytest.skip(
            "no activation kernels here (no llvmlite JIT, no AVX2, TFRT_PY_ISA=portable or "
            "TFRT_PY_PACKED_GEMM=0)"
        )
    assert activation_ir.raw() is got
    return got


def _gelu(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf: (1 + erf) * x is 0 * -inf, NaN
        return gelu_numpy._gelu_erf(x, None)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return (x / (1 + np.exp(-x))).astype(np.float32)


_NUMPY = {"gelu": _gelu, "sigmoid": _sigmoid, "silu": _silu}


def _run(which: str, x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    if which == "gelu":
        return activation_ir.gelu(x, out)
    return activation_ir.logistic(x, out, which == "silu")


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    scales = (1e-12, 1e-3, 1.0, 3.0, 10.0, 80.0, 1e4)
    x = np.concatenate([rng.standard_normal(4099).astype(np.float32) * s for s in scales])
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 4 * 2**0.5, -4 * 2**0.5, 1e38, -1e38,
             87.0, -87.0, 88.0, -88.0, 88.5, -88.5, 103.0, -103.0]  # fmt: skip
    return np.concatenate([x, np.array(edges, np.float32)])


@pytest.mark.parametrize("which", ["gelu", "sigmoid", "silu"])
def test_each_kernel_is_numpy_s(which: str) -> None:
    """Within a few ulps (or 2e-6 near zero) where NumPy's is finite, NaN where NumPy's is,
    the infinities where NumPy's are."""
    _built()
    x = _inputs()
    want = _NUMPY[which](x)
    got = _run(which, x, None)
    assert got is not None and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 15, 16, 17, 31, 33, 100])
def test_every_length_stops_at_its_end(which: int, n: int) -> None:
    fn = _built()[which]
    want_fn = list(_NUMPY.values())[which]
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n + 40).astype(np.float32)
    y = np.full_like(x, 7.0)
    assert fn(x.ctypes.data, y.ctypes.data, n) == 0
    assert np.all(y[n:] == 7.0)
    np.testing.assert_allclose(y[:n], want_fn(x[:n]), rtol=2e-6, atol=2e-6)
    z = x.copy()
    fn(z.ctypes.data, z.ctypes.data, n)  # in place
    np.testing.assert_array_equal(z[:n], y[:n])
    np.testing.assert_array_equal(z[n:], x[n:])


@pytest.mark.parametrize("which", ["gelu", "sigmoid", "silu"])
def test_the_wrappers_decline_what_they_do_not_serve(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _built()
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert _run(which, x.astype(np.float64), None) is None
    assert _run(which, x[:, ::2], None) is None  # not contiguous
    buf = np.zeros(80, np.float32)
    buf[:64] = x.ravel()
    assert _run(which, buf[:64], buf[8:72]) is None  # overlapping elsewhere
    assert _run(which, x, np.zeros((4, 16), np.float32)) is None  # another shape
    same = x.copy()
    assert _run(which, same, same) is same
    np.testing.assert_allclose(same, _NUMPY[which](x), rtol=2e-6, atol=2e-6)
    monkeypatch.setattr(activation_ir._BUILT, "_done", [])
    assert activation_ir.raw() is None and _run(which, x, None) is None


def test_activations_built_while_the_kernels_are_held_take_the_built_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gelu, Sigmoid and Swish nodes and a conv's Gelu and SiLU epilogues built and called
    while a cold start holds the compiled kernels (numba's loops decline) run the kernels
    (a spy counts the calls) and answer as NumPy does."""
    from tfrt_py.concurrency import compiled_gate
    from tfrt_py.ir.graph import Node, Value
    from tfrt_py.kernels import KernelContext, default_registry
    from tfrt_py.kernels.lib.activations import Epilogue
    from tfrt_py.kernels.nn import conv_direct

    kernels = _built()
    calls: list[str] = []

    def spy(name: str, fn: Any) -> Any:
        def counted(*args: Any) -> Any:
            calls.append(name)
            return fn(*args)

        return counted

    monkeypatch.setattr(activation_ir._BUILT, "_done", [activation_ir.Kernels(
        *(spy(n, f) for n, f in zip(("gelu", "sigmoid", "silu"), kernels)))])  # fmt: skip
    x = np.random.default_rng(3).standard_normal((4, 300)).astype(np.float32)
    reg = default_registry()

    def node(op: str, opset: int, **attrs: Any) -> Any:
        n = Node(op, [Value("x")], [Value("y")], attrs, name="a", opset=opset)
        return reg.lookup("", op, opset).build(KernelContext(n))

    compiled_gate.hold()
    try:
        got = {"gelu": node("Gelu", 20)(x), "sigmoid": node("Sigmoid", 13)(x),
               "silu": node("Swish", 24)(x)}  # fmt: skip
        epi = {}
        for act in ("Gelu", "SiLU"):
            y = x.copy()
            conv_direct.apply_epilogue(y, None, None, Epilogue(act))
            epi[act] = y
    finally:
        compiled_gate.release()
    assert sorted(calls) == ["gelu", "gelu", "sigmoid", "silu", "silu"]
    for which, y in got.items():
        np.testing.assert_allclose(y, _NUMPY[which](x), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(epi["Gelu"], _gelu(x), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(epi["SiLU"], _silu(x), rtol=2e-6, atol=2e-6)
