"""tfrt_py's thread budget: how many threads one call may use, and who runs them.

OpenBLAS's own threads spin while they wait for work: next to another busy process they
spin against each other and everything else (a 197x192 @ 192x768 product took 16 ms
instead of 0.5 ms with two BLAS threads and a busy neighbour). So tfrt_py owns the
threads: NumPy's BLAS runs single-threaded, and kernels that pay for it (large matrix
products, convs) split their work over this budget: compiled kernels with a parallel form
in numba ``prange`` loops (``native_threads``: no GIL, blocks taken one at a time by
``native_pool``'s futex-sleeping workers), the rest over tfrt_py's intra-op pool
(``intraop.IntraOpPool``), whose threads block instead of spinning and whose caller
steals back parts a slow helper has not started -- so a busy core slows a split kernel
to about its serial time, never to a stall.

The budget, per process (the number of threads one call uses, caller included):
``TFRT_PY_THREADS`` if set, else ``load(..., threads=N)`` (the last value given wins), else
the cores this process may run on. ``configure`` applies it; the first ``load`` calls it.
The async executor's inter-op pool (``HostContext``) runs expensive kernels side by side
on its own threads; their splits share the same intra-op pool, whose helpers only take
work when they are idle, so inter-op and intra-op never multiply past the budget by more
than the pool's helpers.

Thread-safe. Imports nothing of tfrt_py but ``intraop`` and ``openblas``; threadpoolctl is
imported when a BLAS other than OpenBLAS is loaded, or ``blas_threads()`` is asked.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

from .intraop import IntraOpPool
from .openblas import direct_blas

__all__ = [
    "THREADS_ENV",
    "THREAD_ENV",
    "available_cores",
    "blas_threads",
    "configure",
    "cores",
    "intra_pool",
    "limit_blas",
    "set_process_threads",
    "threads",
]

THREADS_ENV = "TFRT_PY_THREADS"
#: What ``set_process_threads(n)`` sets in the environment, for libraries loaded later and
#: for subprocesses: BLAS and OpenMP pools one thread (tfrt_py splits work itself), numba's
#: and tfrt_py's ``n``.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": None,
    THREADS_ENV: None,
}

_lock = threading.Lock()
_pool: IntraOpPool | None = None


def cores() -> int:
    """The cores this process may run on (an alias of ``available_cores``)."""
    return available_cores()


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _from_env() -> int | None:
    raw = os.environ.get(THREADS_ENV)
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError as e:
        raise ValueError(f"${THREADS_ENV} must be a positive integer, got {raw!r}") from e
    if n < 1:
        raise ValueError(f"${THREADS_ENV} must be a positive integer, got {raw!r}")
    return n


def configure(requested: int | None = None) -> int:
    """Apply the budget (``$TFRT_PY_THREADS``, else ``requested``, else every available
    core): size the intra-op pool and make every loaded BLAS single-threaded (again at
    each call: a library loaded since -- SciPy's own OpenBLAS -- is caught at the next
    load). Returns the budget."""
    global _pool
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int)
                                  or requested < 1):  # fmt: skip
        raise ValueError(f"threads must be a positive int or None, got {requested!r}")
    env = _from_env()
    n = env if env is not None else requested if requested is not None else available_cores()
    with _lock:
        if _pool is None or _pool.threads != n:
            old, _pool = _pool, IntraOpPool(n)
            if old is not None:
                old.close()
        _single_threaded_blas()
    return n


def limit_blas() -> None:
    """Make BLAS libraries loaded since the last look single-threaded too: ``load`` calls
    it again when it has prepared a model (numba's compiles import SciPy, whose own
    OpenBLAS starts with a thread per core), the native tier when a compile is installed.
    Cheap when no module was imported since (``_single_threaded_blas``)."""
    with _lock:
        _single_threaded_blas()


def intra_pool() -> IntraOpPool:
    """The process's intra-op pool (configured with the default budget on first use)."""
    pool = _pool
    if pool is None:
        configure()
        pool = _pool
        assert pool is not None
    return pool


def threads() -> int:
    """The current budget (threads per call)."""
    return intra_pool().threads


