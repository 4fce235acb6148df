"""Linalg-family kernels (MatMul, Gemm, Einsum, Det, MatMulInteger, QLinearMatMul) against
onnxruntime / NumPy, with constant and runtime right-hand sides."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.kernel_harness import Harness
from tfrt_py.kernels import linalg

KERNEL_FAMILIES = (linalg,)
_RNG = np.random.default_rng(0)


def _r(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


GEMM_CASES = [
    ((3, 4), (4, 5), (5,), {}),
    ((4, 3), (4, 5), (3, 5), {"transA": 1, "alpha": 0.5, "beta": 2.0}),
    ((3, 4), (5, 4), (1, 5), {"transB": 1, "alpha": 2.0}),
    ((4, 3), (5, 4), (3, 1), {"transA": 1, "transB": 1, "beta": 0.25}),
    ((3, 4), (4, 5), None, {"alpha": 3.0}),
    ((3, 4), (4, 5), (), {"beta": -1.0}),
]


@pytest.mark.parametrize(("sa", "sb", "sc", "attrs"), GEMM_CASES)
def test_gemm_matches_onnxruntime(harness: Harness, sa, sb, sc, attrs) -> None:
    ins = [_r(*sa), _r(*sb)] + ([] if sc is None else [_r(*sc)])
    harness.check("Gemm", ins, attrs, tol=1e-5)


def test_gemm_out_and_int(harness: Harness) -> None:
    a, b, c = _r(3, 4), _r(4, 5), _r(5)
    fn = harness.build("Gemm", [a, b, c], {"alpha": 2.0}, const=(1, 2))
    out = np.empty((3, 5), np.float32)
    assert fn(a, b, c, out=out) is out
    np.testing.assert_allclose(out, 2 * a @ b + c, rtol=1e-5, atol=1e-5)
    ai = _RNG.integers(-5, 5, (3, 4)).astype(np.int32)
    bi = _RNG.integers(-5, 5, (4, 2)).astype(np.int32)
    ci = _RNG.integers(-5, 5, (2,)).astype(np.int32)
    got = harness.build("Gemm", [ai, bi, ci], {}, const=(1, 2))(ai, bi, ci)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ai @ bi + ci)


@pytest.mark.parametrize(
    ("sa", "sb"), [((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))]
)
def test_matmul_shapes_const_and_out(harness: Harness, sa, sb) -> None:
    a, b = _r(*sa), _r(*sb)
    harness.check("MatMul", [a, b], {}, tol=1e-5)
    fn = harness.build("MatMul", [a, b], {}, const=(1,))
    want = np.matmul(a, b)
    out = np.empty_like(want)
    assert fn(a, b, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_matmul_float16_keeps_dtype(harness: Harness) -> None:
    a, b = _r(3, 8, dtype=np.float16), _r(8, 2, dtype=np.float16)
    got = harness.build("MatMul", [a, b], {})(a, b)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2)


@pytest.mark.parametrize(
    ("eq", "shapes"),
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
        ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(4, 4)]),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
        ("i,i", [(5,), (5,)]),
        ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]),
        ("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("abc,cd->da", [(2, 3, 4), (4, 5)]),
        ("ii,ij->j", [(3, 3), (3, 4)]),  # diagonal: np.einsum fallback
    ],
)
def test_einsum_matches_numpy(harness: Harness, eq, shapes) -> None:
    ins = [_r(*s) for s in shapes]
    fn = harness.build("Einsum", ins, {"equation": eq}, opset=12)
    got = fn(*ins)
    want = np.einsum(eq.replace(" ", ""), *ins)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_det_batched(harness: Harness) -> None:
    x = _r(2, 3, 3, 3)
    got = harness.build("Det", [x], {}, opset=11)(x)
    assert got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-5)


def test_matmul_integer_per_row_and_column_zero_points(harness: Harness) -> None:
    a = _RNG.integers(0, 256, (4, 300)).astype(np.uint8)  # K > 258: float64 path
    b = _RNG.integers(-128, 128, (300, 3)).astype(np.int8)
    azp = _RNG.integers(0, 256, (4,)).astype(np.uint8)
    bzp = _RNG.integers(-128, 128, (3,)).astype(np.int8)
    want = (a.astype(np.int64) - azp[:, None].astype(np.int64)) @ (b.astype(np.int64) - bzp)
    for const in ((), (1, 3)):
        got = harness.build("MatMulInteger", [a, b, azp, bzp], {}, const=const, opset=10)(
            a, b, azp, bzp
        )
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_qlinear_matmul_matches_onnxruntime(harness: Harness) -> None:
    a = _RNG.integers(0, 256, (3, 16)).astype(np.uint8)
    b = _RNG.integers(0, 256, (16, 4)).astype(np.uint8)
    args = [
        a,
        np.array(0.02, np.float32),
        np.array(110, np.uint8),
        b,
        np.array(0.01, np.float32),
        np.array(140, np.uint8),
        np.array(0.1, np.float32),
        np.array(120, np.uint8),
    ]
    (want,) = harness.ort("QLinearMatMul", args, {}, opset=10)
    for const in ((), (3, 5)):
        got = harness.build("QLinearMatMul", args, {}, const=const, opset=10)(*args)
        assert got.dtype == np.uint8
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
