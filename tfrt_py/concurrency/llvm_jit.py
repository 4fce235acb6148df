"""The one way tfrt_py compiles hand-written LLVM IR: llvmlite's MCJIT, in this process,
no C compiler. Its users are the native pool (``native_pool.ll``) and the packed-weight
gemm kernels (``kernels/lib/gemm_packed.py``, ``qgemm_packed.py``).

``compile_ir(ir, host_cpu=...)`` parses and verifies the module, compiles it for this
process's target (with ``host_cpu``, for this CPU's name and features: AVX2, FMA, AVX-512
where present) and returns the engine, which owns the machine code: keep it alive as long
as any address taken from it is called. ``add_symbol`` makes an address callable under a
name from IR compiled later (by this module or by numba, which links through the same
LLVM symbol table). ``compile_ir_cached`` keeps the machine code of host-CPU builds in the
private cache dir, so a later process loads it instead of compiling (the packed gemms).
Imports llvmlite only when called; raises whatever llvmlite raises
(callers turn that into "this fast path is off" with a reason). Thread-safety: callers
serialize (each compiles once, under its own lock).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from typing import Any

__all__ = ["add_symbol", "compile_ir", "compile_ir_cached", "ir_text"]

#: The first bytes of a cached object file; then the SHA-256 of the rest, then the object.
_MAGIC = b"tfrt_py llvm object 1\n"


def ir_text(name: str) -> str:
    """The IR source file ``name`` shipped in this package (``concurrency/``), read now."""
    from importlib.resources import files

    return files(__package__).joinpath(name).read_text(encoding="utf-8")


def compile_ir(
    ir: str, *, host_cpu: bool = False, opt: int = 2,
    keep_object: Callable[[bytes], None] | None = None,
) -> Any:  # fmt: skip
    """``ir`` compiled by MCJIT at optimization level ``opt``: the finalized engine
    (``get_function_address``, ``get_global_value_address``). ``host_cpu``: for this
    CPU's name and features; else the process triple's baseline (code that must run on any
    CPU of the triple, such as the pool's). ``keep_object`` is handed the object file
    MCJIT made (``compile_ir_cached``)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # inline asm (depthwise_ir's valignd)
    target = llvm.Target.from_triple(llvm.get_process_triple())
    if host_cpu:
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=opt
        )
    else:
        tm = target.create_target_machine(opt=opt)
    mod = llvm.parse_assembly(ir)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, tm)
    if keep_object is not None:
        engine.set_object_cache(notify_func=lambda _mod, buf: keep_object(bytes(buf)))
    engine.finalize_object()
    return engine


def compile_ir_cached(
    make_ir: Callable[[], str], key: str, sources: tuple[str, ...], *, opt: int = 2
) -> tuple[Any, bool]:
    """``compile_ir(make_ir(), host_cpu=True, opt=opt)`` with its machine code kept in the
    private cache dir (``cachedir.cache_dir()``): (engine, whether it came from there).

    The file's name hashes ``key`` (the build's parameters: tile, symbol, ...), the
    content of every file in ``sources`` (the code that writes the IR, base classes'
    files included: a change to any builds anew), ``opt``, llvmlite's version and this
    CPU's name and features, so a later process on this host loads the object instead
    of building the IR and compiling it (the packed gemm: 0.46 s on a 2-core Xeon, 0.26 s
    of it building the IR in Python, holding the GIL). A file is trusted because nobody
    else can write the directory (``check_dir``) and used only if it is a regular file
    whose SHA-256 matches (a torn write or a link is deleted and rebuilt); it is written to
    a temporary name and renamed (mode 0600). An unusable cache dir, or a failed write,
    compiles as ``compile_ir`` does."""
    import llvmlite
    import llvmlite.binding as llvm

    from .cachedir import UnsafeCacheDir, cache_dir

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # inline asm (depthwise_ir's valignd)
    host = f"{llvm.get_host_cpu_name()}|{llvm.get_host_cpu_features().flatten()}"
    import hashlib  # here, with llvmlite: `import tfrt_py` does not pay for them

    h = hashlib.sha256(f"{key}\0{opt}\0{llvmlite.__version__}\0{host}".encode())
    for src in sources:
        with open(src, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    digest = h.hexdigest()
    try:
        path: str | None = os.path.join(cache_dir(), f"llvm_{digest[:40]}.o")
    except (UnsafeCacheDir, OSError):
        path = None
    if path is not None:
        obj = _read_object(path)
        if obj is not None:
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _host_machine(opt))
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            return engine, True
    made: list[bytes] = []
    engine = compile_ir(make_ir(), host_cpu=True, opt=opt, keep_object=made.append)
    if path is not None and made:
        _write_object(path, made[0])
    return engine, False


def _host_machine(opt: int) -> Any:
    import llvmlite.binding as llvm

    target = llvm.Target.from_triple(llvm.get_process_triple())
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features, opt=opt)


def _read_object(path: str) -> bytes | None:
    """The object in ``path`` when it is a regular file (not a link) whose digest matches;
    one that is not is deleted (the link, not what it points to)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:  # a link (ELOOP), or unreadable: replaced below
        data = b""
    else:
        with os.fdopen(fd, "rb") as f:
            data = f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else b""
    import hashlib

    head = len(_MAGIC)
    obj = data[head + 32 :]
    if data[:head] == _MAGIC and hashlib.sha256(obj).digest() == data[head : head + 32]:
        return obj
    with contextlib.suppress(OSError):
        os.unlink(path)
    return None


def _write_object(path: str, obj: bytes) -> None:
    import hashlib
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".llvm_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(obj).digest() + obj)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def add_symbol(name: str, address: int) -> None:
    """Bind ``name`` to ``address`` for IR compiled from now on (numba's included)."""
    import llvmlite.binding as llvm

    llvm.add_symbol(name, address)