def set_process_threads(n: int) -> None:
    """Make this process compute with ``n`` threads: a worker among several on one machine
    (a pre-forked server worker, a Ray actor) must not take every core. Sets the budget
    (``configure``), the environment (``THREAD_ENV``) for libraries loaded later and for
    subprocesses, and the default ``HostContext``'s inter-op pool to ``n`` workers when it
    has not started. Call it early in the process it configures, from one thread."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads must be a positive int, got {n!r}")
    for var, value in THREAD_ENV.items():
        os.environ[var] = str(n) if value is None else value
    configure(n)
    from .host import default_host

    default_host().resize(n)


def blas_threads() -> dict[str, int]:
    """Threads of each loaded BLAS library, by file name (threadpoolctl; empty without)."""
    try:
        import threadpoolctl
    except ImportError:
        return {}
    return {
        os.path.basename(info["filepath"]): int(info["num_threads"])
        for info in under_import_lock(threadpoolctl.threadpool_info)
        if info.get("user_api") == "blas"
    }


def under_import_lock(scan: Callable[[], Any]) -> Any:
    """``scan()`` (a threadpoolctl scan of the loaded libraries) with the interpreter's
    import lock held. The scan walks the libraries with ``dl_iterate_phdr``, which holds
    the dynamic loader's lock while it calls back into Python; a thread importing an
    extension module holds the GIL while its ``dlopen`` waits for that lock, so the two
    can wait on each other for ever. Holding the import lock, no import starts meanwhile
    (one already past its module lock can still reach ``dlopen``: this narrows the
    window; ``_single_threaded_blas`` scans only when a BLAS library arrived)."""
    import _imp

    _imp.acquire_lock()
    try:
        return scan()
    finally:
        _imp.release_lock()


#: (number of imported modules, the BLAS libraries mapped, threadpoolctl's BLAS
#: controllers) at the last look; guarded by ``_lock``.
_blas_scan: tuple[int, Any, Any] | None = None

#: Library file names threadpoolctl's BLAS controllers are for (OpenBLAS, MKL, BLIS,
#: FlexiBLAS, NumPy/SciPy's bundled OpenBLAS builds).
_BLAS_HIT = re.compile(rb"blas|mkl|blis")


def _mapped_blas() -> Any:
    """The BLAS-like libraries mapped into this process (from ``/proc/self/maps``: a file
    read, no loader lock, no callback into Python; ~2 ms in a large process), or the
    number of imported modules where that file does not exist."""
    try:
        with open("/proc/self/maps", "rb") as f:
            data = f.read()
    except OSError:
        return len(sys.modules)
    found = set()
    for hit in _BLAS_HIT.finditer(data.lower()):  # a few lines per library
        start = data.rfind(b"\n", 0, hit.start()) + 1
        end = data.find(b"\n", hit.end())
        path = data[start : len(data) if end < 0 else end].rpartition(b" ")[2]
        if path.startswith(b"/") and b"/" not in path[path.rfind(b"/") + 1 :]:
            found.add(path)
    return frozenset(found)


def _single_threaded_blas() -> None:
    """NumPy's BLAS to one thread, process-wide: OpenBLAS builds directly through their C
    API (``openblas.direct_blas``), any other BLAS through threadpoolctl (a no-op without
    it).

    threadpoolctl's scan of the loaded libraries is done again only when a BLAS library
    was mapped since the last one (SciPy's own OpenBLAS comes with ``scipy.linalg``);
    otherwise the libraries found then are asked for their thread counts (µs) and set
    back to one if something raised them. The scan walks the libraries with
    ``dl_iterate_phdr``, which holds the dynamic loader's lock while calling back into
    Python: with another thread importing an extension module (its ``dlopen`` waiting
    for that lock with the GIL held) the two wait on each other for ever -- threadpoolctl
    3.5's callback gives up the GIL for a stat, and the suite's collection hung so while
    a native compile, finishing on its thread, limited BLAS after every import. So the
    scan runs only when a BLAS arrived, under the import lock (``under_import_lock``).
    Caller holds ``_lock``."""
    global _blas_scan
    n_modules = len(sys.modules)
    if _blas_scan is not None and _blas_scan[0] == n_modules:
        blas = _blas_scan[2]  # nothing imported since: no library can have arrived
        mapped = _blas_scan[1]
    else:
        mapped = _mapped_blas()  # ~1 ms: read only after an import
        if _blas_scan is None or _blas_scan[1] != mapped:
            blas = direct_blas(mapped) if isinstance(mapped, frozenset) else None
            if blas is None:  # not only OpenBLAS: threadpoolctl knows the others
                try:
                    import threadpoolctl
                except ImportError:
                    return
                controller: Any = under_import_lock(threadpoolctl.ThreadpoolController)
                blas = controller.select(user_api="blas")
                mapped = _mapped_blas()  # threadpoolctl may have loaded libraries itself
        else:
            blas = _blas_scan[2]
    if any(lib.num_threads != 1 for lib in blas.lib_controllers):
        blas.limit(limits=1)
    _blas_scan = (len(sys.modules), mapped, blas)  # counted last: threadpoolctl imports lazily


def _reset_after_fork() -> None:
    """The intra-op helpers do not survive fork; the child's pool restarts them on use."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
