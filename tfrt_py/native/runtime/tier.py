"""Tiered execution: the sync interpreter serves a native model until compiled code for
the call's input signature is ready; then the call goes to the native entry.

Three forms: *static* (the declared shapes), *rows* (inputs with a dynamic first dim
whose rows are independent: one function for every batch size) and *signature* (other
dynamic dims: one function per box of dims, ``Lowered.mode`` "box", ``generic.py``; a box
that declines, one function per input signature in it; at most ``MAX_SIGNATURES`` kept,
least recently started dropped; each lowered and compiled while the interpreter serves).

``NativeTier.run(feeds, outputs=None)`` is what ``Model.run`` calls: ``entry.fast_entry``,
which looks the feeds' shapes up in ``table`` (signature mode: then their box of dims up in
``boxes``, a decided box's entry); a miss goes to ``_slow``: full validation by
the model's FeedChecker (the sync executor's InputErrors), native byte order and
contiguous aligned copies (read-only feeds are taken as they are: compiled code types
its feeds read-only), then the signature's entry (made now), and if the native call
still fails the prepared program, which raises the interpreter's ExecutionError naming
the node. With ``measure`` (``executor="auto"``) a signature's first calls are a
``entry.Trial`` between native code, the interpreter (and, for big batches in rows mode,
the threaded rows entry), run side by side on the same feeds: the fastest keeps serving
that bucket (a signature, a box, a batch-size class).

Threading: ``run`` may be called from many threads at once; compiled functions allocate
their arena per call and release the GIL (``nogil``). Compiles run on one process-wide
daemon thread (``worker.py``), FIFO; ``mode="eager"`` compiles on the loading thread (for
signature mode: on the calling thread, at a signature's first call). ``state`` moves
"compiling" -> "ready" | "failed", once (signature mode starts "ready": nothing to wait
for before a signature is seen). After ``fork()`` the child compiles what was waiting.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...calls import CallContext
from ...concurrency import compiled_gate
from ...concurrency.threads import limit_blas
from ...errors import InputError
from ...executors.base import Executor
from ...executors.program import Program
from ...feeds import check_output_buffers, concat_prefixes
from ...ir import Graph
from ..lower.cache import cache_pairs
from ..lower.generic import box_of, describe_box, input_shapes, lower_box, native_dim_vars
from ..lower.graph import Lowered, lower
from . import worker
from .compile import Compiled, compile_lowered
from .entry import (
    PAR_MIN_ROWS,
    Trial,
    direct_entry,
    fast_entry,
    native_entry,
    rounding_tolerance,
    split_threads,
    threads_entry,
)

__all__ = ["MAX_SIGNATURES", "MODES", "NativeTier", "plan_lowering"]

#: ``load(..., native=...)``: compile in the background (serve on the interpreter
#: meanwhile) or before ``load`` returns.
MODES = ("background", "eager")
#: Signature mode keeps at most this many compiled functions (boxes and signatures).
MAX_SIGNATURES = 16
#: Under ``auto`` (``measure``), signature mode compiles a signature once it is *hot*: this
#: many of its calls counted, counts halving every ``HOT_WINDOW`` calls the interpreter
#: serves. Traffic that repeats a few shapes compiles them; traffic of ever-new lengths
#: (text, a growing past) compiles nothing and runs on the interpreter's one plan for
#: every length. ``executor="native"`` compiles every signature on first sight.
HOT_CALLS = 16
HOT_WINDOW = 256
#: Entries kept in the shape table (rows mode sees every batch size; a box of text at
#: batch 1..8 and lengths 8..128 holds ~1,000 signatures, each a miss when it is not kept).
_MAX_TABLE = 4096


class _Job:
    """One compile for the worker (``worker.py`` runs its phases): ``lowered`` (or the
    shapes to lower first, in ``_prepare``), compiled by the compile server when it can
    (``server_seconds``: its time there), then loaded and installed by ``_compile``."""

    def __init__(self, tier: NativeTier, key: Any, lowered: Lowered | None,
                 relower: bool = False) -> None:  # fmt: skip
        self.tier = weakref.ref(tier)
        self.key = key
        self.lowered = lowered
        #: lowered while a cold process held the compiled kernels back (without packed
        #: products): lowered again on the worker, which may use them
        self.relower = relower
        self.state = "compiling"
        self.error: str | None = None
        self.compiled: Compiled | None = None
        self.server_seconds: float | None = None
        self.done = threading.Event()

    def _prepare(self) -> bool:
        """Lower the module if it is not yet (in this process); False: the job failed."""
        if self.lowered is not None and not self.relower:
            return True
        tier = self.tier()
        try:
            if tier is None:
                raise RuntimeError("the model was dropped")
            if self.relower:
                self.lowered = plan_lowering(tier.graph, tier.program)
                self.relower = False
                if self.lowered is None:
                    raise RuntimeError("the model no longer lowers as one module")
                return True
            if _is_box(self.key):  # every signature of a box of dims (generic.py)
                assert tier.dims is not None
                self.lowered = lower_box(tier.graph, tier.program, tier.dims, self.key[1],
                                         stop=worker.closing)  # fmt: skip
                return True
            # the table keys one input's signature by its shape, several by their shapes
            one = len(tier.graph.inputs) == 1
            shapes = [self.key] if one else list(self.key)
            self.lowered = lower(tier.graph, tier.program, shapes=shapes)
        except Exception as e:  # noqa: BLE001 - any failure keeps the interpreter serving
            self._fail(f"{type(e).__name__}: {e}")
            return False
        return True

    def source(self) -> str:
        assert self.lowered is not None
        return self.lowered.source

    def _compile(self) -> None:
        tier = self.tier()
        try:
            if tier is None:
                raise RuntimeError("the model was dropped")
            assert self.lowered is not None
            self.compiled = compile_lowered(self.lowered)
        except Exception as e:  # noqa: BLE001 - any failure keeps the interpreter serving
            self._fail(f"{type(e).__name__}: {e}")
            return
        self.state = "ready"
        try:
            if tier is not None:
                tier._installed(self)
        finally:
            self.done.set()  # after the tier switched: wait() returning means it is ready

    def _fail(self, reason: str) -> None:
        self.error = reason
        self.state = "failed"
        tier = self.tier()
        try:
            if tier is not None:
                tier._job_failed(self)
        finally:
            self.done.set()


class _Counted:
    """Signature mode's entry for a signature not compiled: the interpreter serves it, and
    its calls are counted; at ``HOT_CALLS`` its compile starts (``_promote``)."""

    __slots__ = ("key", "n", "tier")

    def __init__(self, tier: NativeTier, key: Any) -> None:
        self.tier = tier
        self.key = key
        self.n = 0

    def __call__(self, feeds: Any, *xs: Any) -> Any:
        tier = self.tier
        self.n += 1
        tier._count()
        if self.n == HOT_CALLS:
            tier.compile_signature(self.key)
            tier._forget(self)  # its signatures ask the job from now on, not this count
        return tier._interp_run(feeds)


class NativeTier(Executor):
    """Executor "native": the native tier of one model. ``state``: "compiling" | "ready" |
    "failed"; ``error`` says why it failed; ``compiled`` has the cache path, whether numba's
    cache answered, and the compile (or cache load) time; ``lowered`` the module (the
    newest signature's in signature mode, None before any)."""

    name = "native"

    def __init__(self, lowered: Lowered | None, program: Program, check: Any, interp: Any, *,
                 mode: str = "background", measure: bool = False,
                 graph: Graph | None = None) -> None:  # fmt: skip
        if mode not in MODES:
            raise ValueError(f"native must be one of {MODES}, got {mode!r}")
        self.lowered = lowered
        self.interp = interp
        self.mode = mode
        self.measure = measure
        self.graph = graph if graph is not None else program.graph
        self._prefixes = concat_prefixes(self.graph)  # outputs whose buffer may hold a feed
        #: how far the trial lets the tiers' outputs differ (``entry.rounding_tolerance``)
        self.rounding_tol = rounding_tolerance(self.graph)
        #: generation may keep the cache in buffers written in place (``lower/cache.py``):
        #: signature mode with cache pairs, until a function lowers without them
        pairs = cache_pairs(self.graph) if lowered is None else ()
        self.writes_concat_in_place = bool(pairs)
        #: (past input index, present name) of those pairs, and the inputs' names and
        #: dtypes (``_cache_call``)
        self._cache_io = [(k, self.graph.outputs[j].name) for k, j in pairs]
        self._in_specs = [(v.name, np.dtype(v.type.dtype)) for v in self.graph.inputs]  # type: ignore[union-attr]
        self.program = self._program = program
        self._check = check
        self.form = "signature" if lowered is None else lowered.mode
        #: signature mode: the dim variables, whose boxes get one function each
        #: (``generic.py``), and the boxes that declined (their signatures compile alone)
        self.dims = native_dim_vars(self.graph)
        self._box_declined: set[Any] = set()
        self.error: str | None = None
        self.compiled: Compiled | None = None
        self.table: dict[Any, Any] = {}
        #: signature mode: a box's final entry (served natively or by the interpreter, as
        #: decided) for every signature in it, found from the shapes on a ``table`` miss
        #: (a growing KV cache or text of any length: a new signature on most calls)
        self.boxes: dict[Any, Any] = {}
        self.sigs: collections.OrderedDict[Any, _Job] = collections.OrderedDict()
        #: signature mode: calls the interpreter served per signature not compiled yet
        self._counts: dict[Any, _Counted] = {}
        self._window = 0
        self.choices: dict[Any, tuple[str, dict[str, float]]] = {}
        #: the trial deciding each bucket (rows mode: every batch size of a power-of-two
        #: class shares it), and the native entry of each compiled function
        self._trials: dict[Any, Trial] = {}
        self._natives: dict[int, tuple[Compiled, Any]] = {}
        self._lock = threading.Lock()
        self._main: _Job | None = None
        self._fast = fast_entry(self.table, self._slow, [v.name for v in self.graph.inputs],
                                [np.dtype(v.type.dtype) for v in self.graph.inputs],  # type: ignore[union-attr]
                                self.boxes if self.form == "signature" else None,
                                self.dims.reads if self.dims else (),
                                [v.convert for v in self.graph.inputs],
                                self._cache_call if pairs else None)  # fmt: skip
        #: the CallContext of the ``run_call`` on this thread (None: a plain ``run``): the
        #: interpreter serves such a call under it (deadline, cancellation per node)
        self._calls = threading.local()
        self._interp_entry = lambda feeds, *xs: self._interp_run(feeds)
        #: The entry Model.run calls: the interpreter now, the native entry when ready.
        self.run: Any = self._run_interp
        if lowered is None:
            self.state = "ready"
            self.run = self._fast
            return
        self.state = "compiling"
        cold = compiled_gate.held()  # lowered without the compiled kernels: again later
        self._main = _Job(self, None, lowered, relower=cold)
        if mode == "eager":
            worker.compile_now(self._main)
            if self.state == "failed":
                from .compile import NativeUnavailable

                raise NativeUnavailable(f"native compilation failed: {self.error}")
        elif cold:  # after the cold start's warm-up (tfrt_py.cold_start)
            compiled_gate.after_release(functools.partial(worker.submit, self._main))
        else:
            worker.submit(self._main)

    # -- compiles -------------------------------------------------------------------------
    def _installed(self, job: _Job) -> None:
        """A compile finished (on the worker, or the caller's thread when eager)."""
        limit_blas()  # numba may have loaded SciPy's BLAS meanwhile
        with self._lock:
            self.compiled = job.compiled
            self.lowered = job.lowered
            if job.lowered is not None and not job.lowered.caches:
                self.writes_concat_in_place = False  # its cache would be copied twice
            self._forget_entries()
            if job is self._main:
                self.state = "ready"
                self.run = self._fast

    def _job_failed(self, job: _Job) -> None:
        if job is self._main:
            self.error = job.error
            self.state = "failed"
        with self._lock:
            if _is_box(job.key):  # its signatures compile one by one from now on
                self._box_declined.add(job.key)
            self._forget_entries()

    def use_interpreter(self, interp: Any, program: Program) -> None:
        """Serve the interpreter's share with ``interp`` over ``program`` from now on (a
        cold process's model switched to the compiled kernels, ``tfrt_py.cold_start``);
        the measured choices between native code and the old interpreter are forgotten.
        Calls in flight finish on the old one."""
        with self._lock:
            self.interp = interp
            self.program = self._program = program
            self.choices.clear()
            self._trials.clear()
            self._forget_entries()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every compile started so far finished (ready or failed); False on
        timeout."""
        jobs = [j for j in [self._main, *self.sigs.values()] if j is not None]
        return all(j.done.wait(timeout) for j in jobs)

    def _job_key(self, key: Any) -> Any:
        """Signature mode: what compiles for the signature ``key``: its box of dims
        (``("box", box)``), or the signature itself when the box declined or the shapes
        break the inputs' declared relations."""
        if self.dims is None or not self.dims.n:
            return key
        shapes = [key] if len(self.graph.inputs) == 1 else list(key)
        vals = self.dims.values(shapes)
        if vals is None:
            return key
        box = ("box", box_of(vals))
        return key if box in self._box_declined else box

    def _in_box(self, key: Any, box: tuple[tuple[int, int], ...]) -> bool:
        assert self.dims is not None
        vals = self.dims.values([key] if len(self.graph.inputs) == 1 else list(key))
        return vals is not None and all(lo < v <= hi for v, (lo, hi) in zip(vals, box))

    def job(self, key: Any) -> _Job | None:
        """Signature mode: the compile job serving the signature ``key`` (its box's, or
        its own), None before one started."""
        return self.sigs.get(self._job_key(key))

    def _sig_job(self, key: Any) -> _Job | None:
        """Signature mode: the job for ``key`` (started now if new); None if it failed."""
        with self._lock:
            job = self.sigs.get(key)
            if job is None:
                job = self.sigs[key] = _Job(self, key, None)
                while len(self.sigs) > MAX_SIGNATURES:
                    self.sigs.popitem(last=False)
                    self._forget_entries()
                fresh = True
            else:
                fresh = False
        if fresh:
            if self.mode == "eager":
                worker.compile_now(job)
            else:
                worker.submit(job)
        return job

    # -- calls ----------------------------------------------------------------------------
    def _run_interp(self, feeds: Mapping[str, Any], outputs: Any = None) -> Any:
        return self.interp.run(feeds, outputs)

    def run_call(self, feeds: Mapping[str, Any], outputs: Any, call: CallContext) -> Any:
        """``run`` under a deadline or canceller (every offloaded ``run_async`` is one): the
        interpreter's checked path until native code is ready; then the call takes ``run``'s
        entries as a plain call does -- in signature mode its signature counts towards
        its box's compile (a model only ever called so must not stay interpreted) -- and
        an entry the interpreter serves runs under ``call`` (``_interp_run``); a native
        call is checked before it starts."""
        if self.state != "ready":
            return self.interp.run_call(feeds, outputs, call)
        call.check()
        local = self._calls
        outer = getattr(local, "call", None)  # a run_call this one runs inside, if any
        local.call = call
        try:
            return self.run(feeds, outputs)
        finally:
            local.call = outer

    def _interp_run(self, feeds: Mapping[str, Any], outputs: Any = None) -> Any:
        """The interpreter's share of a call: under the ``run_call`` in progress on this
        thread, if any."""
        call = getattr(self._calls, "call", None)
        if call is None:
            return self.interp.run(feeds, outputs)
        return self.interp.run_call(feeds, outputs, call)

    def compile_signature(self, key: Any) -> _Job | None:
        """Signature mode: start compiling ``key`` (input shapes, as the table keys them,
        or a ``_job_key``) now, hot or not (``warmup``); the job, or None in other modes."""
        if self.form != "signature":
            return None
        if not _is_box(key):
            self.table.pop(key, None)
            key = self._job_key(key)
        self._counts.pop(key, None)
        return self._sig_job(key)

    def warm(self, feeds: Mapping[str, Any]) -> None:
        """``Model.warmup``: in signature mode, compile the signature of these feeds."""
        if self.form != "signature":
            return
        args = self._check(feeds)
        if all(type(a) is np.ndarray for a in args):
            self.compile_signature(args[0].shape if len(args) == 1 else
                                   tuple(a.shape for a in args))  # fmt: skip

    def _forget(self, entry: Any) -> None:
        """Drop the table's keys that lead to ``entry`` (their next call looks again)."""
        with self._lock:
            for k in [k for k, v in self.table.items() if v is entry]:
                del self.table[k]

    def _count(self) -> None:
        """One call served by a counted entry: every ``HOT_WINDOW`` calls, counts halve."""
        self._window += 1
        if self._window >= HOT_WINDOW:
            self._window = 0
            for c in list(self._counts.values()):
                c.n //= 2

    def _entry(self, key: Any, args: list[np.ndarray]) -> Any:
        """The entry for this signature, put in the table once it is final."""
        jkey = self._job_key(key) if self.form == "signature" else key
        if self.form == "signature" and self.measure and jkey not in self.sigs:
            counted = self._counts.get(jkey)  # a box's signatures count together
            if counted is None:
                if len(self._counts) >= _MAX_TABLE:
                    self._counts.clear()
                counted = self._counts[jkey] = _Counted(self, jkey)
            self._remember(key, counted)
            return counted
        job = self._main if self.form != "signature" else self._sig_job(jkey)
        if job is None or job.state != "ready" or job.compiled is None or job.lowered is None:
            if job is not None and job.state != "ready":
                with self._lock:  # an install clears the table under this lock
                    if job.state in ("failed", "compiling"):
                        self._remember(key, self._interp_entry)
            return self._interp_entry
        low, comp = job.lowered, job.compiled
        if low.mode == "box" and not self._in_box(key, low.box):
            # past where the box's model runs (``generic._fitting``): the interpreter says why
            self._remember(key, self._interp_entry)
            return self._interp_entry
        nat = self._native(low, comp, len(args))
        # a final entry serves the whole box (its function checks every feed's shape)
        box = low.box if self.form == "signature" and jkey == ("box", low.box) else None
        if not self.measure:
            self._remember(key, nat, box)
            self._go_direct(low, comp)
            return nat
        bucket = self._bucket(key, args, low)
        chosen = self.choices.get(bucket)
        cands = [("native", nat), ("sync", self._interp_entry)]
        if (
            low.mode == "rows"
            and comp.fn_into is not None
            and self._rows(args, low) >= PAR_MIN_ROWS
            and split_threads() > 1
        ):
            cands.insert(1, ("native threads", threads_entry(
                comp.fn_into, low.params, low.output_names, low.finishers, low.out_rows,
                low.out_dtypes, low.batched, low.encoders)))  # fmt: skip
        if chosen is not None:
            pick = dict(cands).get(chosen[0], nat)
            self._remember(key, pick, box)
            return pick
        trial = self._trials.get(bucket)
        if trial is None or trial.done or dict(trial.cands).get("native") is not nat:
            trial = self._trials[bucket] = self._trial(bucket, cands, low, comp)
        self._remember(key, trial)
        return trial

    def _trial(self, bucket: Any, cands: list[tuple[str, Any]], low: Lowered,
               comp: Compiled) -> Trial:  # fmt: skip
        """The trial deciding ``bucket``, shared by every signature in it (rows mode: the
        batch sizes of one power-of-two class; with a trial per size, random batch sizes
        never finished one and every call ran both tiers and compared them). Its decision
        replaces it wherever the table holds it."""

        def settle(entry: Any) -> None:
            with self._lock:
                for k in [k for k, v in self.table.items() if v is trial]:
                    self.table[k] = entry
                self._trials.pop(bucket, None)

        def decide(best: str, figures: dict[str, float]) -> None:
            self.choices[bucket] = (best, figures)
            settle(dict(cands)[best])
            if best == "native":
                self._go_direct(low, comp)

        def disagree(reason: str) -> None:
            self.error = reason
            self.choices[bucket] = ("sync", {})
            settle(self._interp_entry)

        size = None
        if low.mode == "rows":
            k = list(low.batched).index(True)
            size = lambda xs: int(xs[k].shape[0])  # noqa: E731 - the rows of a call
        trial = Trial(cands, self._interp_entry, decide, disagree, size, self.rounding_tol)
        return trial

    def _native(self, low: Lowered, comp: Compiled, n_in: int) -> Any:
        """The native entry calling ``comp``'s function: made once per compiled function
        (rows mode serves every batch size with one; making it per signature compiled a
        small Python function on each new size)."""
        got = self._natives.get(id(comp))
        if got is None or got[0] is not comp:
            if len(self._natives) >= _MAX_TABLE:
                self._natives.clear()
            got = (comp, native_entry(comp.fn, low.params, low.output_names, low.finishers,
                                      n_in, low.encoders, low.caches))  # fmt: skip
            self._natives[id(comp)] = got
        return got[1]

    def _go_direct(self, low: Lowered, comp: Compiled) -> None:
        """A static-shape model served natively: ``run`` calls the function straight."""
        if low.mode == "static" and self.form == "static":
            self.run = direct_entry(comp.fn, low.params, low.input_names, low.output_names,
                                    low.input_dtypes, low.finishers, self._slow,
                                    low.encoders,
                                    [v.convert for v in self.graph.inputs])  # fmt: skip

    def _forget_entries(self) -> None:
        """Drop every signature's and box's entry (under ``_lock``: a compile installed or
        failed, a function dropped, another interpreter): the next calls decide again."""
        self.table.clear()
        self.boxes.clear()

    def _remember(self, key: Any, entry: Any, box: Any = None) -> None:
        """``entry`` serves the signature ``key``, and every signature of ``box`` if given."""
        if len(self.table) >= _MAX_TABLE:
            self.table.clear()
        self.table[key] = entry
        if box is not None:
            self.boxes[box] = entry

    @staticmethod
    def _rows(args: list[np.ndarray], low: Lowered) -> int:
        k = list(low.batched).index(True)
        return int(args[k].shape[0])

    def _bucket(self, key: Any, args: list[np.ndarray], low: Lowered) -> Any:
        """Rows mode decides per batch-size class (powers of two), a box's function once
        for the box; others per signature."""
        if low.mode == "rows":
            return ("rows", self._rows(args, low).bit_length())
        if low.mode == "box":
            return ("box", low.box)
        return key

    def _cache_call(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
        """A decoder step whose output buffers are exactly its presents', each a view of an
        array of its own of which the past fed is a view too (``generation/steps.py``), on
        a compiled function that writes its cache in place: that function's result, with
        ``check_output_buffers``' overlap checks replaced by these identities (no other
        feed is a view of those arrays, or of anything but an array). None: ``_slow``."""
        specs = self._in_specs
        pairs = self._cache_io
        if len(feeds) != len(specs) or len(outputs) != len(pairs):
            return None
        xs = [feeds[name] for name, _ in specs]
        for x, (_, dt) in zip(xs, specs):
            if type(x) is not np.ndarray or x.dtype != dt:
                return None
        key = xs[0].shape if len(xs) == 1 else tuple(x.shape for x in xs)
        entry: Any = self.table.get(key)
        if entry is None and self.dims is not None:
            entry = self.boxes.get(box_of(tuple(xs[k].shape[a] for k, a in self.dims.reads)))
        if not getattr(entry, "cache_pasts", None):
            return None
        owners: list[np.ndarray] = []
        for k, name in pairs:
            buf = outputs.get(name)
            if type(buf) is not np.ndarray:
                return None
            b = buf if buf.base is None else buf.base
            if type(b) is not np.ndarray or b.base is not None or xs[k].base is not b:
                return None
            owners.append(b)
        if len({id(b) for b in owners}) != len(owners):
            return None
        pasts = {k for k, _ in pairs}
        for k, x in enumerate(xs):
            up = x.base
            if k not in pasts and up is not None and (
                    type(up) is not np.ndarray or any(up is b for b in owners)):  # fmt: skip
                return None
        res = entry(feeds, *xs, outs=outputs)
        for _, name in pairs:
            if res[name] is not outputs[name]:
                return None
        return res

    def _slow(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None) -> Any:
        args = self._check(feeds)
        names = [v.name for v in self.graph.outputs]
        bufs = {} if not outputs else dict(outputs)
        if bufs:
            check_output_buffers(bufs, names, args, self._prefixes)
        if not all(type(a) is np.ndarray for a in args):
            return self._interp_run(feeds, outputs)
        key = args[0].shape if len(args) == 1 else tuple(a.shape for a in args)
        entry = self.table.get(key) or self._entry(key, args)
        if entry is self._interp_entry:
            return self._interp_run(feeds, outputs)
        # a KV cache in place takes its pasts as they are (views of the output buffers)
        pasts: frozenset[int] = getattr(entry, "cache_pasts", frozenset())
        ready = [
            a
            if (a.flags.c_contiguous or k in pasts) and a.flags.aligned and a.dtype.isnative
            else np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
            for k, a in enumerate(args)
        ]
        try:
            res = entry(feeds, *ready, outs=bufs) if pasts else entry(feeds, *ready)
        except Exception:  # noqa: BLE001 - the interpreter raises the executor's error
            vals = [np.array(v) if isinstance(v, np.ndarray) else v
                    for v in self._program.run(args)]  # fmt: skip
            res = dict(zip(names, vals))
        out: dict[str, Any] = {}
        for name in names:
            v = res[name]
            buf = bufs.get(name)
            if buf is not None:
                if buf.shape != v.shape or buf.dtype != v.dtype:
                    raise InputError(
                        f"outputs[{name!r}]: buffer is {buf.dtype}{list(buf.shape)}, "
                        f"the output is {v.dtype}{list(v.shape)}"
                    )
                if v is not buf:  # (a KV cache in place returns the buffer it wrote)
                    np.copyto(buf, v)
                v = buf
            out[name] = v
        return out

    # -- describe -------------------------------------------------------------------------
    def memory_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The sync interpreter's plan (the layout the native arena follows)."""
        return self.interp.memory_plan(shapes)

    def describe_lines(self) -> list[str]:
        how = "the whole model as one numba function, the sync interpreter until compiled"
        lines = [*self.interp.plan_lines(), "  " + self.describe()]
        for bucket, (best, figs) in list(self.choices.items()):
            rows = isinstance(bucket, tuple) and bucket[:1] == ("rows",)
            what = f"batch {1 << (bucket[1] - 1) if bucket[1] else 0}+ rows" if rows else (
                self._what(bucket))  # fmt: skip
            unit = "µs a row" if rows else "µs"
            shown = ", ".join(f"{n} {us:,.3g} {unit}" for n, us in figs.items()) or "not timed"
            lines.append(f"    measured ({what}): {shown}; serving: {best}")
        return [*lines, f"  executor: native ({self.why}; {how})"]

    def _what(self, key: Any) -> str:
        if _is_box(key) and self.dims is not None:
            return describe_box(key[1], self.dims.names)
        return f"shapes {key}"

    def describe(self) -> str:
        """One line for ``Model.describe()`` (more lines in ``describe_lines``)."""
        if self.form == "signature":
            jobs = list(self.sigs.items())
            done = [
                self._what(("box", j.lowered.box) if j.lowered and j.lowered.box else k)
                for k, j in jobs
                if j.state == "ready"
            ]  # (a box may end lower)
            failed = [f"{self._what(k)}: {j.error}" for k, j in jobs if j.state == "failed"]
            which = (f"hot box of dims or input signature ({HOT_CALLS} of the recent calls)"
                     if self.measure else "box of dims or input signature")  # fmt: skip
            secs = sum(j.compiled.seconds for _, j in jobs if j.compiled is not None)
            text = (f"native: one numba function per {which}, at most {MAX_SIGNATURES}; "
                    f"compiled: {'; '.join(done) or 'none yet'} ({secs:.1f} s)")  # fmt: skip
            return text + (f"; declined: {failed}" if failed else "")
        assert self.lowered is not None
        n, units = self.lowered.n_nodes, self.lowered.units
        tile = self.lowered.tile_rows
        what = "its shapes" if self.form != "rows" else "every batch size (" + (
            f"tiles of {tile} rows, the rest one row per loop step)" if tile
            else "one row per loop step)")  # fmt: skip
        if self.state == "compiling":
            return (
                f"native: compiling {n} nodes ({units} compile units) in the background "
                f"for {what}; the sync interpreter serves"
            )
        if self.state == "failed":
            return f"native: compilation failed ({self.error}); the sync interpreter serves"
        c = self.compiled
        assert c is not None
        how = "loaded from the disk cache" if c.cache_hit else "compiled"
        note = f"; {self.error}" if self.error else ""
        return (
            f"native: {n} nodes as one numba function ({units} compile units) for {what}, "
            f"{how} in {c.seconds:.2f} s ({c.path}){note}"
        )


def _is_box(key: Any) -> bool:
    return type(key) is tuple and len(key) == 2 and key[0] == "box"


def plan_lowering(graph: Graph, program: Program, *, probe_budget: bool = True) -> Lowered | None:
    """The module for ``graph`` (static shapes, or rows mode for a dynamic first dim
    whose rows are independent), or None for signature mode: other dynamic dims, after
    checking that the signature with every dim variable 1 lowers (within the compile
    budget unless not ``probe_budget``: ``executor="native"``, whose boxes each meet it
    when they compile). Raises Declined."""
    from ..lower.budget import budget, precheck
    from ..lower.graph import dynamic_inputs
    from ..lower.source import Declined

    if not any(dynamic_inputs(graph)):
        return lower(graph, program)
    try:
        return lower(graph, program, rows=True)
    except Declined as e:
        if not any(r.startswith("rows:") for r in e.reasons):
            raise
    dims = native_dim_vars(graph)
    if dims is None:
        shapes = [tuple(d if isinstance(d, int) else 1 for d in v.type.shape)  # type: ignore[union-attr]
                  for v in graph.inputs]  # fmt: skip
    else:  # every variable 1: a dim declared as a sum (past + sequence) is their sum
        shapes = input_shapes(graph, dims, [1] * dims.n)
    # A probe that the ops lower, not the code that compiles. In a cold process (the
    # packed products held back: executor="native" at load) it is longer than that code:
    # Llama's 1,525 units against 1,325. "auto" probes once the kernels are warm.
    precheck(graph, budget())
    lower(graph, program, shapes=shapes, limit=None if probe_budget else sys.maxsize)
    return None
