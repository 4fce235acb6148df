"""MatMulNBits on weights kept quantized (``kernels/contrib/matmul_nbits.py``, issue 36):
the decode-sized GEMV over codes unpacked in registers and the prompt-sized product over
chunks dequantized at a time, against onnxruntime (4 and 8 bits) and a float64 reference
(2 bits, which onnxruntime's CPU provider does not take), at the row counts around
``GEMV_ROWS``, column counts around the kernels' 64-column chunks, K not a multiple of the
block; and the weight held at its own size, not dequantized at load."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import (
    nbits_inputs,
    node_model,
    ort_outputs,
    runtime_feeds,
    tfrt_outputs,
)
from tfrt_py.concurrency import native_threads
from tfrt_py.kernels.contrib import matmul_nbits
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.kernels.lib.jit import jit_enabled

RNG = np.random.default_rng(36)
F32 = np.float32


def _inputs(m: int, k: int, n: int, bits: int, block: int, zp: str) -> list[Any]:
    return nbits_inputs(RNG, (m,), k, n, bits, block, zp, bias=True)


def _reference(inputs: list[Any], k: int, n: int, bits: int, block: int) -> np.ndarray:
    """float64 ``A @ ((code - zp) * scale)^T + bias`` from the op's definition."""
    a, b, scales, zps, _, bias = inputs
    k_blocks = -(-k // block)
    per = 8 // bits
    codes = (b.reshape(n, k_blocks, -1)[..., None] >> (np.arange(per) * bits)) & (2**bits - 1)
    codes = codes.reshape(n, k_blocks, block).astype(np.float64)
    if zps is None:
        z = np.full((n, k_blocks), 2.0 ** (bits - 1))
    elif zps.dtype == np.uint8:
        z = (zps[..., None] >> (np.arange(per) * bits)) & (2**bits - 1)
        z = z.reshape(n, -1)[:, :k_blocks].astype(np.float64)
    else:
        z = zps.astype(np.float64)
    w = (codes - z[..., None]) * scales.reshape(n, k_blocks, 1).astype(np.float64)
    return a.astype(np.float64) @ w.reshape(n, -1)[:, :k].T + bias


@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])
@pytest.mark.parametrize(
    ("k", "n", "block"), [(16, 6, 16), (200, 130, 32), (1000, 64, 128), (300, 70, 256)]
)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zp", ["none", "packed", "float"])
def test_the_product_matches_the_definition(m: int, k: int, n: int, block: int, bits: int,
                                            zp: str) -> None:  # fmt: skip
    inputs = _inputs(m, k, n, bits, block, zp)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    model = node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3))
    feeds = runtime_feeds(inputs, (1, 2, 3))
    want = _reference(inputs, k, n, bits, block)
    for ex in ("sync", "async"):
        m_ = tfrt_py.load(model, executor=ex)
        for _ in range(2):
            got = tfrt_outputs(m_, feeds)[0]
            assert got.dtype == F32 and got.shape == (m, n)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    if bits != 2 and not (bits == 8 and zp == "float"):  # what onnxruntime's CPU MatMulNBits takes
        ort = ort_outputs(model, feeds)[0]
        np.testing.assert_allclose(got, ort, rtol=1e-4, atol=1e-5 * np.abs(ort).max())


@pytest.mark.skipif(not jit_enabled(), reason="numba is not installed (or TFRT_PY_JIT=0)")
def test_the_compiled_loops_are_the_ones_that_run() -> None:
    """Where numba's parallel loops run, the product takes the compiled GEMV and, where
    the packed float gemm is built, the panels' product (not the NumPy chunks): their
    dispatchers exist in this process and answer the right values."""
    if not native_threads.ready():
        pytest.skip(f"numba's thread layer is not running here ({native_threads.state()[1]})")
    loops = [matmul_nbits._GEMV]
    if gemm_packed.available():
        loops.append(matmul_nbits._GEMM)
    for jitted in loops:
        assert jitted.get() is not None, jitted.fn.__name__
    inputs = _inputs(1, 64, 70, 4, 32, "none")
    model = tfrt_py.load(node_model("MatMulNBits", inputs,
                                    {"K": 64, "N": 70, "bits": 4, "block_size": 32},
                                    const=(1, 2)))  # fmt: skip
    got = tfrt_outputs(model, runtime_feeds(inputs, (1, 2)))[0]
    np.testing.assert_allclose(got, _reference(inputs, 64, 70, 4, 32), rtol=1e-4, atol=1e-4)


def test_a_4_bit_weight_is_held_at_4_bits() -> None:
    """Loading a 1024 x 1024 4-bit weight allocates about its own 0.5 MB (codes, scales),
    not the 4 MB of float32 that dequantizing at load made."""
    k = n = 1024
    inputs = _inputs(1, k, n, 4, 32, "packed")
    model = node_model("MatMulNBits", inputs, {"K": k, "N": n, "bits": 4, "block_size": 32},
                       const=(1, 2, 3))  # fmt: skip
    tfrt_py.load(model)  # warm: kernels registered, modules imported
    tracemalloc.start()
    try:
        loaded = tfrt_py.load(model)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    weight_bytes = inputs[1].nbytes  # 512 KiB of codes
    assert held < 4 * weight_bytes, held  # the model's copy of B, its layout, scales (1.5 MB)
    got = tfrt_outputs(loaded, runtime_feeds(inputs, (1, 2, 3)))[0]
    np.testing.assert_allclose(got, _reference(inputs, k, n, 4, 32), rtol=1e-4, atol=1e-3)
