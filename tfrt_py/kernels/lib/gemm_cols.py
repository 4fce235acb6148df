"""A float32 product of a constant matrix by a block of columns, with a conv's epilogue:
``y[m, j] = act((sum_t sum_k a[m, t*K + k] * c[toff[t] + k*ldc + j] + bias[m]) + r[m, j])``
for m < M, j < N, t < taps.

This is a one-group convolution's product in NCHW: ``a`` the weights (M filters x taps*K),
``c`` the columns of a block of output pixels (row-major, leading dimension ``ldc``): an
im2col block or a 1x1 conv's input itself (one tap at offset 0, K = C*KH*KW), or a padded
image read once per tap at that tap's offset (``conv_cols``' GRID: K = C, ldc the padded
plane); ``y`` the block of the output's channel rows, written in place (leading dimension
``ldy``: a block of a larger output is an operand as it is). The accumulators stay in
registers across the taps. OpenBLAS's sgemm packs both operands again on every call and leaves
the bias, the residual and the activation to another pass over the output; here the
columns are read where im2col wrote them, the filters' rows are broadcast from the
weights as they are, and the epilogue is applied to the accumulators before the one
store.

The kernel is ``gemm_packed``'s tile walker (``_PackedGemmIR``, on the path it chose,
``TFRT_PY_ISA`` included: 14 x 32 in zmm registers on AVX-512 (``P14``), 6 x 16 on
AVX2/NEON) over panels of ``nr`` columns read in place (row k of panel p at ``c + k*ldc + p*nr``);
the last, partial panel is read and written with masked vector loads and stores, so nothing
outside the N columns is touched, one vector a row where it is at most a vector wide (13x13
and 14x14 planes' last panels: SqueezeNet 1.45-1.50x -> 1.38-1.45x onnxruntime,
EfficientNet-B0 1.16x -> 1.02-1.08x, Zen 5, two runs each). Epilogue ``flags``: 1 adds
``bias[m]`` (a row's filter bias), 4 then adds ``r[m, j]`` (a residual of leading dimension
``ldr``), 2 then applies ReLU (``x < 0 ? 0 : x``, NaN kept), 8 instead clips to ``[lohi[0],
lohi[1]]`` (Clip, as ``activations._act_row``: NaN kept). ``bias``, ``r`` and ``lohi`` must
be readable (M floats, the block's residual, 2 floats) even when their flag is off: pass any
such array (the output itself serves as ``r``).

Nothing is built at import; ``available()`` builds and registers the symbol
``tfrt_py_sgemm_cols`` once per process (thread-safe; its machine code kept in the
private cache dir, ``llvm_jit.compile_ir_cached``), on hosts where ``gemm_packed`` has a
tile and while it is switched on. ``register(module_globals)`` sets a kernel module's
``_sgemm_cols`` (a numba ``ExternalFunction``; a cached kernel needs the symbol before it
loads, so ``Jitted(prepare=...)`` calls it); ``kernel()`` is a numba wrapper for Python
callers; ``raw()`` the same machine code as a ctypes function for the NumPy paths
(``conv_cols_raw``: a cold start's stand-ins, which must not wait for numba). Sums run
k = 0..K-1 as one chain of fused multiply-adds per output: results
differ from BLAS's by rounding only. Stateless; any thread.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import numba_target
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from . import gemm_packed, ir_kernels
from .gemm_packed import TileShape, _PackedGemmIR
from .gemm_packed import available as packed_available
from .ir_kernels import images_function

__all__ = ["FLAG_BIAS", "FLAG_CLIP", "FLAG_RELU", "FLAG_RESIDUAL", "WANTED", "Raw", "available",
           "kernel", "panel_width", "raw", "register", "tile_rows"]  # fmt: skip

FLAG_BIAS, FLAG_RELU, FLAG_RESIDUAL, FLAG_CLIP = 1, 2, 4, 8
SYMBOL = "tfrt_py_sgemm_cols"
IMAGES_SYMBOL = "tfrt_py_sgemm_cols_images"
#: The files whose code writes the IR (the object cache's key hashes them).
IR_SOURCES = (gemm_packed.__file__, ir_kernels.__file__, __file__)

_LOCK = threading.Lock()
_STATE: list[Any] = []  # [numba ExternalFunction or None] once decided
_KERNEL: list[Any] = []  # [the numba wrapper] once built
_kern: Any = None  # the ExternalFunction the wrapper calls (set by kernel())


#: The AVX-512 tile here: 14 rows x 32 columns (28 zmm accumulators; the filters' values
#: broadcast from memory), one k a loop iteration. Against gemm_packed's 8 x 32 with two k
#: an iteration, on ResNet-18's 3x3 products (2-core AVX-512 Xeon, one thread,
#: interleaved, GFLOP/s): 64x576 @ 576x224 84 -> 107, 128x1152 @ 1152x112 78 -> 88,
#: 512x4608 @ 4608x49 63 -> 73 (12 rows: between; 12 rows with two k: spilled, 22-30).
#: gemm_packed's own products (panels packed contiguous) measured no better with it.
#: Other paths keep gemm_packed's tile.
P14 = TileShape(16, 14, {1: 4, 2: 3, 3: 2, 4: 2, **{r: 1 for r in range(5, 14)}})


#: Each k step prefetches the panel's row this many k ahead (its two vectors' lines): a
#: row is a plane's run of columns, ``ldc`` floats from the last, so the rows a tile walks
#: are as many streams as K, which the hardware prefetchers do not follow. One-process A/B
#: on a 2-core Intel Xeon with AVX-512 (2026-12-05, one thread, the kernel alone on 1x1
#: convs, GFLOP/s): 128x55x55 -> 16 (SqueezeNet's squeeze) 79-118 -> 116-136, -> 28 128-147
#: -> 152-174, 256x27x27 -> 16 129 -> 141, 64x55x55 -> 16 125 -> 129 (2 and 32 ahead: less).
PREFETCH_ROWS = 8


#: k steps an iteration of the AVX2/NEON tile here (``gemm_packed``'s own products take
#: four). One: with two, LLVM kept the 6 x 16 tile's twelve accumulators on the stack on
#: a host with sixteen ymm registers (AVX2 without AVX-512: every k step loaded and stored
#: them; an AVX-512 host running this path has 32 and did not). One-node 1x1 convs, one
#: Zen 3 thread, µs, two / one (onnxruntime): 16x112x112 -> 96 1536 / 828 (785), 144x56x56
#: -> 24 642 / 283 (352); without the prefetches 847 and 341.
COLS_UNROLL = 1


#: Panels a tile of the rows left after the whole tiles takes (rows -> panels) on the
#: AVX2/NEON tile: ``P16``'s (2 rows x 3 panels, 1 x 4) held 19 and 17 vectors with the
#: panels' loads, and spilled on sixteen registers. One Zen 3 thread, 1x1 convs, µs,
#: P16's / these: 64x56x56 -> 32 220-245 / 202-205, -> 8 75-78 / 70-72, 16x112x112 -> 8
#: 97-100 / 87-88 (two processes each, alternating).
LEFT_PANELS_16 = {1: 3, 2: 2, 3: 1, 4: 1, 5: 1}


def _tile_for(shape: TileShape) -> tuple[TileShape, int]:
    """(this kernel's tile, its k steps per iteration) on the path of ``shape``."""
    return (P14, 1) if shape.vw == 16 else (shape, COLS_UNROLL)


class _ColsGemmIR(_PackedGemmIR):
    """``SYMBOL(a, lda, c, ldc, taps, toff, y, ldy, M, K, N, bias, r, ldr, lohi, flags,
    nr) -> status`` (module doc): the base walker over N // nr whole panels read in place,
    then the partial panel with masked loads and stores; each tile's k loop runs once per
    tap. The rows left after the whole tiles run as tiles of 8, 4, 2 and 1 rows (4, 2, 1
    after AVX2's 6; ``SPLIT_LEFT``): a tile shape per count of rows, in three contexts, was
    34k lines of IR and 2.0 s of LLVM's code generation in every process with an empty
    cache dir."""

    SPLIT_LEFT = True

    def __init__(self, path_tile: TileShape) -> None:
        shape, self.UNROLL = _tile_for(path_tile)
        ir, fp, i64 = self.types(shape, "tfrt_py_gemm_cols")
        if shape.vw == 8:
            self.panels_for_rows = LEFT_PANELS_16
        mod, v8, i32, vw = self.mod, self.v8, self.i32, self.vw
        self.vmask = vm = ir.VectorType(ir.IntType(1), vw)
        self.mload = ir.Function(mod, ir.FunctionType(v8, [self.v8p, i32, vm, v8]),
                                 name=f"llvm.masked.load.v{vw}f32.p0v{vw}f32")  # fmt: skip
        self.mstore = ir.Function(mod, ir.FunctionType(ir.VoidType(), [v8, self.v8p, i32, vm]),
                                  name=f"llvm.masked.store.v{vw}f32.p0v{vw}f32")  # fmt: skip
        self.i8p = ir.IntType(8).as_pointer()
        self.prefetch = self.prefetch_fn()
        # llvm.prefetch's arguments: a read (0), locality 3 (all caches), the data cache (1)
        self.i32_0, self.i32_3, self.i32_1 = (ir.Constant(i32, n) for n in (0, 3, 1))
        self.fn = ir.Function(mod, ir.FunctionType(i64, [fp, i64, fp, i64, i64, i64.as_pointer(),
                              fp, i64, i64, i64, i64, fp, fp, i64, fp, i64, i64]),
                              name=SYMBOL)  # fmt: skip
        (self.x, self.ldx, self.w, self.ldw, self.taps, self.toff, self.y, self.ldy,
         self.m_rows, self.k_len, self.n_cols, self.bias, self.res, self.ldr, lohi, flags,
         width) = self.fn.args  # fmt: skip
        self.symbol = SYMBOL
        b = self.start(width)

        def on(bit: int) -> Any:
            return b.icmp_unsigned("!=", b.and_(flags, self.c(bit)), self.c(0))

        self.add_bias, self.relu = on(FLAG_BIAS), on(FLAG_RELU)
        self.add_res, self.clip = on(FLAG_RESIDUAL), on(FLAG_CLIP)
        self.lo, self.hi = (self.splat_of(b.load(b.gep(lohi, [self.c(i)]))) for i in (0, 1))
        self.panels = b.sdiv(self.n_cols, self.c(self.nr))
        self.mask: tuple[Any, Any] | None = None  # the partial panel's lanes, while emitted
        self.halves = 2  # vectors a panel's row: 1 while the half-width tail is emitted
        self.tap_off: Any = None  # the tap's element offset into c, in the tap loop
        self.tap_k: Any = None  # the tap's first column of a, in the tap loop

    def tile(self, p: Any, m0: Any, rows: int, npan: int) -> None:
        """The base tile's k loop once per tap, the accumulators carried across taps (tap
        t: columns ``[t*K, (t+1)*K)`` of a, rows of c from ``toff[t]``), then the
        epilogue."""
        b, c = self.b, self.c
        pre = b.block
        head, body, done = (self.fn.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(self.i64)
        t.add_incoming(c(0), pre)
        acc = []
        for _ in range(self.halves * rows * npan):
            a = b.phi(self.v8)
            a.add_incoming(self.zero, pre)
            acc.append(a)
        b.cbranch(b.icmp_signed("<", t, self.taps), body, done)
        b.position_at_end(body)
        self.tap_off = b.load(b.gep(self.toff, [t]))
        self.tap_k = b.mul(t, self.k_len)
        out = self.k_loop(p, m0, rows, npan, acc)
        t.add_incoming(b.add(t, c(1)), b.block)
        for a, v in zip(acc, out, strict=True):
            a.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        self.epilogue(p, m0, rows, npan, acc)

    def x_index(self, m0: Any, r: int, k: Any) -> Any:
        b = self.b
        return b.add(b.mul(b.add(m0, self.c(r)), self.ldx), b.add(self.tap_k, k))

    def k_step(self, p: Any, m0: Any, rows: int, npan: int, k: Any, acc: list[Any]) -> list[Any]:
        """The base step, after prefetches of row ``k + PREFETCH_ROWS`` of the panels
        (whole panels only; a prefetch never faults: one past the last row costs a line)."""
        if self.mask is None:
            b, c = self.b, self.c
            ahead = b.add(k, c(PREFETCH_ROWS))
            for j in range(npan):
                at = b.add(b.add(self.tap_off, b.mul(ahead, self.ldw)),
                           b.mul(b.add(p, c(j)), c(self.nr)))  # fmt: skip
                for off in (0, self.vw, 2 * self.vw - 1):  # the lines the two vectors span
                    ptr = b.bitcast(b.gep(self.w, [b.add(at, c(off))]), self.i8p)
                    b.call(self.prefetch, [ptr, self.i32_0, self.i32_3, self.i32_1])
        return super().k_step(p, m0, rows, npan, k, acc)

    def splat_of(self, s: Any) -> Any:
        """The scalar ``s`` in every lane."""
        b, ir = self.b, self.ir
        v = b.insert_element(ir.Constant(self.v8, ir.Undefined), s, ir.Constant(self.i32, 0))
        return b.shuffle_vector(v, ir.Constant(self.v8, ir.Undefined), self.splat)

    def text(self) -> str:
        """Whole panels (the base walker), then the partial one -- two masked vectors a
        row, or one where it is at most a vector wide (the half-width tail: half the loads
        and multiply-adds) -- then the module."""
        self.walk()
        b, c, ir = self.b, self.c, self.ir
        tail, done = self.fn.append_basic_block("partial_panel"), self.fn.append_basic_block()
        last = self.panels
        left = b.sub(self.n_cols, b.mul(last, c(self.nr)))
        b.cbranch(b.icmp_signed(">", left, c(0)), tail, done)
        b.position_at_end(tail)
        lanes = ir.VectorType(self.i64, self.vw)
        splat64 = b.insert_element(ir.Constant(lanes, ir.Undefined), left, ir.Constant(self.i32, 0))
        splat64 = b.shuffle_vector(splat64, ir.Constant(lanes, ir.Undefined), self.splat)
        lane = [ir.Constant(lanes, [h * self.vw + i for i in range(self.vw)]) for h in range(2)]
        self.mask = (b.icmp_signed("<", lane[0], splat64), b.icmp_signed("<", lane[1], splat64))
        full = b.mul(b.sdiv(self.m_rows, c(self.mr)), c(self.mr))
        half, wide = self.fn.append_basic_block("half_panel"), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed("<=", left, c(self.vw)), half, wide)
        for block, halves in ((half, 1), (wide, 2)):
            b.position_at_end(block)
            self.halves = halves
            self.loop(c(0), full, self.mr, lambda m0: self.tile(last, m0, self.mr, 1))
            self.rows_left(full, lambda m0, rows: self.tile(last, m0, rows, 1))
            b.branch(done)
        self.halves = 2
        b.position_at_end(done)
        self.mask = None
        # the loop over images for the NumPy paths (``Raw``): columns, output, residual
        images_function(self.mod, self.fn, IMAGES_SYMBOL, (2, 6, 12))
        return self.finish()

    def _load(self, ptr: Any, h: int) -> Any:
        """The vector at ``ptr`` (in the partial panel its lanes there only, zeros else)."""
        b = self.b
        if self.mask is None:
            return b.load(ptr, align=4)
        return b.call(self.mload, [ptr, self.ir.Constant(self.i32, 4), self.mask[h], self.zero])

    def panel_vectors(self, p: Any, j: int, k: Any) -> list[Any]:
        """Panel ``p + j``'s two vectors at row ``k``, read in place: ``c[k*ldc + (p+j)*nr]``."""
        b, c = self.b, self.c
        at = b.add(b.add(self.tap_off, b.mul(k, self.ldw)), b.mul(b.add(p, c(j)), c(self.nr)))
        return [self._load(b.bitcast(b.gep(self.w, [b.add(at, c(self.vw * h))]), self.v8p), h)
                for h in range(self.halves)]  # fmt: skip

    def epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """Per row: + bias[m] (flag 1), + r[m, j] (flag 4), then ReLU (2) or the clip (8);
        the stores (masked in the partial panel)."""
        b, c, zero = self.b, self.c, self.zero
        for j in range(npan):
            col = b.mul(b.add(p, c(j)), c(self.nr))
            for r in range(rows):
                m = b.add(m0, c(r))
                bm = self.splat_of(b.load(b.gep(self.bias, [m])))
                bm = b.select(self.add_bias, bm, zero)
                row_y, row_r = b.add(b.mul(m, self.ldy), col), b.add(b.mul(m, self.ldr), col)
                hv = self.halves
                for h in range(hv):
                    v = b.fadd(acc[r * hv * npan + hv * j + h], bm)
                    rp = b.bitcast(b.gep(self.res, [b.add(row_r, c(self.vw * h))]), self.v8p)
                    v = b.select(self.add_res, b.fadd(v, self._load(rp, h)), v)
                    neg = b.select(self.relu, b.fcmp_ordered("<", v, zero), self.none)
                    v = b.select(neg, zero, v)
                    low = b.select(self.clip, b.fcmp_ordered("<", v, self.lo), self.none)
                    v = b.select(low, self.lo, v)
                    high = b.select(self.clip, b.fcmp_ordered(">", v, self.hi), self.none)
                    v = b.select(high, self.hi, v)
                    yp = b.bitcast(b.gep(self.y, [b.add(row_y, c(self.vw * h))]), self.v8p)
                    if self.mask is None:
                        b.store(v, yp, align=4)
                    else:
                        b.call(self.mstore, [v, yp, self.ir.Constant(self.i32, 4), self.mask[h]])


def _build(shape: TileShape) -> str:
    return _ColsGemmIR(shape).text()


def _decide() -> Any:
    """The ExternalFunction over the registered symbol, or None (no tile on this path, or
    the build failed: the callers keep their BLAS path). Sets ``_RAW`` too."""
    global _RAW
    shape = gemm_packed.tile()
    if shape is None:
        return None
    try:
        import ctypes

        from numba import types

        key = f"gemm_cols|{shape!r}|{SYMBOL}"
        engine, _cached = compile_ir_cached(lambda: _build(shape), key, IR_SOURCES, opt=3)
        address = engine.get_function_address(SYMBOL)
        add_symbol(SYMBOL, address)
        _ENGINES.append(engine)  # kept alive: the symbol points into it
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the callers keep BLAS
        return None
    i, vp = ctypes.c_int64, ctypes.c_void_p
    images = ctypes.CFUNCTYPE(i, vp, i, vp, i, i, vp, vp, i, i, i, i, vp, vp, i, vp, i, i, i, i,
                              i, i)(engine.get_function_address(IMAGES_SYMBOL))  # fmt: skip
    _RAW = Raw(images, shape.nr)
    p, n = types.uintp, types.int64
    return types.ExternalFunction(SYMBOL, types.int64(p, n, p, n, n, p, p, n, n, n, n, p, p, n, p,
                                                      n, n))  # fmt: skip


_ENGINES: list[Any] = []


class Raw(NamedTuple):
    """The kernel over images as a ctypes function (``raw()``): ``images(a, lda, c, ldc,
    taps, toff, y, ldy, M, K, N, bias, r, ldr, lohi, flags, nr, count, c_step, y_step,
    r_step)`` (``IMAGES_SYMBOL``) with addresses as integers, callable from Python
    without numba, the GIL released while it runs; ``nr`` its panel width."""

    images: Any
    nr: int


#: The kernel as a ctypes function, set when ``available()`` has built it (``raw``)
_RAW: Raw | None = None

#: Set once a model built a conv that a cold start's stand-in would run on the kernel
#: (``conv_cols_raw``, any thread), so that the warm-up builds it early (``raw``).
WANTED = threading.Event()


def raw() -> Raw | None:
    """The kernel as a ctypes function once ``available()`` has built it in this process
    (any thread: a cold start's warm-up builds it early where ``WANTED``), else None; never
    builds, never waits (one read: the NumPy paths ask it per call)."""
    return _RAW


def available() -> bool:
    """Whether the kernel is built and registered (``gemm_packed.available()`` and the
    build succeeded); builds it on the first call. Thread-safe."""
    if not packed_available():
        return False
    with _LOCK:
        if not _STATE:
            _STATE.append(_decide())
        return _STATE[0] is not None


def register(module_globals: dict[str, Any]) -> bool:
    """Set ``module_globals["_sgemm_cols"]`` to the kernel's ExternalFunction; False where
    ``available()`` is (nothing set)."""
    if not available():
        return False
    module_globals["_sgemm_cols"] = _STATE[0]
    return True


def kernel() -> Any:
    """``sgemm_cols(a, ao, lda, c, co, ldc, toff, y, yo, ldy, m, k, n, bias, r, ro, ldr,
    lohi, flags, nr)`` (element offsets into float32 arrays, ``toff`` int64 tap offsets,
    ``nr`` ``panel_width()``) for Python callers (tests), or None where ``available()``
    is False. Raises ValueError if ``nr`` is not the kernel's."""
    global _kern
    if not available():
        return None
    with _LOCK:
        if not _KERNEL:
            numba = numba_target.import_numba()
            _kern = _STATE[0]
            _KERNEL.append(numba.njit(nogil=True, cache=True)(_sgemm_cols))
        return _KERNEL[0]


def tile_rows() -> int:
    """The rows of the kernel's tile on this process's path (14 on AVX-512, else the packed
    gemm's); 0 where there is none. Builds nothing."""
    shape = gemm_packed.tile()
    return 0 if shape is None else _tile_for(shape)[0].mr


def panel_width() -> int:
    """The kernel's panel width (``gemm_packed.tile().nr``); 0 where there is none."""
    shape = gemm_packed.tile()
    return 0 if shape is None else shape.nr


def _sgemm_cols(a, ao, lda, c, co, ldc, toff, y, yo, ldy, m, k, n, bias, r, ro, ldr, lohi, flags,
                nr):  # fmt: skip
    pa = a.ctypes.data + np.uint64(ao * 4)
    pc = c.ctypes.data + np.uint64(co * 4)
    py = y.ctypes.data + np.uint64(yo * 4)
    pr = r.ctypes.data + np.uint64(ro * 4)
    status = _kern(pa, lda, pc, ldc, toff.shape[0], toff.ctypes.data, py, ldy, m, k, n,
                   bias.ctypes.data, pr, ldr, lohi.ctypes.data, flags, nr)  # fmt: skip
    if status != 0:
        raise ValueError("gemm_cols: a panel width other than this process's kernel's")
