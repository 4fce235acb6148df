"""MatMulNBits at ``accuracy_level=4``: A quantized to int8 per block of K, as onnxruntime's
MLAS does it (``CompInt8``), and multiplied by 4-bit codes in integers.

Per row of A and block of ``block_size`` k's (zeros past K): ``amax = max |a|``, ``scale =
amax / 127``, ``q = round_half_even(a * (127 / amax))`` (0 where amax is 0), int8. Then per
block ``y += scale * w_scale * sum q * code - scale * sum(q) * w_scale * w_zero_point``:
``lib/qnbits_ir``'s kernel (exact integer sums, on VNNI or ``vpmaddubsw`` paths), from
codes held only in its layout (``NBitsWeight.icodes``). The quantized A differs from A by
up to half a step of its block (about 0.4% of the block's largest value), which is what a
model at this level asks for: onnxruntime's results at level 4 differ from level 0's by
that much, and tfrt_py's follow level 4's (the tests compare them to onnxruntime at 4).
As onnxruntime's, only with zero points absent or packed (uint8): float zero points keep
level 0's float product.

Without the kernel (no llvmlite JIT, ``$TFRT_PY_ISA=portable``, 2- and 8-bit codes, a cold
process warming) the same quantized A is dequantized (``fake_quantized``) and takes the
float32 product: level 4's values, level 0's speed. A non-finite value in a block of A
makes that block's outputs NaN.

``product(w, a)``: float32 (M, N_padded) for ``NBitsWeight`` w with ``icodes``; the
compiled loop quantizes A on the caller's thread and splits the panels over native threads
(the GIL released). Any thread; no state between calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib import qnbits_ir
from ..lib.jit import Jitted

__all__ = ["fake_quantized", "int8_blocks", "kernel_ready", "product"]

_F32 = np.float32
#: multiply-adds from which the product splits over threads (int8 sums are ~3x cheaper
#: than the float GEMV's, whose split is at 2**18)
_SPLIT = 1 << 20

numba: Any = None  # set by Jitted(parallel=True) before the loop below compiles
qnbits: Any = None  # qnbits_ir's kernels, set by _prepare before the loop compiles
quantize: Any = None


def int8_blocks(a: np.ndarray, block: int, k_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """A (M, K) float32 as (qa (M, k_blocks * block) int8, ablk (M, k_blocks, 2) float32
    ``[scale, scale * sum q]``), in NumPy (module docstring)."""
    m, k = a.shape
    ap = np.zeros((m, k_blocks * block), _F32)
    ap[:, :k] = a
    blocks = ap.reshape(m, k_blocks, block)
    amax = np.abs(blocks).max(axis=2)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bad = ~np.isfinite(amax)
        inv = np.where((amax != 0) & ~bad, _F32(127) / amax, _F32(0)).astype(_F32)
        q = np.rint(np.where(bad[..., None], _F32(0), blocks) * inv[..., None])
        scale = (amax / _F32(127)).astype(_F32)
    scale[bad] = np.nan
    qa = q.astype(np.int8).reshape(m, -1)
    ablk = np.stack([scale, scale * q.sum(axis=2, dtype=_F32)], axis=2).astype(_F32)
    return qa, ablk


def fake_quantized(a: np.ndarray, block: int, k_blocks: int) -> np.ndarray:
    """A (M, K) as the float32 (M, k_blocks * block) its int8 blocks dequantize to."""
    qa, ablk = int8_blocks(a, block, k_blocks)
    m = a.shape[0]
    out = qa.reshape(m, k_blocks, block).astype(_F32) * ablk[:, :, :1]
    return out.reshape(m, -1)


# -- the compiled loop (numba; the GIL released while it runs) -----------------------------


def _product_i8(a, qa, ablk, codes, scale, zp, y, parts, block):  # pragma: no cover
    # A's blocks to int8 on this thread (qnbits_ir's quantizer: O(M K)), then the panels
    # over threads, each range one call of its product kernel
    m_rows, kp = a.shape
    quantize(a.ctypes.data, m_rows, kp, block, qa.ctypes.data, ablk.ctypes.data)
    panels, k_groups = codes.shape[0], codes.shape[1]
    per = (panels + parts - 1) // parts
    for part in numba.prange(parts):
        p0 = part * per
        p1 = min(panels, p0 + per)
        if p0 < p1:
            qnbits(codes.ctypes.data, qa.ctypes.data, ablk.ctypes.data, scale.ctypes.data,
                   zp.ctypes.data, y.ctypes.data, y.shape[1], m_rows, k_groups,
                   block // 8, p0, p1)  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    fns = qnbits_ir.kernel()
    module_globals["qnbits"], module_globals["quantize"] = fns or (None, None)
    return fns is not None


def _warm(fn: Any) -> None:
    one = np.ones((1, 2, 64), _F32)
    fn(np.ones((1, 16), _F32), np.empty((1, 16), np.int8), np.empty((1, 1, 2), _F32),
       np.zeros((1, 2, 64, 4), np.uint8), one[:, :1], np.zeros((1, 1, 64), np.uint8),
       np.empty((1, 64), _F32),
       1, 16)  # fmt: skip


_PRODUCT = Jitted(_product_i8, _warm, parallel=True, prepare=_prepare)


def kernel_ready() -> bool:
    """Whether the compiled product runs in this process now (decides, and compiles, on
    the first call; the kernels' switch is read each time)."""
    return _PRODUCT.get() is not None and qnbits_ir.kernel() is not None


def product(w: Any, a: np.ndarray) -> np.ndarray | None:
    """float32 (M, panels * 64) ``A @ W`` at level 4 on the compiled loop, A (M, K);
    None where the loop is not running (the caller takes the float path)."""
    fn = _PRODUCT.get()
    if fn is None or qnbits_ir.kernel() is None:  # the kernels switched off since (per call)
        return None
    m = a.shape[0]
    panels = w.icodes.shape[0]
    y = np.empty((m, panels * 64), _F32)
    qa = np.empty((m, w.k_blocks * w.block), np.int8)
    ablk = np.empty((m, w.k_blocks, 2), _F32)
    many = m * w.k * panels * 64 >= _SPLIT
    parts = min(native_threads.enter(intra_pool().threads if many else 1), panels)
    fn(w.padded(a), qa, ablk, w.icodes, w.scale, w.zp8, y, parts, w.block)
    return y
