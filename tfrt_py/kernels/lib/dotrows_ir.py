"""A few float32 query rows against many key rows, as LLVM IR: the scores of a decode
step's attention (``q @ K^T`` over the keys of a KV cache, ``native/lower/ops_dec``),
with the query rows of grouped KV heads served by one pass over their keys.

``dotrows(a, m, k, b, n, y, alpha) -> 0``: ``y[q * n + i]`` = ``alpha`` times the sum over
``j < k`` of ``a[q * k + j] * b[i * k + j]``, for ``q < m`` and ``i < n`` (``a`` m rows,
``b`` n rows, both of ``k`` contiguous floats); -1 (nothing written) where ``k`` is over
``max_k()``. The keys go in blocks of a vector's lanes; each key row is loaded once per
``ROWS`` query rows (masked past ``k`` and past the last key: no read past either), its
products with each query row summed over the row's vectors by fused multiply-adds into
one vector, and a block's vectors reduced into one vector of its sums by a network of
two-source shuffles and adds, combined as they come (a binary counter: at most
log2(lanes) + 1 vectors live a query row). Sums reassociated (lanes, then the network) as
``rowdot.dot_rows_f4``'s and BLAS's; NaN and infinities propagate.

What it replaces: ``dot_rows_f4`` (numba) reduces each score's vector with its own
horizontal add (about 12 instructions a score at heads of 32) and reads the keys again
for every query row of a group.

``kernel()`` is the numba wrapper ``dotrows_f4(a, ao, b, bo, y, yo, m, k, n, alpha)``
(flat float32 arrays, element offsets; the caller checks the bounds), None where there is
no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are switched
off. Vectors of 16 floats with AVX-512F (4 query rows a pass), 8 with AVX2 (2), as
``pool_ir``'s widths.

Built in parts, each once per process under a lock (machine code cached as the packed
gemms'): ``kernel()`` builds ``SYMBOL``, which calls the function for the row's vector
count through a table, and ``ready(k)`` builds and enters the function for ``k``'s count
(the one a model's heads need): the lowering asks it, and ``from ...dotrows_ir import
dotrows_f4_c<count>`` (the generated modules' form, ``wrapper_name``) does it where the
module runs. Every count's function in one module was 26.5k lines of IR: 2.4 s of a
decoder's cold start on a 2-core Zen 4, with calls running (one count: a twentieth).
A count not built yet answers -1 with nothing written. Stateless once built; any thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .gemm_packed import carried_loop, splat, wide_vectors
from .ir_kernels import (
    FloatVectors,
    WrappedKernels,
    build_module,
    call_from_table,
    enter_in_table,
    function_table,
)  # fmt: skip
from .pool_ir import host_lanes, lanes

__all__ = [
    "CHUNKS", "SYMBOL", "TABLE", "add_count", "build", "chunk_symbol", "chunks_of", "describe",
    "host_lanes", "kernel", "lanes", "max_k", "ready", "wrapper_name",
]  # fmt: skip

SYMBOL = "tfrt_py_dotrows_f32"
#: ``SYMBOL``'s module's table of the functions by vector count (0: none built)
TABLE = "tfrt_py_dotrows_f32_table"
#: vectors a row may span (k up to 128 floats with AVX-512, 64 with AVX2)
CHUNKS = 8
#: query rows a pass over the keys serves with AVX-512 (2 with AVX2: sixteen registers)
ROWS = 4


def max_k(n: int | None = None) -> int:
    """The longest rows the kernel takes for vectors of ``n`` floats (this process's)."""
    return CHUNKS * (lanes() if n is None else n)


def chunks_of(k: int, n: int | None = None) -> int:
    """The vectors of ``n`` floats (this process's) a row of ``k`` floats spans."""
    lanes_n = lanes() if n is None else n
    return -(-k // lanes_n)


def build(n: int, chunks: int | None = None) -> Any:
    """The engine holding ``SYMBOL`` for vectors of ``n`` floats (one of ``host_lanes()``),
    with the functions for rows of every vector count (``chunks`` None: for tests and
    benchmarks of a width apart from the process's) or of none (``chunks`` 0: this
    process's, which builds them as ``ready`` asks); ``chunks`` 1..CHUNKS: the engine of
    that count's function alone (``chunk_symbol``). The engines of the counts are kept on
    the one returned. Raises what llvmlite raises."""
    if chunks:
        return build_module(lambda: _DotRowsIR(n, chunks).text(), f"dotrows_ir|{n}|{chunks}",
                            __file__)  # fmt: skip
    engine = build_module(lambda: _DotRowsIR(n, 0).text(), f"dotrows_ir|{n}", __file__)
    engine.tfrt_py_counts = {}
    if chunks is None:
        for ch in range(1, CHUNKS + 1):
            add_count(engine, n, ch)
    return engine


def chunk_symbol(chunks: int) -> str:
    """The function of the engine ``build(n, chunks)`` for rows of ``chunks`` vectors."""
    return f"{SYMBOL}_c{chunks}"


def add_count(engine: Any, n: int, chunks: int) -> None:
    """Build the function for rows of ``chunks`` vectors and enter it in ``engine``'s
    table (``SYMBOL`` calls it from then on); kept alive on ``engine``. The caller
    serializes the calls for one engine."""
    if chunks in engine.tfrt_py_counts:
        return
    part = build(n, chunks)
    engine.tfrt_py_counts[chunks] = part  # kept alive: the table points into it
    enter_in_table(engine, TABLE, CHUNKS + 1, {chunks: part.get_function_address(
        chunk_symbol(chunks))})  # fmt: skip


def ready(k: int) -> bool:
    """Whether ``kernel()`` computes rows of ``k`` floats (1..``max_k()``) in this process:
    the function for their vector count built now if it was not (once a process; a few
    hundredths of a second, against the whole module's second). False where the kernel
    is off or ``k`` is out of that range."""
    if not 1 <= k <= max_k() or kernel() is None:
        return False
    ch = chunks_of(k)
    with _COUNTS_LOCK:
        add_count(_KERNELS.engine(), lanes(), ch)
    return True


def _network_masks(n: int, size: int) -> tuple[list[int], list[int]]:
    """The two shuffles that fold vectors A and B, each ``n // size`` keys of ``size``
    lanes, into one of ``2 n // size`` keys of ``size // 2`` lanes (A's keys first): a
    key's lanes and the half above them, added."""
    groups, half = n // size, size // 2
    lo: list[int] = []
    hi: list[int] = []
    for g_out in range(2 * groups):
        src = 0 if g_out < groups else n
        g = g_out % groups
        lo += [src + g * size + t for t in range(half)]
        hi += [src + g * size + half + t for t in range(half)]
    return lo, hi


class _DotRowsIR(FloatVectors):
    """A module: ``chunks`` 0, ``SYMBOL`` calling the function for the row's vector count
    through ``TABLE`` (filled as the counts are built; -1 for a count not built or over
    ``CHUNKS``), with the rows of no vector (every score 0) in it; ``chunks`` 1..CHUNKS,
    that count's function (``chunk_symbol``) alone, which walks the query rows ``rows``
    at a time (then one at a time) and the keys a block at a time, each block by
    ``block``."""

    def __init__(self, n: int, chunks: int) -> None:
        super().__init__(n, "tfrt_py_dotrows")
        self.rows = ROWS if n == 16 else 2
        self.args = [self.fp, self.i64, self.i64, self.fp, self.i64, self.fp, self.f32]
        self.chunks = chunks

    def text(self) -> str:
        if self.chunks:
            self.rows_fn(self.chunks)
        else:
            self.top()
        text = str(self.mod)
        names = [f.name for f in self.mod.functions
                 if not f.name.startswith("llvm.") and not f.is_declaration]  # fmt: skip
        return wide_vectors(text, names) if self.n * 32 > 256 else text

    def top(self) -> None:
        """``SYMBOL(a, m, k, b, n, y, alpha)``: the function for ``k``'s vector count,
        from ``TABLE``."""
        ir, c, L = self.ir, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(self.i64, self.args), name=SYMBOL)
        table = function_table(self.mod, TABLE, CHUNKS + 1)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        k = fn.args[2]
        none, some = fn.append_basic_block(), fn.append_basic_block()
        b.cbranch(b.icmp_signed("<=", k, c(0)), none, some)  # no vector: every score is 0
        b.position_at_end(none)
        b.ret(b.call(self.rows_fn(0), list(fn.args)))
        b.position_at_end(some)
        ch = b.sdiv(b.add(k, c(L - 1)), c(L))
        ch = b.select(b.icmp_signed("<=", ch, c(CHUNKS)), ch, c(0))  # entry 0: none
        call_from_table(b, table, ch, -1)

    def rows_fn(self, chunks: int) -> Any:
        """``(a, m, k, b, n, y, alpha)`` for rows of ``chunks`` vectors: the query rows
        ``self.rows`` at a time, then one at a time, each over every block of keys."""
        ir, c, L = self.ir, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(self.i64, self.args),
                         name=chunk_symbol(chunks))  # fmt: skip
        a, m, k, bm, n, y, alpha = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        blocks = {(r, full): self.block(chunks, r, full)
                  for r in sorted({1, self.rows}) for full in (True, False)}  # fmt: skip
        R = self.rows
        grouped = b.mul(b.sdiv(m, c(R)), c(R))
        whole = b.mul(b.sdiv(n, c(L)), c(L))

        def query_rows(r: int) -> Any:
            def go(q: Any, _: list[Any]) -> list[Any]:
                aq, yq = b.gep(a, [b.mul(q, k)]), b.gep(y, [b.mul(q, n)])

                def keys(full: bool) -> Any:
                    def go(i0: Any, _: list[Any]) -> list[Any]:
                        b.call(
                            blocks[r, full],
                            [
                                aq,
                                k,
                                b.gep(bm, [b.mul(i0, k)]),
                                b.sub(n, i0),
                                b.gep(yq, [i0]),
                                n,
                                alpha,
                            ],
                        )
                        return []

                    return go

                carried_loop(b, c(0), whole, L, [], keys(True))
                carried_loop(b, whole, n, L, [], keys(False))  # the last keys, if any
                return []

            return go

        carried_loop(b, c(0), grouped, R, [], query_rows(R))
        carried_loop(b, grouped, m, 1, [], query_rows(1))
        b.ret(c(0))
        return fn

    def block(self, chunks: int, rows: int, full: bool) -> Any:
        """``(a, k, b, valid, y, n, alpha)``: the scores of ``rows`` query rows (stride
        ``k``; into ``y``, stride ``n``) against the block of ``lanes`` key rows at ``b``:
        ``full``, all of them; else the first ``valid`` < lanes (the rest neither read nor
        written)."""
        ir, c, L = self.ir, self.c, self.n
        fn = ir.Function(self.mod, ir.FunctionType(self.i64, [self.fp, self.i64, self.fp,
                                                               self.i64, self.fp, self.i64,
                                                               self.f32]),
                         name=f"{SYMBOL}_c{chunks}r{rows}{'' if full else 'p'}")  # fmt: skip
        a, k, bm, valid, y, n, alpha = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vp, four = self.vf.as_pointer(), ir.Constant(self.i32, 4)
        every = ir.Constant(self.vm, [1] * L)
        none = ir.Constant(self.vm, [0] * L)
        last = b.sub(k, c((chunks - 1) * L)) if chunks else c(0)
        tail = b.icmp_signed("<", self.iota, splat(b, b.trunc(last, self.i32), L))

        def load(base: Any, at: Any, mask: Any) -> Any:
            return b.call(self.mload, [b.bitcast(b.gep(base, [at]), vp), four, mask, self.zero])

        masks = [every] * max(chunks - 1, 0) + ([tail] if chunks else [])
        qv = [[load(a, b.add(b.mul(c(q), k), c(ch * L)), masks[ch]) for ch in range(chunks)]
              for q in range(rows)]  # fmt: skip
        stacks: list[list[tuple[int, Any]]] = [[] for _ in range(rows)]
        for i in range(L):
            here = None if full else b.icmp_signed("<", c(i), valid)
            kv = [load(bm, b.add(b.mul(c(i), k), c(ch * L)),
                       masks[ch] if here is None else b.select(here, masks[ch], none))
                  for ch in range(chunks)]  # fmt: skip
            for q in range(rows):
                t = self.zero
                for ch in range(chunks):
                    t = (
                        b.fmul(qv[q][ch], kv[ch])
                        if ch == 0
                        else b.call(self.fma, [qv[q][ch], kv[ch], t])
                    )
                self.push(b, stacks[q], t)
        scale = splat(b, alpha, L)
        out = b.icmp_signed("<", self.iota, splat(b, b.trunc(valid, self.i32), L))
        for q in range(rows):
            ((_, s),) = stacks[q]
            at = b.bitcast(b.gep(y, [b.mul(c(q), n)]), vp)
            if full:
                b.store(b.fmul(s, scale), at, align=4)
            else:
                b.call(self.mstore, [b.fmul(s, scale), at, four, out])
        b.ret(c(0))
        return fn

    def push(self, b: Any, stack: list[tuple[int, Any]], v: Any) -> None:
        """Vector ``v`` (one key's products) onto a query row's network: two vectors of the
        same level (keys of ``lanes >> level`` lanes each) fold into one of the next."""
        ir, L = self.ir, self.n
        stack.append((0, v))
        while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
            (lvl, lo_v), (_, hi_v) = stack[-2], stack[-1]
            lo, hi = _network_masks(L, L >> lvl)
            s = b.fadd(b.shuffle_vector(lo_v, hi_v, ir.Constant(self.vi, lo)),
                       b.shuffle_vector(lo_v, hi_v, ir.Constant(self.vi, hi)))  # fmt: skip
            del stack[-2:]
            stack.append((lvl + 1, s))


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, i, i, p, i, p, t.float32))]


