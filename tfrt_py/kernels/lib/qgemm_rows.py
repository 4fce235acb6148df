"""Exact integer products of 8-bit rows by a constant 8-bit matrix on ``qgemm_packed``'s
kernel: what MatMulInteger, QLinearMatMul, QGemm, MatMulIntegerToFloat and
DynamicQuantizeMatMul compute before they scale, when B is an initializer.

``IntegerWeights.make(b, b_zp)`` packs B at load (uint8 codes shifted by 128 to signed,
their zero point with them) and keeps its column sums; ``product(a, a_zp)`` gives the
int32 ``(A - a_zp) @ (B - b_zp)`` for 8-bit A (int8 codes shifted by 128 to unsigned,
a_zp scalar or one per row of A's last two dims' rows):
``sum_k a*b' - a_zp' * colsum(b') - b_zp'[n] * rowsum(a) + K * a_zp' * b_zp'[n]``, every
term exact in int64 before the int32 result. One kernel call per product (ctypes, the GIL
released while it runs). None from ``make`` where there is no kernel (the callers keep
their exact float products); None from ``product`` for an A it does not take. Immutable
after ``make``; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import qgemm_packed

__all__ = ["IntegerWeights"]

#: the longest reduction whose u8 x s8 sums stay inside int32
MAX_K = (2**31 - 1) // (255 * 128)


class IntegerWeights:
    """A constant B (K x N) packed for the integer kernel, with its column sums."""

    __slots__ = ("built", "colsum", "k", "n", "packed", "wz")

    def __init__(self, built: Any, packed: np.ndarray, colsum: np.ndarray, wz: np.ndarray,
                 k: int, n: int) -> None:  # fmt: skip
        self.built, self.packed, self.colsum, self.wz, self.k, self.n = (
            built, packed, colsum, wz, k, n)  # fmt: skip

    @classmethod
    def make(cls, b: np.ndarray | None, b_zp: Any) -> IntegerWeights | None:
        """B's plan, or None: no kernel here, B not a 2-D 8-bit matrix, a zero point that is
        neither one value nor one per column, or K beyond int32's sums."""
        built = qgemm_packed.available()
        if built is None or b is None or b.ndim != 2 or b.dtype not in (np.uint8, np.int8):
            return None
        k, n = b.shape
        if k == 0 or n == 0 or k > MAX_K:
            return None
        wz = np.zeros(n, np.int64)
        if b_zp is not None:
            z = np.asarray(b_zp)
            if z.dtype != b.dtype or z.size not in (1, n):
                return None
            wz = np.broadcast_to(z.astype(np.int64).reshape(-1), (n,)).copy()
        bi = b.astype(np.int64)
        if b.dtype == np.uint8:
            bi -= 128
            wz -= 128
        packed = qgemm_packed.pack(bi, built.tile)
        return cls(built, packed, bi.sum(axis=0), wz, k, n)

    def product(self, a: np.ndarray, a_zp: Any) -> np.ndarray | None:
        """int32 ``(A - a_zp) @ (B - b_zp)`` with A's leading dims kept, or None when A is not
        8-bit with K columns or a_zp is neither one value nor one per row."""
        if a.dtype not in (np.uint8, np.int8) or a.ndim < 1 or a.shape[-1] != self.k:
            return None
        rows = a.reshape(-1, self.k)
        m = rows.shape[0]
        zx = np.zeros(1, np.int64)
        if a_zp is not None:
            z = np.asarray(a_zp)
            if z.dtype != a.dtype or z.size not in (1, m) or (z.size > 1 and a.ndim > 2):
                return None
            zx = z.astype(np.int64).reshape(-1)
        shape = self.built.tile
        g = shape.g
        kp = -(-self.k // g) * g
        a2 = np.empty((m, kp), qgemm_packed.a_dtype(shape))
        a2[:, self.k :] = 0
        if a.dtype == np.int8:  # signed codes + 128: unsigned, the zero point with them
            zx = zx + 128
            if shape.vnni:
                np.bitwise_xor(rows.view(np.uint8), 0x80, out=a2[:, : self.k])
            else:
                np.add(rows, 128, out=a2[:, : self.k], dtype=np.int16)
        else:
            a2[:, : self.k] = rows
        acc = qgemm_packed.qgemm(self.built, a2, self.packed, m)[:, : self.n].astype(np.int64)
        zcol = zx.reshape(-1, 1)
        acc -= zcol * self.colsum
        if self.wz.any():
            acc -= a2.sum(axis=1, dtype=np.int64).reshape(-1, 1) * self.wz
            acc += self.k * zcol * self.wz
        return acc.astype(np.int32).reshape((*a.shape[:-1], self.n))
