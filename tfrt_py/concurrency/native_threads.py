"""Native intra-op threads: numba's parallel loops (``prange``), run by tfrt_py's pool.

A kernel split over ``intraop.IntraOpPool`` pays for Python threads: a queue hand-off,
waking a helper and the GIL before the helper reaches native code -- ~35 µs a split on
the 2-core VM, more than a 100 µs depthwise conv gains from its second core. A compiled
kernel whose parts run in a ``prange`` loop pays a few µs: native workers take parts
without the GIL one at a time while the caller takes them too, so a helper descheduled
by a busy neighbour holds up one part, not the call.

The loops are compiled for numba's TBB threading layer, and started on it: it is the one
numba layer that is both thread-safe (an executor's worker threads and a server's threads
launch parallel loops at once) and fork-safe (``serve --workers`` and gunicorn
``--preload`` fork after loading); GNU OpenMP aborts a forked child that uses it, numba's
``workqueue`` aborts on concurrent launches. Its parts then run on ``native_pool`` (whose
idle workers sleep on a futex; TBB's spin with ``sched_yield`` and join late next to a
busy process), installed here once TBB has started; on TBB's own workers where the pool
cannot be built or ``$TFRT_PY_NATIVE_POOL`` is ``0``. ``ready()`` says whether this
process has the layer: numba importable, TBB's library loadable (the ``tbb`` wheel puts
``libtbb.so.12`` in the environment's ``lib``, outside the loader's path: it is loaded
from there by path), no other layer already running, ``$NUMBA_THREADING_LAYER`` unset or
``tbb``, and ``$TFRT_PY_NATIVE_THREADS`` not ``0`` (tests switch it off to run the Python
pool's path). Kernels built on it (``Jitted(..., parallel=True)``) fall back to
``IntraOpPool`` when it is not.

Thread-safe: the first ``ready`` decides under a lock, later calls read the answer.
Imports nothing of tfrt_py outside ``concurrency`` (``native_pool``, stdlib only); numba is
imported on the first ``ready``.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from typing import Any

from . import compiled_gate, numba_target
from .env_switch import switched_off

__all__ = [
    "ENV_NATIVE_THREADS",
    "edges",
    "enter",
    "layer_expected",
    "max_threads",
    "plane_blocks",
    "ready",
    "runner",
    "state",
]

#: ``TFRT_PY_NATIVE_THREADS=0``: split kernels use the Python intra-op pool (read each call).
ENV_NATIVE_THREADS = "TFRT_PY_NATIVE_THREADS"

_LOCK = threading.Lock()
_STATE: list[bool] = []  # [answer] once decided
_WHY: list[str] = []  # [why not] once decided ("" when it runs)
_MAX: list[int] = [1]
_TLS = threading.local()


def ready() -> bool:
    """Whether compiled kernels may run their parts in numba ``prange`` loops on TBB."""
    if switched_off(ENV_NATIVE_THREADS) or compiled_gate.held():
        return False
    if _STATE:
        return _STATE[0]
    with _LOCK:
        if not _STATE:
            _STATE.append(_set_up())
        return _STATE[0]


def runner() -> str:
    """Who runs the parallel loops' parts, for ``describe()``."""
    if not ready():
        return "the intra-op pool"
    from . import native_pool  # here: a process without compiled kernels never loads it

    return "native threads (tfrt_py's pool)" if native_pool.installed() else "native threads (TBB)"


def max_threads() -> int:
    """The most threads a ``prange`` loop may use (numba's ``NUMBA_NUM_THREADS``)."""
    return _MAX[0]


def enter(threads: int) -> int:
    """Before a parallel kernel on this thread: its ``prange`` loops use ``threads``
    (capped at ``max_threads``; returned) and hand out one iteration at a time (numba's
    chunk size 1: a kernel's iterations are blocks sized for it, and a helper held up by a
    busy core delays one block instead of half the loop). Both are numba's per-thread
    settings (they apply to this thread's later parallel loops, a user's included): set
    once per thread and budget, ~0.1 µs after that. Call only when ``ready()``."""
    t = min(threads, _MAX[0])
    if getattr(_TLS, "threads", 0) != t:
        import numba

        numba.set_num_threads(t)
        numba.set_parallel_chunksize(1)
        _TLS.threads = t
    return t


#: work (elements or multiply-adds) below which a kernel's loop runs on its caller alone:
#: the parts would cost more to hand out than to run
SMALL_WORK = 1 << 16


def enter_for(work: int, threads: int) -> int:
    """``enter(threads)``, or ``enter(1)`` for ``work`` below ``SMALL_WORK`` (its loops then
    run on the calling thread, without a parallel region). Returns the threads set."""
    return enter(1 if work < SMALL_WORK else threads)


