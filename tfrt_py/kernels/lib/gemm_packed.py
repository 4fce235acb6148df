"""A float32 product of rows by a constant matrix, over the matrix packed once at load.

Used by the native tier's products (``native/lower/products.py``: packed at lowering, stored
only packed) and by the interpreter's split Linear (``linear_par``: a second copy of
weights of at most ``linear_par.PACK_MAX_BYTES``).

``y[m, :] = x[m, :] @ W`` for ``m < M``, W (K x N, N a multiple of the panel width nr)
packed by ``pack`` into N/nr panels of K x nr floats (each panel's rows contiguous).
OpenBLAS packs W again on every call, and for a transformer's products at batch 1 (16 x
128 @ 128 x 512) that copy is a third of the call. The micro-tile is mr rows x nr columns
(``TileShape``): per k two vector loads of the panel, mr broadcasts of x, 2 * mr fused
multiply-adds into as many vector accumulators, four k steps an iteration. The whole tiles
walk W in blocks of panels of about ``PANEL_BLOCK_BYTES`` (in L2), within a block tile by
tile (a tile's rows of x stay in L1) and panel by panel, then the block's rows left, in
tiles of several panels (a pass of their own over all of W read it from memory again:
13x1024 @ 1024x4096 93 -> 132 GFLOP/s, one Intel AVX-512 thread). Each output is the
same chain of fused multiply-adds in any order of the loops, so results do not depend on
it. x and y are row-major with leading dimensions
``ldx``/``ldy``, so a block of a larger array is an operand as it is.

Paths, as MLAS dispatches (``host_paths``; ``$TFRT_PY_ISA`` forces one the host has):
``avx512`` 8 x 32 tiles in zmm registers (``P32``), ``avx2`` and ``neon`` 6 x 16 tiles in
256-bit vectors or register pairs (``P16``), ``portable`` none (the callers keep NumPy's
gemm). One path per process, decided on the first ``available()``; on a 2-core AVX-512
Xeon (2026-11-29, one thread, GFLOP/s) the AVX-512 tile against the AVX2 one and
OpenBLAS's SkylakeX sgemm: 64x576 @ 576x3136 74 / 52 / 64, 16x128 @ 128x512 97 / 73 / 70,
ViT-Tiny's 197x192 @ 192x768 71 / 47 / 70.

The kernel is LLVM IR built here with llvmlite (no optimization passes: the IR is
already the loop wanted), compiled once per process and registered with LLVM as the
symbol ``tfrt_py_sgemm_packed``, which numba code calls through an ``ExternalFunction``
(as ``kernels.lib.blas`` does NumPy's gemm): a cached generated module resolves the name
when it loads, so ``kernel()`` comes first. Nothing is built at import: ``available()``
decides the path and builds and registers its kernel on the first call (once per
process, thread-safe), and says whether there is one (False on ``portable``, or without
llvmlite's JIT: the callers keep NumPy's gemm); ``kernel()`` is the numba wrapper
``sgemm_packed``, or None there. ``from ...gemm_packed import sgemm_packed`` (the
generated modules' form) gives ``kernel()`` and fails with ImportError where it is None.

``sgemm_packed(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags, nr)``: element
offsets into flat arrays; ``flags`` 1 adds the bias ``b[bo:bo + n]`` to every row, 2 then
applies ReLU (NaN kept) as the rows are stored (``b`` must be readable for n floats even
without flag 1); ``nr`` the panel width the weights were packed for, which must be this
process's (else ValueError: nothing bakes a width into cached code, the packed array or
the generated call carries it). Stateless; any thread.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import compiled_gate, numba_target
from ...concurrency.env_switch import switched_off
from ...concurrency.isa import ENV_ISA, host_paths
from ...concurrency.isa import choose as _choose
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached

__all__ = [
    "ENV_ISA",
    "ENV_PACKED_GEMM",
    "P16",
    "P32",
    "TileShape",
    "available",
    "carried_loop",
    "chosen",
    "counted_loop",
    "host_paths",
    "kernel",
    "pack",
    "path",
    "splat",
    "state",
    "tile",
    "wide_vectors",
]

#: ``TFRT_PY_PACKED_GEMM=0``: no packed-weight products (the Linear kernel and the native
#: tier's products keep NumPy's gemm); CI runs the suite's fallback leg so.
ENV_PACKED_GEMM = "TFRT_PY_PACKED_GEMM"


class TileShape(NamedTuple):
    """One build of the kernel: ``vw`` floats per vector, ``mr`` rows per whole tile (2 *
    ``mr`` accumulators), panels of ``nr`` = 2 * ``vw`` columns; ``panels_for_rows[r]``:
    panels per tile for the r < ``mr`` rows left (8-16 accumulators each)."""

    vw: int
    mr: int
    panels_for_rows: dict[int, int]

    @property
    def nr(self) -> int:
        return 2 * self.vw


#: AVX2 and NEON (two registers per vector): 6 x 16 tiles, twelve 256-bit accumulators.
P16 = TileShape(8, 6, {1: 4, 2: 3, 3: 2, 4: 1, 5: 1})
#: AVX-512: 8 x 32 tiles, sixteen zmm accumulators (twelve rows spilled: 32 registers hold
#: 24 accumulators but not two k steps' loads besides).
P32 = TileShape(16, 8, {1: 4, 2: 3, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1})
#: the tile of each path; "portable" has none (NumPy's gemm)
_TILES = {"avx512": P32, "avx2": P16, "neon": P16}
#: The whole tiles walk W in blocks of panels of about this many bytes (in L2): per block,
#: tile by tile (its rows of x stay in L1), the block's panels.
PANEL_BLOCK_BYTES = 128 * 1024
SYMBOL = "tfrt_py_sgemm_packed"
_WIDE_ATTRS = '\nattributes #0 = { "min-legal-vector-width"="512" "prefer-vector-width"="512" }\n'


#: The source of the IR helpers here (``counted_loop``, ``carried_loop``, ``splat``,
#: ``wide_vectors``): other kernels' IR is written with them, so their machine-code cache
#: keys (``compile_ir_cached``'s sources) include it.
IR_HELPERS = (__file__,)


def wide_vectors(text: str, symbols: list[str], ret: str = "i64") -> str:
    """Module ``text`` with its functions ``symbols`` (returning ``ret``) asking for
    512-bit vectors: LLVM splits vectors wider than a CPU's preferred width (256 bits on
    the AVX-512 Xeons) unless the function asks for the wide registers."""
    for sym in symbols:
        head, rest = text.split(f'define {ret} @"{sym}"(', 1)
        args, body = rest.split(")", 1)
        text = f'{head}define {ret} @"{sym}"({args}) #0{body}'
    return text + _WIDE_ATTRS


def counted_loop(b: Any, start: Any, end: Any, step: Any, body: Any, *,
                 whole: bool = True) -> None:  # fmt: skip
    """``for i in range(start, end - step + 1, step): body(i)`` at IR builder ``b``, i64
    indices (whole steps only); ``whole=False``: ``range(start, end, step)``. ``step`` an
    int or an i64 IR value >= 1. The builder continues after the loop."""
    carried_loop(b, start, end, step, [], lambda i, _: (body(i), [])[1], whole=whole)


def carried_loop(b: Any, start: Any, end: Any, step: Any, vals: list[Any], body: Any, *,
                 whole: bool = False) -> list[Any]:  # fmt: skip
    """``for i in range(start, end, step): vals = body(i, vals)`` at IR builder ``b``, i64
    indices (``whole``: whole steps only, ``i + step <= end``; ``step`` an int or an i64
    IR value >= 1): ``vals`` carried as phis (accumulators stay in registers); their
    values after the loop. The builder continues after it."""
    import llvmlite.ir as ir

    i64 = ir.IntType(64)
    st = ir.Constant(i64, step) if isinstance(step, int) else step
    pre = b.block
    head, inner, after = (b.function.append_basic_block() for _ in range(3))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(start, pre)
    phis = []
    for v in vals:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    go = b.icmp_signed("<=", b.add(i, st), end) if whole else b.icmp_signed("<", i, end)
    b.cbranch(go, inner, after)
    b.position_at_end(inner)
    got = body(i, phis)
    for p, v in zip(phis, got):
        p.add_incoming(v, b.block)
    i.add_incoming(b.add(i, st), b.block)
    b.branch(head)
    b.position_at_end(after)
    return phis


def splat(b: Any, value: Any, n: int) -> Any:
    """A vector of ``n`` copies of the scalar IR ``value`` at builder ``b``."""
    import llvmlite.ir as ir

    vt, i32 = ir.VectorType(value.type, n), ir.IntType(32)
    e = b.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(i32, 0))
    return b.shuffle_vector(e, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(i32, n), [0] * n))  # fmt: skip


_LOCK = threading.Lock()
#: [(path, why, tile or None, numba ExternalFunction or None, engine or None)] once decided
_STATE: list[tuple[str, str, TileShape | None, Any, Any]] = []


def pack(w: np.ndarray, shape: TileShape | None = None) -> np.ndarray:
    """W (K x N, N a multiple of the panel width) as the kernel's panels: (N/nr, K, nr), C
    order, float32; ``shape``: this process's tile (``tile()``) unless given."""
    shape = shape or tile()
    if shape is None:
        raise ValueError("no packed-weight gemm kernel in this process")
    k, n = w.shape
    nr = shape.nr
    return np.ascontiguousarray(w.astype(np.float32).reshape(k, n // nr, nr).transpose(1, 0, 2))


class _PackedGemmIR:
    """Builds the module of ``SYMBOL(x, ldx, w, y, ldy, M, K, panels, bias, flags, nr) ->
    status`` to one ``TileShape`` with llvmlite's IR builder: whole tiles of ``mr`` rows
    panel by panel, then the rows left in tiles of several panels. The status is 0, or 1
    (nothing done) when ``nr`` is not this build's panel width. One use: ``text()``."""

    #: The rows left after the whole tiles as tiles of their binary digits (``rows_left``):
    #: four tile shapes' code instead of ``mr - 1``, where the code's size is what costs
    #: (``gemm_cols``: LLVM's code generation is most of a fresh process's build).
    SPLIT_LEFT = False

    def __init__(self, shape: TileShape) -> None:
        ir, fp, i64 = self.types(shape, "tfrt_py_gemm")
        self.fn = ir.Function(self.mod, ir.FunctionType(i64, [fp, i64, fp, fp, i64, i64, i64,
                              i64, fp, i64, i64]), name=SYMBOL)  # fmt: skip
        (self.x, self.ldx, self.w, self.y, self.ldy, self.m_rows, self.k_len, self.panels,
         self.bias, flags, width) = self.fn.args  # fmt: skip
        self.symbol = SYMBOL
        b = self.start(width)
        self.add_bias = b.icmp_unsigned("!=", b.and_(flags, self.c(1)), self.c(0))
        self.relu = b.icmp_unsigned("!=", b.and_(flags, self.c(2)), self.c(0))

    def types(self, shape: TileShape, module: str) -> tuple[Any, Any, Any]:
        """Set the tile's sizes, the IR types (``i64``, ``i32``, ``v8`` -- a vector of ``vw``
        floats -- and ``v8p``), the module ``mod`` named ``module`` and its ``fma``
        intrinsic; returns (llvmlite.ir, a float pointer type, i64) for the signature."""
        import llvmlite.ir as ir

        self.ir = ir
        vw = shape.vw
        self.vw, self.mr, self.nr = vw, shape.mr, 2 * vw
        self.panels_for_rows = shape.panels_for_rows
        f32, i64 = ir.FloatType(), ir.IntType(64)
        self.i64, self.i32 = i64, ir.IntType(32)
        self.v8 = v8 = ir.VectorType(f32, vw)
        self.v8p = v8.as_pointer()
        self.mod = ir.Module(name=module)
        self.fma = ir.Function(self.mod, ir.FunctionType(v8, [v8, v8, v8]),
                               name=f"llvm.fma.v{vw}f32")  # fmt: skip
        return ir, f32.as_pointer(), i64

    def start(self, width: Any) -> Any:
        """The function's entry (x, w, y noalias): status 1 when ``width`` is not ``nr``;
        sets ``b`` (at the work's block), ``zero``, ``splat`` and ``none`` (no lane);
        returns ``b``."""
        ir = self.ir
        for a in (self.x, self.w, self.y):
            a.add_attribute("noalias")
        self.b = b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        wrong, work = self.fn.append_basic_block("wrong_width"), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed("!=", width, self.c(self.nr)), wrong, work)
        b.position_at_end(wrong)
        b.ret(self.c(1))
        b.position_at_end(work)
        self.zero = ir.Constant(self.v8, [0.0] * self.vw)
        self.splat = ir.Constant(ir.VectorType(self.i32, self.vw), [0] * self.vw)
        self.none = ir.Constant(ir.VectorType(ir.IntType(1), self.vw), [0] * self.vw)
        return b

    #: Whole tiles (``mr`` rows each) up to which a whole tile's k loop also prefetches
    #: its share of the panel that the next block of panels reads in its place (tile i
    #: from ``i / tiles`` of it on, at the pace of its k): a panel read by few tiles is
    #: read from memory by the first of them, at the rate of its multiply-adds, while the
    #: others read it from L2 and no memory is read; with the prefetches the next panels
    #: stream during all of them. Past it (a panel read by many tiles, its first read a
    #: small share) they only cost. 0: none -- this build's (its 8-row k loop on AVX-512
    #: spilled its accumulators with the prefetch pointer: 0.6x), and any whose panels are
    #: not laid one after another in ``w``; ``gemm_indirect`` sets it.
    PREFETCH_TILES = 0
    #: Cache lines prefetched an iteration of such a k loop (the share of 4 tiles or more
    #: in whole: an iteration reads ``UNROLL * 4 * nr`` bytes of its own panel).
    PREFETCH_LINES = 2
    #: Whether the whole tiles being emitted prefetch (``walk``).
    ahead = False

    #: steps of k an iteration of a tile's loop (then the rest one at a time). Four against
    #: two, one process, interleaved (2-core Intel Xeon with AVX-512, 2026-12-05, one
    #: thread, GFLOP/s): ViT-Tiny's 197x192 @ 192x576 200 -> 211, BERT's 128x256 @ 256x1024
    #: 214 -> 227, 512x512 @ 512x512 189 -> 201; ResNet-18's 3x3 convs on gemm_indirect
    #: 190-201 -> 204-216 (512x7x7 143 -> 149); with AVX2's tile forced 118 -> 119-124.
    UNROLL = 4

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        """The whole function: full tiles, then the 1..mr-1 rows left."""
        self.walk()
        return self.finish()

    def walk(self) -> None:
        """Emit the tiles over ``self.panels`` whole panels, block of panels by block: full
        tiles of ``mr`` rows, then the block's 1..mr-1 rows left."""
        b, c = self.b, self.c
        # whole tiles of mr rows (2 * mr accumulators each): per block of panels (in L2),
        # tile by tile (the tile's rows of x in L1), the block's panels
        tiles = b.sdiv(self.m_rows, c(self.mr))
        full = b.mul(tiles, c(self.mr))
        # a panel's row (one k, or one group of k) is 4 * nr bytes in every build
        per_block = b.sdiv(c(PANEL_BLOCK_BYTES), b.mul(self.panel_rows(), c(4 * self.nr)))
        per_block = b.select(b.icmp_signed("<", per_block, c(1)), c(1), per_block)

        def block(p0: Any) -> None:
            end = b.add(p0, per_block)
            end = b.select(b.icmp_signed(">", end, self.panels), self.panels, end)

            def whole_tiles(fetch: bool) -> None:
                self.ahead = fetch
                self.loop(
                    c(0),
                    full,
                    self.mr,
                    lambda m0: self.loop(p0, end, 1, lambda p: self.tile(p, m0, self.mr, 1)),
                )
                self.ahead = False

            if self.PREFETCH_TILES:
                few, many, after = (self.fn.append_basic_block() for _ in range(3))
                b.cbranch(b.icmp_signed("<=", tiles, c(self.PREFETCH_TILES)), few, many)
                for at, fetch in ((few, True), (many, False)):
                    b.position_at_end(at)
                    whole_tiles(fetch)
                    b.branch(after)
                b.position_at_end(after)
            else:
                whole_tiles(False)

            # the 1..mr-1 rows left, while the block is in cache: several panels per tile,
            # so that a single row still keeps eight independent accumulators (an FMA's
            # latency covered), then panel by panel
            def left(m0: Any, rows: int) -> None:
                npan = self.panels_for_rows[rows]
                start = b.add(p0, b.mul(b.sdiv(b.sub(end, p0), c(npan)), c(npan)))
                self.loop(p0, start, npan, lambda p: self.tile(p, m0, rows, npan))
                self.loop(start, end, 1, lambda p: self.tile(p, m0, rows, 1))

            self.rows_left(full, left)

        self.loop(c(0), self.panels, per_block, block, whole=False)

    def rows_left(self, full: Any, emit: Any) -> None:
        """``emit(m0, rows)`` for the 1..mr-1 rows after the ``full`` ones: a switch on how
        many there are (``m0`` = ``full``), or with ``SPLIT_LEFT`` their binary digits, a
        tile of each power of two under ``mr`` that is set (8, 4, 2, 1 rows for 14-row
        tiles; ``m0`` its first row); the builder continues after it."""
        b, c = self.b, self.c
        left = b.sub(self.m_rows, full)
        if self.SPLIT_LEFT:
            rows = 1 << ((self.mr - 1).bit_length() - 1)
            m0 = full
            while rows:
                yes, after = self.fn.append_basic_block(), self.fn.append_basic_block()
                b.cbranch(b.icmp_unsigned("!=", b.and_(left, c(rows)), c(0)), yes, after)
                b.position_at_end(yes)
                emit(m0, rows)
                b.branch(after)
                b.position_at_end(after)
                m0 = b.add(m0, b.and_(left, c(rows)))
                rows //= 2
            return
        done = self.fn.append_basic_block()
        sw = b.switch(left, done)
        for rows in range(1, self.mr):
            blk = self.fn.append_basic_block()
            sw.add_case(c(rows), blk)
            b.position_at_end(blk)
            emit(full, rows)
            b.branch(done)
        b.position_at_end(done)

    def finish(self) -> str:
        """Return 0 at the builder and give the module's text (the wide-vector attributes
        where the vectors are wider than 256 bits)."""
        self.b.ret(self.c(0))
        text = str(self.mod)
        return wide_vectors(text, [self.symbol]) if self.vw * 32 > 256 else text

    def loop(self, start: Any, end: Any, step: Any, body: Any, *, whole: bool = True) -> None:
        """``counted_loop`` at this builder."""
        counted_loop(self.b, start, end, step, body, whole=whole)

    def tile(self, p: Any, m0: Any, rows: int, npan: int) -> None:
        """Rows m0..m0+rows of panels p..p+npan: a k loop over 2*rows*npan accumulators
        (``k_loop``), then the epilogue and the stores."""
        out = self.k_loop(p, m0, rows, npan, [self.zero] * (2 * rows * npan))
        self.epilogue(p, m0, rows, npan, out)

    def k_loop(self, p: Any, m0: Any, rows: int, npan: int, start: list[Any]) -> list[Any]:
        """The k loop of a tile from the accumulators' values ``start`` (at the builder's
        block); ``UNROLL`` steps an iteration, then the 0..UNROLL-1 steps left one at a
        time, the whole iterations prefetching where ``ahead`` is set (``PREFETCH_TILES``).
        Returns their values after it, at the builder's (new) block."""
        b, c = self.b, self.c
        fetch = self.ahead and rows == self.mr and npan == 1
        fx0, pace = self.fetch_start(p, m0) if fetch else (None, None)
        pre = b.block
        head, body, rest_head, rest, done = (self.fn.append_basic_block() for _ in range(5))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(self.i64)
        k.add_incoming(c(0), pre)
        fx = None
        if fx0 is not None:
            fx = b.phi(self.i64)
            fx.add_incoming(fx0, pre)
        acc = []
        for v0 in start:
            a = b.phi(self.v8)
            a.add_incoming(v0, pre)
            acc.append(a)
        u = self.UNROLL
        b.cbranch(b.icmp_signed("<=", b.add(k, c(u)), self.k_len), body, rest_head)
        b.position_at_end(body)
        if fx is not None:
            self.prefetch_lines(fx)
        new = self.k_step(p, m0, rows, npan, k, acc)
        for step in range(1, u):
            new = self.k_step(p, m0, rows, npan, b.add(k, c(step)), new)
        k.add_incoming(b.add(k, c(u)), b.block)
        if fx is not None:
            fx.add_incoming(b.add(fx, b.mul(pace, c(u))), b.block)
        for a, v in zip(acc, new, strict=True):
            a.add_incoming(v, b.block)
        b.branch(head)
        # the k left (K not a multiple of UNROLL): one step an iteration
        b.position_at_end(rest_head)
        k1 = b.phi(self.i64)
        k1.add_incoming(k, head)
        out = []
        for a in acc:
            phi = b.phi(self.v8)
            phi.add_incoming(a, head)
            out.append(phi)
        b.cbranch(b.icmp_signed("<", k1, self.k_len), rest, done)
        b.position_at_end(rest)
        last = self.k_step(p, m0, rows, npan, k1, out)
        k1.add_incoming(b.add(k1, c(1)), b.block)
        for phi, v in zip(out, last, strict=True):
            phi.add_incoming(v, b.block)
        b.branch(rest_head)
        b.position_at_end(done)
        return out

    def fetch_start(self, p: Any, m0: Any) -> tuple[Any, Any]:
        """Where whole tile ``m0``'s k loop on panel ``p`` starts prefetching (a byte of
        ``w``) and its pace (bytes a k): a build with ``PREFETCH_TILES`` defines it."""
        raise NotImplementedError

    def prefetch_fn(self) -> Any:
        """The module's ``llvm.prefetch`` (declared on first use): (i8* address, 0 read /
        1 write, locality 0-3, 1 the data cache); a prefetch never faults."""
        ir, i32 = self.ir, self.i32
        fn = self.mod.globals.get("llvm.prefetch.p0i8")
        if fn is None:
            i8p = ir.IntType(8).as_pointer()
            fn = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                             name="llvm.prefetch.p0i8")  # fmt: skip
        return fn

    def prefetch_lines(self, at: Any) -> None:
        """Prefetch ``PREFETCH_LINES`` cache lines from byte ``at`` of ``w`` into L2."""
        b, ir = self.b, self.ir
        i8p, i32 = ir.IntType(8).as_pointer(), self.i32
        fn = self.prefetch_fn()
        w8 = b.bitcast(self.w, i8p)
        # a read (0), locality 2 (prefetcht1: L2 and out), the data cache (1); a prefetch
        # never faults
        args = [ir.Constant(i32, n) for n in (0, 2, 1)]
        for line in range(self.PREFETCH_LINES):
            b.call(fn, [b.gep(w8, [b.add(at, self.c(64 * line))]), *args])

    def k_step(self, p: Any, m0: Any, rows: int, npan: int, k: Any, acc: list[Any]) -> list[Any]:
        """One k of the tile: the panels' two vectors at row k, each x[m, k] broadcast,
        ``acc`` + their products (the accumulators' new values)."""
        b, ir, v8 = self.b, self.ir, self.v8
        wv = [v for j in range(npan) for v in self.panel_vectors(p, j, k)]
        nv = len(wv)  # the vectors a row of the tile accumulates
        new = []
        for r in range(rows):
            xs = b.load(b.gep(self.x, [self.x_index(m0, r, k)]))
            xb = b.insert_element(ir.Constant(v8, ir.Undefined), xs, ir.Constant(self.i32, 0))
            xb = b.shuffle_vector(xb, ir.Constant(v8, ir.Undefined), self.splat)
            new += [b.call(self.fma, [wv[q], xb, acc[r * nv + q]]) for q in range(nv)]
        return new

    def x_index(self, m0: Any, r: int, k: Any) -> Any:
        """The element of x (the rows broadcast) that row ``m0 + r`` reads at step ``k``."""
        b = self.b
        return b.add(b.mul(b.add(m0, self.c(r)), self.ldx), k)

    def panel_rows(self) -> Any:
        """A panel's rows (its bytes, for the blocks of panels ``walk`` keeps in L2)."""
        return self.k_len

    def panel_vectors(self, p: Any, j: int, k: Any) -> list[Any]:
        """Panel ``p + j``'s two vectors at row ``k`` (panels of K x nr, one after another)."""
        b, c = self.b, self.c
        at = b.add(b.mul(b.add(p, c(j)), b.mul(self.k_len, c(self.nr))), b.mul(k, c(self.nr)))
        return [b.load(b.bitcast(b.gep(self.w, [b.add(at, c(self.vw * h))]), self.v8p), align=4)
                for h in range(2)]  # fmt: skip

    def epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """+ bias (flag 1; the pointer is always readable), then ReLU (flag 2; NaN kept, as
        the interpreter's x < 0 ? 0 : x), and the stores of the tile's rows."""
        b, c, zero = self.b, self.c, self.zero
        for j in range(npan):
            col = b.mul(b.add(p, c(j)), c(self.nr))
            at = [b.gep(self.bias, [b.add(col, c(self.vw * h))]) for h in range(2)]
            bv = [b.load(b.bitcast(a, self.v8p), align=4) for a in at]
            bv = [b.select(self.add_bias, v, zero) for v in bv]
            for r in range(rows):
                row = b.add(b.mul(b.add(m0, c(r)), self.ldy), col)
                for h in range(2):
                    v = b.fadd(acc[r * 2 * npan + 2 * j + h], bv[h])
                    neg = b.select(self.relu, b.fcmp_ordered("<", v, zero), self.none)
                    v = b.select(neg, zero, v)
                    b.store(v, b.bitcast(b.gep(self.y, [b.add(row, c(self.vw * h))]), self.v8p),
                            align=4)  # fmt: skip


