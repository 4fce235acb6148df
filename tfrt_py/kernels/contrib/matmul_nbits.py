"""Kernels (contrib): com.microsoft MatMulNBits, the 2/4/8-bit weight-only product that
``onnxruntime.quantization``'s ``MatMulNBitsQuantizer`` writes for language models.

``Y = A @ dequantize(B)^T + bias`` with B's codes in blocks of ``block_size`` along K: per
output column n and block, ``(code - zero_point) * scale``; the zero point absent means
``2**(bits - 1)``, packed (``bits`` a code, low bits first) or float.

A constant weight stays quantized in memory (what a 4-bit model is for: a 1B-parameter
decoder is 0.5 GB at 4 bits and 4 GB dequantized). At load it is laid out once in panels
of 64 output columns, K-major within a panel (``NBitsWeight``: 4-bit codes two to a byte,
an even and an odd k, as in B; 2- and 8-bit codes one to a byte), with ``scale`` and
``scale * zero_point`` per (block, column), float32. Then, with numba:

* up to ``GEMV_ROWS`` rows of A (a decode step): ``_gemv`` walks each 64-column panel's
  codes once, unpacking them in registers, for each block ``d[n] = sum_k code[k, n] *
  a[k]`` (a loop over n: vectorized without reassociating sums) and ``y[n] += scale * d[n]
  - scale * zero_point * sum_k a[k]``; panels split over native threads from
  ``_GEMV_SPLIT`` multiply-adds;
* more rows (a prompt): ``_gemm`` dequantizes each panel into the packed float gemm's
  panel layout (``lib/gemm_packed``) and multiplies there, one panel a thread at a time.

Without numba (or while a cold process warms it) the panels are dequantized in NumPy, at
most ``CHUNK_FLOATS`` floats at a time, and multiplied on NumPy's BLAS: slower, the same
memory bound. Results are float32 sums in another order than
onnxruntime's (within 1e-5 relative on its tests). At ``accuracy_level=4`` A is quantized
to int8 per block first, as onnxruntime does, and 4-bit codes are multiplied in integers
(``matmul_nbits_int8``, ``NBitsWeight.quantize_a``). A weight given at run time is
dequantized per call. Bad constants (a size or block that does not match, a scale not
finite, ``bits`` other than 2/4/8, ``g_idx`` that reorders blocks) are load errors naming
the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..base import ComputeFn, KernelContext
from ..lib import gemm_packed, qnbits_ir
from ..lib.jit import CONTRACT, Jitted
from ..registry import KernelRegistry
from . import matmul_nbits_int8
from .activation import MS_DOMAIN

__all__ = ["CHUNK_FLOATS", "GEMV_ROWS", "NBitsWeight", "register_kernels"]

_NBITS = (2, 4, 8)
_F32 = np.float32
#: rows of A up to which the codes are multiplied in place (``_gemv*``), not dequantized
GEMV_ROWS = 3
#: the most float32 values of a dequantized chunk of columns (4 MB)
CHUNK_FLOATS = 1 << 20
#: multiply-adds from which a GEMV splits over threads (below, a second thread's start
#: costs more than its half: 256 x 688 took 21 µs on one thread, 24 on two)
_GEMV_SPLIT = 1 << 18
#: columns a GEMV inner loop carries (its accumulators: four zmm or eight ymm registers)
_NC = 64

numba: Any = None  # set by Jitted(parallel=True) before the loops below compile
sgemm_packed: Any = None  # gemm_packed's kernel, set by _prepare_gemm before _gemm compiles


def _unpack_codes(b: np.ndarray, bits: int, n: int, k_blocks: int, block: int) -> np.ndarray:
    """(N, k_blocks * block) integer codes from (N, k_blocks, blob) bytes, low bits first."""
    per = 8 // bits
    flat = b.reshape(n, k_blocks, -1)
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (flat[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(n, k_blocks * block)


def _panels(rows: np.ndarray) -> np.ndarray:
    """(N, R) -> (ceil(N / 64), R, 64), C-contiguous, zeros in the added columns: a
    compiled loop walks one panel of 64 columns as one stream of memory."""
    n, r = rows.shape
    chunks = -(-n // _NC)
    out = np.zeros((chunks * _NC, r), rows.dtype)
    out[:n] = rows
    return np.ascontiguousarray(out.reshape(chunks, _NC, r).transpose(0, 2, 1))


class NBitsWeight:
    """B laid out for the kernels (module doc); immutable after construction, any thread.

    In panels of 64 columns, the added ones zero: ``codes`` 4-bit (panels, k_blocks *
    block / 2, 64) uint8, row ``blk * block / 2 + j`` holding k = ``blk * block + 2j`` (low
    nibble) and ``+ 1`` (high); else (panels, k_blocks * block, 64) uint8 codes.
    ``scale`` and ``scale_zp``: (panels, k_blocks, 64) float32.

    With ``int8_a`` (``accuracy_level=4``) and zero points absent or packed,
    ``quantize_a``: products take A's int8 blocks (``matmul_nbits_int8``). 4-bit codes are
    then laid out for the integer kernels where ``int8_layout`` (default: the compiled
    product runs here; the native lowering passes whether its kernels are on):
    ``icodes`` (``qnbits_ir.pack``) and ``zp8`` (panels, k_blocks, 64) uint8 in place of
    ``codes`` and ``scale_zp``."""

    __slots__ = ("block", "codes", "icodes", "k", "k_blocks", "n", "nibbles", "panels",
                 "quantize_a", "scale", "scale_zp", "zp8")  # fmt: skip

    def __init__(self, ctx: KernelContext, b: np.ndarray, scales: np.ndarray,
                 zp: np.ndarray | None, k: int, n: int, bits: int, block: int,
                 int8_a: bool = False, int8_layout: bool | None = None) -> None:  # fmt: skip
        k_blocks = -(-k // block)
        blob = block * bits // 8
        if b.dtype != np.uint8 or b.size != n * k_blocks * blob:
            raise ctx.unsupported(
                f"B holds {b.size} {b.dtype} values; (N={n}, {k_blocks} blocks, {blob} bytes) "
                f"uint8 were expected"
            )
        if scales.size != n * k_blocks:
            raise ctx.unsupported(
                f"scales hold {scales.size} values, not N * blocks = {n * k_blocks}"
            )
        s = scales.astype(_F32).reshape(n, k_blocks)
        if not np.all(np.isfinite(s)):
            raise ctx.unsupported("a scale is not finite")
        if zp is None:
            z = np.full((n, k_blocks), float(1 << (bits - 1)), _F32)
        elif zp.dtype == np.uint8:
            row = -(-k_blocks * bits // 8)
            if zp.size != n * row:
                raise ctx.unsupported(f"zero_points hold {zp.size} bytes, not N * {row}")
            z = _unpack_codes(zp.reshape(n, 1, row), bits, n, 1, row * 8 // bits)[:, :k_blocks]
            z = z.astype(_F32)
        else:
            if zp.size != n * k_blocks:
                raise ctx.unsupported(f"zero_points hold {zp.size} values, not N * blocks")
            z = zp.astype(_F32).reshape(n, k_blocks)
        self.k, self.n, self.block, self.k_blocks = k, n, block, k_blocks
        self.nibbles = bits == 4
        self.panels = -(-n // _NC)
        integral = zp is None or zp.dtype == np.uint8  # float zero points: level 0's product
        self.quantize_a = int8_a and integral
        self.codes: np.ndarray | None = None
        self.icodes: np.ndarray | None = None
        self.zp8: np.ndarray | None = None
        self.scale = _panels(s)
        self.scale_zp: np.ndarray | None = None
        if int8_layout is None:  # the interpreter's: where its compiled product runs
            int8_layout = matmul_nbits_int8.kernel_ready()
        if self.quantize_a and self.nibbles and int8_layout:
            self.icodes = qnbits_ir.pack(_unpack_codes(b, bits, n, k_blocks, block))
            self.zp8 = _panels(z.astype(np.uint8))
        else:
            codes = (
                b.reshape(n, k_blocks * blob)
                if self.nibbles
                else _unpack_codes(b, bits, n, k_blocks, block)
            )
            self.codes = _panels(codes)
            self.scale_zp = _panels(s * z)

    def padded(self, a: np.ndarray) -> np.ndarray:
        """A's rows (M, K) as float32 (M, k_blocks * block), zeros past K."""
        width = self.k_blocks * self.block
        if a.dtype == _F32 and a.shape[1] == width and a.flags.c_contiguous:
            return a
        out = np.zeros((a.shape[0], width), _F32)
        out[:, : self.k] = a
        return out

    def _kmajor(self, p0: int, p1: int) -> np.ndarray:
        """Panels p0..p1's codes as (panels, k_blocks * block, 64) uint8, k-major."""
        if self.icodes is not None:  # (panels, groups, 64, 4): k = 8g + j (low), + 4 (high)
            x = self.icodes[p0:p1]
            both = np.stack([x & np.uint8(15), x >> np.uint8(4)], axis=2)
            return both.transpose(0, 1, 2, 4, 3).reshape(p1 - p0, -1, _NC)
        codes = self.codes[p0:p1]  # type: ignore[index]
        if self.nibbles:
            lo, hi = codes & np.uint8(15), codes >> np.uint8(4)
            return np.stack([lo, hi], axis=2).reshape(p1 - p0, -1, _NC)
        return codes

    def dequantized(self, c0: int, c1: int) -> np.ndarray:
        """Columns c0..c1 (whole panels) of the float32 weight (K, c1 - c0), in NumPy."""
        p0, p1 = c0 // _NC, c1 // _NC
        w = self._kmajor(p0, p1).reshape(p1 - p0, self.k_blocks, self.block, _NC).astype(_F32)
        w *= self.scale[p0:p1, :, None]
        if self.scale_zp is not None:
            w -= self.scale_zp[p0:p1, :, None]
        else:  # the int8 kernel's bytes
            w -= (self.scale[p0:p1] * self.zp8[p0:p1])[:, :, None]  # type: ignore[index]
        return w.transpose(1, 2, 0, 3).reshape(-1, c1 - c0)[: self.k]

    def product(self, a: np.ndarray) -> np.ndarray:
        """float32 (M, N) ``A @ W`` for A (M, K); at ``accuracy_level=4`` (``quantize_a``)
        of A's int8 blocks (``matmul_nbits_int8``)."""
        m = a.shape[0]
        n_pad = self.panels * _NC
        if m == 0:
            return np.empty((0, self.n), _F32)
        if self.icodes is not None:
            got = matmul_nbits_int8.product(self, a)
            if got is not None:
                return got[:, : self.n] if n_pad != self.n else got
        if self.quantize_a:
            ap = matmul_nbits_int8.fake_quantized(a, self.block, self.k_blocks)
        else:
            ap = self.padded(a)
        y = np.empty((m, n_pad), _F32)
        gemv = _GEMV.get() if m <= GEMV_ROWS and self.codes is not None else None
        if gemv is not None:
            many = m * self.k * n_pad >= _GEMV_SPLIT
            parts = min(native_threads.enter(intra_pool().threads if many else 1), self.panels)
            gemv(ap, self.codes, self.scale, self.scale_zp, y, parts, self.nibbles)
            return y[:, : self.n] if n_pad != self.n else y
        gemm = _GEMM.get() if self.codes is not None else None
        if gemm is not None and gemm_packed.available():
            nr = gemm_packed.tile().nr  # type: ignore[union-attr]
            parts = min(native_threads.enter_for(m * self.k * n_pad, intra_pool().threads),
                        self.panels)  # fmt: skip
            gemm(ap, self.codes, self.scale, self.scale_zp, y, parts, nr, self.nibbles)
            return y[:, : self.n] if n_pad != self.n else y
        step = max(_NC, CHUNK_FLOATS // max(self.k_blocks * self.block, 1) // _NC * _NC)
        for c0 in range(0, n_pad, step):
            c1 = min(n_pad, c0 + step)
            y[:, c0:c1] = ap[:, : self.k] @ self.dequantized(c0, c1)
        return y[:, : self.n] if n_pad != self.n else y


# -- the compiled loops (numba; the GIL released while they run) ----------------------------


def _gemv(a, codes, scale, scale_zp, y, parts, nibbles):  # pragma: no cover - numba only
    # per panel of 64 columns and row of A: per block d[n] = sum_k code[k, n] * a[k] (a
    # row of codes is two k's nibbles, or one k's byte), then y += scale * d - scale_zp * s
    m_rows = a.shape[0]
    chunks, rows, _ = codes.shape
    k_blocks = scale.shape[1]
    per_blk = rows // k_blocks
    per = (chunks + parts - 1) // parts
    sixteenth = np.float32(0.0625)
    sixteen = np.float32(16.0)
    for part in numba.prange(parts):
        d = np.empty(64, np.float32)
        acc = np.empty(64, np.float32)
        for chunk in range(part * per, min(chunks, (part + 1) * per)):
            for m in range(m_rows):
                acc[:] = 0.0
                for blk in range(k_blocks):
                    d[:] = 0.0
                    s = np.float32(0.0)
                    for j in range(blk * per_blk, (blk + 1) * per_blk):
                        row = codes[chunk, j]
                        if nibbles:
                            xe = a[m, 2 * j]
                            xo = a[m, 2 * j + 1]
                            s += xe + xo
                            for i in range(64):
                                # the nibbles in float arithmetic: numba's integer ops
                                # widen to int64, whose conversions LLVM does not vectorize
                                f = np.float32(row[i])
                                hi = np.floor(f * sixteenth)
                                d[i] += (f - hi * sixteen) * xe + hi * xo
                        else:
                            x = a[m, j]
                            s += x
                            for i in range(64):
                                d[i] += np.float32(row[i]) * x
                    sr = scale[chunk, blk]
                    zr = scale_zp[chunk, blk]
                    for i in range(64):
                        acc[i] += sr[i] * d[i] - zr[i] * s
                y[m, chunk * 64 : chunk * 64 + 64] = acc


def _gemm(a, codes, scale, scale_zp, y, parts, nr, nibbles):  # pragma: no cover - numba only
    m_rows, width = a.shape
    chunks, rows, _ = codes.shape
    k_blocks = scale.shape[1]
    per_blk = rows // k_blocks
    panels = 64 // nr
    per = (chunks + parts - 1) // parts
    sixteenth = np.float32(0.0625)
    sixteen = np.float32(16.0)
    bias = np.zeros(64, np.float32)
    for part in numba.prange(parts):
        wp = np.empty((panels, width, nr), np.float32)
        for chunk in range(part * per, min(chunks, (part + 1) * per)):
            for blk in range(k_blocks):
                for p in range(panels):
                    sr = scale[chunk, blk, p * nr : p * nr + nr]
                    zr = scale_zp[chunk, blk, p * nr : p * nr + nr]
                    for r in range(blk * per_blk, (blk + 1) * per_blk):
                        row = codes[chunk, r, p * nr : p * nr + nr]
                        if nibbles:
                            lo = wp[p, 2 * r]
                            hi = wp[p, 2 * r + 1]
                            for i in range(nr):
                                f = np.float32(row[i])
                                h = np.floor(f * sixteenth)
                                lo[i] = (f - h * sixteen) * sr[i] - zr[i]
                                hi[i] = h * sr[i] - zr[i]
                        else:
                            out = wp[p, r]
                            for i in range(nr):
                                out[i] = np.float32(row[i]) * sr[i] - zr[i]
            sgemm_packed(a, 0, width, wp, 0, y, chunk * 64, y.shape[1], m_rows, width, 64,
                         bias, 0, 0, nr)  # fmt: skip


def _warm_gemv(fn: Any) -> None:
    one = np.ones((1, 1, 64), _F32)
    for nibbles, rows in ((True, 8), (False, 16)):
        fn(np.ones((1, 16), _F32), np.ones((1, rows, 64), np.uint8), one, one,
           np.empty((1, 64), _F32), 1, nibbles)  # fmt: skip


def _warm_gemm(fn: Any) -> None:
    one = np.ones((1, 1, 64), _F32)
    nr = gemm_packed.tile().nr  # type: ignore[union-attr]
    for nibbles, rows in ((True, 8), (False, 16)):
        fn(np.ones((2, 16), _F32), np.ones((1, rows, 64), np.uint8), one, one,
           np.empty((2, 64), _F32), 1, nr, nibbles)  # fmt: skip


def _prepare_gemm(module_globals: dict[str, Any]) -> bool:
    fn = gemm_packed.kernel()
    module_globals["sgemm_packed"] = fn
    return fn is not None


_GEMV = Jitted(_gemv, _warm_gemv, fastmath=CONTRACT, parallel=True)
_GEMM = Jitted(_gemm, _warm_gemm, fastmath=CONTRACT, parallel=True, prepare=_prepare_gemm)


# -- the kernel -------------------------------------------------------------------------------


def _matmul_nbits(ctx: KernelContext) -> ComputeFn:
    """MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?; K, N, bits, block_size)."""
    k = int(ctx.attr("K"))
    n = int(ctx.attr("N"))
    bits = int(ctx.attr("bits", 4))
    block = int(ctx.attr("block_size"))
    int8_a = ctx.attr("accuracy_level", 0) == 4
    if bits not in _NBITS:
        raise ctx.unsupported(f"bits={bits}: only 2, 4 and 8 are supported")
    if block < 16 or block & (block - 1):
        raise ctx.unsupported(f"block_size={block} must be a power of two of at least 16")
    if k <= 0 or n <= 0:
        raise ctx.unsupported(f"K={k} and N={n} must be positive")
    if ctx.has_input(4) and ctx.const_input(4) is not None:
        g = np.asarray(ctx.const_input(4)).reshape(-1)
        if not np.array_equal(g, np.arange(k) // block):
            raise ctx.unsupported("g_idx that reorders the blocks is not supported")
    consts = [ctx.const_input(i) for i in (1, 2)]
    zp_const = ctx.const_input(3) if ctx.has_input(3) else None
    fixed = None
    if all(c is not None for c in consts) and (not ctx.has_input(3) or zp_const is not None):
        fixed = NBitsWeight(ctx, np.asarray(consts[0]), np.asarray(consts[1]),
                            None if zp_const is None else np.asarray(zp_const),
                            k, n, bits, block, int8_a)  # fmt: skip
        for loops in (_GEMV, _GEMM):
            loops.get()  # compiled (or read from numba's cache) at load, not on a call

    def matmul_nbits(a: np.ndarray, b: np.ndarray, scales: np.ndarray, zero_points: Any = None,
                     g_idx: Any = None, bias: Any = None) -> np.ndarray:  # fmt: skip
        if a.shape[-1] != k:
            raise ValueError(f"MatMulNBits: A's last dim is {a.shape[-1]}, not K={k}")
        w = fixed
        if w is None:
            w = NBitsWeight(ctx, np.asarray(b), np.asarray(scales),
                            None if zero_points is None else np.asarray(zero_points),
                            k, n, bits, block, int8_a)  # fmt: skip
        y = w.product(a.reshape(-1, k)).reshape((*a.shape[:-1], n))
        if bias is not None:
            y += np.asarray(bias, _F32).reshape(n)
        return y.astype(a.dtype, copy=False)

    return matmul_nbits


def register_kernels(registry: KernelRegistry) -> None:
    """Register MatMulNBits."""
    registry.add("MatMulNBits", _matmul_nbits, domain=MS_DOMAIN, since=1)
