"""A Linear's product in row blocks on native threads with its bias and activation done
inside each block, by the thread that computed it, while the block is in cache.

``gemm.matmul_into`` splits a big product into row blocks on native threads; before,
the Linear's epilogue (a bias add and an activation: NumPy calls and compiled loops)
then ran over the whole output on the caller alone: ViT-Tiny's MLP (197x192 @ 192x768
+ GELU, twelve of them) waited for one thread's GELU over 151k elements after a split
product, MobileViT's (1024x64 @ 64x128 + SiLU) likewise. Here a ``Fused`` spec -- the
bias as one value per column and one activation ``conv_direct`` compiles (Relu, Clip,
HardSwish, HardSigmoid, Sigmoid, SiLU, LeakyRelu, GELU's erf form) -- runs per block in
the same ``prange`` iteration as the block's gemm (NumPy's BLAS on the block's rows:
leading dimensions, no copies).

The activations are ``conv_direct._act_row``'s: Sigmoid/SiLU use MLAS's rational
logistic and GELU ``erf.erf_f32``'s rational erf (float32 only: float64 keeps the
NumPy steps), so results agree with the step kernels to float32 rounding, not bit for
bit. numba only (``fused_for`` returns None without it).

A float32 Linear's weight packed in ``gemm_packed``'s panels (``Serial``) takes its products
instead, on this thread or split by columns or rows on native threads, the bias and ReLU
applied as the kernel stores. Thread-safe: no state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from . import blas
from .activations import ACTIVATIONS, PARAMS_LEN, Epilogue, _act_row, _params, numpy_act_after
from .gemm import _MIN_ROWS, NATIVE_SPLIT_MIN_MACS, PARTS_PER_THREAD, splits
from .jit import CONTRACT, Jitted

__all__ = [
    "COLS_MAX_ROWS",
    "PACK_LATER_MAX_BYTES",
    "PACK_MAX_BYTES",
    "Fused",
    "Serial",
    "fused_for",
    "pack_later",
    "pack_padded",
    "serial_for",
]

#: The largest weight a Linear packs at load, besides its own copy (the one-row products
#: by a wide matrix keep the original: ``gemm.gemv_cols``): ViT-Tiny's biggest is 0.6 MB.
PACK_MAX_BYTES = 1 << 20
#: ... and the largest it packs on its first product of two rows or more (``pack_later``):
#: a classifier's head (1024x1000, 2048x1000), BERT-base's projections (768x3072). NumPy's
#: gemm, which packs the weight again on every call, ran a few rows by them on one thread
#: (a split needed 64 rows), and a Gemm's transB weight (a transposed view) on OpenBLAS's
#: slow small-M path: batch 8 by MobileNetV3's 1024x1000 head 522 µs, 77 packed and split
#: (onnxruntime 90-130; Zen 5, two threads, 2026-12-03). A decoder that only ever runs
#: one row never packs; a 256 MB matrix is served by NumPy's gemm alone rather than held
#: twice.
PACK_LATER_MAX_BYTES = 16 << 20
#: A product of at most this many rows by a packed weight of at least ``COLS_MIN_BYTES``
#: splits by columns (``Serial.split``): it streams the weight (a decode step's
#: projections, a small batch by a classifier's head), so two threads read it in about
#: half the time -- when the workers are awake (``native_pool``'s spin after short
#: parts). 2-core Zen 4 VM (AVX-512, weights from L3, 2026-11-30, µs): 1x256 @ 256x704
#: 10.8 -> 5.9, 1x704 @ 704x256 10.5 -> 5.7, 1x256 @ 256x256 4.2 -> 3.1, 1x256 @ 256x64
#: 1.6 -> 1.8 (too small). More than ``STREAM_ROWS`` rows split only from
#: ``gemm.NATIVE_SPLIT_MIN_MACS``; more than ``COLS_MAX_ROWS`` by rows (``Serial.split_rows``).
COLS_MAX_ROWS = 64
STREAM_ROWS = 4
COLS_MIN_BYTES = 128 << 10
#: Panels per part at least (a part's weight columns: 2 x nr).
COLS_MIN_PANELS = 2

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None


class Fused(NamedTuple):
    """What ``run_fused`` does after each block's product: ``y += bias`` (length 0: no
    bias), then ``conv_direct``'s activation ``act`` with ``params``. (A float32 Linear
    whose weight is packed runs on ``Serial`` instead.) Immutable."""

    bias: np.ndarray
    act: int
    params: np.ndarray
    kernel: Any  # the compiled _linear_par

    def run(self, a: np.ndarray, w: np.ndarray, out: np.ndarray, edges: Any) -> bool:
        """``out = act(a @ w + bias)`` in the row blocks between ``edges`` on native
        threads (the caller has entered them), when every array is C-contiguous of the
        bias's dtype; False (nothing done) otherwise."""
        dt = self.params.dtype
        if a.dtype != dt or w.dtype != dt or out.dtype != dt:
            return False
        if not (a.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous):
            return False
        if self.bias.shape[0] not in (0, w.shape[1]):
            return False
        self.kernel(a, w, out, self.bias, edges, self.act, self.params)
        return True


