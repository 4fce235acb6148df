"""The Python side of a native call: the fast entry, per-signature entries, row threads,
and the measured choice between native code and the sync interpreter.

``fast_entry(...)`` generates the function ``Model.run`` calls (names are bound as
variables ``n<k>``/``o<k>``, never pasted: they are model text). It checks ``len(feeds)``,
fetches each feed, checks that its dtype is (or equals) the input's native-order dtype,
and looks the feeds' shapes up in ``table`` (one dict per tier), then, in signature mode,
the box of the dims they hold up in ``boxes``: the entry found serves the call. Anything
else -- a signature of no decided box, another dtype, ``outputs=``, any exception -- goes
to the tier's slow path.

An entry is a callable ``(feeds, x0, x1, ...) -> dict``: ``native_entry`` (the compiled
function, then the finishers: ZipMap dicts, string labels), ``threads_entry`` (rows mode:
the batch split over a few threads, the compiled function releases the GIL), or the sync
interpreter. ``Trial`` serves a bucket's first calls (a signature's, a box's, or in rows mode
a power-of-two class of batch sizes'), running every candidate on each call's feeds and
timing them side by side, checks the first native answer against the interpreter's, and
then serves the fastest, which the tier puts in the table (``describe()`` shows the
figures).

Thread-safe: tables are plain dicts mutated by single stores (the GIL); a trial's lists
may lose a sample to a race, never a result.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from ...concurrency.threads import intra_pool, threads
from ...kernels.ml.encode import zipmap_rows
from ..lower.cache import CACHE_RANK

__all__ = [
    "PAR_MIN_ROWS",
    "ROUNDING_TOL",
    "Trial",
    "agree",
    "direct_entry",
    "fast_entry",
    "native_entry",
    "rounding_tolerance",
    "scaled_atol",
    "split_threads",
    "threads_entry",
]

Entry = Callable[..., dict[str, Any]]

#: Rows mode: batches of at least this many rows also try the threaded entry.
PAR_MIN_ROWS = 256
#: Calls of a trial (each runs every candidate): one warm-up (the interpreter plans on its
#: first call of a signature), then the timed ones.
WARMUP, SAMPLES = 1, 3


def split_threads() -> int:
    """How many threads a threaded rows call splits over: the process's thread budget
    (``concurrency.threads``: ``$TFRT_PY_THREADS``, ``load(threads=)``, a Ray actor's or
    pre-forked worker's CPUs), at most 4."""
    return min(4, threads())


def _finisher(spec: Any) -> Callable[[np.ndarray], Any] | None:
    if spec is None:
        return None
    kind, labels = spec
    if kind == "zipmap":
        rows = zipmap_rows(list(labels))
        # the function's scores are (N, C) already: a reshape cost 0.4 µs of a batch-1 call
        return lambda a: rows(a if a.ndim == 2 else np.asarray(a).reshape(len(a), -1))
    table = np.asarray(labels, dtype=object)
    return lambda a: table.take(a)


def _encoders(encoders: Sequence[Any], n_in: int) -> list[Callable[[np.ndarray], Any] | None]:
    """Per input: None, or the function mapping its strings to the ids the compiled
    function takes (``Lowered.encoders``)."""
    from ...kernels.fused.ml import encoder

    got = list(encoders) + [None] * (n_in - len(encoders))
    return [None if v is None else encoder(tuple(v)) for v in got[:n_in]]


def _args(encs: Sequence[Any], env: dict[str, Any]) -> list[str]:
    """The compiled function's input arguments: ``x<k>``, or ``E<k>(x<k>)`` for an
    encoded input (``E<k>`` bound in ``env``)."""
    env.update({f"E{k}": e for k, e in enumerate(encs) if e is not None})
    return [f"x{k}" if e is None else f"E{k}(x{k})" for k, e in enumerate(encs)]


def _cache_target(name: str) -> Callable[[Any], tuple[np.ndarray, np.ndarray]]:
    """``outs -> (buffer, view)``: the caller's ``outs[name]`` and the array it is a view of
    (itself when it owns its memory), which a KV cache's present is written into
    (``lower/cache.py``: the function checks that the view is the buffer's first positions
    of the present's shape and takes only C-ordered, writeable float32 buffers, else
    raises); two empty arrays (the function allocates the present) when there is no such
    output buffer."""
    empty = np.empty((0,) * CACHE_RANK, np.float32)

    def target(outs: Any) -> tuple[np.ndarray, np.ndarray]:
        v = outs.get(name) if outs else None
        if type(v) is not np.ndarray:
            return empty, empty
        b = v.base
        if b is None:
            return v, v
        return (b, v) if type(b) is np.ndarray else (empty, empty)

    return target


def _written_in(r: np.ndarray, t: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A present's output: the caller's view when the function wrote it there (the buffer
    was not empty: the function checked the view), else the array it made."""
    return t[1] if t[0].size else r


def native_entry(fn: Any, params: Sequence[np.ndarray], out_names: Sequence[str],
                 finishers: Sequence[Any], n_in: int, encoders: Sequence[Any] = (),
                 caches: Sequence[tuple[int, int]] = ()) -> Entry:  # fmt: skip
    """``(feeds, x0, ..., outs=None) -> {name: output}`` calling ``fn(x0, ..., *params)``
    (an encoded input's ids in place of its strings). ``caches``: (past input, present
    output) pairs of a KV cache in place, whose buffers (``_cache_target`` of ``outs``, the
    caller's output buffers) the function takes after the inputs; such an entry has
    ``cache_pasts``, the past inputs it takes in any layout (views of those buffers)."""
    xs = [f"x{k}" for k in range(n_in)]
    env: dict[str, Any] = {"fn": fn}
    called = _args(_encoders(encoders, n_in), env)
    targets = []
    for i, (_, j) in enumerate(caches):
        env[f"T{i}"] = _cache_target(out_names[j])
        targets.append(f"    t{i} = T{i}(outs)")
    env["U"] = _written_in
    called += [f"t{i}[0]" for i in range(len(caches))] + [f"t{i}[1]" for i in range(len(caches))]
    written = {j: i for i, (_, j) in enumerate(caches)}
    fins = [_finisher(f) for f in finishers]
    one = len(out_names) == 1

    def val(k: int) -> str:
        r = "r" if one else f"r[{k}]"
        if k in written:
            return f"U({r}, t{written[k]})"
        return r if fins[k] is None else f"F{k}({r})"

    src = "\n".join([
        f"def native(feeds, {', '.join([*xs, 'outs=None'])}):",
        *targets,
        f"    r = fn({', '.join([*called, *(f'P{i}' for i in range(len(params)))])})",
        "    return {" + ", ".join(f"o{k}: {val(k)}" for k in range(len(out_names))) + "}",
    ])  # fmt: skip
    env.update({f"P{i}": p for i, p in enumerate(params)})
    env.update({f"o{k}": n for k, n in enumerate(out_names)})
    env.update({f"F{k}": f for k, f in enumerate(fins) if f is not None})
    exec(compile(src, "<tfrt_py native call>", "exec"), env)
    native = env["native"]
    native.cache_pasts = frozenset(k for k, _ in caches)
    return native


def threads_entry(fn_into: Any, params: Sequence[np.ndarray], out_names: Sequence[str],
                  finishers: Sequence[Any], out_rows: Sequence[tuple[int, ...]],
                  out_dtypes: Sequence[np.dtype], batched: Sequence[bool],
                  encoders: Sequence[Any] = ()) -> Entry:  # fmt: skip
    """Rows mode over a few threads: the outputs are allocated here, the batch is cut in
    ``split_threads()`` blocks of rows, each filled by ``fn_into(xs, outs, params, lo, hi)``
    as one part of the process's intra-op pool (whose caller takes part and steals the
    parts a busy helper has not started: never much slower than one thread)."""

    fins = [_finisher(f) for f in finishers]
    first = list(batched).index(True)
    encs = _encoders(encoders, len(batched))
    encoded = any(e is not None for e in encs)

    def threaded(feeds: Any, *xs: np.ndarray) -> dict[str, Any]:
        if encoded:
            xs = tuple(x if e is None else e(x) for x, e in zip(xs, encs))
        n = xs[first].shape[0]
        outs = [np.empty((n, *rest), dt) for rest, dt in zip(out_rows, out_dtypes)]
        k = split_threads()
        cuts = [n * i // k for i in range(k + 1)]
        args = (*xs, *outs, *params)
        intra_pool().run([partial(fn_into, *args, cuts[i], cuts[i + 1]) for i in range(k)])
        return {name: (o if fin is None else fin(o))
                for name, o, fin in zip(out_names, outs, fins)}  # fmt: skip

    return threaded


def scaled_atol(b: np.ndarray, atol: float, scale_tol: float) -> float:
    """``atol``, or ``scale_tol`` times ``b``'s largest finite magnitude when larger."""
    finite = np.abs(b[np.isfinite(b)]) if scale_tol else b[:0]
    return max(atol, scale_tol * float(finite.max())) if finite.size else atol


def agree(a: Any, b: Any, scale_tol: float = 0.0) -> bool:
    """Whether two outputs agree: floats to 1e-3 (and, with ``scale_tol``, to that
    fraction of ``b``'s largest finite magnitude: a model that rounds activations to int8
    at run time, where two correct tiers differ by a step wherever a rounding flips),
    integers and strings in all but 1%."""
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b):
            return False
        return all(
            isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys()
            and np.allclose(list(x.values()), list(y.values()), rtol=1e-3, atol=1e-4)
            for x, y in zip(a, b)
        )  # fmt: skip
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        atol = scaled_atol(b, 1e-4, scale_tol)
        return bool(np.allclose(a, b, rtol=1e-3, atol=atol, equal_nan=True))
    return int((a != b).sum()) <= a.size // 100


class Trial:
    """A bucket's first calls, each running every candidate ``(name, entry)`` on the same
    feeds (the order rotating from call to call), ``WARMUP + SAMPLES`` calls, then
    ``decide(best_name, figures)``: the best is the candidate whose time over the first
    candidate's, call by call, has the least median; ``figures`` are each candidate's
    median µs (per unit of ``size`` when given). Paired because a bucket's calls differ
    in shape: a box of dims spans calls of 34 to 2,048 tokens, and timing each candidate
    on calls of its own compared shapes, not code (BERT's native box lost to the
    interpreter in 2 of 6 cold starts, and the interpreter then served it for good).
    The first call's answers are compared with ``reference``'s (the interpreter's: run
    apart only when it is not a candidate; ``agree`` with ``scale_tol``, the model's
    ``rounding_tolerance``); a disagreement calls ``disagree(reason)``
    and stops the trial. Trial calls cost the candidates' sum: a few calls a bucket."""

    def __init__(self, cands: list[tuple[str, Entry]], reference: Entry,
                 decide: Callable[[str, dict[str, float]], None],
                 disagree: Callable[[str], None],
                 size: Callable[[tuple[Any, ...]], int] | None = None,
                 scale_tol: float = 0.0) -> None:  # fmt: skip
        self.cands = cands
        self.scale_tol = scale_tol
        #: the work of a call's inputs (rows mode: its rows), which the figures are per
        self.size = size
        self.reference = reference
        self.decide = decide
        self.disagree = disagree
        self.calls = 0
        self.times: dict[str, list[float]] = {name: [] for name, _ in cands}
        #: per candidate, its time over the first candidate's on the same call
        self.ratios: dict[str, list[float]] = {name: [] for name, _ in cands}
        self.done = False
        #: what serves once done: the fastest candidate, or ``reference`` on a disagreement
        self.best: Entry = reference

    def __call__(self, feeds: Any, *xs: Any) -> dict[str, Any]:
        if self.done:
            return self.best(feeds, *xs)
        i = self.calls
        self.calls = i + 1
        n = len(self.cands)
        outs: dict[str, dict[str, Any]] = {}
        dts: dict[str, float] = {}
        for j in range(n):
            name, entry = self.cands[(i + j) % n]
            t0 = time.perf_counter()
            outs[name] = entry(feeds, *xs)
            dts[name] = time.perf_counter() - t0
        first = self.cands[0][0]
        out = outs[first]
        if i == 0:
            ref = next((outs[nm] for nm, e in self.cands if e is self.reference), None)
            want = self.reference(feeds, *xs) if ref is None else ref
            for name, got in [(nm, o) for nm, o in outs.items() if o is not want]:
                bad = [k for k in want
                       if k not in got or not agree(got[k], want[k], self.scale_tol)]  # fmt: skip
                if bad:
                    self.done = True
                    self.best = self.reference
                    self.disagree(f"the {name} result of output {bad[0]!r} disagrees "
                                  "with the sync interpreter's")  # fmt: skip
                    return want
        if i >= WARMUP:
            per = max(1, self.size(xs)) if self.size is not None else 1
            for name, dt in dts.items():
                self.times[name].append(dt / per)
                self.ratios[name].append(dt / max(dts[first], 1e-9))
        if not self.done and i + 1 >= WARMUP + SAMPLES:
            self.done = True
            figures = {nm: statistics.median(t) * 1e6 for nm, t in self.times.items()}
            best = min(self.ratios, key=lambda nm: statistics.median(self.ratios[nm]))
            self.best = dict(self.cands)[best]
            self.decide(best, figures)
        return out


def _compiled_run(in_names: Sequence[str], dtypes: Sequence[np.dtype], hit: list[str],
                  env: dict[str, Any],
                  converts: Sequence[Any] = ()) -> Callable[..., Any]:  # fmt: skip
    """Compile ``run(feeds, outputs=None)``: called without ``outputs``, with exactly the
    inputs ``in_names`` (bound to ``x0``...), each of its dtype in ``dtypes``, it runs the
    source lines ``hit`` (which return, or fall through); anything else, or any exception,
    goes to ``env["slow"]``. ``env``: the names ``hit`` uses (never model text: names and
    dtypes reach the source only as these bindings). ``converts``: per input None or its
    ``Value.convert`` (a map made a row), applied to the feed first (``C<k>``)."""
    n = len(in_names)
    conv = list(converts) + [None] * (n - len(converts))
    env.update({f"C{k}": c for k, c in enumerate(conv) if c is not None})

    def fetch(k: int) -> str:
        return f"feeds[n{k}]" if conv[k] is None else f"C{k}(feeds[n{k}])"

    # ``is`` first; ``==`` for an equal dtype object that is not NumPy's own (the arrays
    # a cached numba function returns carry dtypes unpickled with it: a KV cache fed back)
    same = " and ".join(f"(x{k}.dtype is d{k} or x{k}.dtype == d{k})" for k in range(n)) or "True"
    src = "\n".join([
        "def run(feeds, outputs=None):",
        "    if outputs is None:",
        "        try:",
        f"            if len(feeds) == {n}:",
        *[f"                x{k} = {fetch(k)}" for k in range(n)],
        f"                if {same}:",
        *["                    " + line for line in hit],
        "        except Exception:",
        "            pass",
        *([] if "cached" not in env else [
            "    else:",
            "        try:",
            "            r = cached(feeds, outputs)",
            "            if r is not None:",
            "                return r",
            "        except Exception:",
            "            pass",
        ]),
        "    return slow(feeds, outputs)",
    ])  # fmt: skip
    env.update({f"d{k}": np.dtype(dt.name) for k, dt in enumerate(dtypes)})
    env.update({f"n{k}": name for k, name in enumerate(in_names)})
    exec(compile(src, "<tfrt_py native entry>", "exec"), env)
    return env["run"]


def fast_entry(table: dict[Any, Entry], slow: Callable[..., Any], in_names: Sequence[str],
               dtypes: Sequence[np.dtype], boxes: dict[Any, Entry] | None = None,
               reads: Sequence[tuple[int, int]] = (),
               converts: Sequence[Any] = (),
               cached: Callable[..., Any] | None = None) -> Callable[..., Any]:  # fmt: skip
    """The generated ``run(feeds, outputs=None)`` (see the module docstring); a call with
    ``outputs`` tries ``cached(feeds, outputs)`` first when given (a KV cache's buffers:
    None or an exception sends it to ``slow``). With
    ``boxes`` (signature mode: box of dim values -> entry) a signature not in ``table``
    tries its box: the dims read from the shapes at ``reads`` (input, axis), ``box_of``
    them. A box's compiled function checks every feed's shape against its dims and
    raises on a mismatch (which then takes ``slow``, as any exception does); the
    interpreter's entry checks the feeds itself."""
    n = len(in_names)
    xs = "".join(f", x{k}" for k in range(n))
    key = "x0.shape" if n == 1 else "(" + ", ".join(f"x{k}.shape" for k in range(n)) + ")"
    hit = [
        f"f = table.get({key if n else '()'})",
        "if f is not None:",
        f"    return f(feeds{xs})",
    ]
    env: dict[str, Any] = {"table": table, "slow": slow}
    if cached is not None:
        env["cached"] = cached
    if boxes is not None and reads:
        from ..lower.generic import box_of

        dims = ", ".join(f"x{k}.shape[{a}]" for k, a in reads)
        hit += [
            f"f = boxes.get(box_of(({dims},)))",
            "if f is not None:",
            f"    return f(feeds{xs})",
        ]
        env.update(boxes=boxes, box_of=box_of)
    return _compiled_run(in_names, dtypes, hit, env, converts)


def direct_entry(fn: Any, params: Sequence[np.ndarray], in_names: Sequence[str],
                 out_names: Sequence[str], dtypes: Sequence[np.dtype], finishers: Sequence[Any],
                 slow: Callable[..., Any], encoders: Sequence[Any] = (),
                 converts: Sequence[Any] = ()) -> Callable[..., Any]:  # fmt: skip
    """A static-shape model's ``run`` once native code serves it: no table, the compiled
    function called straight (its explicit signature and in-function shape check reject
    anything unusual, which then takes ``slow``)."""
    n = len(in_names)
    fins = [_finisher(f) for f in finishers]
    one = len(out_names) == 1

    def val(k: int) -> str:
        r = "r" if one else f"r[{k}]"
        return r if fins[k] is None else f"F{k}({r})"

    env: dict[str, Any] = {"fn": fn, "slow": slow}
    called = _args(_encoders(encoders, n), env)
    args = ", ".join([*called, *(f"P{i}" for i in range(len(params)))])
    result = "{" + ", ".join(f"o{k}: {val(k)}" for k in range(len(out_names))) + "}"
    env.update({f"P{i}": p for i, p in enumerate(params)})
    env.update({f"o{k}": name for k, name in enumerate(out_names)})
    env.update({f"F{k}": f for k, f in enumerate(fins) if f is not None})
    return _compiled_run(in_names, dtypes, [f"r = fn({args})", f"return {result}"], env,
                         converts)  # fmt: skip


#: ``rounding_tolerance`` of a model with activations rounded to int8 at run time: flips
#: add up through the layers (a 4-layer 1024-wide random-weight Llama at level 4: 0.8-1.7e-2
#: of its logits' scale between tfrt_py's tiers and onnxruntime, and 1.5e-2 between
#: onnxruntime's own basic and full graph optimizations); a wrong kernel is far outside
ROUNDING_TOL = 2e-2


def rounding_tolerance(graph: Any) -> float:
    """How far (a fraction of an output's largest value) two correct tiers' outputs may
    differ for ``graph``: ``ROUNDING_TOL`` where a node rounds its activations to int8 at
    run time (com.microsoft MatMulNBits at ``accuracy_level=4``, DynamicQuantizeLinear and
    DynamicQuantizeMatMul: a float difference of one ulp upstream can move a value across a
    rounding boundary, a step of its scale, ~1e-3 of an output, and later layers carry it
    on), else 0."""
    for node in graph.nodes:
        if node.op_type == "MatMulNBits" and node.attrs.get("accuracy_level") == 4:
            return ROUNDING_TOL
        if node.op_type in _DYNAMIC_QUANTIZERS:
            return ROUNDING_TOL
    return 0.0


#: Ops that quantize their float input with a range found at run time.
_DYNAMIC_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul"})
