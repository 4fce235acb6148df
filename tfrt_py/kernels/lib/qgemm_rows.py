"""Exact integer products of 8-bit rows by a constant 8-bit matrix on ``qgemm_packed``'s
kernel: what MatMulInteger, QLinearMatMul, QGemm, MatMulIntegerToFloat and
DynamicQuantizeMatMul compute before they scale, when B is an initializer.

``IntegerWeights.make(b, b_zp)`` packs B at load (uint8 codes shifted by 128 to signed,
their zero point with them) and keeps its column sums; ``product(a, a_zp)`` gives the
int32 ``(A - a_zp) @ (B - b_zp)`` for 8-bit A (int8 codes shifted by 128 to unsigned,
a_zp scalar or one per row of A's last two dims' rows):
``sum_k a*b' - a_zp' * colsum(b') - b_zp'[n] * rowsum(a) + K * a_zp' * b_zp'[n]``, in
int32 in place (every term fits: K <= ``MAX_K``); the result is a view of the kernel's
padded output when N is not a whole number of panels. The kernel is called from numba's
loop over parts (by ctypes where numba's loops are off), the GIL released while it runs.
None from ``make`` where there is no kernel (the callers keep their exact float products);
None from ``product`` for an A it does not take. Immutable after ``make``; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..base import Cost, KernelContext
from . import qgemm_packed
from .jit import Jitted

__all__ = ["IntegerWeights", "integer_product_cost"]

#: the longest reduction whose u8 x s8 sums stay inside int32
MAX_K = (2**31 - 1) // (255 * 128)
#: products of at least this many multiply-adds split over native threads
_SPLIT_OPS = 1 << 20

numba: Any = None  # set by Jitted(parallel=True) before _split compiles
qgemm_kernel: Any = None  # the ExternalFunction, set by _prepare
qgemm_scaled: Any = None  # the float-storing one, set by _prepare_scaled


class IntegerWeights:
    """A constant B (K x N) packed for the integer kernel, with its column sums."""

    __slots__ = ("asymmetric", "built", "colsum32", "k", "n", "packed", "tile", "wz", "wz32",
                 "wz_i32")  # fmt: skip

    def __init__(self, built: Any, packed: np.ndarray, colsum: np.ndarray, wz: np.ndarray,
                 k: int, n: int, tile: qgemm_packed.QTile) -> None:  # fmt: skip
        self.built, self.packed, self.wz, self.k, self.n = built, packed, wz, k, n
        self.tile = tile  # the process's tile, or pairs256's (``make``)
        # padded to the panels' columns, as the kernel's output
        self.colsum32 = np.zeros(packed.shape[0] * packed.shape[2], np.int32)
        self.colsum32[:n] = colsum
        self.wz32 = np.zeros(self.colsum32.shape[0], np.int64)
        self.wz32[:n] = wz
        self.wz_i32 = self.wz32.astype(np.int32)
        self.asymmetric = bool(wz.any())  # B has zero points: A's row sums enter

    def _product(self, a2: np.ndarray, m: int) -> np.ndarray:
        """The kernel's int32 output (m, panels * nr): split over native threads by panels
        when the product is worth it, else one part on this thread (both through numba:
        a ctypes call costs ~10 µs more); one ctypes call where numba's loops are off."""
        panels = self.packed.shape[0]
        fn = _SPLIT.get()
        if fn is None:
            return qgemm_packed.qgemm(self.built._replace(tile=self.tile), a2, self.packed, m)
        ops = m * self.k * panels * self.packed.shape[2]
        threads = native_threads.enter(intra_pool().threads if ops >= _SPLIT_OPS else 1)
        c = np.empty((m, panels * self.packed.shape[2]), np.int32)
        fn(a2, self.packed, c, m, qgemm_packed.layout_code(self.tile), min(threads, panels))
        return c

    @classmethod
    def make(cls, b: np.ndarray | None, b_zp: Any) -> IntegerWeights | None:
        """B's plan, or None: no kernel here, B not a 2-D 8-bit matrix, a zero point that is
        neither one value nor one per column, or K beyond int32's sums. On an ``avx2`` path
        a B whose pairs cannot saturate ``vpmaddubsw`` (``qgemm_packed.pairs_exact``: 7-bit
        weights) is packed for ``pairs256``, and A's rows stay bytes."""
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
        tile = qgemm_packed.tile_for(bi, built.tile)
        packed = qgemm_packed.pack(bi, tile)
        _SPLIT.get()  # numba's loops compiled (or read from its cache) at load, not on a call
        _SCALED.get()
        return cls(built, packed, bi.sum(axis=0), wz, k, n, tile)

    def _rows(self, a: np.ndarray, a_zp: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """A's rows in the kernel's layout (m, K padded to whole groups) and the zero
        point(s) of those codes (int64, one or one per row), or None (``product``)."""
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
        shape = self.tile
        g = shape.g
        kp = -(-self.k // g) * g
        adt = qgemm_packed.a_dtype(shape)
        if a.dtype == adt and kp == self.k and rows.flags.c_contiguous:
            return rows, zx  # already the kernel's layout: no copy
        a2 = np.empty((m, kp), adt)
        a2[:, self.k :] = 0
        if a.dtype == np.int8:  # signed codes + 128: unsigned, the zero point with them
            zx = zx + 128
            if shape.g == 4:  # bytes
                np.bitwise_xor(rows.view(np.uint8), 0x80, out=a2[:, : self.k])
            else:
                np.add(rows, 128, out=a2[:, : self.k], dtype=np.int16)
        else:
            a2[:, : self.k] = rows
        return a2, zx

    def product(self, a: np.ndarray, a_zp: Any) -> np.ndarray | None:
        """int32 ``(A - a_zp) @ (B - b_zp)`` with A's leading dims kept, or None when A is not
        8-bit with K columns or a_zp is neither one value nor one per row."""
        got = self._rows(a, a_zp)
        if got is None:
            return None
        a2, zx = got
        acc = self._product(a2, a2.shape[0])
        # the corrections in int32, in place: every term and the exact result fit (K <= MAX_K)
        if zx.size == 1:
            if zx[0]:
                acc -= np.int32(zx[0]) * self.colsum32
        else:
            acc -= zx.astype(np.int32).reshape(-1, 1) * self.colsum32
        if self.asymmetric:
            zcol = zx.reshape(-1, 1)
            rows_sum = a2.sum(axis=1, dtype=np.int64).reshape(-1, 1)
            acc -= (rows_sum * self.wz32 - self.k * zcol * self.wz32).astype(np.int32)
        out = acc[:, : self.n] if acc.shape[1] != self.n else acc
        return out.reshape((*a.shape[:-1], self.n))

    def padded(self, v: np.ndarray) -> np.ndarray:
        """A per-column float32 vector (length N) padded with zeros to the panels' columns,
        as ``product_scaled`` reads its scale and bias (make them once, at load)."""
        out = np.zeros(self.colsum32.shape[0], np.float32)
        out[: self.n] = v
        return out

    def product_scaled(self, a: np.ndarray, a_zp: Any, scale: np.ndarray, bias: np.ndarray | None,
                       a_scale: Any = 1.0) -> np.ndarray | None:  # fmt: skip
        """float32 ``float32(product(a, a_zp)) * (scale * a_scale) + bias`` (``scale`` and
        ``bias`` float32, one per column, or ``padded``; ``a_scale`` one float32; each step
        rounded as the separate nodes round: no fused multiply-add; no bias adds 0.0), the
        zero-point corrections and the scaling done by the kernel as it stores each tile
        (``qgemm_packed``'s scaled form); None where ``product`` is None, a_zp is one per
        row or numba's loops are off (the caller scales ``product``'s sums). The result is
        a view of a wider output when N is not a whole number of vectors."""
        fn = _SCALED.get()
        got = None if fn is None else self._rows(a, a_zp)
        if got is None or got[1].size != 1:
            return None
        a2, zx = got
        m = a2.shape[0]
        panels, nr = self.packed.shape[0], self.packed.shape[2]
        npad = panels * nr
        scale = scale if scale.shape[0] == npad else self.padded(scale)
        if bias is None:
            bias = _no_bias(npad)
        elif bias.shape[0] != npad:
            bias = self.padded(bias)
        ops = m * self.k * npad
        threads = native_threads.enter(intra_pool().threads if ops >= _SPLIT_OPS else 1)
        vw = nr // 2
        width = self.n if self.n % vw == 0 else -(-self.n // vw) * vw
        y = np.empty((m, width), np.float32)
        zx0 = int(zx[0])
        if self.asymmetric:
            row_term = (a2.sum(axis=1, dtype=np.int64) - self.k * zx0).astype(np.int32)
        else:
            row_term = _zero_rows(m)
        fn(a2, self.packed, y, m, qgemm_packed.layout_code(self.tile), min(threads, panels),
           self.colsum32, self.wz_i32, row_term, scale, bias, np.full(1, a_scale, np.float32),
           zx0, self.n)  # fmt: skip
        out = y if width == self.n else y[:, : self.n]
        return out.reshape((*a.shape[:-1], self.n))


def _zero_rows(m: int) -> np.ndarray:
    """At least ``m`` int32 zeros (shared: never written): the row terms of a B without
    zero points."""
    got = _ZERO_ROWS[0]
    if got.shape[0] < m:
        got = _ZERO_ROWS[0] = np.zeros(max(m, 2 * got.shape[0]), np.int32)
    return got


_ZERO_ROWS = [np.zeros(256, np.int32)]


def _no_bias(npad: int) -> np.ndarray:
    """Zeros for ``npad`` columns (shared: never written): the bias of a product without
    one."""
    got = _ZEROS.get(npad)
    if got is None:
        got = _ZEROS[npad] = np.zeros(npad, np.float32)
    return got


_ZEROS: dict[int, np.ndarray] = {}


def _split(a, packed, c, m, layout, parts):  # pragma: no cover - numba only
    panels, kg, nr, g = packed.shape
    per = (panels + parts - 1) // parts
    esize = packed.itemsize
    for part in numba.prange(parts):
        p0 = part * per
        p1 = min(panels, p0 + per)
        if p0 < p1:
            w = packed.ctypes.data + p0 * kg * nr * g * esize
            out = c.ctypes.data + p0 * nr * 4
            qgemm_kernel(a.ctypes.data, a.shape[1], w, out, c.shape[1], m, kg, p1 - p0, layout)


def _split_scaled(
    a, packed, y, m, layout, parts, colsum, wz, row_term, scale, bias, a_scale, zx, n
):  # pragma: no cover - numba only
    panels, kg, nr, g = packed.shape
    if parts == 1:  # no parallel region
        qgemm_scaled(a.ctypes.data, a.shape[1], packed.ctypes.data, y.ctypes.data, y.shape[1], m,
                     kg, panels, layout, colsum.ctypes.data, wz.ctypes.data, row_term.ctypes.data,
                     scale.ctypes.data, bias.ctypes.data, a_scale.ctypes.data, zx, n)  # fmt: skip
        return
    per = (panels + parts - 1) // parts
    esize = packed.itemsize
    for part in numba.prange(parts):
        p0 = part * per
        p1 = min(panels, p0 + per)
        if p0 < p1:
            c0 = p0 * nr
            qgemm_scaled(a.ctypes.data, a.shape[1], packed.ctypes.data + p0 * kg * nr * g * esize,
                         y.ctypes.data + c0 * 4, y.shape[1], m, kg, p1 - p0, layout,
                         colsum.ctypes.data + c0 * 4, wz.ctypes.data + c0 * 4,
                         row_term.ctypes.data, scale.ctypes.data + c0 * 4,
                         bias.ctypes.data + c0 * 4, a_scale.ctypes.data, zx, n - c0)  # fmt: skip


def _tiles() -> list[qgemm_packed.QTile]:
    """The tiles this process's weights may be packed for (the warm-ups compile each)."""
    built = qgemm_packed.available()
    if built is None:
        return []
    pairs = qgemm_packed.pairs_tile()
    return [built.tile] if pairs is None else [built.tile, pairs]


def _warm_split(fn: Any) -> None:
    for shape in _tiles():
        _warm_split_tile(fn, shape)


def _warm_split_tile(fn: Any, shape: qgemm_packed.QTile) -> None:
    packed = qgemm_packed.pack(np.ones((4, 2 * shape.nr), np.int8), shape)
    a = np.ones((2, 4), qgemm_packed.a_dtype(shape))
    c = np.empty((2, 2 * shape.nr), np.int32)
    fn(a, packed, c, 2, qgemm_packed.layout_code(shape), 2)


def _warm_scaled(fn: Any) -> None:
    for shape in _tiles():
        _warm_scaled_tile(fn, shape)


def _warm_scaled_tile(fn: Any, shape: qgemm_packed.QTile) -> None:
    n = 2 * shape.nr
    packed = qgemm_packed.pack(np.ones((4, n), np.int8), shape)
    a = np.ones((2, 4), qgemm_packed.a_dtype(shape))
    cols = np.zeros(n, np.int32)
    for parts in (1, 2):
        fn(a, packed, np.empty((2, n), np.float32), 2, qgemm_packed.layout_code(shape), parts,
           cols, cols, cols[:2], np.ones(n, np.float32), np.ones(n, np.float32),
           np.ones(1, np.float32), 1, n)  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    fn = qgemm_packed.kernel()
    module_globals["qgemm_kernel"] = fn
    return fn is not None


def _prepare_scaled(module_globals: dict[str, Any]) -> bool:
    fn = qgemm_packed.kernel_scaled()
    module_globals["qgemm_scaled"] = fn
    return fn is not None


_SPLIT = Jitted(_split, _warm_split, parallel=True, prepare=_prepare)
_SCALED = Jitted(_split_scaled, _warm_scaled, parallel=True, prepare=_prepare_scaled)


def integer_product_cost(b_idx: int) -> Any:
    """The cost function of an integer product whose B is input ``b_idx``: two operations
    a multiply-add (the profile's GOP/s), the operands and the output read or written."""

    def cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
        if len(ins) <= b_idx or not outs or not ins[0]:
            return Cost(0.0, 0.0)
        y = float(np.prod(outs[0]))
        return Cost(2.0 * y * ins[0][-1], float(np.prod(ins[0])) + float(np.prod(ins[b_idx])) + y)

    return cost
