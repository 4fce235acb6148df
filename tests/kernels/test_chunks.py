"""NumPy paths over cache-sized pieces (``kernels/lib/chunks.py``): the same bits as over
the whole arrays, in place or not, and no piecing where it would be wrong."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tfrt_py.kernels.lib import activation_ir
from tfrt_py.kernels.lib.chunks import CHUNK, by_chunks
from tfrt_py.kernels.lib.erf import erf, erf_f32
from tfrt_py.kernels.lib.gelu_numpy import _gelu_erf, _gelu_tanh, gelu_erf, gelu_tanh

_N = 3 * CHUNK + 123  # pieces, and a short last one
_Gelu = Callable[..., np.ndarray]


def _x(dtype: type = np.float32) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((_N // 7, 7)) * 3
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("pieced", "whole"), [(gelu_erf, _gelu_erf), (gelu_tanh, _gelu_tanh)])
def test_gelu_in_pieces_is_bitwise_the_whole_array_pass(
    monkeypatch: pytest.MonkeyPatch, pieced: _Gelu, whole: _Gelu, dtype: type
) -> None:
    monkeypatch.setattr(activation_ir._BUILT, "_done", [])  # NumPy's pieces, not the IR kernel
    x = _x(dtype)
    with np.errstate(invalid="ignore"):  # -inf: 0 * -inf, in pieces as whole
        _gelu_cases(pieced, whole, x)


def _gelu_cases(pieced: _Gelu, whole: _Gelu, x: np.ndarray) -> None:
    ref = whole(x, None)
    np.testing.assert_array_equal(pieced(x), ref)
    out = np.empty_like(x)
    assert pieced(x, out) is out
    np.testing.assert_array_equal(out, ref)
    y = x.copy()
    assert pieced(y, y) is y  # the planner's in place
    np.testing.assert_array_equal(y, ref)


def test_erf_in_pieces_is_bitwise_the_whole_array_pass() -> None:
    x = _x()
    np.testing.assert_array_equal(erf(x), erf_f32(x))
    y = x.copy()
    erf(y, out=y)
    np.testing.assert_array_equal(y, erf_f32(x))


def _double(x: np.ndarray, out: np.ndarray) -> None:
    np.multiply(x, 2, out=out)


def test_no_pieces_where_they_would_be_wrong_or_not_pay() -> None:
    x = np.arange(_N, dtype=np.float32)
    assert by_chunks(_double, x[:CHUNK], None) is None  # small: one pass anyway
    assert by_chunks(_double, x[::2], None) is None  # not contiguous
    assert by_chunks(_double, x, np.empty(_N, np.float64)) is None  # another dtype
    assert by_chunks(_double, x, np.empty((1, _N), np.float32)) is None  # another shape
    buf = np.zeros(_N + 1, np.float32)
    buf[:_N] = x
    # out overlapping x one element on: a piece of out written before x's next piece is
    # read would feed a doubled value in, so it must not be pieced
    assert by_chunks(_double, buf[:_N], buf[1:]) is None
    out = by_chunks(_double, x, None)
    assert out is not None
    np.testing.assert_array_equal(out, x * 2)
