"""A float32 depthwise convolution in NCHW, channel by channel, as LLVM IR: every tap a
vector of outputs' inputs times the broadcast weight, one fused multiply-add a vector.

**Stride 1** (``body_rows``) reads the input where it lies: a block of ``ROW_BLOCK``
output rows by a vector of columns keeps one accumulator a row; each input row the block
reads is loaded once as a run of two vectors, masked to the image's columns (zeros past
its edges; a row above or below the image reads a row of zeros in the scratch), and its
K shifts by ``j`` (``valignd`` on AVX-512) serve the K output rows that use that row.
Nothing is copied and no output is computed twice.

**Stride 2** (``body``) runs on the output's extended grid: each channel's zero-padded input
is split into its four phase planes (rows and columns of one parity) in a scratch, whose
rows are ``wq`` floats (``row_width``: at least OW + kq - 1 from a plane's first data
column, ``kq = (K - 1) // 2 + 1``; a row's zeros on the right are the next row's on the
left). Output (oy, ox) is lane ``t = oy*wq + ox`` of the grid, and tap (i, j) reads phase
``(i % 2)*2 + j % 2`` at ``t + (i // 2)*wq + j // 2``: no masks, the padding is real zeros,
and the ``wq - OW`` extra lanes a row are computed and dropped. The grid runs in blocks of
``BLOCK_VECTORS`` vectors, then one block of what is left; the taps of one phase row read
one run shifted by ``j // 2`` (``valignd``, or unaligned loads: ``loaded_shifts``). Each
row's OW outputs are then stored (the crop). The copy stores whole vectors: lanes past an
image row are zeros (masked loads) and land in the next row's padding or data (written
after it) or in the zero rows below, inside the plane. Where the image is big
(``PREFETCH_MIN_FLOATS``: a batch's early layers, streamed from memory) each row's copy
prefetches the next channel's row into L2.

Both store with the residual added (``flags`` 1) and clamped to ``[lo, hi]`` (ReLU, Clip,
or +-inf for none; NaN kept), or put through HardSwish or HardSigmoid (``FLAG_HARD_*``:
MobileNetV3's depthwise convs), sums starting from the bias. ``valignd`` is inline
assembly: LLVM lowers the shuffle to ``vpermt2ps``, slower on Zen 4.

``tfrt_py_dw_grid(kind, x, w, bias, res, y, xp, xp_len, lo, hi, flags, C, H, W, OH, OW,
pt, pl) -> status`` computes C channels of one image: ``x`` (C, H, W), ``w`` (C, K*K),
``bias`` (C), ``y`` and ``res`` (C, OH, OW) (``res`` unread without flag 1), ``xp`` a
scratch of ``xp_len`` floats (``scratch_len``), ``pt``/``pl`` the top and left padding,
``kind`` an index into ``KINDS``. Outputs read zeros past the image on every side (OH and
OW set the bottom and right padding). Status 0; 1 for an unknown kind, a negative size
or padding, or both ``FLAG_HARD_*``; 2 when ``xp_len`` is short (nothing written for
either). Built with the vector width of ``gemm_packed``'s path (16 floats on AVX-512, 8
on AVX2 and NEON; none on ``portable``), its machine code cached per CPU
(``llvm_jit.compile_ir_cached``). Stateless; any thread.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from . import gemm_packed
from .gemm_packed import counted_loop, splat, wide_vectors

__all__ = ["BLOCK_VECTORS", "FLAG_HARD_SIGMOID", "FLAG_HARD_SWISH", "FLAG_RESIDUAL", "KINDS",
           "NARROW_MAX_WIDTH", "SYMBOL", "SYMBOL_NARROW", "function", "kind_of", "narrow_function",
           "row_width", "scratch_len", "vector_width"]  # fmt: skip

SYMBOL = "tfrt_py_dw_grid"
#: The same kernel built with 8-float vectors beside the AVX-512 one (``narrow_function``):
#: stride-1 planes at most ``NARROW_MAX_WIDTH`` wide fill 7 of its 8 lanes where they fill 7
#: of 16 (Zen 4, one thread, µs, 16 / 8 lanes: 576x7x7 5x5 46 / 32, 1152x7x7 5x5 89 / 62,
#: 960x7x7 3x3 27 / 25; at 14x14 the 16 lanes win, 576x14x14 3x3 35 / 52).
SYMBOL_NARROW = "tfrt_py_dw_rows8"
NARROW_MAX_WIDTH = 8
#: (K, stride) of each ``kind``: stride 1 straight from the input (``body_rows``), stride
#: 2 on the extended grid over the phase planes.
KINDS = ((3, 1), (5, 1), (7, 1), (3, 2), (5, 2))
#: Output rows a block of the stride-1 kernel (one accumulator each; 7 divides MobileNet's
#: and EfficientNet's planes, 7x7 to 112x112). Zen 4, one thread, 3x3, µs, blocks of 4 / 7:
#: 576x14x14 45.7 / 32.5, 960x7x7 38.1 / 27.0, 32x112x112 123.8 / 99.6.
ROW_BLOCK = 7
#: ``flags``: 1 adds ``res`` first; then by default the clamp to ``[lo, hi]``, or with 2
#: HardSwish ``v * clip(lo*v + hi, 0, 1)``, with 4 HardSigmoid ``clip(lo*v + hi, 0, 1)``
#: (``lo``, ``hi`` their alpha and beta).
FLAG_RESIDUAL, FLAG_HARD_SWISH, FLAG_HARD_SIGMOID = 1, 2, 4
#: Vectors of the grid a block (accumulators in registers; the weight loaded once a tap).
BLOCK_VECTORS = 8
#: Images (C*H*W floats) from this size on have each channel's rows prefetched while the
#: channel before is summed (an L2's worth: below, the input is in cache and the prefetches
#: cost 2-4%). Zen 4, one thread, µs a batch of 8: 96x112x112 3x3/2 4125 -> 3387,
#: 144x56x56 3x3/2 1017 -> 815.
PREFETCH_MIN_FLOATS = 1 << 18
#: The files whose code writes the IR (the machine-code cache's key hashes them).
IR_SOURCES = (*gemm_packed.IR_HELPERS, __file__)


def kind_of(k: int, stride: int) -> int:
    """The ``kind`` of a K x K kernel at ``stride``, or -1 when there is none."""
    return KINDS.index((k, stride)) if (k, stride) in KINDS else -1


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def row_width(k: int, ow: int, w: int, pl: int) -> int:
    """``wq`` at stride 2: the phase planes' row, as short as their zero columns allow -- a
    row's zeros on the right are the next row's on the left, so a tap past a row's end
    reads zeros -- and at least OW + kq - 1 from each plane's first data column (the even
    image columns' plane and the odd ones')."""
    kq = (k - 1) // 2 + 1
    le, lo, de, do = pl >> 1, (pl + 1) >> 1, (w + 1) >> 1, w >> 1
    return max(le + de, lo + do, ow + kq - 1 - min(le, lo))


def scratch_len(k: int, stride: int, oh: int, ow: int, w: int, pl: int, vw: int) -> int:
    """The floats of ``xp`` a call needs (the kernel computes the same and refuses less):
    at stride 1 a row of zeros, at stride 2 the phase planes and the extended grid."""
    if stride == 1:
        return _up(w + 2 * vw, vw)
    kq = (k - 1) // stride + 1
    wq = row_width(k, ow, w, pl)
    lanes = _up(oh * wq, vw)
    lq = _up(lanes + (kq - 1) * (wq + 1) + vw, vw)
    return stride * stride * lq + lanes


class _GridIR:
    """The module: ``SYMBOL`` switching on ``kind`` to one body per ``KINDS`` entry."""

    def __init__(self, vw: int, symbol: str = SYMBOL) -> None:
        import llvmlite.ir as ir

        self.symbol = symbol
        self.ir, self.vw = ir, vw
        f32, i64 = ir.FloatType(), ir.IntType(64)
        self.f32, self.i64, self.i32 = f32, i64, ir.IntType(32)
        self.v = ir.VectorType(f32, vw)
        self.vp = self.v.as_pointer()
        self.mask_t = ir.VectorType(ir.IntType(1), vw)
        self.mod = ir.Module(name="tfrt_py_depthwise_grid")
        v = self.v
        self.fma = ir.Function(self.mod, ir.FunctionType(v, [v, v, v]), name=f"llvm.fma.v{vw}f32")
        self.mload = ir.Function(self.mod, ir.FunctionType(v, [self.vp, self.i32, self.mask_t, v]),
                                 name=f"llvm.masked.load.v{vw}f32.p0v{vw}f32")  # fmt: skip
        self.mstore = ir.Function(
            self.mod,
            ir.FunctionType(ir.VoidType(), [v, self.vp, self.i32, self.mask_t]),
            name=f"llvm.masked.store.v{vw}f32.p0v{vw}f32",
        )
        fp = f32.as_pointer()
        self.fn = ir.Function(self.mod, ir.FunctionType(i64, [i64, fp, fp, fp, fp, fp, fp, i64,
                              f32, f32, i64, i64, i64, i64, i64, i64, i64, i64]),
                              name=symbol)  # fmt: skip
        (self.kind, self.x, self.w, self.bias, self.res, self.y, self.xp, self.xp_len, self.lo,
         self.hi, self.flags, self.chans, self.h, self.wd, self.oh, self.ow, self.pt,
         self.pl) = self.fn.args  # fmt: skip
        for a in (self.x, self.y, self.xp):
            a.add_attribute("noalias")
        i8p = ir.IntType(8).as_pointer()
        self.prefetch_fn = ir.Function(
            self.mod,
            ir.FunctionType(ir.VoidType(), [i8p, self.i32, self.i32, self.i32]),
            name="llvm.prefetch.p0i8",
        )
        self.iota = ir.Constant(ir.VectorType(self.i32, vw), list(range(vw)))
        self.align = ir.Constant(self.i32, 4)

    def c(self, n: int) -> Any:
        return self.ir.Constant(self.i64, n)

    def text(self) -> str:
        ir = self.ir
        entry = self.fn.append_basic_block("entry")
        self.b = b = ir.IRBuilder(entry)
        unknown = self.fn.append_basic_block("unknown")
        sw = b.switch(self.kind, unknown)
        b.position_at_end(unknown)
        b.ret(self.c(1))
        for n, (k, s) in enumerate(KINDS):
            block = self.fn.append_basic_block(f"k{k}s{s}")
            sw.add_case(self.c(n), block)
            b.position_at_end(block)
            if s == 1:
                self.body_rows(k)
            else:
                self.body(k)
        text = str(self.mod)
        return wide_vectors(text, [self.symbol]) if self.vw == 16 else text

    def body_rows(self, k: int) -> None:
        """A stride-1 kind straight from ``x`` (no copy, no crop): blocks of ``ROW_BLOCK``
        output rows by a vector of columns, each input row the block reads loaded once as a
        run of two vectors masked to the image's columns (a row above or below the image
        reads a row of zeros in ``xp``), its K shifts shared by the K output rows that use
        it; one accumulator a row. ``xp`` needs W + 2 vectors (the zeros)."""
        b, c, vw = self.b, self.c, self.vw
        self.checks()
        need = self.up(b.add(self.wd, c(2 * vw)))
        bad, good = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed(">", need, self.xp_len), bad, good)
        b.position_at_end(bad)
        b.ret(c(2))
        b.position_at_end(good)
        plane_in, plane_out = b.mul(self.h, self.wd), b.mul(self.oh, self.ow)
        zero = self.ir.Constant(self.v, [0.0] * vw)
        self.each_epilogue(lambda residual, code: self.rows_direct(k, residual, code, plane_in,
                                                                   plane_out, zero))  # fmt: skip
        b.ret(c(0))

    def each_epilogue(self, emit: Any) -> None:
        """``emit(residual, code)`` once for each epilogue ``flags`` can ask for (+ ``res``
        or not; the clamp, HardSwish or HardSigmoid), a switch on ``flags`` choosing one
        per call: the loops carry no test of the flags."""
        b, c = self.b, self.c
        hard = b.and_(self.flags, c(FLAG_HARD_SWISH | FLAG_HARD_SIGMOID))
        mode = b.add(b.mul(b.and_(self.flags, c(FLAG_RESIDUAL)), c(8)), hard)
        done = self.fn.append_basic_block()
        sw = b.switch(mode, done)
        for residual in (False, True):
            for code in (0, FLAG_HARD_SWISH, FLAG_HARD_SIGMOID):
                case = self.fn.append_basic_block()
                sw.add_case(c(8 * residual + code), case)
                b.position_at_end(case)
                emit(residual, code)
                b.branch(done)
        b.position_at_end(done)

    def rows_direct(self, k: int, residual: bool, code: int, plane_in: Any, plane_out: Any,
                    zero: Any) -> None:  # fmt: skip
        """``body_rows``' loops for one epilogue: + ``res`` or not, and the activation."""
        b, c, vw = self.b, self.c, self.vw
        neg = self.ir.Constant(self.v, [-0.0] * vw)
        # rows above and below the image read a row of zeros (only its columns inside the
        # image are read: the loads are masked to them)
        counted_loop(b, c(0), b.add(self.wd, c(2 * vw)), vw,
                     lambda i: b.store(zero, self.at(self.xp, i), align=4),
                     whole=False)  # fmt: skip
        zrow = b.gep(self.xp, [c(2 * vw)])

        def channel(ch: Any) -> None:
            xb = b.gep(self.x, [b.mul(ch, plane_in)])
            yb = b.gep(self.y, [b.mul(ch, plane_out)])
            rb = b.gep(self.res, [b.mul(ch, plane_out)])
            wrow = b.gep(self.w, [b.mul(ch, c(k * k))])
            bias = splat(b, b.load(b.gep(self.bias, [ch])), vw)

            rr_n = ROW_BLOCK

            def rows(oy0: Any) -> None:
                def piece(c0: Any) -> None:
                    acc = [bias] * rr_n
                    col0 = b.sub(c0, self.pl)
                    masks = []
                    for q in range(2):
                        base = b.add(col0, c(q * vw))
                        inside = b.and_(self.below(b.sub(self.wd, base)),
                                        b.not_(self.below(b.sub(c(0), base))))  # fmt: skip
                        masks.append(inside)
                    for u in range(rr_n + k - 1):  # the input rows of the block's outputs
                        r = b.add(b.sub(oy0, self.pt), c(u))
                        valid = b.icmp_unsigned("<", r, self.h)  # 0 <= r < H
                        row_at = b.gep(xb, [b.mul(r, self.wd)])
                        src = b.gep(b.select(valid, row_at, zrow), [col0])
                        run = [b.call(self.mload, [self.at(src, c(q * vw)), self.align,
                                                   masks[q], zero])
                               for q in range(2 if k > 1 else 1)]  # fmt: skip
                        shifted = [run[0]] + [self.shift(run[0], run[1], j) for j in range(1, k)]
                        for rr in range(rr_n):
                            i = u - rr
                            if not 0 <= i < k:
                                continue
                            for j in range(k):
                                wv = splat(b, b.load(b.gep(wrow, [c(i * k + j)])), vw)
                                acc[rr] = b.call(self.fma, [shifted[j], wv, acc[rr]])
                    m = self.below(b.sub(self.ow, c0))
                    for rr in range(rr_n):
                        oy = b.add(oy0, c(rr))
                        mr = b.and_(m, splat(b, b.icmp_signed("<", oy, self.oh), vw))
                        at = b.add(b.mul(oy, self.ow), c0)
                        v = acc[rr]
                        if residual:
                            v = b.fadd(v, b.call(self.mload, [self.at(rb, at), self.align, mr,
                                                              neg]))  # fmt: skip
                        b.call(self.mstore, [self.activate(v, code), self.at(yb, at), self.align,
                                             mr])  # fmt: skip

                counted_loop(b, c(0), self.ow, vw, piece, whole=False)

            counted_loop(b, c(0), self.oh, rr_n, rows, whole=False)

        counted_loop(b, c(0), self.chans, 1, channel)

    def activate(self, v: Any, code: int) -> Any:
        """``v`` clamped to ``[lo, hi]`` (code 0; NaN kept), or HardSwish/HardSigmoid with
        ``lo``, ``hi`` their alpha and beta."""
        b, vw = self.b, self.vw
        lo, hi = splat(b, self.lo, vw), splat(b, self.hi, vw)
        zero = self.ir.Constant(self.v, [0.0] * vw)
        one = self.ir.Constant(self.v, [1.0] * vw)

        def clamp(v: Any, low: Any, high: Any) -> Any:  # NaN kept
            v = b.select(b.fcmp_ordered("<", v, low), low, v)
            return b.select(b.fcmp_ordered(">", v, high), high, v)

        if code == 0:
            return clamp(v, lo, hi)
        t = clamp(b.call(self.fma, [v, lo, hi]), zero, one)
        return b.fmul(v, t) if code == FLAG_HARD_SWISH else t

    def checks(self) -> None:
        """Status 1 for a negative size or padding, or both hard activations."""
        b, c = self.b, self.c
        negative = c(0)
        for v in (self.chans, self.h, self.wd, self.oh, self.ow, self.pt, self.pl):
            negative = b.or_(negative, v)
        both = c(FLAG_HARD_SWISH | FLAG_HARD_SIGMOID)
        hard_both = b.icmp_unsigned("==", b.and_(self.flags, both), both)
        refused, ok = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(b.or_(b.icmp_signed("<", negative, c(0)), hard_both), refused, ok)
        b.position_at_end(refused)
        b.ret(c(1))
        b.position_at_end(ok)

    # -- pieces ---------------------------------------------------------------------------

    def at(self, base: Any, off: Any) -> Any:
        """A vector pointer at float ``off`` of ``base``."""
        return self.b.bitcast(self.b.gep(base, [off]), self.vp)

    def below(self, n: Any) -> Any:
        """The lanes i < ``n`` (an i64; none when n <= 0, all past ``vw``)."""
        b = self.b
        n = b.trunc(self.min(self.max(n, self.c(-1)), self.c(self.vw)), self.i32)
        return b.icmp_signed("<", self.iota, splat(b, n, self.vw))

    def min(self, a: Any, z: Any) -> Any:
        return self.b.select(self.b.icmp_signed("<", a, z), a, z)

    def max(self, a: Any, z: Any) -> Any:
        return self.b.select(self.b.icmp_signed(">", a, z), a, z)

    def body(self, k: int) -> None:
        """A stride-2 kind: the arguments' checks, the geometry, the scratch zeroed, then
        channel by channel its copy into the phase planes, grid and crop."""
        b, c, vw = self.b, self.c, self.vw
        s = 2
        self.checks()
        kq = (k - 1) // s + 1
        # a phase's first data column and its data columns: the even image columns' phase
        # and the odd ones'
        le, lo_ = b.ashr(self.pl, c(1)), b.ashr(b.add(self.pl, c(1)), c(1))
        de, do = b.ashr(b.add(self.wd, c(1)), c(1)), b.ashr(self.wd, c(1))
        wq = self.max(self.max(b.add(le, de), b.add(lo_, do)),
                      b.sub(b.add(self.ow, c(kq - 1)), self.min(le, lo_)))  # fmt: skip
        lanes = self.up(b.mul(self.oh, wq))
        lq = self.up(b.add(lanes, b.add(b.mul(c(kq - 1), b.add(wq, c(1))), c(vw))))
        planes = b.mul(lq, c(s * s))
        bad, good = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed(">", b.add(planes, lanes), self.xp_len), bad, good)
        b.position_at_end(bad)
        b.ret(c(2))
        b.position_at_end(good)
        zero = self.ir.Constant(self.v, [0.0] * vw)
        counted_loop(b, c(0), planes, vw, lambda i: b.store(zero, self.at(self.xp, i), align=4))
        offs = [[b.add(b.mul(c((i % s) * s + j % s), lq), b.add(b.mul(c(i // s), wq), c(j // s)))
                 for j in range(k)] for i in range(k)]  # fmt: skip
        nrows = self.min(self.h, b.sub(b.mul(b.add(self.oh, c(kq - 1)), c(s)), self.pt))
        plane_in = b.mul(self.h, self.wd)
        big = b.icmp_signed(">=", b.mul(plane_in, self.chans), c(PREFETCH_MIN_FLOATS))
        geo = _Geometry(wq, lq, lanes, b.gep(self.xp, [planes]), nrows, plane_in,
                        b.mul(self.oh, self.ow), big)  # fmt: skip
        copy = self.copy_s2(geo)
        crop = self.crop(geo)

        def channel(ch: Any) -> None:
            copy(ch)
            self.grid(ch, k, s, offs, geo)
            crop(ch)

        counted_loop(b, c(0), self.chans, 1, channel)
        b.ret(c(0))

    def up(self, n: Any) -> Any:
        """``n`` rounded up to whole vectors."""
        b, c = self.b, self.c
        return b.mul(b.sdiv(b.add(n, c(self.vw - 1)), c(self.vw)), c(self.vw))

    def prefetch_next(self, src: Any, geo: _Geometry) -> None:
        """Where the image is over ``PREFETCH_MIN_FLOATS`` (``geo.prefetch``), prefetches
        into L2 the next channel's copy of the image row at ``src``, a 64-byte line at a
        time (past the last channel too: a prefetch never faults), so that it arrives while
        this channel's grid is summed."""
        b, c, ir = self.b, self.c, self.ir
        nxt = b.gep(src, [geo.plane_in])
        i32 = self.i32

        def line(o: Any) -> None:
            at = b.bitcast(b.gep(nxt, [o]), ir.IntType(8).as_pointer())
            b.call(self.prefetch_fn, [at, ir.Constant(i32, 0), ir.Constant(i32, 2),
                                      ir.Constant(i32, 1)])  # fmt: skip

        with b.if_then(geo.prefetch):
            counted_loop(b, c(0), self.wd, 16, line, whole=False)

    def copy_s2(self, geo: _Geometry) -> Any:
        """Channel ``ch``'s image into its four phase planes: each image row's even and odd
        columns split by two shuffles of two vectors (the row's parity and ``pt`` pick the
        planes' row, ``pl`` their columns; columns past a plane's row dropped)."""
        b, c, vw, ir = self.b, self.c, self.vw, self.ir
        wq, lq = geo.wq, geo.lq
        evens = ir.Constant(ir.VectorType(self.i32, vw), [2 * i for i in range(vw)])
        odds = ir.Constant(ir.VectorType(self.i32, vw), [2 * i + 1 for i in range(vw)])
        pl_odd = b.and_(self.pl, c(1))
        ce, co = b.ashr(self.pl, c(1)), b.ashr(b.add(self.pl, c(1)), c(1))
        # whole vectors of both the even and the odd columns
        full = b.mul(b.sdiv(b.ashr(self.wd, c(1)), c(vw)), c(vw))
        left = b.sub(self.wd, b.mul(full, c(2)))
        loads = (self.below(left), self.below(b.sub(left, c(vw))))
        zero = ir.Constant(self.v, [0.0] * vw)

        def channel(ch: Any) -> None:
            src0 = b.gep(self.x, [b.mul(ch, geo.plane_in)])
            for par in range(2):  # the image rows of one parity in the padded image
                first = b.and_(b.add(self.pt, c(par)), c(1))
                count = b.ashr(b.add(b.sub(geo.nrows, first), c(1)), c(1))
                rq0 = b.ashr(b.add(first, self.pt), c(1))
                to_e = b.add(b.mul(b.add(c(2 * par), pl_odd), lq), b.add(b.mul(rq0, wq), ce))
                to_o = b.add(b.mul(b.sub(c(2 * par + 1), pl_odd), lq), b.add(b.mul(rq0, wq), co))
                src1 = b.gep(src0, [b.mul(first, self.wd)])

                def row(i: Any, to_e: Any = to_e, to_o: Any = to_o, src1: Any = src1) -> None:
                    src = b.gep(src1, [b.mul(i, b.mul(self.wd, c(2)))])
                    dst_e = b.gep(self.xp, [b.add(to_e, b.mul(i, wq))])
                    dst_o = b.gep(self.xp, [b.add(to_o, b.mul(i, wq))])
                    self.prefetch_next(src, geo)

                    def split(e0: Any, tail: bool) -> None:
                        two = b.mul(e0, c(2))
                        pair = [self.at(src, two), self.at(src, b.add(two, c(vw)))]
                        if tail:
                            a0, a1 = (b.call(self.mload, [p, self.align, m, zero])
                                      for p, m in zip(pair, loads))  # fmt: skip
                        else:
                            a0, a1 = (b.load(p, align=4) for p in pair)
                        b.store(b.shuffle_vector(a0, a1, evens), self.at(dst_e, e0), align=4)
                        b.store(b.shuffle_vector(a0, a1, odds), self.at(dst_o, e0), align=4)

                    counted_loop(b, c(0), full, vw, lambda e0: split(e0, False))
                    split(full, True)  # zeros past the row: see the doc

                counted_loop(b, c(0), count, 1, row)

        return channel

    def grid(self, ch: Any, k: int, s: int, offs: list[list[Any]], geo: _Geometry) -> None:
        """The extended grid's sums for channel ``ch``: blocks of ``BLOCK_VECTORS`` vectors,
        then one block of the vectors left (fewer than four: two chains of sums each, every
        other tap, so that the multiply-adds' latency is hidden)."""
        b, c, vw = self.b, self.c, self.vw
        wrow = b.gep(self.w, [b.mul(ch, c(k * k))])
        bias = splat(b, b.load(b.gep(self.bias, [ch])), vw)
        zero = self.ir.Constant(self.v, [0.0] * vw)
        kq = (k - 1) // s + 1
        loaded = self.loaded_shifts(kq)

        def block(nv: int, t0: Any) -> None:
            chains = 2 if nv < 4 else 1
            acc = [bias] * nv + [zero] * (nv * (chains - 1))
            n = 0
            for i in range(k):
                for cp in range(min(s, k)):  # one phase row's taps: shifts of one run
                    base = b.add(offs[i][cp], t0)
                    js = range(cp, k, s)
                    run = [b.load(self.at(self.xp, b.add(base, c(q * vw))), align=4)
                           for q in range(nv + (1 if len(js) > 1 else 0))]  # fmt: skip
                    for j in js:
                        sh = j // s
                        # loaded at each use: the multiply-add's broadcast operand
                        wv = splat(b, b.load(b.gep(wrow, [c(i * k + j)])), vw)
                        at = (n % chains) * nv
                        n += 1
                        for q in range(nv):
                            if sh == 0:
                                xv = run[q]
                            elif sh in loaded:
                                xv = b.load(self.at(self.xp, b.add(base, c(q * vw + sh))), align=4)
                            else:
                                xv = self.shift(run[q], run[q + 1], sh)
                            acc[at + q] = b.call(self.fma, [xv, wv, acc[at + q]])
            for q in range(nv):
                total = acc[q] if chains == 1 else b.fadd(acc[q], acc[nv + q])
                b.store(total, self.at(geo.ext, b.add(t0, c(q * vw))), align=4)

        step = BLOCK_VECTORS * vw
        counted_loop(b, c(0), geo.lanes, step, lambda t0: block(BLOCK_VECTORS, t0))
        start = b.mul(b.sdiv(geo.lanes, c(step)), c(step))
        left = b.sdiv(b.sub(geo.lanes, start), c(vw))
        done = self.fn.append_basic_block()
        sw = b.switch(left, done)
        for nv in range(1, BLOCK_VECTORS):
            case = self.fn.append_basic_block()
            sw.add_case(c(nv), case)
            b.position_at_end(case)
            block(nv, start)
            b.branch(done)
        b.position_at_end(done)

    def loaded_shifts(self, kq: int) -> tuple[int, ...]:
        """The grid's shifts of a run read by their own (unaligned) loads rather than
        shuffled out of the run's vectors: every shift on 8-float builds (a cross-lane
        shift of a 256-bit pair is two shuffles), none on AVX-512 (``valignd``)."""
        return tuple(range(1, kq)) if self.vw != 16 else ()

    def shift(self, lo: Any, hi: Any, sh: int) -> Any:
        """Lanes ``sh .. sh + vw - 1`` of the two-vector run ``lo, hi``: AVX-512's
        ``valignd`` (LLVM lowers the shuffle to ``vpermt2ps``, slower on Zen 4: the grid's
        sums 36 -> 30 µs at 576x7x7 5x5), else the shuffle."""
        if self.vw != 16:
            mask = self.ir.Constant(self.ir.VectorType(self.i32, self.vw),
                                    [sh + i for i in range(self.vw)])  # fmt: skip
            return self.b.shuffle_vector(lo, hi, mask)
        ft = self.ir.FunctionType(self.v, [self.v, self.v])
        return self.b.asm(ft, f"valignd $${sh}, $1, $2, $0", "=v,v,v", [lo, hi], False)

    def crop(self, geo: _Geometry) -> Any:
        """Channel ``ch``'s OW outputs a row from the grid to ``y``: + ``res``, then the
        clamp, HardSwish or HardSigmoid (``flags``). One loop per combination: a masked
        load of ``res`` that reads nothing would still wait for the stores before it."""
        b, c, vw = self.b, self.c, self.vw
        neg = self.ir.Constant(self.v, [-0.0] * vw)
        full = b.mul(b.sdiv(self.ow, c(vw)), c(vw))
        mask = self.below(b.sub(self.ow, full))
        act = self.activate

        def channel(ch: Any) -> None:
            yb = b.gep(self.y, [b.mul(ch, geo.plane_out)])
            rb = b.gep(self.res, [b.mul(ch, geo.plane_out)])

            def rows(residual: bool, code: int) -> None:
                def row(oy: Any) -> None:
                    src = b.gep(geo.ext, [b.mul(oy, geo.wq)])
                    at = b.mul(oy, self.ow)

                    def whole(c0: Any) -> None:
                        v = b.load(self.at(src, c0), align=4)
                        if residual:
                            v = b.fadd(v, b.load(self.at(rb, b.add(at, c0)), align=4))
                        b.store(act(v, code), self.at(yb, b.add(at, c0)), align=4)

                    counted_loop(b, c(0), full, vw, whole)
                    v = b.call(self.mload, [self.at(src, full), self.align, mask, neg])
                    if residual:
                        r = b.call(self.mload, [self.at(rb, b.add(at, full)), self.align, mask,
                                                neg])  # fmt: skip
                        v = b.fadd(v, r)
                    b.call(self.mstore, [act(v, code), self.at(yb, b.add(at, full)), self.align,
                                         mask])  # fmt: skip

                counted_loop(b, c(0), self.oh, 1, row)

            self.each_epilogue(rows)

        return channel


class _Geometry(NamedTuple):
    """One call's layout (IR values): the phase planes' row ``wq`` and length ``lq``, the
    grid's ``lanes`` and its buffer ``ext``, the image rows copied, the planes' sizes."""

    wq: Any
    lq: Any
    lanes: Any
    ext: Any
    nrows: Any
    plane_in: Any
    plane_out: Any
    prefetch: Any  # an i1: the image is big enough to prefetch the next channel


_ENGINES: list[Any] = []  # kept alive: the symbol points into them


def vector_width() -> int:
    """Floats a vector on this process's path (0: the ``portable`` path, no kernel)."""
    shape = gemm_packed.tile()
    return 0 if shape is None else shape.vw


def _build(vw: int, symbol: str) -> Any:
    """The ExternalFunction over ``symbol`` built with ``vw``-float vectors and registered
    (its machine code cached); raises where llvmlite cannot build it."""
    from numba import types

    engine, _cached = compile_ir_cached(lambda: _GridIR(vw, symbol).text(),
                                        f"dw_grid|{vw}|{symbol}", IR_SOURCES, opt=3)  # fmt: skip
    add_symbol(symbol, engine.get_function_address(symbol))
    _ENGINES.append(engine)
    p, n, f = types.uintp, types.int64, types.float32
    return types.ExternalFunction(symbol, n(n, p, p, p, p, p, p, n, f, f, n, n, n, n, n, n, n, n))


def _decide() -> tuple[Any, Any] | None:
    """(the kernel, its narrow build or None), or None (no vector path, or the build
    failed: callers keep their numba kernels)."""
    vw = vector_width()
    if not vw:
        return None
    try:
        return _build(vw, SYMBOL), _build(8, SYMBOL_NARROW) if vw == 16 else None
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the callers keep their kernels
        return None


_FUNCTION: Once[tuple[Any, Any] | None] = Once(_decide)


def function() -> Any:
    """The kernel as a numba ``ExternalFunction`` (addresses as uintp), or None where there
    is no vector path or the build failed. Builds it once per process; thread-safe."""
    got = _FUNCTION.get() if gemm_packed.available() else None
    return None if got is None else got[0]


def narrow_function() -> Any:
    """The 8-float build beside a 16-float ``function()`` (``SYMBOL_NARROW``), else None."""
    got = _FUNCTION.get() if gemm_packed.available() else None
    return None if got is None else got[1]