def _build(shape: TileShape = P16) -> str:
    """The module text of the kernel built to ``shape`` (``_PackedGemmIR``)."""
    return _PackedGemmIR(shape).text()


def _register() -> tuple[str, str, TileShape | None, Any, Any]:
    try:
        from numba import types

        path, why = _choose()
        shape = _TILES.get(path)
        if shape is None:
            return path, why, None, None, None
        key = f"gemm_packed|{shape!r}|{SYMBOL}"
        engine, cached = compile_ir_cached(lambda: _build(shape), key, (__file__,), opt=3)
        _ORIGIN[:] = ["the machine code from the cache" if cached else "built"]
        add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the lowering keeps gemm
        return "portable", f"the kernel did not build: {type(e).__name__}", None, None, None
    p, n = types.uintp, types.int64
    fn = types.ExternalFunction(SYMBOL, types.int64(p, n, p, p, n, n, n, n, p, n, n))
    return path, why, shape, fn, engine


#: ["built"] or ["the machine code from the cache"], once the kernel is made
_ORIGIN: list[str] = []


def origin() -> str:
    """How the process's kernel was made ("" before it was, or where there is none)."""
    return _ORIGIN[0] if _ORIGIN else ""


def _decided() -> tuple[str, str, TileShape | None, Any, Any]:
    with _LOCK:
        if not _STATE:
            _STATE.append(_register())
        return _STATE[0]


