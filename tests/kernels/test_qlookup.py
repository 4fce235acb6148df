"""The byte-table kernel (``kernels/lib/qlookup_ir.py``) where the host has AVX-512 VBMI,
and the lookup QTable / QLinearSigmoid / QLinearLeakyRelu run on
(``contrib/quantized_elementwise.compiled_lookup``): every code of both 8-bit types, runs
that are and are not whole vectors of 64, the output over its own input."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.kernels.test_qgemm import _need_kernel
from tfrt_py.kernels.contrib import quantized_elementwise
from tfrt_py.kernels.lib import qlookup_ir

RNG = np.random.default_rng(38)


def _vbmi() -> bool:
    try:
        return qlookup_ir.host_has_vbmi()
    except ImportError:  # no llvmlite
        return False


def test_the_kernel_looks_up_every_code_of_any_run() -> None:
    if not _vbmi():
        pytest.skip("this host has no AVX-512 VBMI: the numba loop looks the codes up")
    engine = qlookup_ir.build()
    p = ctypes.c_void_p
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, p, p, p, ctypes.c_int64)(
        engine.get_function_address(qlookup_ir.SYMBOL)
    )
    for dt in (np.uint8, np.int8):
        table = RNG.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, 256).astype(dt)
        for n in (0, 1, 63, 64, 65, 127, 128, 256, 1000):
            x = np.arange(n, dtype=np.int64).astype(np.uint8)  # every code, in order
            RNG.shuffle(x[: n // 2])
            y = np.full(n, 7, dt)
            assert fn(x.ctypes.data, table.ctypes.data, y.ctypes.data, n) == 0
            np.testing.assert_array_equal(y, table[x], err_msg=f"{dt.__name__} n={n}")
        x = np.arange(256, dtype=np.int64).astype(np.uint8)
        fn(x.ctypes.data, table.ctypes.data, x.ctypes.data, 256)  # in place
        np.testing.assert_array_equal(x.view(dt), table)


def test_compiled_lookups_take_the_kernel_where_the_host_has_it() -> None:
    _need_kernel(numba=True)
    if not _vbmi():
        pytest.skip("this host has no AVX-512 VBMI: the numba loop looks the codes up")
    if qlookup_ir.kernel() is None:  # $TFRT_PY_ISA=avx2 or portable: the numba loop
        pytest.skip(f"this process does not take the kernel ({qlookup_ir.describe()})")
    assert quantized_elementwise._LOOKUP_VBMI.get() is not None
    for dt in (np.uint8, np.int8):
        table = RNG.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, 256).astype(dt)
        for shape in ((1, 112, 112, 3), (2, 65537), (5,)):  # blocks of 65536 and their tails
            x = RNG.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, shape).astype(dt)
            got = quantized_elementwise.compiled_lookup(x, table)
            assert got is not None and got.dtype == table.dtype
            np.testing.assert_array_equal(got, table[x.view(np.uint8)])
