"""Optional numba for the few kernels NumPy cannot do in one pass (direct grouped
convolution, fused conv epilogues, GELU, LayerNormalization rows, small Softmax):
``Jitted`` compiles a plain Python function with ``numba.njit`` the first time a kernel
builder asks for it.

numba is optional (the ``[native]`` extra). ``Jitted.get()`` returns None when numba
cannot be imported, when ``$TFRT_PY_JIT=0`` (read on each ``get``: tests and users
switch the compiled kernels off so the NumPy paths run), or when compiling failed once
(the failure is remembered, never retried); every caller then takes its NumPy path, which
computes the same values. Functions are compiled with ``nogil=True`` (an executor's worker
threads run them in parallel), ``cache=True`` (numba keeps the machine code on disk, so a
second process skips LLVM) and ``error_model='numpy'``; no fastmath, so results follow
IEEE arithmetic in the model's dtype -- except where a ``Jitted`` names LLVM fast-math
flags itself (``fastmath``: only ``contract``, fused multiply-adds, which change rounding
and nothing else, is used).

Thread-safe: the first ``get`` compiles under a lock; later ones return the dispatcher.
Nothing here imports numba until a builder calls ``get`` (or ``import_numba``); a cold
process's ``load()`` holds them back while they warm in the background
(``tfrt_py.cold_start``).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

from ...concurrency import compiled_gate, native_threads, numba_target
from ...concurrency.env_switch import switched_off

__all__ = [
    "CONTRACT",
    "ENV_JIT",
    "Jitted",
    "frozen",
    "import_numba",
    "imported",
    "inline",
    "jit_enabled",
    "join_stamps",
    "uses",
    "why_off",
]

#: ``TFRT_PY_JIT=0`` turns the numba kernels off: every kernel takes its NumPy path.
ENV_JIT = "TFRT_PY_JIT"

#: The one fast-math flag kernels use: LLVM may fuse ``a * b + c`` into one multiply-add
#: (rounded once instead of twice; nothing else changes). A kernel of multiply-add chains
#: (the depthwise taps, the logistic's polynomials) runs on half the instructions: the
#: float32 SiLU epilogue took 0.66 ns an element without it, 0.51 with it.
CONTRACT = frozenset({"contract"})

_LOCK = threading.Lock()
_NUMBA: list[Any] = []  # [module] once imported, [None] when it cannot be


def jit_enabled() -> bool:
    """Whether compiled kernels may be used: numba is installed, ``$TFRT_PY_JIT`` is not
    ``0`` and a cold process's warm-up does not hold them back on this thread
    (``concurrency.compiled_gate``). Does not import numba; ``why_off`` says why not."""
    return not why_off()


def why_off() -> str:
    """Why compiled kernels may not be used on this thread now ("" when they may): the
    reason ``jit_enabled()`` is False. Does not import numba."""
    if switched_off(ENV_JIT):
        return f"${ENV_JIT}=0"
    if compiled_gate.held():
        return "a cold start's warm-up holds them back until it switches"
    if _NUMBA:
        return "" if _NUMBA[0] is not None else "numba failed to import in this process"
    try:
        found = importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):  # a broken install is "no numba", as in ``_numba``
        found = False
    return "" if found else "numba is not installed"


def imported() -> bool:
    """Whether this process tried to import numba for the compiled kernels (``_numba``)."""
    return bool(_NUMBA)


def import_numba() -> bool:
    """Import numba now, unless ``jit_enabled()`` is False; whether it is imported."""
    return jit_enabled() and _numba() is not None


def _numba() -> Any:
    with _LOCK:
        if not _NUMBA:
            mod: Any = None
            try:
                mod = numba_target.import_numba()
            except Exception:  # noqa: BLE001 - a broken numba install is "no numba"
                mod = None
            _NUMBA.append(mod)
        return _NUMBA[0]


_HELPERS: set[int] = set()
_INLINE = "_tfrt_py_inline"
_USES = "_tfrt_py_uses"


def inline(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the helper ``fn`` to be inlined into the compiled functions that call it (in
    numba's IR, before LLVM: the loop compiles as if written in the caller, so one body can
    serve a float32 and a float64 kernel, or an in-place and an out-of-place loop, at no
    cost). Returns ``fn``, still a plain Python function."""
    setattr(fn, _INLINE, True)
    return fn


