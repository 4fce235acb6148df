"""A float32 product of gathered rows by filters packed once: a convolution's product with
no im2row matrix, each output pixel's taps read where they lie in the padded input, and
(AVX-512) its outputs stored straight into the NCHW result.

``y[m, f] = sum_t sum_k x[rowoff[m] + toff[t] + k] * W[t*K + k, f]`` for ``m < M``, ``t <
taps``, ``k < K``: ``x`` the image channels-last and zero-padded (``conv_packed``'s
``xt``), ``rowoff[m]`` the element where output pixel m's first tap starts, ``toff[t]``
tap t's offset from it, K the input channels (a tap's contiguous run), W ((taps*K) x N)
packed by ``gemm_packed.pack`` (panels of taps*K rows of nr). This is XNNPACK's indirect
GEMM with offsets for pointers: the im2row matrix it replaces (nine copies of the input
for a 3x3 conv, ResNet-18's 256x14x14 stage 1.8 MB an image) is never written, and the
product reads each row's taps from the padded image, which stays in cache. One Zen 4
thread (2026-12-05, AVX-512, the product alone): ResNet-18's 3x3 convs at 56x56, 28x28,
14x14 and 7x7, stride 1 and 2, 113-117 GFLOP/s, as ``gemm_packed`` on a copied im2row.

The kernel is ``gemm_packed``'s tile walker (``_PackedGemmIR``) on the path it chose
(``TFRT_PY_ISA`` included: 8 x 32 zmm tiles on AVX-512, 6 x 16 on AVX2/NEON): a tile's rows
load their ``rowoff`` once, its k loop runs once per tap with the accumulators carried
across taps (one chain of fused multiply-adds an output, k = 0..taps*K-1 in (tap, channel)
order, as the im2row product's). Then, by ``flags`` (``FLAG_*``):

* rows (no ``FLAG_NCHW``): ``gemm_packed``'s epilogue (1: + ``bias[f]``, 2: ReLU), row m
  at ``y + m*ldy``;
* ``FLAG_NCHW`` (the AVX-512 build only, ``nchw_stores()``): output (m, f) at
  ``y[yoff[m] + f*ldf]`` for f < ``nf`` (filters past ``nf`` are the panels' padding, not
  stored): ``act((v + bias[f]) + res[same place])``, ReLU (2) or the clip to ``lohi``
  (8), as ``conv_packed``'s ``_finish`` would, which it replaces (one pass over the
  output less: ResNet-18's 56x56 convs 2191 -> 2051 µs). A whole tile (8 pixels
  consecutive in ``y``, every filter real) is transposed in registers (three stages of
  two-source shuffles) and stored as 8-float runs; any other tile goes through a buffer
  one output at a time. Before its k loop a whole tile fetches into L2 the lines its
  epilogue will write and read (``fetch_outputs``), and the copy into the padded image
  fetches the next row of each channel it reads: at a batch a conv's input, output and
  residual are out of L2 (ResNet-18's 64x56x56 3x3 with its residual, one Zen 4 thread,
  2026-12-06, µs an image over a batch of 16 / one image repeated: 2357 / 2184 ->
  2175 / 2130; 128x28x28 2158 / 2078 -> 2120 / 2060).

The builds that store rows have ``conv_packed`` put them back with
``SYMBOL_ROWS_NCHW`` (``_IndirectGemmIR.rows_nchw_function``: blocks of 8 pixels x 16
filters transposed in registers, the same epilogue; one Zen 3 thread, one-node convs
against onnxruntime, processes alternating, two or three rounds: 1x1 96x14x14 -> 576
1.40-1.47x -> 1.10-1.15x, 160x7x7 -> 960 1.26-1.30x -> 1.12-1.13x, ResNet's 64x56x56 3x3
1.11-1.32x -> 1.04-1.09x; its scalar loop took ~3 ns an output). The copy into the padded
image stores a pixel's 8 channels plainly wherever all 8 are real (planes under 16
pixels wide have only partial blocks: 960x7x7 -> 160 and 576x14x14 -> 96 1.3-1.4x ->
1.13-1.32x with both changes).

``available()`` builds and registers the symbol ``tfrt_py_sgemm_indirect`` once per
process (thread-safe; its machine code cached, ``llvm_jit.compile_ir_cached``) where
``gemm_packed`` has a tile; ``register(globals)`` sets a kernel module's
``_sgemm_indirect`` (a numba ``ExternalFunction``: ``(x, rowoff, taps, toff, K, w, KT, y,
ldy, M, panels, bias, flags, nr, yoff, ldf, nf, res, lohi) -> status``, addresses as
uintp; status 1 (nothing done) when ``nr`` is not this process's panel width, 2 when
``FLAG_NCHW`` is asked of a build without it); ``kernel()`` is a numba wrapper for Python
callers (tests); ``raw()`` the two as ctypes functions once built (``Raw``: a cold
start's stand-ins, ``conv_packed_raw``, which must not wait for numba; ``WANTED`` has
the warm-up build them early). ``bias`` must be readable for the panels' columns in the rows form,
``res`` wherever ``y`` is written in the NCHW form (pass ``y`` when there is none).
Stateless; any thread.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, NamedTuple

from ...concurrency import numba_target
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from . import gemm_packed
from .gemm_packed import (
    PANEL_BLOCK_BYTES,
    TileShape,
    _PackedGemmIR,
    carried_loop,
    counted_loop,
    splat,
    wide_vectors,
)
from .gemm_packed import available as packed_available

__all__ = ["FLAG_BIAS", "FLAG_CLIP", "FLAG_NCHW", "FLAG_RELU", "FLAG_RESIDUAL", "WANTED", "Raw",
           "available", "kernel", "nchw_stores", "raw", "register", "stores_nchw"]  # fmt: skip

SYMBOL = "tfrt_py_sgemm_indirect"
#: The copy into the padded channels-last image (every build's second function).
SYMBOL_NHWC = "tfrt_py_nhwc_pad"
#: The product's rows put back as NCHW runs with the epilogue (the builds that store rows).
SYMBOL_ROWS_NCHW = "tfrt_py_rows_nchw"
#: The files whose code writes the IR (the object cache's key hashes them).
IR_SOURCES = (gemm_packed.__file__, __file__)


#: ``flags``: 1 adds ``bias[f]``, 2 then ReLU, 4 adds the residual ``res`` (NCHW stores
#: only, before the activation), 8 clips to ``[lohi[0], lohi[1]]`` instead of ReLU, 16
#: stores NCHW: output (row m, filter f) at ``y[yoff[m] + f*ldf]`` for f < ``nf``
#: (``nchw_stores()`` builds only; elsewhere the rows go to ``y`` with ``ldy``).
FLAG_BIAS, FLAG_RELU, FLAG_RESIDUAL, FLAG_CLIP, FLAG_NCHW = 1, 2, 4, 8, 16
#: The most floats of one tile (rows x panels x nr) on any build: the slow stores' buffer.
_TILE_FLOATS = 8 * 32


class _IndirectGemmIR(_PackedGemmIR):
    """``SYMBOL`` (module doc) built to one ``TileShape``: the base walker over ``panels``
    panels; a tile's k loop once per tap; the epilogue stores rows (``ldy``), or with
    ``FLAG_NCHW`` each filter's run of pixels (8-row tiles of 16-float vectors only:
    transposed in registers where the tile's pixels are consecutive in ``y`` and its
    filters all real, else through a buffer one output at a time)."""

    #: ``_PackedGemmIR.PREFETCH_TILES``: a conv's panels are read by few tiles where its
    #: planes are small and its filters many (one Intel AVX-512 thread, 2026-12-05, the
    #: product alone, 64 MB touched between calls / not: ResNet-18's 512x7x7 3x3 1548 ->
    #: 1330 µs / 1387 -> 1298, 256x7x7/2 -> 512 764 -> 655 / 664 -> 619, 256x14x14 1218
    #: -> 1163 / 1124 -> 1111; 56x56 and 28x28, past it, even).
    PREFETCH_TILES = 32

    def __init__(self, shape: TileShape) -> None:
        ir, fp, i64 = self.types(shape, "tfrt_py_gemm_indirect")
        ip = i64.as_pointer()
        self.fn = ir.Function(self.mod, ir.FunctionType(i64, [fp, ip, i64, ip, i64, fp, i64, fp,
                              i64, i64, i64, fp, i64, i64, ip, i64, i64, fp, fp]),
                              name=SYMBOL)  # fmt: skip
        (self.x, self.rowoff, self.taps, self.toff, self.k_len, self.w, self.k_total, self.y,
         self.ldy, self.m_rows, self.panels, self.bias, flags, width, self.yoff, self.ldf,
         self.nf, self.res, lohi) = self.fn.args  # fmt: skip
        self.symbol = SYMBOL
        b = self.start(width)

        def on(bit: int) -> Any:
            return b.icmp_unsigned("!=", b.and_(flags, self.c(bit)), self.c(0))

        self.add_bias, self.relu, self.add_res = on(FLAG_BIAS), on(FLAG_RELU), on(FLAG_RESIDUAL)
        self.clip, self.nchw = on(FLAG_CLIP), on(FLAG_NCHW)
        self.lo, self.hi = (b.load(b.gep(lohi, [self.c(i)])) for i in (0, 1))
        self.transposes = stores_nchw(shape)
        if not self.transposes:  # FLAG_NCHW asked of a build without it: status 2
            refuse, work = self.fn.append_basic_block("no_nchw"), self.fn.append_basic_block()
            b.cbranch(self.nchw, refuse, work)
            b.position_at_end(refuse)
            b.ret(self.c(2))
            b.position_at_end(work)
        with b.goto_block(self.fn.entry_basic_block):
            self.buf = b.bitcast(b.alloca(ir.ArrayType(ir.FloatType(), _TILE_FLOATS)), fp)
        self.row_at: list[Any] = []  # each tile row's element of x at the tap, in the tap loop
        self.tap_k: Any = None  # the tap's first row of the panels, in the tap loop

    def tile(self, p: Any, m0: Any, rows: int, npan: int) -> None:
        """The rows' offsets, the k loop once per tap (accumulators carried), the epilogue."""
        b, c = self.b, self.c
        bases = [b.load(b.gep(self.rowoff, [b.add(m0, c(r))])) for r in range(rows)]

        def tap(t: Any, acc: list[Any]) -> list[Any]:
            off = b.load(b.gep(self.toff, [t]))
            self.row_at = [b.add(base, off) for base in bases]
            self.tap_k = b.mul(t, self.k_len)
            return self.k_loop(p, m0, rows, npan, acc)

        if self.transposes and rows == self.mr and npan == 1:
            self.fetch_outputs(p, m0)
        zeros = [self.zero] * (2 * rows * npan)
        acc = carried_loop(b, c(0), self.taps, 1, zeros, tap)
        if not self.transposes:
            self.epilogue(p, m0, rows, npan, acc)
            return
        rows_out, nchw, done = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(self.nchw, nchw, rows_out)
        b.position_at_end(rows_out)
        self.epilogue(p, m0, rows, npan, acc)
        b.branch(done)
        b.position_at_end(nchw)
        self.nchw_epilogue(p, m0, rows, npan, acc)
        b.branch(done)
        b.position_at_end(done)

    def fetch_outputs(self, p: Any, m0: Any) -> None:
        """``FLAG_NCHW``: before a whole tile's k loop, the lines its epilogue will write
        (``y``, for writing) and read (``res``, where ``FLAG_RESIDUAL``) fetched into L2,
        one a filter: the line of the tile's last pixel (its first pixel's line, where
        another, is the previous tile's last). At a batch a conv's output and residual
        are out of L2 (the last layer wrote the other images since): each of the
        epilogue's 32 runs waited on L3 or memory (figures in the module doc)."""
        b, c, ir = self.b, self.c, self.ir
        i8p, i32 = ir.IntType(8).as_pointer(), self.i32
        fn = self.prefetch_fn()
        go, res, after = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(self.nchw, go, after)
        b.position_at_end(go)
        last = b.load(b.gep(self.yoff, [b.add(m0, c(self.mr - 1))]))
        col0 = b.mul(p, c(self.nr))
        ats = [b.add(last, b.mul(b.add(col0, c(j)), self.ldf)) for j in range(self.nr)]
        # a write (1) or a read (0), locality 2 (L2), the data cache; a prefetch never
        # faults (the panel's padding filters fetch lines no one stores)
        write, read = ([ir.Constant(i32, n) for n in (rw, 2, 1)] for rw in (1, 0))
        y8, res8 = b.bitcast(self.y, i8p), b.bitcast(self.res, i8p)
        for at in ats:
            b.call(fn, [b.gep(y8, [b.mul(at, c(4))]), *write])
        b.cbranch(self.add_res, res, after)
        b.position_at_end(res)
        for at in ats:
            b.call(fn, [b.gep(res8, [b.mul(at, c(4))]), *read])
        b.branch(after)
        b.position_at_end(after)

    def nchw_epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """``FLAG_NCHW``'s stores: transposed where the tile is whole (``mr`` pixels
        consecutive in ``y``, every filter of the panel real), else one at a time."""
        b, c = self.b, self.c
        col0 = b.mul(p, c(self.nr))
        y0 = b.load(b.gep(self.yoff, [m0]))
        if rows != self.mr or npan != 1:
            self.one_at_a_time(col0, m0, rows, npan, acc)
            return
        y_last = b.load(b.gep(self.yoff, [b.add(m0, c(rows - 1))]))
        whole = b.and_(b.icmp_signed("==", b.sub(y_last, y0), c(rows - 1)),
                       b.icmp_signed("<=", b.add(col0, c(self.nr)), self.nf))  # fmt: skip
        fast, slow, done = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(whole, fast, slow)
        b.position_at_end(fast)
        for h in range(2):
            for pair in _transpose_8x16(b, self.ir, [acc[2 * r + h] for r in range(8)]):
                for e, lanes in enumerate(((0, 8), (8, 16))):
                    v = b.shuffle_vector(pair.value, self.ir.Constant(self.v8, self.ir.Undefined),
                                         self._lanes(*lanes))  # fmt: skip
                    f = b.add(col0, c(16 * h + pair.first + e))
                    self._finish_run(v, f, b.add(y0, b.mul(f, self.ldf)))
        b.branch(done)
        b.position_at_end(slow)
        self.one_at_a_time(col0, m0, rows, npan, acc)
        b.branch(done)
        b.position_at_end(done)

    def _lanes(self, lo: int, hi: int) -> Any:
        return self.ir.Constant(self.ir.VectorType(self.i32, hi - lo), list(range(lo, hi)))

    def _finish_run(self, v: Any, f: Any, at: Any) -> None:
        """Filter ``f``'s 8 consecutive pixels ``v`` from ``y[at]``: + bias, + residual,
        ReLU or the clip, stored."""
        b, ir = self.b, self.ir
        v8 = ir.VectorType(ir.FloatType(), 8)
        v8p = v8.as_pointer()

        def splat8(s: Any) -> Any:
            e = b.insert_element(ir.Constant(v8, ir.Undefined), s, ir.Constant(self.i32, 0))
            return b.shuffle_vector(e, ir.Constant(v8, ir.Undefined),
                                    ir.Constant(ir.VectorType(self.i32, 8), [0] * 8))  # fmt: skip

        zero8, minus0 = ir.Constant(v8, [0.0] * 8), ir.Constant(v8, [-0.0] * 8)
        none8 = ir.Constant(ir.VectorType(ir.IntType(1), 8), [0] * 8)
        # no bias adds -0.0, which changes no float (+0.0 would turn -0.0 into +0.0)
        bias = b.select(self.add_bias, splat8(b.load(b.gep(self.bias, [f]))), minus0)
        v = b.fadd(v, bias)
        rv = b.load(b.bitcast(b.gep(self.res, [at]), v8p), align=4)
        v = b.select(self.add_res, b.fadd(v, rv), v)
        v = b.select(b.select(self.relu, b.fcmp_ordered("<", v, zero8), none8), zero8, v)
        lo, hi = splat8(self.lo), splat8(self.hi)
        v = b.select(b.select(self.clip, b.fcmp_ordered("<", v, lo), none8), lo, v)
        v = b.select(b.select(self.clip, b.fcmp_ordered(">", v, hi), none8), hi, v)
        b.store(v, b.bitcast(b.gep(self.y, [at]), v8p), align=4)

    def one_at_a_time(self, col0: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """The tile through ``buf``: each output (row, filter < ``nf``) finished and stored
        alone."""
        b, c = self.b, self.c
        width = npan * self.nr
        for q, v in enumerate(acc):
            b.store(v, b.bitcast(b.gep(self.buf, [c(q * self.vw)]), self.v8p), align=4)
        left = b.sub(self.nf, col0)
        cols = b.select(b.icmp_signed("<", left, c(width)), left, c(width))
        f32 = self.ir.FloatType()
        zero, minus0 = self.ir.Constant(f32, 0.0), self.ir.Constant(f32, -0.0)

        def row(r: Any) -> None:
            yo = b.load(b.gep(self.yoff, [b.add(m0, r)]))

            def one(j: Any) -> None:
                f = b.add(col0, j)
                v = b.load(b.gep(self.buf, [b.add(b.mul(r, c(width)), j)]))
                v = b.fadd(v, b.select(self.add_bias, b.load(b.gep(self.bias, [f])), minus0))
                at = b.add(yo, b.mul(f, self.ldf))
                v = b.select(self.add_res, b.fadd(v, b.load(b.gep(self.res, [at]))), v)
                v = b.select(b.and_(self.relu, b.fcmp_ordered("<", v, zero)), zero, v)
                v = b.select(b.and_(self.clip, b.fcmp_ordered("<", v, self.lo)), self.lo, v)
                v = b.select(b.and_(self.clip, b.fcmp_ordered(">", v, self.hi)), self.hi, v)
                b.store(v, b.gep(self.y, [at]))

            counted_loop(b, c(0), cols, 1, one)

        counted_loop(b, c(0), c(rows), 1, row)

    def text(self) -> str:
        """The product's function, then ``SYMBOL_NHWC``'s and ``SYMBOL_ROWS_NCHW``'s
        (16-lane vectors on every build: two registers each on AVX2)."""
        self.walk()
        self.b.ret(self.c(0))
        self.nhwc_function()
        self.rows_nchw_function()
        text = str(self.mod)
        names = [SYMBOL, SYMBOL_NHWC, SYMBOL_ROWS_NCHW]
        return wide_vectors(text, names) if self.vw == 16 else text

    def rows_nchw_function(self) -> None:
        """``SYMBOL_ROWS_NCHW(yt, ld, y, ldy, rows, cols, bias, res, lo, hi, flags) -> 0``:
        the product's rows (pixel r, filter f at ``yt[r*ld + f]``) as filters' runs of
        pixels, ``y[f*ldy + r]`` = ((v + ``bias[f]``) + ``res[f*ldy + r]``) clamped to
        [``lo``, ``hi``] (NaN kept; the bias with ``FLAG_BIAS``, the residual with
        ``FLAG_RESIDUAL``, each else not added), for r < ``rows``, f < ``cols``. Blocks of
        8 pixels x 16 filters transposed in registers (``_transpose_8x16``), 8-float
        stores; the rows and filters past the whole blocks one at a time."""
        ir, c, i64 = self.ir, self.c, self.i64
        f32 = ir.FloatType()
        fp = f32.as_pointer()
        fn = ir.Function(self.mod, ir.FunctionType(i64, [fp, i64, fp, i64, i64, i64, fp, fp,
                         f32, f32, i64]), name=SYMBOL_ROWS_NCHW)  # fmt: skip
        yt, ld, y, ldy, rows, cols, bias, res, lo, hi, flags = fn.args
        yt.add_attribute("noalias")  # not y: ``res`` may point there (read, then dropped)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        v16, v8 = ir.VectorType(f32, 16), ir.VectorType(f32, 8)
        add_bias = b.icmp_unsigned("!=", b.and_(flags, c(FLAG_BIAS)), c(0))
        add_res = b.icmp_unsigned("!=", b.and_(flags, c(FLAG_RESIDUAL)), c(0))

        def finish(v: Any, f: Any, at: Any, n: int) -> Any:
            """((v + bias[f]) + res[at]) clamped: ``n`` lanes (1: a scalar)."""

            def wide(x: Any) -> Any:
                return x if n == 1 else splat(b, x, n)

            bv = b.select(add_bias, wide(b.load(b.gep(bias, [f]))),
                          ir.Constant(v.type, -0.0 if n == 1 else [-0.0] * n))  # fmt: skip
            v = b.fadd(v, bv)
            rp = b.gep(res, [at])
            rv = b.load(rp if n == 1 else b.bitcast(rp, v8.as_pointer()), align=4)
            v = b.select(add_res, b.fadd(v, rv), v)
            lov, hiv = wide(lo), wide(hi)
            v = b.select(b.fcmp_ordered("<", v, lov), lov, v)
            return b.select(b.fcmp_ordered(">", v, hiv), hiv, v)

        pw = b.mul(b.sdiv(rows, c(8)), c(8))  # pixels in whole blocks
        fw = b.mul(b.sdiv(cols, c(16)), c(16))  # filters in whole blocks

        def block(r0: Any, f0: Any) -> None:
            loads = [b.load(b.bitcast(b.gep(yt, [b.add(b.mul(b.add(r0, c(i)), ld), f0)]),
                                      v16.as_pointer()), align=4)
                     for i in range(8)]  # fmt: skip
            for pair in _transpose_8x16(b, ir, loads):
                for e, lanes in enumerate(((0, 8), (8, 16))):
                    v = b.shuffle_vector(pair.value, ir.Constant(v16, ir.Undefined),
                                         self._lanes(*lanes))  # fmt: skip
                    f = b.add(f0, c(pair.first + e))
                    at = b.add(b.mul(f, ldy), r0)
                    # the residual's load happens for every block (its pointer is valid:
                    # the caller passes ``y`` where there is none); the select drops it
                    b.store(finish(v, f, at, 8), b.bitcast(b.gep(y, [at]), v8.as_pointer()),
                            align=4)  # fmt: skip

        def blocks(r0: Any) -> None:
            counted_loop(b, c(0), fw, 16, lambda f0: block(r0, f0))

        counted_loop(b, c(0), pw, 8, blocks)

        def one(r: Any, f: Any) -> None:
            at = b.add(b.mul(f, ldy), r)
            v = b.load(b.gep(yt, [b.add(b.mul(r, ld), f)]))
            b.store(finish(v, f, at, 1), b.gep(y, [at]))

        # the filters past the whole blocks, every pixel; then the pixels past them
        counted_loop(b, c(0), rows, 1,
                     lambda r: counted_loop(b, fw, cols, 1, lambda f: one(r, f)))  # fmt: skip
        counted_loop(b, pw, rows, 1,
                     lambda r: counted_loop(b, c(0), fw, 1, lambda f: one(r, f)))  # fmt: skip
        b.ret(c(0))

    def nhwc_function(self) -> None:
        """``SYMBOL_NHWC(x, C, H, W, xt, Hp, Wp, pt, pl, r0, r1, count) -> 0``: rows ``[r0,
        r1)`` of ``count`` images' padded channels-last copies ``xt`` (count, Hp, Wp, C) of
        ``x`` (count, C, H, W), image row ``r - pt`` at row r, column ``j - pl`` at column
        j, zeros elsewhere (a call of many images hands a Python caller's GIL over once:
        ``conv_packed_raw``). Blocks of 8
        channels x 16 pixels: 16-lane loads along a channel's row (masked past W or C), the
        8 x 16 transpose, an 8-float masked store of each pixel's channels; each block
        fetches the same pixels of its channels' next row into L2."""
        ir, c, i64 = self.ir, self.c, self.i64
        f32 = ir.FloatType()
        fp = f32.as_pointer()
        fn = ir.Function(self.mod, ir.FunctionType(i64, [fp, i64, i64, i64, fp, i64, i64, i64,
                         i64, i64, i64, i64]), name=SYMBOL_NHWC)  # fmt: skip
        x, ch, h, w, xt, hp, wp, pt, pl, r0, r1, count = fn.args
        for a in (x, xt):
            a.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        v16, v8 = ir.VectorType(f32, 16), ir.VectorType(f32, 8)
        m16, m8 = ir.VectorType(ir.IntType(1), 16), ir.VectorType(ir.IntType(1), 8)
        i32 = self.i32
        mload = ir.Function(self.mod, ir.FunctionType(v16, [v16.as_pointer(), i32, m16, v16]),
                            name="llvm.masked.load.v16f32.p0v16f32")  # fmt: skip
        store16 = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [v16, v16.as_pointer(),
                              i32, m16]), name="llvm.masked.store.v16f32.p0v16f32")  # fmt: skip
        store8 = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [v8, v8.as_pointer(), i32,
                             m8]), name="llvm.masked.store.v8f32.p0v8f32")  # fmt: skip
        four = ir.Constant(i32, 4)
        i8p = ir.IntType(8).as_pointer()
        fetch = self.prefetch_fn()
        read2 = [ir.Constant(i32, n) for n in (0, 2, 1)]
        zero16, none16 = ir.Constant(v16, [0.0] * 16), ir.Constant(m16, [0] * 16)
        none8 = ir.Constant(m8, [0] * 8)

        def below(n: int, bound: Any) -> Any:
            """Lanes ``i < bound`` of ``n``."""
            lanes = ir.VectorType(i64, n)
            return b.icmp_signed("<", ir.Constant(lanes, list(range(n))), splat(b, bound, n))

        def at(base: Any, off: Any, vt: Any) -> Any:
            return b.bitcast(b.gep(base, [off]), vt.as_pointer())

        def zeros(start: Any, n: Any) -> None:
            whole = b.mul(b.sdiv(n, c(16)), c(16))
            counted_loop(
                b, c(0), whole, 16, lambda i: b.store(zero16, at(xt, b.add(start, i), v16), align=4)
            )
            b.call(store16, [zero16, at(xt, b.add(start, whole), v16), four,
                             below(16, b.sub(n, whole))])  # fmt: skip

        row_len = b.mul(wp, ch)
        plane = b.mul(h, w)
        right = b.mul(b.add(pl, w), ch)

        def smaller(a: Any, z: Any) -> Any:
            return b.select(b.icmp_signed("<", a, z), a, z)

        def block(dst: Any, src: Any, c0: Any, w0: Any) -> None:
            # plain moves for a whole block (8 channels by 16 pixels): AVX2's masked ones
            # (``vmaskmovps``) cost ~4 ns a store on Zen 3
            cm, pm = smaller(c(8), b.sub(ch, c0)), smaller(c(16), b.sub(w, w0))
            whole = b.and_(b.icmp_signed("==", cm, c(8)), b.icmp_signed("==", pm, c(16)))
            with b.if_else(whole) as (plain, part):
                with plain:
                    moves(dst, src, c0, w0, None)
                with part:
                    moves(dst, src, c0, w0, (below(16, pm), below(8, cm), cm, pm))

        def moves(dst: Any, src: Any, c0: Any, w0: Any, masks: Any) -> None:
            rows = []
            for i in range(8):
                off = b.add(b.add(src, b.mul(b.add(c0, c(i)), plane)), w0)
                if masks is None:
                    rows.append(b.load(at(x, off, v16), align=4))
                else:
                    mask = b.select(b.icmp_signed("<", c(i), masks[2]), masks[0], none16)
                    rows.append(b.call(mload, [at(x, off, v16), four, mask, zero16]))
                # the same pixels of the channel's next row, into L2 (the image is read a
                # row of every channel at a time: short runs a plane, which the hardware's
                # prefetchers do not follow; at a batch x is out of L2); never faults
                b.call(fetch, [b.bitcast(b.gep(x, [b.add(off, w)]), i8p), *read2])
            for pair in _transpose_8x16(b, ir, rows):
                for e, lanes in enumerate(((0, 8), (8, 16))):
                    v = b.shuffle_vector(pair.value, ir.Constant(v16, ir.Undefined),
                                         self._lanes(*lanes))  # fmt: skip
                    px = pair.first + e
                    off = b.add(dst, b.add(b.mul(b.add(b.add(pl, w0), c(px)), ch), c0))
                    if masks is None:
                        b.store(v, at(xt, off, v8), align=4)
                        continue
                    # a pixel of all 8 channels stores plainly (planes under 16 wide:
                    # every block is partial)
                    inside = b.icmp_signed("<", c(px), masks[3])
                    whole = b.and_(inside, b.icmp_signed("==", masks[2], c(8)))
                    with b.if_else(whole) as (plain, part):
                        with plain:
                            b.store(v, at(xt, off, v8), align=4)
                        with part:
                            mask = b.select(inside, masks[1], none8)
                            b.call(store8, [v, at(xt, off, v8), four, mask])

        def row(r: Any, x_image: Any, xt_image: Any) -> None:
            dst, hh = b.add(xt_image, b.mul(r, row_len)), b.sub(r, pt)
            inside = b.and_(b.icmp_signed(">=", hh, c(0)), b.icmp_signed("<", hh, h))
            pad_row, image_row, done = (fn.append_basic_block() for _ in range(3))
            b.cbranch(inside, image_row, pad_row)
            b.position_at_end(pad_row)
            zeros(dst, row_len)
            b.branch(done)
            b.position_at_end(image_row)
            zeros(dst, b.mul(pl, ch))
            zeros(b.add(dst, right), b.sub(row_len, right))
            src = b.add(x_image, b.mul(hh, w))
            counted_loop(
                b,
                c(0),
                ch,
                8,
                lambda c0: counted_loop(
                    b, c(0), w, 16, lambda w0: block(dst, src, c0, w0), whole=False
                ),
                whole=False,
            )
            b.branch(done)
            b.position_at_end(done)

        def image(q: Any) -> None:
            x_image, xt_image = b.mul(q, b.mul(ch, plane)), b.mul(q, b.mul(hp, row_len))
            counted_loop(b, r0, r1, 1, lambda r: row(r, x_image, xt_image), whole=False)

        counted_loop(b, c(0), count, 1, image, whole=False)
        b.ret(c(0))

    def x_index(self, m0: Any, r: int, k: Any) -> Any:
        return self.b.add(self.row_at[r], k)

    def fetch_start(self, p: Any, m0: Any) -> tuple[Any, Any]:
        """Where whole tile ``m0``'s k loop on panel ``p`` starts prefetching, and its pace
        (bytes a k, a constant: ``PREFETCH_LINES`` lines an iteration): the byte of ``w``
        in the panel a block of panels on (``walk``'s blocks; the last panel past the end)
        at tile m0's share (``m0 / full`` of it), plus the pace times the panel rows
        before the tap's first (``tap_k``). A tile's prefetches then cover ``pace /
        (4 * nr)`` of the panel from its share's start: all of it with 4 tiles or more
        (AVX2's tile: 2), twice and more over with more. Computed from the arguments at
        each loop's start, the pace a constant: LLVM spilled the k loop's accumulators
        where values of the walk stayed live through it, or the pace was computed at run
        time (a fixed-point share of ``4 * nr / tiles`` bytes a k)."""
        b, c = self.b, self.c
        panel = b.mul(self.panel_rows(), c(4 * self.nr))
        per_block = b.sdiv(c(PANEL_BLOCK_BYTES), panel)
        per_block = b.select(b.icmp_signed("<", per_block, c(1)), c(1), per_block)
        last = b.sub(self.panels, c(1))
        nxt = b.add(p, per_block)
        nxt = b.select(b.icmp_signed(">", nxt, last), last, nxt)
        full = b.mul(b.sdiv(self.m_rows, c(self.mr)), c(self.mr))  # > 0 where tiles run
        at = b.add(b.mul(nxt, panel), b.sdiv(b.mul(m0, panel), full))
        pace = c(64 * self.PREFETCH_LINES // self.UNROLL)
        return b.add(at, b.mul(self.tap_k, pace)), pace

    def panel_rows(self) -> Any:
        return self.k_total

    def panel_vectors(self, p: Any, j: int, k: Any) -> list[Any]:
        """Panel ``p + j``'s two vectors at its row ``tap_k + k``."""
        b, c = self.b, self.c
        at = b.add(b.mul(b.add(p, c(j)), b.mul(self.k_total, c(self.nr))),
                   b.mul(b.add(self.tap_k, k), c(self.nr)))  # fmt: skip
        return [b.load(b.bitcast(b.gep(self.w, [b.add(at, c(self.vw * h))]), self.v8p), align=4)
                for h in range(2)]  # fmt: skip


class _Pair(NamedTuple):
    """A transposed vector: filters ``first`` and ``first + 1``'s 8 pixels each."""

    value: Any
    first: int


def _transpose_8x16(b: Any, ir: Any, rows: list[Any]) -> list[_Pair]:
    """Eight 16-lane vectors (row r's lane c: pixel r, filter c) as eight vectors of two
    filters' 8 pixels, in three stages of two-source shuffles (each one ``vpermt2ps``)."""
    i32 = ir.IntType(32)
    vals = [(v, [(r, col) for col in range(16)]) for r, v in enumerate(rows)]

    def shuffle(a: tuple[Any, list[Any]], z: tuple[Any, list[Any]], want: list[Any]) -> Any:
        idx = [a[1].index(w) if w in a[1] else 16 + z[1].index(w) for w in want]
        return b.shuffle_vector(a[0], z[0], ir.Constant(ir.VectorType(i32, 16), idx)), want

    # stage 1: rows 2q, 2q+1 interleaved, filters 0-7 and 8-15
    s1 = {(q, g): shuffle(vals[2 * q], vals[2 * q + 1],
                          [(2 * q + e, col) for col in range(8 * g, 8 * g + 8) for e in (0, 1)])
          for q in range(4) for g in range(2)}  # fmt: skip
    # stage 2: four rows, four filters
    s2 = {(u, g): shuffle(s1[(2 * u, g // 2)], s1[(2 * u + 1, g // 2)],
                          [(4 * u + e, col) for col in range(4 * g, 4 * g + 4) for e in range(4)])
          for u in range(2) for g in range(4)}  # fmt: skip
    # stage 3: eight rows, two filters
    out = []
    for g in range(8):
        v, _ = shuffle(
            s2[(0, g // 2)],
            s2[(1, g // 2)],
            [(e, col) for col in (2 * g, 2 * g + 1) for e in range(8)],
        )
        out.append(_Pair(v, 2 * g))
    return out


_ENGINES: list[Any] = []  # kept alive: the symbols point into them
_kern: Any = None  # the ExternalFunction the tests' wrapper calls (set before it compiles)


def _decide() -> tuple[Any, Any, Any] | None:
    """The ExternalFunctions over the registered symbols (the product, the copy into the
    padded channels-last image), or None (no tile on this path, or the build failed: the
    callers keep their other routes)."""
    global _RAW
    shape = gemm_packed.tile()
    if shape is None:
        return None
    try:
        from numba import types

        key = f"gemm_indirect|{shape!r}|{SYMBOL}"
        engine, _cached = compile_ir_cached(lambda: _IndirectGemmIR(shape).text(), key,
                                            IR_SOURCES, opt=3)  # fmt: skip
        for sym in (SYMBOL, SYMBOL_NHWC, SYMBOL_ROWS_NCHW):
            add_symbol(sym, engine.get_function_address(sym))
        _ENGINES.append(engine)
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the callers keep their routes
        return None
    i, vp = ctypes.c_int64, ctypes.c_void_p
    product = ctypes.CFUNCTYPE(i, vp, vp, i, vp, i, vp, i, vp, i, i, i, vp, i, i, vp, i, i, vp,
                               vp)(engine.get_function_address(SYMBOL))  # fmt: skip
    nhwc = ctypes.CFUNCTYPE(i, vp, i, i, i, vp, i, i, i, i, i, i, i)(
        engine.get_function_address(SYMBOL_NHWC)
    )
    _RAW = Raw(product, nhwc, shape)
    p, n = types.uintp, types.int64
    gemm = n(p, p, n, p, n, p, n, p, n, n, n, p, n, n, p, n, n, p, p)
    f = types.float32
    return (types.ExternalFunction(SYMBOL, gemm),
            types.ExternalFunction(SYMBOL_NHWC, n(p, n, n, n, p, n, n, n, n, n, n, n)),
            types.ExternalFunction(SYMBOL_ROWS_NCHW,
                                   n(p, n, p, n, n, n, p, p, f, f, n)))  # fmt: skip


#: (the product's ExternalFunction, the copy's, the rows' put back) or None, decided on
#: first use
_KERNELS: Once[tuple[Any, Any, Any] | None] = Once(_decide)


class Raw(NamedTuple):
    """The kernels as ctypes functions (``raw()``), callable from Python without numba,
    the GIL released while they run: ``product`` is ``SYMBOL`` and ``nhwc``
    ``SYMBOL_NHWC`` (their signatures above, addresses as integers); ``shape`` the tile
    they were built to (its ``nr`` the panel width, ``pack``'s)."""

    product: Any
    nhwc: Any
    shape: TileShape


#: The kernels as ctypes functions, set when ``available()`` has built them (``raw``)
_RAW: Raw | None = None

#: Set once a model built a conv that a cold start's stand-in would run on the kernels
#: (``conv_packed_raw``, any thread), so that the warm-up builds them early.
WANTED = threading.Event()


def raw() -> Raw | None:
    """The kernels as ctypes functions once ``available()`` has built them in this
    process (any thread: a cold start's warm-up builds them early where ``WANTED``), else
    None; never builds, never waits (one read: the NumPy paths ask it per call)."""
    return _RAW


def available() -> bool:
    """Whether the kernels are built and registered (``gemm_packed.available()`` and the
    build succeeded); builds them on the first call. Thread-safe."""
    return packed_available() and _KERNELS.get() is not None


def register(module_globals: dict[str, Any]) -> bool:
    """Set ``module_globals["_sgemm_indirect"]``, ``["_nhwc_pad"]`` and
    ``["_rows_nchw"]`` to the kernels' ExternalFunctions; False where ``available()`` is
    (nothing set)."""
    got = _KERNELS.get() if packed_available() else None
    if got is None:
        return False
    (module_globals["_sgemm_indirect"], module_globals["_nhwc_pad"],
     module_globals["_rows_nchw"]) = got  # fmt: skip
    return True


def _wrap() -> Any:
    global _kern
    _kern = _KERNELS.get()[0]  # type: ignore[index]  # available() was True
    return numba_target.import_numba().njit(nogil=True, cache=True)(_sgemm_indirect)


_WRAPPER: Once[Any] = Once(_wrap)


def kernel() -> Any:
    """``sgemm_indirect(x, rowoff, toff, k, w, y, ldy, m, panels, bias, flags, nr, yoff, ldf,
    nf, res, lohi)`` over whole arrays (float32 ``x``, ``y``, ``bias``, ``res``, ``lohi``;
    int64 ``rowoff``, ``toff``, ``yoff``; ``w`` packed) for Python callers (tests), or None
    where ``available()`` is False. Raises ValueError if ``nr`` is not the kernel's."""
    return _WRAPPER.get() if available() else None


def nchw_stores() -> bool:
    """Whether this process's kernel takes ``FLAG_NCHW`` (the 8 x 32 AVX-512 tile; the
    other builds store rows only). Builds nothing."""
    shape = gemm_packed.tile()
    return shape is not None and stores_nchw(shape)


def stores_nchw(shape: TileShape) -> bool:
    """Whether a build to ``shape`` takes ``FLAG_NCHW``: the 8 x 32 tile of 16-float
    vectors, whose rows the epilogue transposes in registers."""
    return shape.vw == 16 and shape.mr == 8


def _sgemm_indirect(x, rowoff, toff, k, w, y, ldy, m, panels, bias, flags, nr, yoff, ldf, nf,
                    res, lohi):  # fmt: skip  # pragma: no cover - numba only
    status = _kern(x.ctypes.data, rowoff.ctypes.data, toff.shape[0], toff.ctypes.data, k,
                   w.ctypes.data, toff.shape[0] * k, y.ctypes.data, ldy, m, panels,
                   bias.ctypes.data, flags, nr, yoff.ctypes.data, ldf, nf, res.ctypes.data,
                   lohi.ctypes.data)  # fmt: skip
    if status == 1:
        raise ValueError("gemm_indirect: a panel width other than this process's kernel's")
    if status == 2:
        raise ValueError("gemm_indirect: NCHW stores asked of a kernel without them")
