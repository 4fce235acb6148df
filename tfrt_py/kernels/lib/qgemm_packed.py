"""An exact 8-bit integer product of rows by a constant matrix packed once at load: the
int32 accumulators of ``C[m, n] = sum_k A[m, k] * W[k, n]`` with A unsigned 8-bit codes
(activations) and W signed 8-bit codes (weights), the integer kernels' core (QLinearConv,
QLinearMatMul, MatMulInteger and what onnxruntime's QDQ groups become at load).

Paths, as MLAS's U8S8 kernels dispatch (``host_paths``; ``$TFRT_PY_QGEMM`` forces one the
host has, else ``$TFRT_PY_ISA``'s family picks, else the host's widest):

* ``vnni512``: AVX512-VNNI ``vpdpbusd`` on zmm registers, 8 x 32 tiles: each instruction
  sums four u8 x s8 products into each of 16 int32 lanes (exact: no 16-bit stage);
* ``vnni256``: the same on ymm registers, 6 x 16 tiles (AVX-VNNI: Alder Lake and later);
* ``avx512``: AVX-512BW without VNNI: the codes widened to int16 (at packing, and by the
  caller for A), ``vpmaddwd`` pairs into int32, 8 x 32 tiles;
* ``avx2``: the same on ymm registers, 6 x 16 tiles;
* ``portable``: none (the callers compute exactly on float BLAS, as before this kernel).

No path saturates. ``vpmaddubsw`` (MLAS's AVX2 U8S8 path) sums two u8 x s8 products in
int16 and saturates; it is used only as ``pairs256`` (bytes as VNNI's groups of 4,
``vpmaddubsw`` then ``vpmaddwd`` by ones, 6 x 16 tiles), for weights that
``pairs_exact`` proves cannot saturate with any codes (7-bit weights, as onnxruntime's
``reduce_range`` writes for such CPUs): each ``avx2`` build hands a call with its layout
to the same form's ``pairs256`` build, so a caller picks it per matrix (``pairs_tile``:
``conv_qint8``, ``qgemm_rows``) and calls the same symbols. On one Zen 3 core (2026-12-07, 7-bit
weights, products of ResNet, MobileNet and BERT shapes, interleaved) it runs 1.27-1.38x as
fast as ``avx2`` and takes 0.87-0.93x of onnxruntime's MatMulInteger time on eight of nine
shapes (1.06x at 3136 x 144 x 24), A read as the bytes they are (no int16 copy).

Layouts. K is taken in groups of ``g`` (4 codes per int32 lane for VNNI, 2 int16 per lane
otherwise), padded with zeros to a whole group. ``pack(w)`` (K x N int8, N padded with zero
columns to the panel width ``nr``) makes ``(N/nr, K/g, nr, g)`` in the path's element type
(int8, or int16 for the widening paths). A's rows are ``lda`` elements apart, each holding
``K/g * g`` elements (zeros past K) of the path's type: uint8 codes for VNNI, the codes as
int16 otherwise (``a_dtype()``).

The kernel is LLVM IR built with llvmlite on ``gemm_packed``'s tile walker (blocks of
panels in L2, whole tiles, then the rows left in tiles of several panels), compiled once per
process on first use and registered as the symbol ``tfrt_py_qgemm_packed`` for numba code
(``kernel()``: an ExternalFunction ``(a, lda, w, c, ldc, m, k_groups, panels, layout) ->
status``, pointers as integers; status 1, nothing done, when ``layout`` is not this
process's ``layout_code()``: packed data never meets another path's kernel). ``build(path)``
compiles any path the host has apart from the process's (tests, benchmarks). Stateless
kernels; any thread; the build is once per process under a lock.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import add_symbol, compile_ir_cached
from ...concurrency.once import Once
from . import gemm_packed, qgemm_amx
from .gemm_packed import ENV_ISA, ENV_PACKED_GEMM, _PackedGemmIR

__all__ = [
    "ENV_QGEMM",
    "IR_SOURCES",
    "PAIRS_HOST",
    "PAIR_LIMIT",
    "TILES",
    "QTile",
    "a_dtype",
    "available",
    "build",
    "choose_path",
    "chosen",
    "host_paths",
    "kernel",
    "kernel_requant",
    "kernel_scaled",
    "layout_code",
    "pack",
    "pairs_exact",
    "pairs_tile",
    "path",
    "qgemm",
    "qgemm_requant",
    "qgemm_scaled",
    "tile_for",
]  # fmt: skip

#: ``TFRT_PY_QGEMM=vnni512|vnni256|avx512|avx2|portable``: the integer kernel's path, when
#: the host has it (read once, when the kernel is first built).
ENV_QGEMM = "TFRT_PY_QGEMM"
SYMBOL = "tfrt_py_qgemm_packed"
SYMBOL_REQUANT = "tfrt_py_qgemm_requant"
SYMBOL_SCALED = "tfrt_py_qgemm_scaled"
#: The three symbols numba code calls are the AMX builds where this process has them
#: (``qgemm_amx``), else the path's vector builds, registered under these names too.
_VECTORS = {"int32": f"{SYMBOL}_vectors", "requant": f"{SYMBOL_REQUANT}_vectors",
            "scaled": f"{SYMBOL_SCALED}_vectors"}  # fmt: skip
#: The code that writes the IR (``_QGemmIR`` builds on ``gemm_packed._PackedGemmIR``): the
#: cached machine code (``compile_ir_cached``) is rebuilt when either file changes.
IR_SOURCES = (gemm_packed.__file__, __file__)


class QTile(NamedTuple):
    """One build: ``vw`` int32 lanes per vector, ``mr`` rows per whole tile, panels of
    ``nr`` = 2 * ``vw`` columns, ``g`` codes per lane (4: bytes; 2: int16 pairs);
    ``pairs``: bytes multiplied by ``vpmaddubsw`` (``pairs256``), not VNNI."""

    vw: int
    mr: int
    g: int
    panels_for_rows: dict[int, int]
    pairs: bool = False

    @property
    def nr(self) -> int:
        return 2 * self.vw

    @property
    def vnni(self) -> bool:
        return self.g == 4 and not self.pairs

    @property
    def dtype(self) -> np.dtype:
        """The packed weights' (and A's) element type without the sign: int8 / int16."""
        return np.dtype(np.int8 if self.g == 4 else np.int16)


_ROWS_512 = {1: 4, 2: 3, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1}
_ROWS_256 = {1: 4, 2: 3, 3: 2, 4: 1, 5: 1}
TILES = {
    "vnni512": QTile(16, 8, 4, _ROWS_512),
    "avx512": QTile(16, 8, 2, _ROWS_512),
    "vnni256": QTile(8, 6, 4, _ROWS_256),
    "avx2": QTile(8, 6, 2, _ROWS_256),
    "pairs256": QTile(8, 6, 4, _ROWS_256, True),
}
_INTRINSIC = {  # path -> (name, argument vector, result vector) of the product step
    "vnni512": ("llvm.x86.avx512.vpdpbusd.512", (32, 16), 16),
    "vnni256": ("llvm.x86.avx512.vpdpbusd.256", (32, 8), 8),
    "avx512": ("llvm.x86.avx512.pmaddw.d.512", (16, 32), 16),
    "avx2": ("llvm.x86.avx2.pmadd.wd", (16, 16), 8),
    "pairs256": ("llvm.x86.avx2.pmadd.ub.sw", (8, 32), 16),
}
#: The path whose builds also take ``pairs256``'s layout (handing such calls to its build).
PAIRS_HOST = "avx2"
#: The most a pair of same-signed weights may sum to for ``vpmaddubsw`` to be exact: 255 *
#: 128 = 32640 fits int16, 255 * 129 does not.
PAIR_LIMIT = 128


def layout_code(shape: QTile) -> int:
    """The number a packed matrix and the kernel agree on: panel width, group, pairs."""
    return shape.nr * 8 + shape.g + (1024 if shape.pairs else 0)


def a_dtype(shape: QTile) -> np.dtype:
    """A's element type for ``shape``: uint8 codes (groups of 4) or the codes as int16."""
    return np.dtype(np.uint8 if shape.g == 4 else np.int16)