def uses(*helpers: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the helpers a compiled function calls: a ``Jitted`` of the decorated function,
    or of one that names it among its ``helpers``, registers them first (its callers need
    not know them)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _USES, helpers)
        return fn

    return mark


def _with_uses(helpers: tuple[Callable[..., Any], ...]) -> list[Callable[..., Any]]:
    """``helpers`` and what they ``uses``, each after what it calls, once."""
    order: list[Callable[..., Any]] = []
    for h in helpers:
        for d in [*_with_uses(getattr(h, _USES, ())), h]:
            if d not in order:
                order.append(d)
    return order


def _register_helper(numba: Any, fn: Callable[..., Any]) -> None:
    """Make ``fn`` callable from compiled code (once per process; under ``_LOCK``, so two
    kernels never register one helper twice at once); inlined where ``inline`` marked it."""
    with _LOCK:
        if id(fn) not in _HELPERS:
            from numba.extending import register_jitable

            if getattr(fn, _INLINE, False):
                register_jitable(inline="always")(fn)
            else:
                register_jitable(fn)
            _HELPERS.add(id(fn))


class Jitted:
    """A Python function compiled with numba on first use.

    ``fn`` must be a module-level function numba can compile in nopython mode. ``get()``
    returns the compiled dispatcher, or None (see the module doc); ``warm`` (optional)
    is called with the dispatcher once after compiling, to force compilation for the
    argument types the kernels use at load time rather than on a model's first call.
    ``helpers`` are module-level functions ``fn`` calls: they are registered with numba
    (``register_jitable``; inlined where ``inline`` marked them) before ``fn`` compiles and
    stay plain Python functions.
    ``fastmath``: LLVM fast-math flags for ``fn`` (empty: none). ``parallel``: compiled
    with ``parallel=True`` for its ``numba.prange`` loops, which run on numba's TBB layer
    (``concurrency.native_threads``): ``get()`` returns None where that layer is not ready
    (the caller splits over the Python intra-op pool instead). ``fn`` refers to numba
    through its module's global ``numba``, set here before it compiles (kernel modules
    import without numba). ``prepare(fn's module globals)``, when given, runs before
    compiling (or loading from the cache) and sets what else ``fn`` needs; False: the
    kernel is unavailable (``get()`` returns None).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        warm: Callable[[Any], None] | None = None,
        helpers: tuple[Callable[..., Any], ...] = (),
        fastmath: frozenset[str] = frozenset(),
        parallel: bool = False,
        prepare: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.fn = fn
        self._parallel = parallel
        self._prepare = prepare
        self._warm = warm
        self._helpers = helpers
        self._fastmath = set(fastmath) or False
        self._compiled: Any = None
        self._failed = False
        self._lock = threading.Lock()
        self._warmed: dict[Any, bool] = {}  # get_for's keys: whether their warm-up compiled

    def usable(self) -> bool:
        """Whether ``get()`` may give the compiled function here (it has not failed, numba
        may be used, the parallel layer is ready), without compiling it: a plan asks this
        before it knows it will call the function."""
        if self._failed or not jit_enabled():
            return False
        return not self._parallel or native_threads.ready()

    def lazy(self) -> Callable[..., Any]:
        """A stand-in for ``get()``'s function that compiles it on its first call: for a
        plan that holds a kernel it will rarely call (a split conv's serial form, used if
        the thread budget drops to one), so a model does not compile what it never runs.
        Compiles whatever ``$TFRT_PY_JIT`` says by then (the plan was made with it on);
        RuntimeError (the node's ExecutionError) if the function cannot be compiled."""
        return _LazyKernel(self)

    def get(self) -> Any:
        """The compiled function, or None when the NumPy path must run."""
        return self._compile() if self.usable() else None

    def get_for(self, key: Any, warm_one: Callable[[Any], None]) -> Any:
        """``get()``, and ``warm_one(the function)`` the first time this process asks for
        ``key`` (the argument types of one call, hashable): for a kernel with many type
        combinations a plan compiles only those its model calls (numba compiles one
        signature per argument types), at load, where a warm-up of every combination cost
        each process minutes on a cold cache. None where ``get()`` is, or where that
        warm-up failed (as ``get()`` where its own fails: the NumPy path, for these types
        only). Any thread; two plans may warm one key at once (numba compiles it once)."""
        fn = self.get()
        if fn is not None and key not in self._warmed:
            try:
                warm_one(fn)
                self._warmed[key] = True
            except Exception:  # noqa: BLE001 - any compile failure: the NumPy path
                self._warmed[key] = False
        return fn if fn is None or self._warmed[key] else None

    def _compile(self) -> Any:
        """The compiled function (compiled now if not yet), or None when it cannot be."""
        compiled = self._compiled
        if compiled is not None or self._failed:
            return compiled
        with self._lock:
            if self._compiled is None and not self._failed:
                numba = _numba()
                if numba is None:
                    self._failed = True
                    return None
                try:
                    helpers = _with_uses((*self._helpers, *getattr(self.fn, _USES, ())))
                    for h in helpers:
                        _register_helper(numba, h)
                    if self._parallel and self.fn.__globals__.get("numba") is None:
                        self.fn.__globals__["numba"] = numba
                    if self._prepare is not None and not self._prepare(self.fn.__globals__):
                        self._failed = True
                        return None
                    d = numba.njit(
                        nogil=True,
                        cache=True,
                        error_model="numpy",
                        fastmath=self._fastmath,
                        parallel=self._parallel,
                    )(self.fn)
                    own = inspect.getsourcefile(self.fn)
                    join_stamps(d, [f for h in helpers
                                    if (f := inspect.getsourcefile(h)) and f != own])  # fmt: skip
                    if self._warm is not None:
                        self._warm(d)
                    self._compiled = d
                except Exception:  # noqa: BLE001 - any compile failure: the NumPy path
                    self._failed = True
            return self._compiled


class _LazyKernel:
    """``Jitted.lazy()``'s callable: compiles on its first call, then calls the function."""

    __slots__ = ("_fn", "_jitted")

    def __init__(self, jitted: Jitted) -> None:
        self._jitted = jitted
        self._fn: Any = None

    def __call__(self, *args: Any) -> Any:
        fn = self._fn
        if fn is None:
            fn = self._fn = self._jitted._compile()
            if fn is None:  # the executor reports it as the node's ExecutionError
                name = self._jitted.fn.__name__
                raise RuntimeError(f"the compiled kernel {name} is unavailable")
        return fn(*args)


def frozen(a: Any) -> Any:
    """``a`` made read-only, for ``warm`` functions: a model's constant weights reach the
    kernels read-only, and numba compiles a read-only array argument apart from a writable
    one, so a warm-up on writable weights compiles a signature no model calls."""
    a.flags.writeable = False
    return a


def join_stamps(d: Any, files: list[str]) -> None:
    """numba's disk cache checks only the stamp (mtime, size) of a function's own file: a
    helper from another file, changed, would leave stale machine code. The stamps of
    ``files`` join the cache's stamp of the dispatcher ``d``, so a change to any of them
    recompiles (numba's internals: where they differ, the cache keeps its own stamp)."""
    if not files:
        return
    try:
        cache_file = d._cache._cache_file
        stamps = tuple((f, os.stat(f).st_mtime, os.stat(f).st_size) for f in sorted(set(files)))
        cache_file._source_stamp = (cache_file._source_stamp, stamps)
    except (AttributeError, OSError):
        pass