def _linear_par(  # pragma: no cover - numba only
    a: Any, w: Any, y: Any, b: Any, edges: Any, act: int, p: Any
) -> None:
    """y[r0:r1] = act(a[r0:r1] @ w + b) for the row blocks between consecutive ``edges``,
    in a ``prange`` loop on native threads. ``a`` (M, K), ``w`` (K, N), ``y`` (M, N)
    C-contiguous, one dtype; ``b`` (N,) or empty."""
    k = a.shape[1]
    n = w.shape[1]
    has_b = b.shape[0] > 0
    zero, one = p[2], p[3]
    neg0 = -zero
    sz = y.itemsize
    for q in numba.prange(edges.shape[0] - 1):
        r0, r1 = edges[q], edges[q + 1]
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        pa = a.ctypes.data + np.uint64(r0 * k * sz)
        pc = y.ctypes.data + np.uint64(r0 * n * sz)
        if sz == 4:
            _sgemm(101, 111, 111, r1 - r0, n, k, one, pa, k, w.ctypes.data, n, zero, pc, n)
        else:
            _dgemm(101, 111, 111, r1 - r0, n, k, one, pa, k, w.ctypes.data, n, zero, pc, n)
        for r in range(r0, r1):
            row = y[r]
            if has_b:
                for j in range(n):
                    row[j] += b[j]
            if act != 0:
                _act_row(row, neg0, act, p)


