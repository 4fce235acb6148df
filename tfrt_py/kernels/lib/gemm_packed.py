"""A float32 product of rows by a constant matrix, over the matrix packed once at load.

Used by the native tier's products (``native/lower/products.py``: packed at lowering, stored
only packed) and by the interpreter's split Linear (``linear_par``: a second copy of
weights of at most ``linear_par.PACK_MAX_BYTES``).

``y[m, :] = x[m, :] @ W`` for ``m < M``, W (K x N, N a multiple of 16) packed by
``pack16`` into N/16 panels of K x 16 floats (each panel's rows contiguous). OpenBLAS
packs W again on every call, and for a transformer's products at batch 1 (16 x 128 @ 128
x 512) that copy is a third of the call: 64 GFLOP/s, against ~85 here and ~100 for a big
product on one core of this machine. The micro-tile is 6 rows x 16 columns: per k two
vector loads of the panel, six broadcasts of x, twelve fused multiply-adds into twelve
AVX accumulators, two k steps an iteration. The whole tiles walk W in blocks of panels of
about ``PANEL_BLOCK_BYTES`` (in L2), within a block tile by tile (a tile's rows of x stay
in L1) and panel by panel; then the 1-5 rows left, in tiles of several panels. Each
output is the same chain of fused multiply-adds in any order of the loops, so results do
not depend on it. x and y are row-major with leading dimensions ``ldx``/``ldy``, so a block of a
larger array is an operand as it is.

The kernel is LLVM IR built here with llvmlite (no optimization passes: the IR is
already the loop wanted), compiled once per process and registered with LLVM as the
symbol ``tfrt_py_sgemm_p16``, which numba code calls through an ``ExternalFunction``
(as ``kernels.lib.blas`` does NumPy's gemm): a cached generated module resolves the name
when it loads, so ``kernel()`` comes first. Nothing is built at import: ``available()``
builds and registers the kernel on its first call (once per process, thread-safe) and
says whether this host runs it (False on an x86 CPU without AVX2 and FMA, or without
llvmlite's JIT: the callers keep NumPy's gemm); ``kernel()`` is the numba wrapper
``gemm_p16``, or None there. ``from ...gemm_packed import gemm_p16`` (the generated
modules' form) gives ``kernel()`` and fails with ImportError where it is None.

``gemm_p16(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags)``: element offsets into
flat arrays; ``flags`` 1 adds the bias ``b[bo:bo + n]`` to every row, 2 then applies ReLU
(NaN kept) as the rows are stored (``b`` must be readable for n floats even without flag
1). Stateless; any thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir

__all__ = ["ENV_PACKED_GEMM", "MR", "available", "kernel", "pack16", "state"]

#: ``TFRT_PY_PACKED_GEMM=0``: no packed-weight products (the Linear kernel and the native
#: tier's products keep NumPy's gemm); CI runs the suite's fallback leg so.
ENV_PACKED_GEMM = "TFRT_PY_PACKED_GEMM"

MR = 6  # rows per tile
NR = 16  # columns per panel (two 8-float vectors)
#: panels per tile for the rows left after whole tiles: 8-12 accumulators each
_PANELS_FOR_ROWS = {1: 4, 2: 3, 3: 2, 4: 1, 5: 1}
#: The whole tiles walk W in blocks of panels of about this many bytes (in L2): per block,
#: tile by tile (its rows of x stay in L1), the block's panels.
PANEL_BLOCK_BYTES = 128 * 1024
SYMBOL = "tfrt_py_sgemm_p16"

_LOCK = threading.Lock()
_STATE: list[Any] = []  # [(ExternalFunction type, execution engine)] or [None]


def pack16(w: np.ndarray) -> np.ndarray:
    """W (K x N, N % 16 == 0) as the kernel's panels: (N/16, K, 16), C order, float32."""
    k, n = w.shape
    return np.ascontiguousarray(w.astype(np.float32).reshape(k, n // NR, NR).transpose(1, 0, 2))


def _host_ok() -> bool:
    import llvmlite.binding as llvm

    triple = llvm.get_process_triple()
    if not triple.startswith(("x86_64", "i386", "i686")):
        return triple.startswith("aarch64")  # NEON: fma and two registers per vector
    feats = llvm.get_host_cpu_features()
    return bool(feats.get("avx2")) and bool(feats.get("fma"))


class _PackedGemmIR:
    """Builds the module of ``tfrt_py_sgemm_p16(x, ldx, w, y, ldy, M, K, panels, bias,
    flags)`` with llvmlite's IR builder: whole tiles of ``MR`` rows panel by panel, then the
    rows left in tiles of several panels (``_PANELS_FOR_ROWS``). One use: ``text()``."""

    def __init__(self) -> None:
        import llvmlite.ir as ir

        self.ir = ir
        f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
        self.i64, self.i32 = i64, i32
        self.v8 = v8 = ir.VectorType(f32, 8)
        fp, self.v8p = f32.as_pointer(), v8.as_pointer()
        self.mod = ir.Module(name="tfrt_py_gemm")
        self.fma = ir.Function(self.mod, ir.FunctionType(v8, [v8, v8, v8]), name="llvm.fma.v8f32")
        self.fn = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [fp, i64, fp, fp, i64,
                              i64, i64, i64, fp, i64]), name=SYMBOL)  # fmt: skip
        (self.x, self.ldx, self.w, self.y, self.ldy, self.m_rows, self.k_len, self.panels,
         self.bias, flags) = self.fn.args  # fmt: skip
        for a in (self.x, self.w, self.y):
            a.add_attribute("noalias")
        self.b = b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.zero = ir.Constant(v8, [0.0] * 8)
        self.splat = ir.Constant(ir.VectorType(i32, 8), [0] * 8)
        self.add_bias = b.icmp_unsigned("!=", b.and_(flags, self.c(1)), self.c(0))
        self.relu = b.icmp_unsigned("!=", b.and_(flags, self.c(2)), self.c(0))
        self.none = ir.Constant(ir.VectorType(ir.IntType(1), 8), [0] * 8)

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)

    def text(self) -> str:
        """The whole function: full tiles, then the 1..MR-1 rows left."""
        b, c = self.b, self.c
        # whole tiles of MR rows (twelve accumulators each): per block of panels (in L2),
        # tile by tile (the tile's rows of x in L1), the block's panels
        full = b.mul(b.sdiv(self.m_rows, c(MR)), c(MR))
        per_block = b.sdiv(c(PANEL_BLOCK_BYTES), b.mul(self.k_len, c(4 * NR)))
        per_block = b.select(b.icmp_signed("<", per_block, c(1)), c(1), per_block)

        def block(p0: Any) -> None:
            end = b.add(p0, per_block)
            end = b.select(b.icmp_signed(">", end, self.panels), self.panels, end)

            def panels_of_tile(m0: Any) -> None:
                self.loop(p0, end, 1, lambda p: self.tile(p, m0, MR, 1))

            self.loop(c(0), full, MR, panels_of_tile)

        self.loop(c(0), self.panels, per_block, block, whole=False)
        # the 1..MR-1 rows left: several panels per tile, so that a single row still keeps
        # eight independent accumulators (an FMA's latency covered), then panel by panel
        done = self.fn.append_basic_block()
        sw = b.switch(b.sub(self.m_rows, full), done)
        for rows in range(1, MR):
            blk = self.fn.append_basic_block()
            sw.add_case(c(rows), blk)
            b.position_at_end(blk)
            npan = _PANELS_FOR_ROWS[rows]
            start = b.mul(b.sdiv(self.panels, c(npan)), c(npan))
            self.loop(c(0), self.panels, npan, lambda p, r=rows, q=npan: self.tile(p, full, r, q))
            self.loop(start, self.panels, 1, lambda p, r=rows: self.tile(p, full, r, 1))
            b.branch(done)
        b.position_at_end(done)
        b.ret_void()
        return str(self.mod)

    def loop(self, start: Any, end: Any, step: Any, body: Any, *, whole: bool = True) -> None:
        """``for i in range(start, end - step + 1, step): body(i)`` at the builder (whole
        steps only); ``whole=False``: ``range(start, end, step)``. ``step`` an int or an IR
        value >= 1."""
        b = self.b
        st = self.c(step) if isinstance(step, int) else step
        pre = b.block
        head, inner, after = (self.fn.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(self.i64)
        i.add_incoming(start, pre)
        go = b.icmp_signed("<=", b.add(i, st), end) if whole else b.icmp_signed("<", i, end)
        b.cbranch(go, inner, after)
        b.position_at_end(inner)
        body(i)
        i.add_incoming(b.add(i, st), b.block)
        b.branch(head)
        b.position_at_end(after)

    def tile(self, p: Any, m0: Any, rows: int, npan: int) -> None:
        """Rows m0..m0+rows of panels p..p+npan: a k loop over 2*rows*npan accumulators, two
        steps of k an iteration (then the odd one), then the epilogue and the stores."""
        b, c = self.b, self.c
        pre = b.block
        head, body, odd_head, odd, done = (self.fn.append_basic_block() for _ in range(5))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(self.i64)
        k.add_incoming(c(0), pre)
        acc = []
        for _ in range(2 * rows * npan):
            a = b.phi(self.v8)
            a.add_incoming(self.zero, pre)
            acc.append(a)
        b.cbranch(b.icmp_signed("<=", b.add(k, c(2)), self.k_len), body, odd_head)
        b.position_at_end(body)
        new = self.k_step(p, m0, rows, npan, k, acc)
        new = self.k_step(p, m0, rows, npan, b.add(k, c(1)), new)
        k.add_incoming(b.add(k, c(2)), b.block)
        for a, v in zip(acc, new, strict=True):
            a.add_incoming(v, b.block)
        b.branch(head)
        # the odd k left (K odd): one more step
        b.position_at_end(odd_head)
        b.cbranch(b.icmp_signed("<", k, self.k_len), odd, done)
        b.position_at_end(odd)
        last = self.k_step(p, m0, rows, npan, k, acc)
        b.branch(done)
        b.position_at_end(done)
        out = []
        for a, v in zip(acc, last, strict=True):
            phi = b.phi(self.v8)
            phi.add_incoming(a, odd_head)
            phi.add_incoming(v, odd)
            out.append(phi)
        self.epilogue(p, m0, rows, npan, out)

    def k_step(self, p: Any, m0: Any, rows: int, npan: int, k: Any, acc: list[Any]) -> list[Any]:
        """One k of the tile: the panels' two vectors at row k, each x[m, k] broadcast,
        ``acc`` + their products (the accumulators' new values)."""
        b, c, ir, v8 = self.b, self.c, self.ir, self.v8
        wv = []
        for j in range(npan):
            at = b.add(b.mul(b.add(p, c(j)), b.mul(self.k_len, c(NR))), b.mul(k, c(NR)))
            wv += [b.load(b.bitcast(b.gep(self.w, [b.add(at, c(8 * h))]), self.v8p), align=4)
                   for h in range(2)]  # fmt: skip
        new = []
        for r in range(rows):
            xs = b.load(b.gep(self.x, [b.add(b.mul(b.add(m0, c(r)), self.ldx), k)]))
            xb = b.insert_element(ir.Constant(v8, ir.Undefined), xs, ir.Constant(self.i32, 0))
            xb = b.shuffle_vector(xb, ir.Constant(v8, ir.Undefined), self.splat)
            new += [b.call(self.fma, [wv[q], xb, acc[r * 2 * npan + q]]) for q in range(2 * npan)]
        return new

    def epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """+ bias (flag 1; the pointer is always readable), then ReLU (flag 2; NaN kept, as
        the interpreter's x < 0 ? 0 : x), and the stores of the tile's rows."""
        b, c, zero = self.b, self.c, self.zero
        for j in range(npan):
            col = b.mul(b.add(p, c(j)), c(NR))
            bv = [b.load(b.bitcast(b.gep(self.bias, [b.add(col, c(8 * h))]), self.v8p), align=4)
                  for h in range(2)]  # fmt: skip
            bv = [b.select(self.add_bias, v, zero) for v in bv]
            for r in range(rows):
                row = b.add(b.mul(b.add(m0, c(r)), self.ldy), col)
                for h in range(2):
                    v = b.fadd(acc[r * 2 * npan + 2 * j + h], bv[h])
                    neg = b.select(self.relu, b.fcmp_ordered("<", v, zero), self.none)
                    v = b.select(neg, zero, v)
                    b.store(v, b.bitcast(b.gep(self.y, [b.add(row, c(8 * h))]), self.v8p),
                            align=4)  # fmt: skip


def _build() -> str:
    """The module text of ``tfrt_py_sgemm_p16`` (``_PackedGemmIR``)."""
    return _PackedGemmIR().text()


def _register() -> Any:
    try:
        from numba import types

        if not _host_ok():
            return None
        engine = compile_ir(_build(), host_cpu=True, opt=3)
        add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the lowering keeps gemm
        return None
    p, n = types.uintp, types.int64
    return types.ExternalFunction(SYMBOL, types.void(p, n, p, p, n, n, n, n, p, n)), engine


def state() -> bool | None:
    """``available()``'s answer once decided, None before (builds nothing)."""
    return (_STATE[0] is not None) if _STATE else None


def available() -> bool:
    """Whether the kernel is built and registered (once per process; thread-safe). False
    while ``$TFRT_PY_PACKED_GEMM`` is ``0`` (read on each call; the products then keep
    NumPy's gemm)."""
    if switched_off(ENV_PACKED_GEMM):
        return False
    with _LOCK:
        if not _STATE:
            _STATE.append(_register())
        return _STATE[0] is not None


_p16: Any = None  # the registered kernel as a numba ExternalFunction (set by kernel())
_KERNEL: list[Any] = []  # [the compiled wrapper] once built


def kernel() -> Any:
    """The numba wrapper ``gemm_p16`` (signature below), built on first use; None where
    ``available()`` is False. Thread-safe."""
    global _p16
    if not available():
        return None
    with _LOCK:
        if not _KERNEL:
            from numba import njit

            _p16 = _STATE[0][0]
            _KERNEL.append(njit(nogil=True, cache=True)(_gemm_p16))
        return _KERNEL[0]


def __getattr__(name: str) -> Any:
    """``gemm_p16``: ``kernel()``, for ``from ...gemm_packed import gemm_p16``."""
    if name == "gemm_p16":
        fn = kernel()
        if fn is not None:
            return fn
        raise AttributeError("the packed-weight gemm kernel cannot run on this host")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _gemm_p16(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags):
    px = x.ctypes.data + np.uint64(xo * 4)
    pw = w.ctypes.data + np.uint64(wo * 4)
    py = y.ctypes.data + np.uint64(yo * 4)
    pb = b.ctypes.data + np.uint64(bo * 4)
    _p16(px, ldx, pw, py, ldy, m, k, n // 16, pb, flags)
