"""What the float32 LLVM IR kernels of ``kernels/lib`` share (``linear_rows_ir``,
``rowvec_ir``, ``dotrows_ir``, ``rowreduce_ir``).

``FloatVectors(n, name)``: a builder's base: an IR module ``name`` with the integer, float
and vector types for vectors of ``n`` floats, the masked load/store and FMA intrinsics at
that width, a zero vector, the lane indices and ``c(v)`` (an i64 constant). Built on the
thread that builds the module (under the kernel's ``Once``); not shared.

``WrappedKernels(build, signatures, unit, namespace, wrappers)``: a module's kernels
decided once per process (``pool_ir.register_lanes``: built at this process's width,
registered with LLVM as ExternalFunctions) and the numba wrappers generated code calls,
compiled once under a lock: each wrapper a plain function of ``namespace`` that calls its
ExternalFunction through a global of ``namespace``, set before the wrapper compiles.
``get()`` is None where the kernels are off (``$TFRT_PY_PACKED_GEMM=0``, the cold start's
gate held, no llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable``). Any thread.
"""

from __future__ import annotations

import threading
from typing import Any

from ...concurrency import compiled_gate, numba_target
from ...concurrency.env_switch import switched_off
from ...concurrency.llvm_jit import compile_ir_cached
from ...concurrency.once import Once
from .gemm_packed import ENV_PACKED_GEMM, IR_HELPERS
from .pool_ir import register_lanes

__all__ = [
    "BASE_SOURCES", "FloatVectors", "WrappedKernels", "build_module", "call_from_table",
    "enter_in_table", "function_table", "images_function",
]  # fmt: skip

#: What a ``FloatVectors`` module's IR is written with besides its own file (the sources
#: of its machine-code cache key, ``compile_ir_cached``)
BASE_SOURCES = (__file__, *IR_HELPERS)


def build_module(make_text: Any, key: str, source: str) -> Any:
    """``compile_ir_cached`` of a ``FloatVectors`` module's text (``make_text()``) written
    by the file ``source``: the engine (its machine code cached, the key hashing
    ``source`` and ``BASE_SOURCES``). Raises what llvmlite raises."""
    return compile_ir_cached(make_text, key, (source, *BASE_SOURCES), opt=3)[0]


def function_table(mod: Any, name: str, slots: int) -> Any:
    """A global ``name`` in ``mod`` of ``slots`` function addresses, all 0 (none built):
    a kernel built in parts calls each part through it (``call_from_table``) once
    ``enter_in_table`` put the part's address there."""
    import llvmlite.ir as ir

    table = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(64), slots), name=name)
    table.initializer = ir.Constant(table.type.pointee, [0] * slots)
    return table


def call_from_table(b: Any, table: Any, slot: Any, missing: int) -> None:
    """At builder ``b``: return what the function at ``table[slot]`` (an i64 index in
    range) returns for the arguments of ``b``'s function, of the same type; ``missing``
    (an i64) where that entry is 0."""
    import llvmlite.ir as ir

    i64, fn = ir.IntType(64), b.function
    address = b.load(b.gep(table, [ir.Constant(i64, 0), slot]))
    none, found = fn.append_basic_block(), fn.append_basic_block()
    b.cbranch(b.icmp_unsigned("==", address, ir.Constant(i64, 0)), none, found)
    b.position_at_end(none)
    b.ret(ir.Constant(i64, missing))
    b.position_at_end(found)
    b.ret(b.call(b.inttoptr(address, fn.function_type.as_pointer()), list(fn.args)))


def enter_in_table(engine: Any, name: str, slots: int, entries: dict[int, int]) -> None:
    """Write ``entries`` (slot: function address) into the table ``name`` of ``slots``
    entries in ``engine`` (``function_table``): calls through those slots run from then
    on. The caller keeps the engines of the addresses alive and serializes the writes
    for one table (each an aligned 8-byte store: a concurrent call sees 0 or the
    address)."""
    import ctypes

    table = (ctypes.c_uint64 * slots).from_address(engine.get_global_value_address(name))
    for slot, address in entries.items():
        table[slot] = address