def state() -> bool | None:
    """``available()``'s answer once decided, None before (builds nothing)."""
    return (_STATE[0][2] is not None) if _STATE else None


def chosen() -> tuple[str, str, TileShape | None] | None:
    """(path, why, tile) once decided, None before (builds nothing)."""
    return _STATE[0][:3] if _STATE else None


def path() -> tuple[str, str]:
    """(this process's kernel path, why it was chosen): ``avx512``, ``avx2``, ``neon`` or
    ``portable``. Decides (and builds the kernel) on the first call."""
    got = _decided()
    return got[0], got[1]


def tile() -> TileShape | None:
    """The tile this process's kernel computes (so ``pack``'s panel width), None where
    ``available()`` is False."""
    return _decided()[2] if available() else None


def available() -> bool:
    """Whether the kernel is built and registered (once per process; thread-safe). False
    while ``$TFRT_PY_PACKED_GEMM`` is ``0`` (read on each call; the products then keep
    NumPy's gemm)."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return False
    return _decided()[2] is not None


_kern: Any = None  # the registered kernel as a numba ExternalFunction (set by kernel())
_KERNEL: list[Any] = []  # [the compiled wrapper] once built


def kernel() -> Any:
    """The numba wrapper ``sgemm_packed`` (signature in the module docstring), built on
    first use; None where ``available()`` is False. Thread-safe."""
    global _kern
    if not available():
        return None
    with _LOCK:
        if not _KERNEL:
            numba = numba_target.import_numba()
            _kern = _STATE[0][3]
            _KERNEL.append(numba.njit(nogil=True, cache=True)(_sgemm_packed))
        return _KERNEL[0]


def __getattr__(name: str) -> Any:
    """``sgemm_packed``: ``kernel()``, for ``from ...gemm_packed import sgemm_packed``."""
    if name == "sgemm_packed":
        fn = kernel()
        if fn is not None:
            return fn
        raise AttributeError("the packed-weight gemm kernel cannot run on this host")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _sgemm_packed(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags, nr):
    px = x.ctypes.data + np.uint64(xo * 4)
    pw = w.ctypes.data + np.uint64(wo * 4)
    py = y.ctypes.data + np.uint64(yo * 4)
    pb = b.ctypes.data + np.uint64(bo * 4)
    if _kern(px, ldx, pw, py, ldy, m, k, n // nr, pb, flags, nr) != 0:
        raise ValueError("weights packed for another panel width than this process's kernel")
