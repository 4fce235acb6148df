"""``kernels.addresses`` (array start addresses without ``ndarray.ctypes``) and
``concurrency.env_switch`` (the per-call on/off switches), which hot kernels ask per call."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfrt_py.concurrency.env_switch import switched_off
from tfrt_py.kernels.lib import addresses as addr
from tfrt_py.kernels.lib.jit import ENV_JIT, jit_enabled


def test_same_start_tells_the_planners_in_place_view_from_other_buffers() -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = x.reshape(2, 12)  # the planner's in place: a new view of the same buffer
    assert addr.same_start(x, view)
    assert not addr.same_start(x, x[1:])  # same buffer, another start
    assert not addr.same_start(x, x.copy())
    assert addr.same_start(x.astype(np.float64), x.astype(np.float64)) is False


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_addresses_of_strided_head_views_match_ctypes(dtype: type) -> None:
    q: np.ndarray = np.zeros((2, 16, 4, 8), dtype)
    heads = q.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim) view: not contiguous
    out: np.ndarray = np.zeros((2, 4, 16, 16), dtype)
    got = addr.addresses(heads, heads[:, :, 1:], out)
    want = [heads.ctypes.data, heads[:, :, 1:].ctypes.data, out.ctypes.data]
    assert got.dtype == np.uint64 and got.tolist() == [*want, out.ctypes.data]  # d: c
    got4 = addr.addresses(heads, heads[:, :, 1:], out, q[1:])
    assert got4.tolist() == [*want, q[1:].ctypes.data]
    # the fallback forms (no numba, or $TFRT_PY_JIT=0 at the first call) agree
    buf = np.empty(4, np.uint64)
    addr._ctypes_addresses(heads, heads[:, :, 1:], out, q[1:], buf)
    assert buf.tolist() == got4.tolist()
    assert addr._ctypes_same(heads, q) and not addr._ctypes_same(heads, out)


def test_switches_follow_every_change_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_JIT, raising=False)
    assert not switched_off(ENV_JIT)
    monkeypatch.setenv(ENV_JIT, " 0 ")
    assert switched_off(ENV_JIT) and not jit_enabled()
    monkeypatch.setenv(ENV_JIT, "1")
    assert not switched_off(ENV_JIT)
    os.environ[ENV_JIT] = "0"  # plain assignment writes through too
    try:
        assert switched_off(ENV_JIT)
    finally:
        del os.environ[ENV_JIT]
    assert not switched_off(ENV_JIT)
    monkeypatch.setenv(ENV_JIT, "00")  # only "0" switches off
    assert not switched_off(ENV_JIT)