def edges(size: int, parts: int) -> Any:
    """``[size * i // parts for i in 0..parts]`` as an int64 array: the block boundaries a
    parallel kernel's ``prange`` loop walks, made once per (size, parts) (kernels call
    this per call: no allocation after the first; a dict read and write are atomic)."""
    key = (size, parts)
    got = _EDGES.get(key)
    if got is None:
        import numpy as np

        if len(_EDGES) >= _EDGES_MAX:  # requests of ever new sizes: start again
            _EDGES.clear()
        got = _EDGES[key] = np.array([size * i // parts for i in range(parts + 1)], np.int64)
        got.flags.writeable = False
    return got


def plane_blocks(n: int, c: int, parts: int) -> Any:
    """(n0, n1, c0, c1) rows, int64: ``parts`` blocks of the channels of one image (``n``
    1), else of the images -- how kernels over (N, C, ...) planes split; made once per
    (n, c, parts), like ``edges``."""
    key = (-n, c, parts)  # beside edges' (size, parts) keys, never equal to one
    got = _EDGES.get(key)
    if got is None:
        import numpy as np

        e = edges(c if n == 1 else n, min(parts, c if n == 1 else n)).tolist()
        rows = [(0, 1, a, b) if n == 1 else (a, b, 0, c) for a, b in itertools.pairwise(e)]
        if len(_EDGES) >= _EDGES_MAX:
            _EDGES.clear()
        got = _EDGES[key] = np.array(rows, np.int64)
        got.flags.writeable = False
    return got


#: ``edges`` by (size, parts) and ``plane_blocks`` by (-images, channels, parts): a model's
#: few shapes, at most ``_EDGES_MAX`` of them.
_EDGES: dict[tuple[int, ...], Any] = {}
_EDGES_MAX = 1024


def _set_up() -> bool:
    why = _start_tbb()
    _WHY[:] = [why]
    return not why


def _start_tbb() -> str:
    """Start numba's TBB layer and the pool on it; "" when it runs, else why not."""
    wanted = os.environ.get("NUMBA_THREADING_LAYER", "").strip().lower()
    if wanted not in ("", "default", "tbb"):
        return f"$NUMBA_THREADING_LAYER={wanted}"  # the user's choice for their own code
    try:
        numba = numba_target.import_numba()
        from numba.np.ufunc import parallel
    except Exception:  # noqa: BLE001 - a broken numba install is "no numba"
        return "numba is not installed"
    if getattr(parallel, "_is_initialized", False):
        try:
            if numba.threading_layer() != "tbb":
                return f"numba's {numba.threading_layer()} layer started first"
        except ValueError:
            return "another numba threading layer started first"
    elif not _tbb_importable():
        return "TBB's library (the tbb package) is not loadable"
    config: Any = numba.config
    config.THREADING_LAYER = "tbb"
    _MAX[0] = int(config.NUMBA_NUM_THREADS)
    try:
        parallel._launch_threads()  # TBB registers its parallel_for: the pool's replaces it
    except Exception as e:  # noqa: BLE001 - TBB failed to start: no native threads
        return f"TBB did not start ({type(e).__name__})"
    from . import native_pool

    native_pool.install(_MAX[0])
    return ""


def state() -> tuple[bool | None, str]:
    """(on, why) without starting anything: None while no kernel has asked (``ready``
    decides on first use), else whether the layer runs and, when not, why."""
    if switched_off(ENV_NATIVE_THREADS):
        return False, f"${ENV_NATIVE_THREADS}=0"
    if not _STATE:
        return None, "starts with the first split kernel"
    return _STATE[0], (_WHY[0] if _WHY else "")


def layer_expected() -> bool:
    """Whether the layer runs or is expected to, deciding nothing and importing nothing:
    its state once decided, else whether TBB's library is installed where ``_tbb_importable``
    looks (or numba's TBB pool is already imported)."""
    on, _ = state()
    if on is not None:
        return bool(on)
    if "numba.np.ufunc.tbbpool" in sys.modules:
        return True
    dirs = {os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")}
    return any(os.path.exists(os.path.join(d, "libtbb.so.12")) for d in dirs)


def _tbb_importable() -> bool:
    """numba's TBB pool imports, after loading ``libtbb.so.12`` by path when the loader
    does not find it (a pip-installed ``tbb`` in a virtual environment)."""
    try:
        import numba.np.ufunc.tbbpool

        return True
    except ImportError:
        pass
    for d in {os.path.join(sys.prefix, "lib"), os.path.join(sys.base_prefix, "lib")}:
        path = os.path.join(d, "libtbb.so.12")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                import numba.np.ufunc.tbbpool  # noqa: F401

                return True
            except (OSError, ImportError):
                return False
    return False
