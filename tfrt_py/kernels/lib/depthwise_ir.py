"""A float32 depthwise convolution in NCHW, channel by channel, as LLVM IR: every tap a
vector of outputs' inputs times the broadcast weight, one fused multiply-add a vector.

Each kind reads the input where it lies (``_GridIR.body``): a block of ``ROW_BLOCK`` output
rows by a vector of columns keeps one accumulator a row; each input row the block reads
is loaded once as a run of vectors, masked to the image's columns (zeros past its edges;
a row above or below the image reads a row of zeros in the scratch), and its K column
taps (``taps``) serve the output rows that use that row. At stride 1 tap j is the run
shifted by j (``valignd`` on AVX-512); at stride 2 the run's even and odd lanes (two
two-source shuffles), each shifted by j // 2. Nothing is copied and no output is computed
twice. (Stride 2 used to copy each channel into its four phase planes and sum an
extended grid: one Intel AVX-512 thread, µs, 96x112x112 3x3/2 455 -> 234, 576x14x14
3x3/2 40 -> 28, 144x56x56 5x5/2 123 -> 110.)

Only the blocks at the image's edges mask: a block whose loads lie inside the image and
whose stores inside the output takes plain moves, and an edge block stores a whole vector
wherever it stays inside the channel's output plane (its lanes past the row fall on the
next rows' first columns, which later stores write: a channel's pieces run right to left,
its rows top to bottom), masking only the plane's last vectors; a residual's edge stores
stay masked (kept simple: the zoo's depthwise convs add no residual). AVX2's masked moves
(``vmaskmovps``, ~4 ns a store) cost more than a block's sums on Zen 3: one thread,
one-node models, ratio to onnxruntime's time before -> after, 32x112x112 3x3 1.63 ->
0.72-0.78, 96x112x112 3x3/2 1.35-1.56 -> 0.81-0.85, 576x14x14 3x3 1.37 -> 0.91.

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
or padding, or both ``FLAG_HARD_*``; 2 when ``xp_len`` is short; 3 when the kind's
functions for the call's epilogue are not built yet (nothing written for any).

Built in parts, each once per process (a module of every kind and epilogue was 2.8 s of a
cold start with calls running, on a 2-core Zen 4, and as much again for the narrow
build): ``function()`` builds ``SYMBOL``, which calls the function for the call's kind,
residual and epilogue through a table, and ``ready(kind, code)`` builds and enters a
kind's functions for one epilogue (the plans ask it for each conv they take; a cold
start's warm-up builds what the NumPy paths' convs noted with ``want``). Built with the
vector width of ``gemm_packed``'s path (16 floats on AVX-512, 8 on AVX2 and NEON; none on
``portable``), each part's machine code cached per CPU (``llvm_jit.compile_ir_cached``).
Stateless once built; any thread. ``function()`` is the kernel as numba calls it;
``raw()`` the same machine code as ctypes functions for the NumPy paths
(``conv_depthwise_grid.run_raw``: a cold start's stand-ins, which must not import numba).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from . import gemm_packed, ir_kernels
from .gemm_packed import counted_loop, splat, wide_vectors
from .ir_kernels import call_from_table, enter_in_table, function_table, images_function

__all__ = [
    "CODES",
    "FLAG_HARD_SIGMOID",
    "FLAG_HARD_SWISH",
    "FLAG_RESIDUAL",
    "KINDS",
    "NARROW_MAX_WIDTH",
    "SLOTS",
    "STATUS_NOT_BUILT",
    "SYMBOL",
    "SYMBOL_NARROW",
    "WANTED",
    "Raw",
    "add_variant",
    "build",
    "build_wanted",
    "function",
    "kind_of",
    "min_scratch_len",
    "narrow_function",
    "raw",
    "ready",
    "scratch_len",
    "table_symbol",
    "variant_symbol",
    "vector_width",
    "want",
]  # fmt: skip

SYMBOL = "tfrt_py_dw_grid"
#: The same kernel built with 8-float vectors beside the AVX-512 one (``narrow_function``):
#: outputs at most ``NARROW_MAX_WIDTH`` wide fill 7 of its 8 lanes where they fill 7 of 16
#: (one thread, µs, 16 / 8 lanes; Zen 4: 576x7x7 5x5 46 / 32, 1152x7x7 5x5 89 / 62, 960x7x7
#: 3x3 27 / 25, at 14x14 the 16 lanes win, 576x14x14 3x3 35 / 52; Intel AVX-512, stride 2
#: into 7x7: 576x14x14 3x3 28 / 23, 672x14x14 5x5 52 / 39).
SYMBOL_NARROW = "tfrt_py_dw_rows8"
NARROW_MAX_WIDTH = 8
#: (K, stride) of each ``kind``.
KINDS = ((3, 1), (5, 1), (7, 1), (3, 2), (5, 2))
#: Output rows a block (one accumulator each; 7 divides MobileNet's and EfficientNet's
#: output planes, 7x7 to 112x112). Zen 4, one thread, 3x3, µs, blocks of 4 / 7:
#: 576x14x14 45.7 / 32.5, 960x7x7 38.1 / 27.0, 32x112x112 123.8 / 99.6.
ROW_BLOCK = 7
#: Vector widths whose blocks inside the image load each stride-1 tap from memory (an
#: unaligned load) instead of shifting the row's vectors: AVX2 has no one-instruction
#: two-register shift (``valignd``), LLVM's takes two shuffles a tap. One Zen 3 thread,
#: both builds in one process, interleaved, µs, shifts / loads: 3x3 32x112x112 226 / 201,
#: 144x56x56 234 / 218, 96x56x56 158 / 141; 5x5 at 28x28 and 14x14 even (14x14 and 7x7
#: planes have edge blocks only).
LOADED_TAPS = frozenset({8})
#: Vector widths whose stride-1 planes more than a vector and at most ``PADDED_MAX_W``
#: wide are copied, a channel at a time, into a zero-padded plane in the scratch first
#: (``_GridIR.padded_geometry``): at 14x14 every block is at an edge, masks its loads and
#: takes its taps by shuffles; padded, every block loads its taps plainly. One Zen 3
#: thread, both builds in one process, interleaved, µs, in place / padded: 3x3 576x14x14
#: 102 / 94, 144x28x28 86 / 70; 5x5 672x14x14 426-444 / 348-356, 480x14x14 327 / 272,
#: 240x28x28 527 / 394. Not taken: 7x7 planes (one piece a row: 3x3 960x7x7 58 / 63, 5x5
#: 1152x7x7 141-162 / 163-178), stride 2 (its taps are shuffles either way: 0.96-1.06x),
#: and planes past 32 (56x56 0.82-0.89x in one run, 1.05-1.06x in another).
PADDED_WIDTHS = frozenset({8})
PADDED_MAX_W = 32
#: ``flags``: 1 adds ``res`` first; then by default the clamp to ``[lo, hi]``, or with 2
#: HardSwish ``v * clip(lo*v + hi, 0, 1)``, with 4 HardSigmoid ``clip(lo*v + hi, 0, 1)``
#: (``lo``, ``hi`` their alpha and beta).
FLAG_RESIDUAL, FLAG_HARD_SWISH, FLAG_HARD_SIGMOID = 1, 2, 4
#: The epilogue codes a kind's functions are built for (``flags`` less the residual): the
#: clamp, HardSwish, HardSigmoid.
CODES = (0, FLAG_HARD_SWISH, FLAG_HARD_SIGMOID)
#: Entries of a build's table: a function per kind, residual or not, and code.
SLOTS = len(KINDS) * 2 * len(CODES)
#: The status of a call whose kind and epilogue have no function built yet (nothing
#: written): ``ready`` builds it.
STATUS_NOT_BUILT = 3
#: The files whose code writes the IR (the machine-code cache's key hashes them).
IR_SOURCES = (*gemm_packed.IR_HELPERS, ir_kernels.__file__, __file__)


def kind_of(k: int, stride: int) -> int:
    """The ``kind`` of a K x K kernel at ``stride``, or -1 when there is none."""
    return KINDS.index((k, stride)) if (k, stride) in KINDS else -1


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def min_scratch_len(w: int, vw: int) -> int:
    """The fewest floats of ``xp`` the kernel takes for images ``w`` wide (it refuses
    less, status 2): a row of zeros, W + 2 vectors; with them every plane is read in
    place."""
    return _up(w + 2 * vw, vw)


def scratch_len(h: int, w: int, vw: int) -> int:
    """The floats of ``xp`` a call over images ``h`` x ``w`` with ``vw``-float vectors
    needs: a row of zeros, W + 2 vectors, for every kind (the kernel refuses less); where
    the plane is copied padded (``PADDED_WIDTHS``, ``PADDED_MAX_W``), room for that copy
    for every kind at "same" padding (a call whose copy does not fit reads in place)."""
    n = min_scratch_len(w, vw)
    if vw in PADDED_WIDTHS and w <= PADDED_MAX_W:
        n = max(n, (h + 20) * _up(w + 5 * vw, vw))
    return n


class _Geometry(NamedTuple):
    """How ``rows_direct`` reads the input: ``plane(ch)`` a channel's first row (an IR
    builder step), ``h`` x ``wd`` its rows and columns, ``pt``/``pl`` the rows and
    columns before output (0, 0)'s window; ``copied_at`` None where the image is read in
    place (rows outside it read zeros, edge blocks mask), else the row its copy starts
    at in the padded plane."""

    plane: Any
    h: Any
    wd: Any
    pt: Any
    pl: Any
    copied_at: Any


class _GridIR:
    """A module over ``vw``-float vectors: ``variant`` None, ``symbol`` looking up the
    function for the call's kind and epilogue in ``table_symbol(symbol)`` (status 3 where
    it holds none) and its loop over images; ``variant`` (kind, code), the two functions
    of that kind and epilogue code, with and without the residual (``variant_symbol``)."""

    def __init__(self, vw: int, symbol: str = SYMBOL,
                 variant: tuple[int, int] | None = None) -> None:  # fmt: skip
        import llvmlite.ir as ir

        self.symbol, self.variant = symbol, variant
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
        self.fn_type = ir.FunctionType(i64, [i64, fp, fp, fp, fp, fp, fp, i64, f32, f32, i64,
                                             i64, i64, i64, i64, i64, i64, i64])  # fmt: skip
        self.iota = ir.Constant(ir.VectorType(self.i32, vw), list(range(vw)))
        self.align = ir.Constant(self.i32, 4)

    def function(self, name: str) -> Any:
        """A new function ``name`` of the kernel's arguments, made the one being written
        (its arguments as attributes, a builder at its entry)."""
        self.fn = self.ir.Function(self.mod, self.fn_type, name=name)
        (self.kind, self.x, self.w, self.bias, self.res, self.y, self.xp, self.xp_len, self.lo,
         self.hi, self.flags, self.chans, self.h, self.wd, self.oh, self.ow, self.pt,
         self.pl) = self.fn.args  # fmt: skip
        for a in (self.x, self.y, self.xp):
            a.add_attribute("noalias")
        self.b = self.ir.IRBuilder(self.fn.append_basic_block("entry"))
        return self.fn

    def c(self, n: int) -> Any:
        return self.ir.Constant(self.i64, n)

    def text(self) -> str:
        if self.variant is None:
            self.dispatch()
            # the loop over images for the NumPy paths (``raw``): input, residual, output
            images_function(self.mod, self.fn, f"{self.symbol}_images", (1, 4, 5))
            return str(self.mod)
        kind, code = self.variant
        names = []
        for residual in (False, True):
            names.append(variant_symbol(self.symbol, kind, code, residual))
            self.function(names[-1])
            self.body(kind, residual, code)
        text = str(self.mod)
        return wide_vectors(text, names) if self.vw == 16 else text

    def dispatch(self) -> None:
        """``symbol``: status 1 for a kind out of ``KINDS`` or both hard activations, 3
        where the table holds no function for the kind and ``flags``' epilogue, else that
        function's status."""
        c = self.c
        fn = self.function(self.symbol)
        b = self.b
        table = function_table(self.mod, table_symbol(self.symbol), SLOTS)
        both = c(FLAG_HARD_SWISH | FLAG_HARD_SIGMOID)
        hard = b.and_(self.flags, both)
        bad = b.or_(b.icmp_unsigned(">=", self.kind, c(len(KINDS))),
                    b.icmp_unsigned("==", hard, both))  # fmt: skip
        refused, known = fn.append_basic_block(), fn.append_basic_block()
        b.cbranch(bad, refused, known)
        b.position_at_end(refused)
        b.ret(c(1))
        b.position_at_end(known)
        residual = b.and_(self.flags, c(FLAG_RESIDUAL))
        slot = b.add(b.add(b.mul(self.kind, c(6)), b.mul(residual, c(3))), b.lshr(hard, c(1)))
        call_from_table(b, table, slot, STATUS_NOT_BUILT)

    def body(self, kind: int, residual: bool, code: int) -> None:
        """A kind with one epilogue: blocks of ``ROW_BLOCK`` output rows by a vector of
        columns, each input row the block reads loaded once as a run of vectors (masked to
        the image's columns in the blocks at its edges; a row above or below the image
        reads a row of zeros in ``xp``), its K column taps (``taps``) shared by the output
        rows that use that row; one accumulator a row. ``xp`` needs W + 2 vectors (the
        zeros). Planes at most ``PADDED_MAX_W`` wide (every block at an edge) on the
        widths of ``PADDED_WIDTHS`` are first copied into a zero-padded plane in ``xp``
        where it holds one (``scratch_len``), whose blocks all load plainly."""
        b, c, vw = self.b, self.c, self.vw
        k, s = KINDS[kind]
        self.checks()
        need = self.up(b.add(self.wd, c(2 * vw)))
        bad, good = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed(">", need, self.xp_len), bad, good)
        b.position_at_end(bad)
        b.ret(c(2))
        b.position_at_end(good)
        plane_out = b.mul(self.oh, self.ow)
        args = (k, s, residual, code, plane_out)
        if vw not in PADDED_WIDTHS or s != 1:
            self.rows_direct(*args, self.in_place_geometry())
            b.ret(c(0))
            return
        geo = self.padded_geometry(k, s)
        small = b.and_(b.and_(b.icmp_signed(">", self.wd, c(vw)),
                              b.icmp_signed("<=", self.wd, c(PADDED_MAX_W))),
                       b.icmp_signed("<=", b.mul(geo.h, geo.wd), self.xp_len))  # fmt: skip
        with b.if_else(small) as (padded, direct):
            with padded:
                self.zero_scratch(b.mul(geo.h, geo.wd))
                self.rows_direct(*args, geo)
            with direct:
                self.rows_direct(*args, self.in_place_geometry())
        b.ret(c(0))

    def in_place_geometry(self) -> _Geometry:
        """The image read where it lies: rows outside it read ``xp``'s row of zeros."""
        b = self.b
        plane = b.mul(self.h, self.wd)
        return _Geometry(lambda ch: b.gep(self.x, [b.mul(ch, plane)]), self.h, self.wd,
                         self.pt, self.pl, None)  # fmt: skip

    def padded_geometry(self, k: int, s: int) -> _Geometry:
        """Each channel copied into ``xp`` as a plane of zeros holding the image at row
        ``pt`` and column ``vw`` (its rows and columns past every block's reach zero):
        blocks load plainly and never mask. Rows: every block's reach; columns: the last
        piece's reach past the image, rounded up to vectors."""
        b, c, vw = self.b, self.c, self.vw
        nload = -(-(s * (vw - 1) + k) // vw)
        blocks = b.mul(b.sdiv(b.add(self.oh, c(ROW_BLOCK - 1)), c(ROW_BLOCK)), c(ROW_BLOCK))
        rows = self.max(b.add(b.mul(blocks, c(s)), c(k)), b.add(self.pt, self.h))
        last = b.mul(b.sdiv(self.ow, c(vw)), c(vw))  # past the last piece's first column
        reach = b.add(b.sub(b.mul(last, c(s)), self.pl), c(vw + max(nload * vw, k - 1 + vw)))
        cols = self.up(self.max(reach, b.add(self.wd, c(2 * vw))))
        pl = b.sub(self.pl, c(vw))  # the image's column 0 at column vw
        return _Geometry(lambda ch: self.copy_padded(ch, rows, cols), rows, cols, self.c(0),
                         pl, self.pt)  # fmt: skip

    def zero_scratch(self, n: Any) -> None:
        """``xp``'s first ``n`` floats (a multiple of the vector) to zero."""
        b, zero = self.b, self.ir.Constant(self.v, [0.0] * self.vw)
        counted_loop(b, self.c(0), n, self.vw,
                     lambda i: b.store(zero, self.at(self.xp, i), align=4))  # fmt: skip

    def copy_padded(self, ch: Any, rows: Any, cols: Any) -> Any:
        """Channel ``ch``'s rows into ``xp``'s padded plane (``padded_geometry``): each row's
        vectors at row ``pt + r``, column ``vw``, the last one's lanes past the image zero
        (a masked load); returns the plane."""
        b, c, vw = self.b, self.c, self.vw
        zero = self.ir.Constant(self.v, [0.0] * vw)
        src = b.gep(self.x, [b.mul(ch, b.mul(self.h, self.wd))])
        whole = b.mul(b.sdiv(self.wd, c(vw)), c(vw))
        mask = self.below(b.sub(self.wd, whole))

        def row(r: Any) -> None:
            at, to = b.mul(r, self.wd), b.add(b.mul(b.add(r, self.pt), cols), c(vw))
            counted_loop(b, c(0), whole, vw,
                         lambda q: b.store(b.load(self.at(src, b.add(at, q)), align=4),
                                           self.at(self.xp, b.add(to, q)), align=4))  # fmt: skip
            tail = self.load(self.at(src, b.add(at, whole)), mask, zero)
            b.store(tail, self.at(self.xp, b.add(to, whole)), align=4)

        counted_loop(b, c(0), self.min(self.h, b.sub(rows, self.pt)), 1, row)
        return self.xp

    def rows_direct(self, k: int, s: int, residual: bool, code: int, plane_out: Any,
                    geo: _Geometry) -> None:  # fmt: skip
        """``body``'s loops for one epilogue (+ ``res`` or not, and the activation) over the
        input as ``geo`` lays it out."""
        b, c, vw = self.b, self.c, self.vw
        zero = self.ir.Constant(self.v, [0.0] * vw)
        padded = geo.copied_at is not None
        zrow = self.xp
        if not padded:
            # rows above and below the image read a row of zeros (only its columns inside
            # the image are read: the loads are masked to them)
            counted_loop(b, c(0), b.add(geo.wd, c(2 * vw)), vw,
                         lambda i: b.store(zero, self.at(self.xp, i), align=4),
                         whole=False)  # fmt: skip
            zrow = b.gep(self.xp, [c(2 * vw)])
        # the vectors of input a vector of outputs reads: s*(vw - 1) + K columns
        nload = -(-(s * (vw - 1) + k) // vw)

        def channel(ch: Any) -> None:
            xb = geo.plane(ch)
            yb = b.gep(self.y, [b.mul(ch, plane_out)])
            rb = b.gep(self.res, [b.mul(ch, plane_out)])
            wrow = b.gep(self.w, [b.mul(ch, c(k * k))])
            bias = splat(b, b.load(b.gep(self.bias, [ch])), vw)

            rr_n = ROW_BLOCK

            def rows(oy0: Any) -> None:
                def block(c0: Any, col0: Any, masked_loads: bool, masked: bool) -> None:
                    acc = [bias] * rr_n
                    masks = []
                    for q in range(nload if masked_loads else 0):
                        base = b.add(col0, c(q * vw))
                        inside = b.and_(self.below(b.sub(geo.wd, base)),
                                        b.not_(self.below(b.sub(c(0), base))))  # fmt: skip
                        masks.append(inside)
                    for u in range(s * (rr_n - 1) + k):  # the input rows of the outputs
                        r = b.add(b.sub(b.mul(oy0, c(s)), geo.pt), c(u))
                        row_at = b.gep(xb, [b.mul(r, geo.wd)])
                        if not padded:  # 0 <= r < H, else the row of zeros
                            valid = b.icmp_unsigned("<", r, geo.h)
                            row_at = b.select(valid, row_at, zrow)
                        src = b.gep(row_at, [col0])
                        if not masked_loads and s == 1 and vw in LOADED_TAPS:
                            shifted = [self.load(self.at(src, c(j)), None, zero)
                                       for j in range(k)]  # fmt: skip
                        else:
                            run = [self.load(self.at(src, c(q * vw)),
                                             masks[q] if masked_loads else None, zero)
                                   for q in range(nload)]  # fmt: skip
                            shifted = self.taps(run, k, s)
                        for rr in range(rr_n):
                            i = u - s * rr
                            if not 0 <= i < k:
                                continue
                            for j in range(k):
                                wv = splat(b, b.load(b.gep(wrow, [c(i * k + j)])), vw)
                                acc[rr] = b.call(self.fma, [shifted[j], wv, acc[rr]])
                    self.store_rows(acc, oy0, c0, yb, rb, plane_out, residual, code, masked)

                def piece(i: Any) -> None:
                    c0 = b.sub(last, i)  # right to left (``store_rows``' whole stores)
                    # plain moves where every load lies inside the image and every
                    # store inside the output's rows (module docstring)
                    col0 = b.sub(b.mul(c0, c(s)), geo.pl)
                    inside = b.and_(b.icmp_signed("<=", b.add(c0, c(vw)), self.ow),
                                    b.icmp_signed("<=", b.add(oy0, c(rr_n)), self.oh))  # fmt: skip
                    if not padded:
                        inside = b.and_(inside, b.and_(
                            b.icmp_signed(">=", col0, c(0)),
                            b.icmp_signed("<=", b.add(col0, c(nload * vw)), geo.wd)))  # fmt: skip
                    with b.if_else(inside) as (plain, edge):
                        with plain:
                            block(c0, col0, False, False)
                        with edge:
                            block(c0, col0, not padded, True)

                last = b.mul(b.sdiv(b.sub(self.ow, c(1)), c(vw)), c(vw))  # the last piece
                end = b.select(b.icmp_signed(">", self.ow, c(0)), b.add(last, c(1)), c(0))
                counted_loop(b, c(0), end, vw, piece, whole=False)

            counted_loop(b, c(0), self.oh, rr_n, rows, whole=False)

        counted_loop(b, c(0), self.chans, 1, channel)

    def store_rows(self, acc: list[Any], oy0: Any, c0: Any, yb: Any, rb: Any, plane_out: Any,
                   residual: bool, code: int, masked: bool) -> None:  # fmt: skip
        """A block's rows ``acc`` (+ ``res``, the activation) stored at output row ``oy0``,
        column ``c0``: plainly, or (``masked``) to the output's rows -- a whole vector
        where it stays inside the plane (the lanes past the row fall on the next rows'
        first columns, which later stores write: pieces run right to left, rows top to
        bottom), else masked, and always masked with a residual."""
        b, c, vw = self.b, self.c, self.vw
        neg = self.ir.Constant(self.v, [-0.0] * vw)
        m = self.below(b.sub(self.ow, c0)) if masked else None
        for rr, v in enumerate(acc):
            oy = b.add(oy0, c(rr))
            mr = (b.and_(m, splat(b, b.icmp_signed("<", oy, self.oh), vw))
                  if masked else None)  # fmt: skip
            at = b.add(b.mul(oy, self.ow), c0)
            if residual:
                v = b.fadd(v, self.load(self.at(rb, at), mr, neg))
            v = self.activate(v, code)
            if not masked or residual:  # a residual's stay masked (module docstring)
                self.store(v, self.at(yb, at), mr)
                continue
            whole = b.icmp_signed("<=", b.add(at, c(vw)), plane_out)
            with b.if_else(whole) as (plain, part):
                with plain:
                    self.store(v, self.at(yb, at), None)
                with part:
                    self.store(v, self.at(yb, at), mr)

    def taps(self, run: list[Any], k: int, s: int) -> list[Any]:
        """The K column taps of an input row's ``run`` (its vectors from the first column a
        vector of outputs reads): tap j is lanes ``s*t + j``. Stride 1: the run shifted by
        j. Stride 2: its even and odd lanes (two-source shuffles), each shifted by j // 2
        with the next vector's even or odd lanes."""
        if s == 1:
            return [run[0]] + [self.shift(run[0], run[1], j) for j in range(1, k)]
        b, ir, vw = self.b, self.ir, self.vw

        def lanes(a: Any, z: Any, first: int) -> Any:
            idx = [(first + 2 * t) % (2 * vw) for t in range(vw)]
            return b.shuffle_vector(a, z, ir.Constant(ir.VectorType(self.i32, vw), idx))

        parts = [lanes(run[0], run[1], p) for p in (0, 1)]  # the even lanes, the odd
        nxt = [lanes(run[2], run[2], p) if k > 2 else None for p in (0, 1)]
        return [parts[j % 2] if j < 2 else self.shift(parts[j % 2], nxt[j % 2], j // 2)
                for j in range(k)]  # fmt: skip

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

    def load(self, ptr: Any, mask: Any, fill: Any) -> Any:
        """The vector at ``ptr``: lanes out of ``mask`` read as ``fill`` (all lanes when
        ``mask`` is None: a plain load)."""
        if mask is None:
            return self.b.load(ptr, align=4)
        return self.b.call(self.mload, [ptr, self.align, mask, fill])

    def store(self, v: Any, ptr: Any, mask: Any) -> None:
        """``v`` stored at ``ptr``, only ``mask``'s lanes (all when None)."""
        if mask is None:
            self.b.store(v, ptr, align=4)
        else:
            self.b.call(self.mstore, [v, ptr, self.align, mask])

    def below(self, n: Any) -> Any:
        """The lanes i < ``n`` (an i64; none when n <= 0, all past ``vw``)."""
        b = self.b
        n = b.trunc(self.min(self.max(n, self.c(-1)), self.c(self.vw)), self.i32)
        return b.icmp_signed("<", self.iota, splat(b, n, self.vw))

    def min(self, a: Any, z: Any) -> Any:
        return self.b.select(self.b.icmp_signed("<", a, z), a, z)

    def max(self, a: Any, z: Any) -> Any:
        return self.b.select(self.b.icmp_signed(">", a, z), a, z)

    def up(self, n: Any) -> Any:
        """``n`` rounded up to whole vectors."""
        b, c = self.b, self.c
        return b.mul(b.sdiv(b.add(n, c(self.vw - 1)), c(self.vw)), c(self.vw))

    def shift(self, lo: Any, hi: Any, sh: int) -> Any:
        """Lanes ``sh .. sh + vw - 1`` of the two-vector run ``lo, hi``: AVX-512's
        ``valignd`` (LLVM lowers the shuffle to ``vpermt2ps``, slower on Zen 4: the old grid's
        sums 36 -> 30 µs at 576x7x7 5x5), else the shuffle."""
        if self.vw != 16:
            mask = self.ir.Constant(self.ir.VectorType(self.i32, self.vw),
                                    [sh + i for i in range(self.vw)])  # fmt: skip
            return self.b.shuffle_vector(lo, hi, mask)
        ft = self.ir.FunctionType(self.v, [self.v, self.v])
        return self.b.asm(ft, f"valignd $${sh}, $1, $2, $0", "=v,v,v", [lo, hi], False)


#: The process's builds (``SYMBOL``, ``SYMBOL_NARROW``) by symbol, as ``_decide`` made them
#: (kept alive: the symbols point into them)
_DISPATCH: dict[str, Any] = {}
_VARIANT_LOCK = threading.Lock()
#: (kind, code) pairs the NumPy paths' convs serve with (``want``), for the warm-up; its
#: own lock: a load noting one never waits for a build under ``_VARIANT_LOCK``
_WANTED_VARIANTS: set[tuple[int, int]] = set()
_WANTED_LOCK = threading.Lock()


def vector_width() -> int:
    """Floats a vector on this process's path (0: the ``portable`` path, no kernel)."""
    shape = gemm_packed.tile()
    return 0 if shape is None else shape.vw


def table_symbol(symbol: str) -> str:
    """The table of the functions ``symbol`` calls (``SLOTS`` addresses, 0: not built)."""
    return f"{symbol}_table"


def variant_symbol(symbol: str, kind: int, code: int, residual: bool) -> str:
    """The function of ``symbol``'s build for a kind, epilogue code and residual."""
    return f"{symbol}_v{kind}_{code}_{int(residual)}"


def _slot(kind: int, code: int, residual: bool) -> int:
    return kind * 2 * len(CODES) + int(residual) * len(CODES) + CODES.index(code)


def build(vw: int, symbol: str = SYMBOL) -> Any:
    """The engine of ``symbol`` over ``vw``-float vectors with its table empty (every call
    status 3 until ``add_variant``), its machine code cached; not registered with LLVM
    (``_build`` does that for the process's builds). Raises what llvmlite raises."""
    engine, _cached = compile_ir_cached(lambda: _GridIR(vw, symbol).text(),
                                        f"dw_grid|{vw}|{symbol}", IR_SOURCES, opt=3)  # fmt: skip
    engine.tfrt_py_variants = {}
    return engine


def add_variant(engine: Any, vw: int, symbol: str, kind: int, code: int) -> None:
    """Build the functions of ``kind`` with epilogue ``code`` (one of ``CODES``; with and
    without the residual) and enter them in the table of ``engine`` (``build(vw,
    symbol)``): its calls of that kind and epilogue run from then on. Once an engine;
    the caller serializes the calls for one engine. Raises ValueError for a kind or code
    out of range, else what llvmlite raises."""
    if not 0 <= kind < len(KINDS) or code not in CODES:
        raise ValueError(f"no depthwise kernel of kind {kind} with epilogue code {code}")
    if (kind, code) in engine.tfrt_py_variants:
        return
    part, _cached = compile_ir_cached(lambda: _GridIR(vw, symbol, (kind, code)).text(),
                                      f"dw_grid|{vw}|{symbol}|{kind}|{code}", IR_SOURCES,
                                      opt=3)  # fmt: skip
    engine.tfrt_py_variants[(kind, code)] = part  # kept alive: the table points into it
    enter_in_table(engine, table_symbol(symbol), SLOTS, {
        _slot(kind, code, residual): part.get_function_address(
            variant_symbol(symbol, kind, code, residual))
        for residual in (False, True)})  # fmt: skip


def _build(vw: int, symbol: str) -> tuple[Any, Any]:
    """(the ExternalFunction over ``symbol`` built with ``vw``-float vectors and
    registered, the same machine code as a ctypes function: ``raw()``), its machine code
    cached, no kind built yet (``ready``); raises where llvmlite cannot build it."""
    import ctypes

    from numba import types

    engine = build(vw, symbol)
    address = engine.get_function_address(symbol)
    add_symbol(symbol, address)
    _DISPATCH[symbol] = engine
    p, n, f = types.uintp, types.int64, types.float32
    i, vp, fl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    raw = ctypes.CFUNCTYPE(i, i, vp, vp, vp, vp, vp, vp, i, fl, fl, *[i] * 12)(
        engine.get_function_address(f"{symbol}_images")
    )
    return types.ExternalFunction(symbol, n(n, p, p, p, p, p, p, n, f, f, n, n, n, n, n, n, n,
                                            n)), raw  # fmt: skip


def ready(kind: int, code: int, narrow: bool = False) -> bool:
    """Whether the process's kernel (``function()``, and with ``narrow`` its 8-float build
    where there is one) runs convs of ``kind`` with epilogue ``code``: their functions
    built now where they were not (a kind's two, about a fifteenth of every kind's and
    epilogue's at once: 2.8 s of a cold start's warm-up on a 2-core Zen 4). False where
    there is no kernel, or for a kind or code out of range. Thread-safe."""
    if function() is None or not 0 <= kind < len(KINDS) or code not in CODES:
        return False
    with _VARIANT_LOCK:
        add_variant(_DISPATCH[SYMBOL], vector_width(), SYMBOL, kind, code)
        if narrow and narrow_function() is not None:
            add_variant(_DISPATCH[SYMBOL_NARROW], 8, SYMBOL_NARROW, kind, code)
    return True


def want(kind: int, code: int) -> None:
    """Note that a conv the NumPy paths build serves with ``kind`` and epilogue ``code``
    (``WANTED``): a cold start's warm-up builds them (``build_wanted``)."""
    if 0 <= kind < len(KINDS) and code in CODES:
        with _WANTED_LOCK:
            _WANTED_VARIANTS.add((kind, code))
        WANTED.set()


def build_wanted() -> None:
    """``ready`` every kind and epilogue ``want`` noted (the main build)."""
    with _WANTED_LOCK:
        wanted = sorted(_WANTED_VARIANTS)
    for kind, code in wanted:
        ready(kind, code)


class Raw(NamedTuple):
    """The kernel's loops over images as ctypes functions (``raw()``): ``SYMBOL``'s
    arguments, then ``count``, ``x_step``, ``r_step``, ``y_step`` (floats from one image's
    input, residual and output to the next's); callable from Python without numba, the
    GIL released while they run."""

    fn: Any
    vw: int
    narrow: Any  # the 8-float build beside a 16-float ``fn`` once built, else None


def _decide() -> tuple[Any, Any] | None:
    """(the kernel as an ExternalFunction, as a ctypes function), or None (no vector path,
    or the build failed: callers keep their numba kernels)."""
    global _RAW
    vw = vector_width()
    if not vw:
        return None
    try:
        built = _build(vw, SYMBOL)
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the callers keep their kernels
        return None
    _RAW = Raw(built[1], vw, None)
    return built


def _decide_narrow() -> tuple[Any, Any] | None:
    """``_decide`` for the 8-float build, None where the main build is not 16 floats wide
    (or was not built)."""
    global _RAW
    if vector_width() != 16 or _FUNCTION.get() is None or _RAW is None:
        return None
    try:
        built = _build(8, SYMBOL_NARROW)
    except Exception:  # noqa: BLE001 - the callers take the main build
        return None
    _RAW = _RAW._replace(narrow=built[1])
    return built


#: Built apart: the main build first serves a cold start's stand-ins (``raw``) a second
#: sooner than both would (each ~1 s of IR text and 0.9 s of LLVM where not cached).
_FUNCTION: Once[tuple[Any, Any] | None] = Once(_decide)
_NARROW: Once[tuple[Any, Any] | None] = Once(_decide_narrow)
#: Both builds as ctypes functions, set as each is built (``raw``)
_RAW: Raw | None = None


#: Set once a model built a conv the kernel serves (any thread), so that a cold start's
#: warm-up builds it first (``raw``) for the NumPy paths that model serves on meanwhile.
WANTED = threading.Event()


def raw() -> Raw | None:
    """The kernel as ctypes functions once ``function()`` has built it in this process
    (on any thread: the cold start's warm-up builds it first), else None; never builds,
    never waits (one read: the NumPy paths ask it per call)."""
    return _RAW


def function() -> Any:
    """The kernel as a numba ``ExternalFunction`` (addresses as uintp), or None where there
    is no vector path or the build failed. Builds it once per process; thread-safe."""
    got = _FUNCTION.get() if gemm_packed.available() else None
    return None if got is None else got[0]


def narrow_function() -> Any:
    """The 8-float build beside a 16-float ``function()`` (``SYMBOL_NARROW``), else None.
    Builds it once per process; thread-safe."""
    got = _NARROW.get() if gemm_packed.available() else None
    return None if got is None else got[0]