def images_function(mod: Any, fn: Any, name: str, stepped: tuple[int, ...]) -> None:
    """Add to ``mod`` the function ``name(<fn's arguments>, count, <one step a stepped
    argument>) -> status``: ``fn`` (returning an i64 status) on ``count`` images, its
    pointer argument ``stepped[j]`` advanced ``i * step_j`` elements for image i; the first
    non-zero status ends it. One ctypes call for a batch instead of one an image: each
    call from Python hands the GIL over, and a busy background thread takes it each time."""
    import llvmlite.ir as ir

    i64 = ir.IntType(64)
    base = fn.function_type.args
    loop = ir.Function(mod, ir.FunctionType(i64, [*base, i64] + [i64] * len(stepped)), name=name)
    args = list(loop.args)
    count, steps = args[len(base)], args[len(base) + 1 :]
    b = ir.IRBuilder(loop.append_basic_block("entry"))
    head, body, fail, done = (loop.append_basic_block() for _ in range(4))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, count), body, done)
    b.position_at_end(body)
    call = args[: len(base)]
    for at, step in zip(stepped, steps, strict=True):
        call[at] = b.gep(args[at], [b.mul(i, step)])
    status = b.call(fn, call)
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), body)
    b.cbranch(b.icmp_signed("!=", status, ir.Constant(i64, 0)), fail, head)
    b.position_at_end(fail)
    b.ret(status)
    b.position_at_end(done)
    b.ret(ir.Constant(i64, 0))


class FloatVectors:
    """Types, intrinsics and constants for an IR module over vectors of ``n`` floats."""

    def __init__(self, n: int, name: str) -> None:
        import llvmlite.ir as ir

        self.ir, self.n = ir, n
        self.i1, self.i32, self.i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
        self.f32 = ir.FloatType()
        self.fp = self.f32.as_pointer()
        self.vf = ir.VectorType(self.f32, n)
        self.vi = ir.VectorType(self.i32, n)
        self.vm = ir.VectorType(self.i1, n)
        self.mod = ir.Module(name=name)
        vp = self.vf.as_pointer()
        load_t = ir.FunctionType(self.vf, [vp, self.i32, self.vm, self.vf])
        self.mload = ir.Function(self.mod, load_t, name=f"llvm.masked.load.v{n}f32.p0v{n}f32")
        store_t = ir.FunctionType(ir.VoidType(), [self.vf, vp, self.i32, self.vm])
        self.mstore = ir.Function(self.mod, store_t, name=f"llvm.masked.store.v{n}f32.p0v{n}f32")
        self.fma = ir.Function(self.mod, ir.FunctionType(self.vf, [self.vf] * 3),
                               name=f"llvm.fma.v{n}f32")  # fmt: skip
        self.zero = ir.Constant(self.vf, [0.0] * n)
        self.iota = ir.Constant(self.vi, list(range(n)))

    def c(self, v: int) -> Any:
        return self.ir.Constant(self.i64, v)


class WrappedKernels:
    """A module's ExternalFunctions and their numba wrappers (module docstring).
    ``wrappers`` maps each public name, in ``signatures``' order, to (the wrapper's
    function name in ``namespace``, the global it calls the ExternalFunction by)."""

    def __init__(self, build: Any, signatures: Any, unit: str, namespace: dict[str, Any],
                 wrappers: dict[str, tuple[str, str]]) -> None:  # fmt: skip
        #: (why, the ExternalFunctions or None, engine or None), decided on first use
        self._decided: Once[tuple[str, Any, Any]] = Once(
            lambda: register_lanes(build, signatures, unit)
        )
        self._namespace, self._wrappers = namespace, wrappers
        self._lock = threading.Lock()
        self._wrapped: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        """The numba wrappers in ``wrappers``' order, None where the kernels are off."""
        if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
            return None
        fns = self._decided.get()[1]
        if fns is None:
            return None
        with self._lock:
            if self._wrapped is None:
                numba = numba_target.import_numba()
                jit = numba.njit(nogil=True, cache=True)
                wrapped = []
                for ext, (fn_name, global_name) in zip(fns, self._wrappers.values()):
                    self._namespace[global_name] = ext
                    wrapped.append(jit(self._namespace[fn_name]))
                self._wrapped = tuple(wrapped)
            return self._wrapped

    def first(self) -> Any:
        """The first wrapper (a module of one kernel's ``kernel()``), None where off."""
        got = self.get()
        return None if got is None else got[0]

    def engine(self) -> Any:
        """The engine the kernels were built in (deciding them now), None where they
        were not."""
        return self._decided.get()[2]

    def describe(self) -> str:
        """How the kernels were decided ("" before they were)."""
        got = self._decided.peek()
        return got[0] if got else ""

    def module_getattr(self, module: str) -> Any:
        """Module ``module``'s ``__getattr__``: ``attribute`` for that module."""
        return lambda name: self.attribute(name, module)

    def attribute(self, name: str, module: str) -> Any:
        """The wrapper called ``name`` (building the kernels), for the generated modules'
        ``from module import name``; else module ``module`` has no such attribute."""
        if name in self._wrappers:
            got = self.get()
            if got is not None:
                return got[list(self._wrappers).index(name)]
            raise AttributeError(f"{name} cannot run on this host ({self.describe() or 'off'})")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