#: the kernel and its numba wrapper, decided and built once per process
_KERNELS = WrappedKernels(lambda n: build(n, 0), _signatures, "float32", globals(),
                          {"dotrows_f4": ("_dotrows_f4", "_ext")})  # fmt: skip
_ext: Any = None  # the ExternalFunction the wrapper calls (set before it compiles)


#: ``kernel()``: the numba wrapper ``dotrows_f4`` (module docstring), None where the kernel
#: is off; ``describe()``: how it was decided ("" before it was); ``from ... import
#: dotrows_f4`` (the generated modules' form) builds it
kernel = _KERNELS.first
describe = _KERNELS.describe
_COUNTS_LOCK = threading.Lock()


def __getattr__(name: str) -> Any:
    """``dotrows_f4_c<count>`` (the generated modules' form, ``wrapper_name``): the wrapper,
    with the function for rows of that many vectors built; ``dotrows_f4``: the wrapper."""
    head, _, count = name.rpartition("_c")
    if head == "dotrows_f4" and count.isdigit() and 1 <= int(count) <= CHUNKS:
        if not ready(int(count) * lanes()):
            raise AttributeError(f"{name} cannot run on this host ({describe() or 'off'})")
        return kernel()
    return _KERNELS.attribute(name, __name__)


def wrapper_name(k: int) -> str:
    """The name generated code imports the wrapper by for rows of ``k`` floats (1..
    ``max_k()``): importing it builds their function (``ready``)."""
    return f"dotrows_f4_c{chunks_of(k)}"


def _dotrows_f4(a, ao, b, bo, y, yo, m, k, n, alpha):  # pragma: no cover - compiled
    _ext(a.ctypes.data + np.uint64(ao * 4), m, k, b.ctypes.data + np.uint64(bo * 4), n,
         y.ctypes.data + np.uint64(yo * 4), np.float32(alpha))  # fmt: skip