def _panels_into(  # pragma: no cover - numba only
    a: Any, wp: Any, y: Any, b: Any, flags: int, p0: int, p1: int
) -> None:
    """y[:, p0 * nr : min(p1 * nr, N)] = a @ W's panels p0..p1 [+ b] (``flags``: 1 bias,
    2 ReLU), N being ``y``'s width. A last panel that reaches past N (``pack_padded``'s
    zero columns) is computed into a scratch of one panel's width and its first columns
    copied: the kernel stores whole panels."""
    m, k = a.shape
    n = y.shape[1]
    nr = wp.shape[2]
    full = min(p1, n // nr)
    if full > p0:
        sgemm_packed(a, 0, k, wp, p0 * k * nr, y, p0 * nr, n, m, k, (full - p0) * nr, b,
                     p0 * nr, flags, nr)  # fmt: skip
    if p1 > full:  # the padded panel (only the last one is)
        c0 = full * nr
        tail = np.empty((m, nr), np.float32)
        sgemm_packed(a, 0, k, wp, full * k * nr, tail, 0, nr, m, k, nr, b, c0, flags, nr)
        for r in range(m):
            for j in range(n - c0):
                y[r, c0 + j] = tail[r, j]


def _linear_serial(  # pragma: no cover - numba only
    a: Any, wp: Any, y: Any, b: Any, act: int, p: Any, flags: int
) -> None:
    """y = act(a @ W [+ b]) on this thread, W in ``pack_padded``'s panels (``b``, when
    used, padded likewise)."""
    m = a.shape[0]
    _panels_into(a, wp, y, b, flags, 0, wp.shape[0])
    if act != 0:
        neg0 = -p[2]
        for r in range(m):
            _act_row(y[r], neg0, act, p)


def _linear_cols(  # pragma: no cover - numba only
    a: Any, wp: Any, y: Any, b: Any, act: int, p: Any, flags: int, edges: Any
) -> None:
    """``_linear_serial`` split by columns: the panels between consecutive ``edges`` per
    part of a ``prange`` loop on native threads, each with its activation. For few rows,
    where the product streams the weight: each thread reads its own columns."""
    m = a.shape[0]
    n = y.shape[1]
    nr = wp.shape[2]
    neg0 = -p[2]
    for q in numba.prange(edges.shape[0] - 1):
        p0, p1 = edges[q], edges[q + 1]
        _panels_into(a, wp, y, b, flags, p0, p1)
        if act != 0:
            c1 = min(p1 * nr, n)
            for r in range(m):
                _act_row(y[r, p0 * nr : c1], neg0, act, p)


def _linear_rows(  # pragma: no cover - numba only
    a: Any, wp: Any, y: Any, b: Any, act: int, p: Any, flags: int, edges: Any
) -> None:
    """``_linear_serial`` split by rows: the rows between consecutive ``edges`` per part of
    a ``prange`` loop on native threads, each over every panel, with its activation."""
    neg0 = -p[2]
    for q in numba.prange(edges.shape[0] - 1):
        r0, r1 = edges[q], edges[q + 1]
        _panels_into(a[r0:r1], wp, y[r0:r1], b, flags, 0, wp.shape[0])
        if act != 0:
            for r in range(r0, r1):
                _act_row(y[r], neg0, act, p)


def _panel_width() -> int:
    """This process's packed panel width, 0 while there is no packed kernel."""
    from .gemm_packed import tile

    shape = tile()
    return 0 if shape is None else shape.nr


def _warm_serial(fn: Any) -> None:
    t, nr = np.float32, _panel_width() or 16
    a, y, wp = np.ones((2, 3), t), np.zeros((2, nr), t), np.ones((1, 3, nr), t)
    fn(a, wp, y, np.zeros(nr, t), 8, np.zeros(PARAMS_LEN, t), 1)


def _warm_cols(fn: Any) -> None:
    t, nr = np.float32, _panel_width() or 16
    a, y, wp = np.ones((1, 3), t), np.zeros((1, 2 * nr - 1), t), np.ones((2, 3, nr), t)
    edges = np.array([0, 1, 2], np.int64)
    edges.flags.writeable = False  # as native_threads.edges gives them
    fn(a, wp, y, np.zeros(2 * nr, t), 8, np.zeros(PARAMS_LEN, t), 1, edges)


def _warm_rows(fn: Any) -> None:
    t, nr = np.float32, _panel_width() or 16
    a, y, wp = np.ones((2, 3), t), np.zeros((2, 2 * nr - 1), t), np.ones((2, 3, nr), t)
    edges = np.array([0, 1, 2], np.int64)
    edges.flags.writeable = False  # as native_threads.edges gives them
    fn(a, wp, y, np.zeros(2 * nr, t), 8, np.zeros(PARAMS_LEN, t), 1, edges)


def _prepare_packed(module_globals: dict[str, Any]) -> bool:
    from .gemm_packed import kernel

    fn = kernel()  # None: no numba, or a host the kernel does not run on
    module_globals["sgemm_packed"] = fn
    return fn is not None


def _warm(fn: Any) -> None:
    t = np.float32
    a, w, y = np.ones((2, 3), t), np.ones((3, 4), t), np.zeros((2, 4), t)
    fn(a, w, y, np.zeros(4, t), np.array([0, 1, 2], np.int64), 1, np.zeros(PARAMS_LEN, t))


def _prepare(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


_LINEAR_PAR = Jitted(
    _linear_par, _warm, helpers=(_act_row,), fastmath=CONTRACT, parallel=True, prepare=_prepare
)
_LINEAR_SERIAL = Jitted(
    _linear_serial, _warm_serial, helpers=(_act_row, _panels_into), fastmath=CONTRACT,
    prepare=_prepare_packed,
)  # fmt: skip
_LINEAR_COLS = Jitted(
    _linear_cols, _warm_cols, helpers=(_act_row, _panels_into), fastmath=CONTRACT,
    parallel=True, prepare=_prepare_packed,
)  # fmt: skip
_LINEAR_ROWS = Jitted(
    _linear_rows, _warm_rows, helpers=(_act_row, _panels_into), fastmath=CONTRACT,
    parallel=True, prepare=_prepare_packed,
)  # fmt: skip
sgemm_packed: Any = None  # set by _prepare_packed


class Serial(NamedTuple):
    """A float32 Linear's product over its weight packed in ``gemm_packed``'s panels
    (NumPy's gemm packs the weight again on every call, a third of a small product's
    time), the bias and a ReLU applied as the rows are stored, another activation after
    (``conv_direct``'s ``_act_row``): on this thread, split by columns over the native
    threads for a few rows (``split``), by rows for many (``split_rows``). A weight packed
    later (``pack_later``) serves products of ``min_rows`` rows or more: one row by a big
    matrix is ``gemm.gemv_cols``'. Immutable; any thread."""

    packed: np.ndarray  # (ceil(N/nr), K, nr): pack_padded's panels
    bias: np.ndarray  # (panels * nr,) zero-padded, or the packed weight when there is no bias
    act: int
    params: np.ndarray
    flags: int
    kernel: Any
    n: int  # W's columns
    cols: Any = None  # the compiled _linear_cols when the weight is big enough to split
    rows: Any = None  # the compiled _linear_rows
    min_rows: int = 1

    def fits(self, a: np.ndarray, out: np.ndarray) -> bool:
        """Whether ``a`` (M, K) and ``out`` (M, N) are C-contiguous float32 of this product's
        shapes, M at least ``min_rows``."""
        pk = self.packed
        return not (
            a.dtype != np.float32 or out.dtype != np.float32 or a.ndim != 2 or out.ndim != 2
            or a.shape[1] != pk.shape[1] or out.shape[1] != self.n
            or out.shape[0] != a.shape[0] or a.shape[0] < self.min_rows
            or not (a.flags.c_contiguous and out.flags.c_contiguous)
        )  # fmt: skip

    def run(self, a: np.ndarray, out: np.ndarray) -> bool:
        """``out = act(a @ W + b)`` on this thread for ``a`` (M, K) and ``out`` (M, N), both
        C-contiguous float32; False (nothing done) for anything else."""
        if not self.fits(a, out):
            return False
        self.kernel(a, self.packed, out, self.bias, self.act, self.params, self.flags)
        return True

    def split(self, a: np.ndarray, out: np.ndarray) -> bool:
        """``run`` split by columns over the native threads of this call's budget, for at
        most ``COLS_MAX_ROWS`` rows (more than ``STREAM_ROWS`` from
        ``NATIVE_SPLIT_MIN_MACS``): each thread reads its own panels; False (nothing done)
        when it would not split or the arrays do not fit."""
        cols = self.cols
        m = a.shape[0]
        if cols is None or m > COLS_MAX_ROWS or not self.fits(a, out):
            return False
        panels, k = self.packed.shape[0], self.packed.shape[1]
        if m > STREAM_ROWS and m * k * self.n < NATIVE_SPLIT_MIN_MACS:
            return False
        blocks = min(native_threads.enter(intra_pool().threads), panels // COLS_MIN_PANELS)
        if blocks < 2:
            return False
        cols(a, self.packed, out, self.bias, self.act, self.params, self.flags,
             native_threads.edges(panels, blocks))  # fmt: skip
        return True

    def split_rows(self, a: np.ndarray, out: np.ndarray) -> bool:
        """``run`` split by blocks of rows over the native threads (as ``gemm.matmul_into``
        splits NumPy's gemm), for ``2 * _MIN_ROWS`` rows or more; False (nothing done)
        otherwise."""
        rows = self.rows
        m = a.shape[0]
        t = intra_pool().threads
        if rows is None or t < 2 or m < 2 * _MIN_ROWS or not self.fits(a, out):
            return False
        blocks = min(PARTS_PER_THREAD * native_threads.enter(t), m // _MIN_ROWS)
        rows(a, self.packed, out, self.bias, self.act, self.params, self.flags,
             native_threads.edges(m, blocks))  # fmt: skip
        return True

    def packed_product(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
        """``act(x @ W + b)`` for ``x`` (..., K) into ``out`` (or a new array) on the packed
        weight: split by columns (``split``), by rows where ``matmul_into`` would split
        (``split_rows``), else on this thread, the arrays C-contiguous float32; None: the
        caller's path runs (fewer than ``min_rows`` rows, another layout, or a split the
        native threads cannot take)."""
        k = self.packed.shape[1]
        if not k or not x.flags.c_contiguous or (out is not None and not out.flags.c_contiguous):
            return None
        a = x if x.ndim == 2 else x.reshape(-1, k)
        m, n = a.shape[0], self.n
        if m < self.min_rows:
            return None
        y = np.empty((*x.shape[:-1], n), np.float32) if out is None else out
        y2 = y if y.ndim == 2 else y.reshape(m, n)
        if self.split(a, y2):
            return y
        if splits(m, k, n, 4):
            return y if self.split_rows(a, y2) else None
        return y if self.run(a, y2) else None


def _packable(
    steps: list[tuple[str, int, dict[str, Any], tuple[int, ...]]],
    bias: np.ndarray | None,
    w: np.ndarray,
    max_bytes: int,
) -> Epilogue | None:
    """The epilogue of a product ``serial_for`` can pack (see there), or None."""
    f32 = np.dtype(np.float32)
    if w.ndim != 2 or w.dtype != f32 or w.nbytes > max_bytes:
        return None
    if len(steps) > 1 or (steps and tuple(steps[0][3]) != (-1,)):
        return None
    epi = _epilogue_of(steps[0][0], steps[0][2]) if steps else Epilogue()
    if epi is None or numpy_act_after(epi, f32):
        return None
    if bias is not None and (bias.dtype != f32 or bias.size != w.shape[1]):
        return None
    nr = _panel_width()
    if not nr or w.shape[1] < nr:  # narrower: NumPy's gemm, as before
        return None
    return epi


def serial_for(
    steps: list[tuple[str, int, dict[str, Any], tuple[int, ...]]],
    bias: np.ndarray | None,
    w: np.ndarray,
    max_bytes: int = PACK_MAX_BYTES,
) -> Serial | None:
    """The packed product of a float32 Linear with weight ``w`` (at least one panel wide, at most
    ``max_bytes``: the packed copy is a second one), bias ``bias`` (one value per
    column, or None) and ``steps`` (none, or one activation reading only the product that
    ``conv_direct`` compiles), split by columns for a few rows when ``w`` has at least
    ``COLS_MIN_BYTES``; None otherwise, or without numba or a host the kernel runs on.
    A weight over ``PACK_MAX_BYTES`` serves products of two rows or more."""
    epi = _packable(steps, bias, w, max_bytes)
    kernel = None if epi is None else _LINEAR_SERIAL.get()
    if epi is None or kernel is None:
        return None
    nr = _panel_width()
    packed = pack_padded(w)
    relu = epi.act == "Relu"
    flags = (1 if bias is not None else 0) | (2 if relu else 0)
    if bias is not None:
        b = np.zeros(packed.shape[0] * nr, np.float32)
        b[: w.shape[1]] = bias.reshape(-1)
    else:
        b = packed.reshape(-1)
    act = 0 if relu else ACTIVATIONS[epi.act]
    cols = None
    if w.nbytes >= COLS_MIN_BYTES and packed.shape[0] >= 2 * COLS_MIN_PANELS:
        cols = _LINEAR_COLS.get()
    return Serial(packed, b, act, _params(epi, np.dtype(np.float32)), flags, kernel,
                  w.shape[1], cols, _LINEAR_ROWS.get(),
                  1 if w.nbytes <= PACK_MAX_BYTES else 2)  # fmt: skip


def pack_later(
    steps: list[tuple[str, int, dict[str, Any], tuple[int, ...]]],
    bias: np.ndarray | None,
    w: np.ndarray,
) -> Callable[[], Serial | None] | None:
    """For a weight over ``PACK_MAX_BYTES`` that ``serial_for`` would pack up to
    ``PACK_LATER_MAX_BYTES``: the call that packs it (``serial_for``; None when numba or
    the kernel is missing), made by the caller when a product of two rows or more is about
    to run, so a model that only runs one row never holds the second copy; the kernels
    that call uses are compiled now, so it does not compile them. None for any other
    weight (``serial_for`` packs it now, or never)."""
    if w.nbytes <= PACK_MAX_BYTES or _packable(steps, bias, w, PACK_LATER_MAX_BYTES) is None:
        return None
    # the pack runs in a model's call; its kernels compile now, at the build
    _LINEAR_SERIAL.get()
    _LINEAR_ROWS.get()
    _LINEAR_COLS.get()
    return functools.partial(serial_for, steps, bias, w, PACK_LATER_MAX_BYTES)


def pack_padded(w: np.ndarray) -> np.ndarray:
    """``gemm_packed.pack`` of ``w`` (K x N) with N rounded up to the panel width by zero
    columns: (ceil(N/nr), K, nr)."""
    from .gemm_packed import pack

    nr = _panel_width()
    k, n = w.shape
    pad = -n % nr
    if not pad:
        return pack(w)
    wide = np.zeros((k, n + pad), np.float32)
    wide[:, :n] = w
    return pack(wide)


def _epilogue_of(op: str, attrs: dict[str, Any]) -> Epilogue | None:
    """conv_direct's Epilogue computing a Linear's activation step (op, attributes), or
    None for another step."""
    if op == "Relu":
        return Epilogue(act="Relu")
    if op == "Sigmoid":
        return Epilogue(act="Sigmoid")
    if op == "Swish" and float(attrs.get("alpha", 1.0)) == 1.0:
        return Epilogue(act="SiLU")
    if op == "Gelu" and attrs.get("approximate", "none") in ("none", b"none"):
        return Epilogue(act="Gelu")
    if op == "HardSwish":
        return Epilogue(act="HardSwish")
    if op == "HardSigmoid":
        return Epilogue(act="HardSigmoid", alpha=float(attrs.get("alpha", 0.2)),
                        beta=float(attrs.get("beta", 0.5)))  # fmt: skip
    if op == "LeakyRelu":
        return Epilogue(act="LeakyRelu", alpha=float(attrs.get("alpha", 0.01)))
    return None


def fused_for(
    steps: list[tuple[str, int, dict[str, Any], tuple[int, ...]]],
    bias: np.ndarray | None,
    dtype: np.dtype,
) -> Fused | None:
    """The fused epilogue for a Linear of this dtype whose steps are ``steps`` (at most
    one activation reading only the product) and whose bias is ``bias`` (one value per
    column, or None), or None when it has none (no bias and no step), another step, or
    numba's native threads are not there."""
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    if len(steps) > 1 or (steps and tuple(steps[0][3]) != (-1,)):
        return None
    epi = _epilogue_of(steps[0][0], steps[0][2]) if steps else Epilogue()
    if epi is None or numpy_act_after(epi, dtype) or (bias is None and not steps):
        return None
    if bias is not None and (bias.dtype != dtype or bias.ndim != 1):
        return None
    kernel = _LINEAR_PAR.get()
    if kernel is None:
        return None
    b = np.zeros(0, dtype) if bias is None else np.ascontiguousarray(bias)
    return Fused(b, ACTIVATIONS[epi.act], _params(epi, dtype), kernel)