def pairs_exact(w: np.ndarray) -> bool:
    """Whether ``vpmaddubsw`` multiplies W (K x N signed codes, k in ``pairs256``'s groups:
    rows 2i and 2i + 1 are a pair) by any uint8 codes exactly: in every column, each
    pair's positive weights sum to at most ``PAIR_LIMIT``, and its negative ones to at
    least ``-PAIR_LIMIT`` (the two products' sum then fits int16 for codes 0..255). True
    for 7-bit weights (onnxruntime's ``reduce_range``), rarely for full 8-bit ones."""
    k = w.shape[0]
    wi = np.zeros((k + (k & 1), w.shape[1]), np.int32)
    wi[:k] = w
    pos, neg = np.maximum(wi, 0), np.minimum(wi, 0)
    return bool((pos[0::2] + pos[1::2]).max(initial=0) <= PAIR_LIMIT
                and (neg[0::2] + neg[1::2]).min(initial=0) >= -PAIR_LIMIT)  # fmt: skip


def pack(w: np.ndarray, shape: QTile) -> np.ndarray:
    """W (K x N signed 8-bit codes, any integer dtype holding -128..127) as ``shape``'s
    panels ``(ceil(N/nr), ceil(K/g), nr, g)``, zero-padded, C order."""
    k, n = w.shape
    g, nr = shape.g, shape.nr
    kp, np_ = -(-k // g) * g, -(-n // nr) * nr
    full = np.zeros((kp, np_), shape.dtype)
    full[:k, :n] = w
    return np.ascontiguousarray(full.reshape(kp // g, g, np_ // nr, nr).transpose(2, 0, 3, 1))


def host_paths() -> list[str]:
    """The integer kernel paths this host runs, widest first (``portable`` always)."""
    import llvmlite.binding as llvm

    if not llvm.get_process_triple().startswith("x86_64"):
        return ["portable"]
    f = llvm.get_host_cpu_features()
    out = []
    if f.get("avx512bw"):
        if f.get("avx512vnni"):
            out.append("vnni512")
        out.append("avx512")
    if f.get("avx2"):
        if f.get("avxvnni") or (f.get("avx512vnni") and f.get("avx512vl")):
            out.append("vnni256")
        out.append("avx2")
    return [*out, "portable"]


def choose_path() -> tuple[str, str]:
    """(path, why) as this process picks it (``$TFRT_PY_QGEMM``, else ``$TFRT_PY_ISA``'s
    family, else the host's widest): the integer kernels that follow it (``qnbits_ir``) read
    the same choice. Builds nothing."""
    have = host_paths()
    asked = os.environ.get(ENV_QGEMM, "").strip().lower()
    if asked:
        if asked in have:
            return asked, f"${ENV_QGEMM}={asked}"
        return have[0], f"${ENV_QGEMM}={asked} is not a path of this host ({', '.join(have)})"
    isa = os.environ.get(ENV_ISA, "").strip().lower()
    if isa == "portable":
        return "portable", f"${ENV_ISA}=portable"
    if isa in ("avx512", "avx2"):
        import llvmlite.binding as llvm

        # an AVX2 host's VNNI is AVX-VNNI: AVX-512 VNNI's ymm form does not stand for it
        real_vex_vnni = bool(llvm.get_host_cpu_features().get("avxvnni"))
        family = ["vnni512", "avx512"] if isa == "avx512" else ["vnni256", "avx2"]
        for p in family:
            if p in have and (p != "vnni256" or real_vex_vnni):
                return p, f"${ENV_ISA}={isa}"
    return have[0], "the host's widest"


class _QGemmIR(_PackedGemmIR):
    """``SYMBOL(a, lda, w, c, ldc, M, Kg, panels, layout) -> status`` for one path: the
    tile walker of ``gemm_packed`` over int32 accumulators; per group of k, the panels'
    vectors, each row's group of A broadcast as one int32, the path's product step
    (``pairs256``: ``vpmaddubsw`` into int16 pairs, ``vpmaddwd`` by ones into int32).
    ``pairs_symbol``: a call with ``pairs256``'s layout goes on to that function (the
    same form's ``pairs256`` build, resolved when this one is compiled)."""

    #: two groups of k an iteration (as measured when it was written; the float builds
    #: take four)
    UNROLL = 2

    def __init__(self, path: str, symbol: str, requant: bool = False,
                 scaled: bool = False, pairs_symbol: str | None = None) -> None:  # fmt: skip
        import llvmlite.ir as ir

        self.requant, self.scaled = requant, scaled
        shape = TILES[path]
        self.ir, self.vnni = ir, shape.vnni
        self.vw, self.mr, self.nr = shape.vw, shape.mr, shape.nr
        self.panels_for_rows = shape.panels_for_rows
        i64, i32, i8 = ir.IntType(64), ir.IntType(32), ir.IntType(8)
        self.i64, self.i32 = i64, i32
        self.v8 = vi = ir.VectorType(i32, shape.vw)  # the accumulators' type
        self.vip = vi.as_pointer()
        self.mod = ir.Module(name="tfrt_py_qgemm")
        name, (lanes, n), out = _INTRINSIC[path]
        elem = ir.IntType(lanes)
        self.varg = ir.VectorType(elem, n)
        self.pairs = shape.pairs
        if self.pairs:  # vpmaddubsw(unsigned bytes, signed bytes) -> int16 pairs
            v16 = ir.VectorType(ir.IntType(16), out)
            self.step = ir.Function(self.mod, ir.FunctionType(v16, [self.varg, self.varg]),
                                    name=name)  # fmt: skip
            self.widen = ir.Function(self.mod, ir.FunctionType(vi, [v16, v16]),
                                     name=_INTRINSIC["avx2"][0])  # fmt: skip
            self.ones = ir.Constant(v16, [1] * out)
        else:
            self.step = ir.Function(self.mod, ir.FunctionType(vi, [vi, vi, vi] if self.vnni else
                                    [self.varg, self.varg]), name=name)  # fmt: skip
        self.esize = 1 if shape.g == 4 else 2
        ep = (i8 if shape.g == 4 else ir.IntType(16)).as_pointer()
        self.symbol = symbol
        f32 = ir.FloatType()
        out_t = i8.as_pointer() if requant else (f32.as_pointer() if scaled else i32.as_pointer())
        extra = [i32.as_pointer(), f32.as_pointer(), f32.as_pointer(), i64] if requant else []
        if scaled:
            i32p, f32p = i32.as_pointer(), f32.as_pointer()
            extra = [i32p, i32p, i32p, f32p, f32p, f32p, i64, i64]
        self.fn = ir.Function(self.mod, ir.FunctionType(i64, [ep, i64, ep, out_t, i64, i64, i64,
                              i64, i64, *extra]), name=symbol)  # fmt: skip
        (self.x, self.ldx, self.w, self.y, self.ldy, self.m_rows, self.k_len, self.panels,
         layout) = self.fn.args[:9]  # fmt: skip
        if requant:
            self.bias, self.scale, params, self.n_valid = self.fn.args[9:]
        if scaled:
            (self.colsum, self.wz, self.row_term, self.scale, self.bias, a_scale, a_zp,
             self.n_valid) = self.fn.args[9:]  # fmt: skip
        for a in (self.x, self.w, self.y):
            a.add_attribute("noalias")
        entry = self.fn.append_basic_block("entry")
        self.b = b = ir.IRBuilder(entry)
        wrong, work = self.fn.append_basic_block("wrong_layout"), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed("!=", layout, self.c(layout_code(shape))), wrong, work)
        b.position_at_end(wrong)
        if pairs_symbol is not None:  # pairs256's layout: its build's status
            other = self.fn.append_basic_block("pairs_layout")
            refuse = self.fn.append_basic_block("refuse")
            b.cbranch(b.icmp_signed("==", layout, self.c(layout_code(TILES["pairs256"]))),
                      other, refuse)  # fmt: skip
            b.position_at_end(other)
            callee = ir.Function(self.mod, self.fn.function_type, name=pairs_symbol)
            b.ret(b.call(callee, list(self.fn.args)))
            b.position_at_end(refuse)
        b.ret(self.c(1))
        b.position_at_end(work)
        self.zero = ir.Constant(vi, [0] * shape.vw)
        self.splat = ir.Constant(ir.VectorType(i32, shape.vw), [0] * shape.vw)
        self.g = shape.g
        if requant:  # the output's [lo - zp, hi - zp, zp] splat once
            self.vf = vf = ir.VectorType(f32, shape.vw)
            self.vb = ir.VectorType(i8, shape.vw)
            lo, hi, zp = (b.load(b.gep(params, [self.c(i)])) for i in range(3))
            self.lo, self.hi, self.zp = (self.broadcast(v, vf) for v in (lo, hi, zp))
            self.magic = ir.Constant(vf, [12582912.0] * shape.vw)
        if scaled:  # A's scale and zero point splat once
            self.vf = ir.VectorType(f32, shape.vw)
            self.a_scale = self.broadcast(b.load(a_scale), self.vf)
            self.a_zp = self.broadcast(b.trunc(a_zp, i32), vi)

    def broadcast(self, value: Any, vtype: Any) -> Any:
        """``value`` (a scalar of ``vtype``'s element) in every lane of ``vtype``."""
        b, ir = self.b, self.ir
        e = b.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(self.i32, 0))
        return b.shuffle_vector(e, ir.Constant(vtype, ir.Undefined), self.splat)

    def stored_vectors(self, p: Any, npan: int) -> Iterator[tuple[int, int, Any]]:
        """The fused epilogues' walk: per output vector of the tile's ``npan`` panels, (j,
        h, its first column), the builder inside a block that runs only when that column
        is before ``n_valid`` (the caller's row holds whole vectors up to it)."""
        b, c = self.b, self.c
        for j in range(npan):
            for h in range(2):
                col = b.add(b.mul(b.add(p, c(j)), c(self.nr)), c(self.vw * h))
                store, after = self.fn.append_basic_block(), self.fn.append_basic_block()
                b.cbranch(b.icmp_signed("<", col, self.n_valid), store, after)
                b.position_at_end(store)
                yield j, h, col
                b.branch(after)
                b.position_at_end(after)

    def k_step(self, p: Any, m0: Any, rows: int, npan: int, k: Any, acc: list[Any]) -> list[Any]:
        """One group of k: the panels' vectors at group k, each row's group of A broadcast,
        ``acc`` + their products."""
        b, c, vi = self.b, self.c, self.v8
        wv = []
        row_len = b.mul(self.k_len, c(self.nr * self.g))
        for j in range(npan):
            at = b.add(b.mul(b.add(p, c(j)), row_len), b.mul(k, c(self.nr * self.g)))
            for h in range(2):
                at_h = b.gep(self.w, [b.add(at, c(self.vw * self.g * h))])
                wv.append(b.load(b.bitcast(at_h, self.vip), align=self.esize))
        new = []
        for r in range(rows):
            at = b.add(b.mul(b.add(m0, c(r)), self.ldx), b.mul(k, c(self.g)))
            xs = b.load(b.bitcast(b.gep(self.x, [at]), self.i32.as_pointer()), align=1)
            xb = self.broadcast(xs, vi)
            for q in range(2 * npan):
                a = acc[r * 2 * npan + q]
                if self.pairs:
                    s16 = b.call(self.step, [b.bitcast(xb, self.varg),
                                             b.bitcast(wv[q], self.varg)])  # fmt: skip
                    new.append(b.add(a, b.call(self.widen, [s16, self.ones])))
                elif self.vnni:  # vpdpbusd(acc, unsigned bytes, signed bytes)
                    new.append(b.call(self.step, [a, xb, wv[q]]))
                else:
                    prod = b.call(self.step, [b.bitcast(wv[q], self.varg),
                                              b.bitcast(xb, self.varg)])  # fmt: skip
                    new.append(b.add(a, prod))
        return new

    def epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """The tile's int32 accumulators stored as they are, or requantized to bytes."""
        if self.requant:
            self.requant_epilogue(p, m0, rows, npan, acc)
            return
        if self.scaled:
            self.scaled_epilogue(p, m0, rows, npan, acc)
            return
        b, c = self.b, self.c
        for j in range(npan):
            col = b.mul(b.add(p, c(j)), c(self.nr))
            for r in range(rows):
                row = b.add(b.mul(b.add(m0, c(r)), self.ldy), col)
                for h in range(2):
                    at = b.gep(self.y, [b.add(row, c(self.vw * h))])
                    b.store(acc[r * 2 * npan + 2 * j + h], b.bitcast(at, self.vip), align=4)

    def requant_epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """MLAS's requantize as the tile is stored: (acc + bias[col]) as float32 times
        scale[col], clamped to [lo - zp, hi - zp], rounded half to even (the 1.5 * 2**23
        addition), + zp, stored as one byte per column; a vector whose first column is at
        or past ``n_valid`` is not stored (the caller's row holds whole vectors up to it)."""
        b, c = self.b, self.c
        vfp, vbp = self.vf.as_pointer(), self.vb.as_pointer()
        for j, h, col in self.stored_vectors(p, npan):
            bias = b.load(b.bitcast(b.gep(self.bias, [col]), self.vip), align=4)
            scale = b.load(b.bitcast(b.gep(self.scale, [col]), vfp), align=4)
            for r in range(rows):
                v = b.add(acc[r * 2 * npan + 2 * j + h], bias)
                f = b.fmul(b.sitofp(v, self.vf), scale)
                f = b.select(b.fcmp_ordered("<", f, self.lo), self.lo, f)
                f = b.select(b.fcmp_ordered(">", f, self.hi), self.hi, f)
                f = b.fadd(b.fsub(b.fadd(f, self.magic), self.magic), self.zp)
                q = b.trunc(b.fptosi(f, self.v8), self.vb)
                at = b.add(b.mul(b.add(m0, c(r)), self.ldy), col)
                b.store(q, b.bitcast(b.gep(self.y, [at]), vbp), align=1)

    def scaled_epilogue(self, p: Any, m0: Any, rows: int, npan: int, acc: list[Any]) -> None:
        """MatMulIntegerToFloat's store: ``float32(acc - a_zp * colsum[col] - wz[col] *
        row_term[row]) * (scale[col] * a_scale) + bias[col]``, the corrections in int32
        (exact: every term and the result fit; wrapping partial sums cancel), each float step
        rounded on its own (no fused multiply-add), as the separate Cast, Mul and Add round;
        a vector whose first column is at or past ``n_valid`` is not stored."""
        b, c = self.b, self.c
        vfp = self.vf.as_pointer()
        for j, h, col in self.stored_vectors(p, npan):
            colsum = b.load(b.bitcast(b.gep(self.colsum, [col]), self.vip), align=4)
            corr = b.mul(colsum, self.a_zp)
            wz = b.load(b.bitcast(b.gep(self.wz, [col]), self.vip), align=4)
            scale = b.fmul(b.load(b.bitcast(b.gep(self.scale, [col]), vfp), align=4), self.a_scale)
            bias = b.load(b.bitcast(b.gep(self.bias, [col]), vfp), align=4)
            for r in range(rows):
                row = b.add(m0, c(r))
                t = self.broadcast(b.load(b.gep(self.row_term, [row]), align=4), self.v8)
                v = b.sub(b.sub(acc[r * 2 * npan + 2 * j + h], corr), b.mul(wz, t))
                f = b.fadd(b.fmul(b.sitofp(v, self.vf), scale), bias)
                b.store(f, b.bitcast(b.gep(self.y, [b.add(b.mul(row, self.ldy), col)]), vfp),
                        align=4)  # fmt: skip


class Built(NamedTuple):
    """A compiled path: its tile, the engine that owns the code, a ctypes callable."""

    path: str
    tile: QTile
    engine: Any
    call: Any


def build(path: str, symbol: str | None = None, requant: bool = False,
          scaled: bool = False, pairs_symbol: str | None = None) -> Built:  # fmt: skip
    """Compile ``path`` (one of ``host_paths()`` but portable, or ``pairs256`` where the
    host has ``avx2``) now, apart from the process's kernel: for tests and benchmarks.
    ``requant``: the form that requantizes to bytes as it stores (``qgemm_requant``);
    ``scaled``: the form that stores float32 (``qgemm_scaled``); ``pairs_symbol``: the
    registered symbol that calls with ``pairs256``'s layout go to. Raises what llvmlite
    raises."""
    form = "_requant" if requant else ("_scaled" if scaled else "")
    sym = symbol or f"{SYMBOL}_{path}{form}"
    key = f"qgemm_packed|{path}|{sym}|{requant}|{scaled}|{pairs_symbol}"

    def text() -> str:
        return _QGemmIR(path, sym, requant, scaled, pairs_symbol).text()

    engine, _ = compile_ir_cached(text, key, IR_SOURCES, opt=3)
    p, n = ctypes.c_void_p, ctypes.c_int64
    args = [p, n, p, p, n, n, n, n, n] + ([p, p, p, n] if requant else [])
    args += [p, p, p, p, p, p, n, n] if scaled else []
    call = ctypes.CFUNCTYPE(n, *args)(engine.get_function_address(sym))
    return Built(path, TILES[path], engine, call)


def qgemm_requant(built: Built, a: np.ndarray, packed: np.ndarray, m: int, bias: np.ndarray,
                  scale: np.ndarray, params: np.ndarray, n_valid: int,
                  y: np.ndarray) -> None:  # fmt: skip
    """``y[:m, :n_valid]`` (8-bit, rows ``y.shape[1]`` apart, room for whole vectors up to
    ``n_valid``) = the product of A's rows by ``packed`` requantized: bias (int32) and
    scale (float32) padded to the panels' columns, ``params`` float32 [lo - zp, hi - zp,
    zp]. Through ``built``, a ``requant`` build (ctypes)."""
    panels, kg = packed.shape[0], packed.shape[1]
    st = built.call(a.ctypes.data, a.shape[1], packed.ctypes.data, y.ctypes.data, y.shape[1],
                    m, kg, panels, layout_code(built.tile), bias.ctypes.data, scale.ctypes.data,
                    params.ctypes.data, n_valid)  # fmt: skip
    if st:
        raise ValueError("packed for another path")


def qgemm(built: Built, a: np.ndarray, packed: np.ndarray, m: int) -> np.ndarray:
    """The int32 product of A's first ``m`` rows (``a_dtype`` codes, rows padded to whole
    groups) by ``packed`` through ``built`` (ctypes; the GIL released while it runs):
    an (m, panels * nr) array."""
    shape = built.tile
    panels, kg = packed.shape[0], packed.shape[1]
    if a.dtype != a_dtype(shape) or a.shape[1] < kg * shape.g or not a.flags.c_contiguous:
        raise ValueError("A is not in this path's layout")
    c = np.empty((m, panels * shape.nr), np.int32)
    st = built.call(a.ctypes.data, a.shape[1], packed.ctypes.data, c.ctypes.data, c.shape[1],
                    m, kg, panels, layout_code(shape))  # fmt: skip
    if st:
        raise ValueError("packed for another path")
    return c


def _register() -> tuple[str, str, Built | None, Any, Any, Any]:
    try:
        from numba import types

        path_, why = choose_path()
        if path_ == "portable":
            return path_, why, None, None, None, None
        # each form's vector build under its own name; the public names are the AMX
        # builds where this process has them (they call the vector ones for the rest).
        # On an avx2 path, pairs256's builds first: the avx2 ones hand them its layout
        pairs: dict[str, str | None] = {"int32": None, "requant": None, "scaled": None}
        if path_ == PAIRS_HOST:
            for form in pairs:
                name = f"{_VECTORS[form]}_pairs"
                pb = build("pairs256", name, form == "requant", form == "scaled")
                add_symbol(name, pb.engine.get_function_address(name))
                _ENGINES.append(pb)
                pairs[form] = name
        built = build(path_, _VECTORS["int32"], pairs_symbol=pairs["int32"])
        fused = build(path_, _VECTORS["requant"], requant=True, pairs_symbol=pairs["requant"])
        scaled = build(path_, _VECTORS["scaled"], scaled=True, pairs_symbol=pairs["scaled"])
        vectors = {}
        for form, b in (("int32", built), ("requant", fused), ("scaled", scaled)):
            vectors[form] = b.engine.get_function_address(_VECTORS[form])
            add_symbol(_VECTORS[form], vectors[form])
        amx = qgemm_amx.install(path_, layout_code(TILES["vnni512"]), _VECTORS)
        for form, public in (("int32", SYMBOL), ("requant", SYMBOL_REQUANT),
                             ("scaled", SYMBOL_SCALED)):  # fmt: skip
            add_symbol(public, amx.get(form) or vectors[form])
    except Exception as e:  # noqa: BLE001 - no llvmlite JIT here: the callers stay exact on BLAS
        return "portable", f"the kernel did not build: {type(e).__name__}", None, None, None, None
    _ENGINES.extend((fused, scaled))
    p, n = types.uintp, types.int64
    fn = types.ExternalFunction(SYMBOL, types.int64(p, n, p, p, n, n, n, n, n))
    fn_requant = types.ExternalFunction(
        SYMBOL_REQUANT, types.int64(p, n, p, p, n, n, n, n, n, p, p, p, n)
    )
    fn_scaled = types.ExternalFunction(
        SYMBOL_SCALED, types.int64(p, n, p, p, n, n, n, n, n, p, p, p, p, p, p, n, n)
    )
    return path_, why, built, fn, fn_requant, fn_scaled


_ENGINES: list[Built] = []  # the requantizing and scaling builds, kept alive with their code


#: (path, why, built, fn, requant fn, scaled fn), decided on first use
_DECIDED: Once[tuple[str, str, Built | None, Any, Any, Any]] = Once(_register)


def pairs_tile() -> QTile | None:
    """``pairs256``'s tile where this process's kernels take its layout (an ``avx2`` path
    whose builds exist), else None. Builds the kernels on first use (``available``)."""
    if available() is None or path()[0] != PAIRS_HOST:
        return None
    return TILES["pairs256"]


def tile_for(w: np.ndarray, tile: QTile) -> QTile:
    """The tile to pack W (K x N signed codes) for: ``pairs256``'s where this process takes
    it (``pairs_tile``) and ``pairs_exact(w)``, else ``tile`` (the caller's default)."""
    pairs = pairs_tile()
    return pairs if pairs is not None and pairs_exact(w) else tile


def chosen() -> tuple[str, str] | None:
    """(path, why) once decided, None before (builds nothing)."""
    got = _DECIDED.peek()
    return (got[0], got[1]) if got else None


def path() -> tuple[str, str]:
    """(this process's path, why): decides and builds on the first call."""
    got = _DECIDED.get()
    return got[0], got[1]


def available() -> Built | None:
    """This process's compiled kernel, or None (``portable``, no llvmlite JIT, or
    ``$TFRT_PY_PACKED_GEMM=0``, read on each call, which turns the integer kernel off
    with the float one)."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    return _DECIDED.get()[2]


def kernel() -> Any:
    """The numba ExternalFunction of the registered kernel (signature in the module
    docstring), None where ``available()`` is None."""
    return _DECIDED.get()[3] if available() is not None else None


def kernel_requant() -> Any:
    """The numba ExternalFunction of the requantizing kernel ``(a, lda, w, y, ldy, m,
    k_groups, panels, layout, bias, scale, params, n_valid) -> status`` (as
    ``qgemm_requant``), None where ``available()`` is None."""
    return _DECIDED.get()[4] if available() is not None else None


def kernel_scaled() -> Any:
    """The numba ExternalFunction of the float-storing kernel ``(a, lda, w, y, ldy, m,
    k_groups, panels, layout, colsum, wz, row_term, scale, bias, a_scale, a_zp, n_valid)
    -> status`` (as ``qgemm_scaled``), None where ``available()`` is None."""
    return _DECIDED.get()[5] if available() is not None else None


def qgemm_scaled(built: Built, a: np.ndarray, packed: np.ndarray, m: int, colsum: np.ndarray,
                 wz: np.ndarray, row_term: np.ndarray, scale: np.ndarray, bias: np.ndarray,
                 a_scale: np.ndarray, a_zp: int, n_valid: int, y: np.ndarray) -> None:  # fmt: skip
    """``y[:m, :n_valid]`` (float32, rows ``y.shape[1]`` apart, room for whole vectors up
    to ``n_valid``) = ``float32(acc - a_zp * colsum - wz * row_term[row]) * (scale *
    a_scale) + bias`` for the int32 product ``acc`` of A's rows by ``packed``: colsum and
    wz int32, scale and bias float32, all padded to the panels' columns; row_term int32
    per row; a_scale one float32. Through ``built``, a ``scaled`` build (ctypes)."""
    panels, kg = packed.shape[0], packed.shape[1]
    st = built.call(a.ctypes.data, a.shape[1], packed.ctypes.data, y.ctypes.data, y.shape[1],
                    m, kg, panels, layout_code(built.tile), colsum.ctypes.data, wz.ctypes.data,
                    row_term.ctypes.data, scale.ctypes.data, bias.ctypes.data,
                    a_scale.ctypes.data, a_zp, n_valid)  # fmt: skip
    if st:
        raise ValueError("packed for another path")
