"""``gelu_ir``'s float32 GELU, which the NumPy paths' erf-form Gelu take once it is built (a
cold start's stand-ins): against NumPy's GELU (``gelu_numpy``) from 1e-12 to 1e4 and at
NaN, the infinities, the signed zeros and the clamp's edges; every length's masked tail
(nothing written past it); in place; what ``run`` declines; and a Gelu node and a conv's
Gelu epilogue built while the compiled kernels are held taking it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import gelu_ir, gelu_numpy


@pytest.fixture(autouse=True)
def _unbuilt_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds (or loads) the kernel into a decision of its own, dropped after
    it: later tests in this process see the NumPy paths they expect."""
    monkeypatch.setattr(gelu_ir._BUILT, "_done", [])


def _built() -> Any:
    fn = gelu_ir.build_once()
    if fn is None:
        pytest.skip(
            "no GELU kernel here (no llvmlite JIT, no AVX2, TFRT_PY_ISA=portable or "
            "TFRT_PY_PACKED_GEMM=0)"
        )
    assert gelu_ir.raw() is fn
    return fn


def _numpy(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf: (1 + erf) * x is 0 * -inf, NaN
        return gelu_numpy._gelu_erf(x, None)


def test_the_kernel_is_numpy_s_gelu() -> None:
    _built()
    rng = np.random.default_rng(0)
    scales = (1e-12, 1e-3, 1.0, 3.0, 10.0, 1e4)
    x = np.concatenate([rng.standard_normal(4099).astype(np.float32) * s for s in scales])
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 4 * 2**0.5, -4 * 2**0.5, 1e38, -1e38]
    x = np.concatenate([x, np.array(edges, np.float32)])
    want = _numpy(x)
    got = gelu_ir.run(x, None)
    assert got is not None and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 15, 16, 17, 31, 33, 100])
def test_every_length_stops_at_its_end(n: int) -> None:
    fn = _built()
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n + 40).astype(np.float32)
    y = np.full_like(x, 7.0)
    assert fn(x.ctypes.data, y.ctypes.data, n) == 0
    assert np.all(y[n:] == 7.0)
    np.testing.assert_allclose(y[:n], _numpy(x[:n]), rtol=2e-6, atol=2e-6)
    z = x.copy()
    fn(z.ctypes.data, z.ctypes.data, n)  # in place
    np.testing.assert_array_equal(z[:n], y[:n])
    np.testing.assert_array_equal(z[n:], x[n:])


def test_run_declines_what_it_does_not_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    _built()
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    assert gelu_ir.run(x.astype(np.float64), None) is None
    assert gelu_ir.run(x[:, ::2], None) is None  # not contiguous
    buf = np.zeros(80, np.float32)
    buf[:64] = x.ravel()
    assert gelu_ir.run(buf[:64], buf[8:72]) is None  # overlapping elsewhere
    same = x.copy()
    assert gelu_ir.run(same, same) is same
    np.testing.assert_allclose(same, _numpy(x), rtol=2e-6, atol=2e-6)
    monkeypatch.setattr(gelu_ir._BUILT, "_done", [])
    assert gelu_ir.raw() is None and gelu_ir.run(x, None) is None


def test_gelus_built_while_the_kernels_are_held_take_the_built_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Gelu node and a conv's Gelu epilogue built and called while a cold start holds the
    compiled kernels (numba's GELU declines) run the kernel (a spy counts the calls) and
    answer as NumPy does."""
    from tfrt_py.concurrency import compiled_gate
    from tfrt_py.ir.graph import Node, Value
    from tfrt_py.kernels import KernelContext, default_registry
    from tfrt_py.kernels.lib.activations import Epilogue
    from tfrt_py.kernels.nn import conv_direct

    _built()
    calls: list[int] = []
    real = gelu_ir.run

    def spy(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
        calls.append(1)
        return real(x, out)

    monkeypatch.setattr(gelu_ir, "run", spy)
    x = np.random.default_rng(3).standard_normal((4, 300)).astype(np.float32)
    want = _numpy(x)
    node = Node("Gelu", [Value("x")], [Value("y")], {}, name="g", opset=20)
    compiled_gate.hold()
    try:
        fn = default_registry().lookup("", "Gelu", 20).build(KernelContext(node))
        got = fn(x)
        y = x.copy()
        conv_direct.apply_epilogue(y, None, None, Epilogue("Gelu"))
    finally:
        compiled_gate.release()
    assert len(calls) == 2
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)
