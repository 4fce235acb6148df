"""A float32 product of a few rows by a constant matrix, over weights packed at lowering.

``y[m, :] = x[m, :] @ W`` for ``m < M``, W (K x N, N a multiple of 16) packed by
``pack16`` into N/16 panels of K x 16 floats (each panel's rows contiguous). OpenBLAS
packs W again on every call, and for a transformer's products at batch 1 (16 x 128 @ 128
x 512) that copy is a third of the call: 64 GFLOP/s, against ~85 here and ~100 for a big
product on one core of this machine. The micro-tile is 6 rows x 16 columns: per k two
vector loads of the panel, six broadcasts of x, twelve fused multiply-adds into twelve
AVX accumulators; each panel is walked by tiles of 6 rows, then one tile of the 1-5 rows
left. x and y are row-major with leading dimensions ``ldx``/``ldy``, so a block of a
larger array is an operand as it is.

The kernel is LLVM IR built here with llvmlite (no optimization passes: the IR is
already the loop wanted), compiled once per process and registered with LLVM as the
symbol ``tfrt_py_sgemm_p16``, which numba code calls through an ``ExternalFunction``
(as ``kernels.blas`` does NumPy's gemm): a cached generated module resolves the name
when it loads, so importing this module comes first. ImportError where the host cannot
run it well (an x86 CPU without AVX2 and FMA): ``available()`` says so first, and the
lowering keeps NumPy's gemm.

``gemm_p16(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags)``: element offsets into
flat arrays; ``flags`` 1 adds the bias ``b[bo:bo + n]`` to every row, 2 then applies ReLU
(NaN kept) as the rows are stored (``b`` must be readable for n floats even without flag
1). Stateless; any thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["MR", "available", "gemm_p16", "pack16"]

MR = 6  # rows per tile
NR = 16  # columns per panel (two 8-float vectors)
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


def _build() -> Any:
    """The module text of ``tfrt_py_sgemm_p16(x, ldx, w, y, ldy, M, K, panels)``."""
    import llvmlite.ir as ir

    f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
    v8 = ir.VectorType(f32, 8)
    fp, v8p = f32.as_pointer(), v8.as_pointer()
    mod = ir.Module(name="tfrt_py_gemm")
    fma = ir.Function(mod, ir.FunctionType(v8, [v8, v8, v8]), name="llvm.fma.v8f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [fp, i64, fp, fp, i64, i64, i64, i64,
                                                          fp, i64]), name=SYMBOL)  # fmt: skip
    x, ldx, w, y, ldy, m_rows, k_len, panels, bias, flags = fn.args
    for a in (x, w, y):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(v8, [0.0] * 8)
    splat = ir.Constant(ir.VectorType(i32, 8), [0] * 8)
    add_bias = b.icmp_unsigned("!=", b.and_(flags, ir.Constant(i64, 1)), ir.Constant(i64, 0))
    relu = b.icmp_unsigned("!=", b.and_(flags, ir.Constant(i64, 2)), ir.Constant(i64, 0))
    none = ir.Constant(ir.VectorType(ir.IntType(1), 8), [0] * 8)

    def c(v: int) -> Any:
        return ir.Constant(i64, v)

    def tile(p: Any, m0: Any, rows: int) -> None:
        """The rows m0..m0+rows of panel p: a k loop over 2*rows accumulators, then stores."""
        pre = b.block
        head, body, done = (fn.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(i64)
        k.add_incoming(c(0), pre)
        acc = []
        for _ in range(2 * rows):
            a = b.phi(v8)
            a.add_incoming(zero, pre)
            acc.append(a)
        b.cbranch(b.icmp_signed("<", k, k_len), body, done)
        b.position_at_end(body)
        at = b.add(b.mul(p, b.mul(k_len, c(NR))), b.mul(k, c(NR)))
        w0 = b.load(b.bitcast(b.gep(w, [at]), v8p), align=4)
        w1 = b.load(b.bitcast(b.gep(w, [b.add(at, c(8))]), v8p), align=4)
        new = []
        for r in range(rows):
            xs = b.load(b.gep(x, [b.add(b.mul(b.add(m0, c(r)), ldx), k)]))
            xb = b.insert_element(ir.Constant(v8, ir.Undefined), xs, ir.Constant(i32, 0))
            xb = b.shuffle_vector(xb, ir.Constant(v8, ir.Undefined), splat)
            new += [b.call(fma, [w0, xb, acc[2 * r]]), b.call(fma, [w1, xb, acc[2 * r + 1]])]
        k.add_incoming(b.add(k, c(1)), b.block)
        for a, v in zip(acc, new, strict=True):
            a.add_incoming(v, b.block)
        b.branch(head)
        b.position_at_end(done)
        # the epilogue: + bias (flag 1; the pointer is always readable), then ReLU (flag
        # 2; NaN kept, as the interpreter's x < 0 ? 0 : x)
        col = b.mul(p, c(NR))
        bv = [b.load(b.bitcast(b.gep(bias, [b.add(col, c(8 * h))]), v8p), align=4)
              for h in range(2)]  # fmt: skip
        bv = [b.select(add_bias, v, zero) for v in bv]
        for r in range(rows):
            row = b.add(b.mul(b.add(m0, c(r)), ldy), col)
            for h in range(2):
                v = b.fadd(acc[2 * r + h], bv[h])
                neg = b.select(relu, b.fcmp_ordered("<", v, zero), none)
                v = b.select(neg, zero, v)
                b.store(v, b.bitcast(b.gep(y, [b.add(row, c(8 * h))]), v8p), align=4)

    # for p in panels: full tiles of MR rows, then the 1..MR-1 rows left
    entry = b.block
    p_head, p_body, m_head, m_body, m_rest, p_next, done = (
        fn.append_basic_block() for _ in range(7))  # fmt: skip
    b.branch(p_head)
    b.position_at_end(p_head)
    p = b.phi(i64)
    p.add_incoming(c(0), entry)
    b.cbranch(b.icmp_signed("<", p, panels), p_body, done)
    b.position_at_end(p_body)
    b.branch(m_head)
    b.position_at_end(m_head)
    m0 = b.phi(i64)
    m0.add_incoming(c(0), p_body)
    b.cbranch(b.icmp_signed("<=", b.add(m0, c(MR)), m_rows), m_body, m_rest)
    b.position_at_end(m_body)
    tile(p, m0, MR)
    m0.add_incoming(b.add(m0, c(MR)), b.block)
    b.branch(m_head)
    b.position_at_end(m_rest)
    left = b.sub(m_rows, m0)
    sw = b.switch(left, p_next)
    for rows in range(1, MR):
        blk = fn.append_basic_block()
        sw.add_case(c(rows), blk)
        b.position_at_end(blk)
        tile(p, m0, rows)
        b.branch(p_next)
    b.position_at_end(p_next)
    p.add_incoming(b.add(p, c(1)), p_next)
    b.branch(p_head)
    b.position_at_end(done)
    b.ret_void()
    return str(mod)


def _register() -> Any:
    try:
        import llvmlite.binding as llvm
        from numba import types

        if not _host_ok():
            return None
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_triple(llvm.get_process_triple())
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
        )
        mod = llvm.parse_assembly(_build())
        mod.verify()
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        llvm.add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
    except Exception:  # noqa: BLE001 - no llvmlite JIT here: the lowering keeps gemm
        return None
    p, n = types.uintp, types.int64
    return types.ExternalFunction(SYMBOL, types.void(p, n, p, p, n, n, n, n, p, n)), engine


def available() -> bool:
    """Whether the kernel is built and registered (once per process; thread-safe)."""
    with _LOCK:
        if not _STATE:
            _STATE.append(_register())
        return _STATE[0] is not None


if not available():
    raise ImportError("the packed-weight gemm kernel cannot run on this host")

from numba import njit  # noqa: E402 - only once the kernel is known to exist

_p16 = _STATE[0][0]


@njit(nogil=True, cache=True)
def gemm_p16(x, xo, ldx, w, wo, y, yo, ldy, m, k, n, b, bo, flags):
    px = x.ctypes.data + np.uint64(xo * 4)
    pw = w.ctypes.data + np.uint64(wo * 4)
    py = y.ctypes.data + np.uint64(yo * 4)
    pb = b.ctypes.data + np.uint64(bo * 4)
    _p16(px, ldx, pw, py, ldy, m, k, n // 16, pb, flags)
