"""Tiered execution: the sync interpreter serves a native model until its compiled
function is ready, then one attribute store switches ``run`` to the native entry.

``NativeTier.run(feeds, outputs=None)`` is what ``Model.run`` calls. Its fast entry
(generated per model, like the interpreter's; names are bound as variables, never pasted
into its source) checks ``len(feeds)``, fetches each feed by name, checks that its dtype
*is* the input's native-byte-order dtype (numba would read a 0-d big-endian array as
native-endian), and calls the numba function with the feeds and the packed constants;
numba's dispatcher rejects a wrong dtype, layout or a read-only array (explicit signature,
no new specializations) and the function itself rejects a wrong shape. Anything unusual —
an exception of any kind, another dtype object, or ``outputs=`` — goes to ``_slow``: full
validation by the model's FeedChecker (the sync executor's InputErrors), native byte order
and contiguous writable copies, the native call again, and if that still fails the
prepared program, which raises the interpreter's ExecutionError naming the node. The
model stays usable either way.

Threading: ``run`` may be called from many threads at once; the compiled function
allocates its arena per call and releases the GIL (``nogil``). Compilation runs on one
process-wide daemon thread (``worker.py``), FIFO, so loads never wait for it and at most
one core compiles; tiers whose model was dropped are skipped. ``mode="eager"`` compiles on
the loading thread instead. ``state`` moves "compiling" -> "ready" | "failed", once.
After ``fork()`` the child compiles what was still waiting (``worker.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..calls import CallContext
from ..errors import InputError
from ..executors.base import Executor
from ..executors.program import Program
from ..feeds import check_output_buffers
from . import worker
from .compile import Compiled, compile_lowered
from .lower import Lowered

__all__ = ["MODES", "NativeTier"]

#: ``load(..., native=...)``: compile in the background (serve on the interpreter
#: meanwhile) or before ``load`` returns.
MODES = ("background", "eager")


class NativeTier(Executor):
    """Executor "native": the native tier of one model. ``state``: "compiling" | "ready" |
    "failed"; ``error`` says why it failed; ``compiled`` has the cache path, whether numba's
    cache answered, and the compile (or cache load) time."""

    name = "native"

    def __init__(
        self,
        lowered: Lowered,
        program: Program,
        check: Any,
        interp: Any,
        *,
        mode: str = "background",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"native must be one of {MODES}, got {mode!r}")
        self.lowered = lowered
        self.interp = interp
        self.mode = mode
        self.state = "compiling"
        self.error: str | None = None
        self.compiled: Compiled | None = None
        self._program = program
        self._check = check
        self._fn: Any = None
        self._done = threading.Event()
        #: The entry Model.run calls: the interpreter now, the native function when ready.
        self.run: Any = self._run_interp
        if mode == "eager":
            worker.compile_now(self)
            if self.state == "failed":
                from .compile import NativeUnavailable

                raise NativeUnavailable(f"native compilation failed: {self.error}")
        else:
            worker.submit(self)

    def _run_interp(self, feeds: Mapping[str, Any], outputs: Any = None) -> Any:
        return self.interp.run(feeds, outputs)

    def run_call(self, feeds: Mapping[str, Any], outputs: Any, call: CallContext) -> Any:
        """``run`` under a deadline or canceller: the interpreter's checked path until the
        native function is ready; then the call is checked before the native call (a model
        on the native tier is tiny by construction unless forced: its loops are bounded by
        static shapes)."""
        if self._fn is None:
            return self.interp.run_call(feeds, outputs, call)
        call.check()
        return self.run(feeds, outputs)

    def memory_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The sync interpreter's plan (the layout the native arena follows)."""
        return self.interp.memory_plan(shapes)

    def describe_lines(self) -> list[str]:
        how = "the whole model as one numba function, the sync interpreter until compiled"
        return [*self.interp.plan_lines(), "  " + self.describe(),
                f"  executor: native ({self.why}; {how})"]  # fmt: skip

    def wait(self, timeout: float | None = None) -> bool:
        """Block until compilation finished (ready or failed); False on timeout."""
        return self._done.wait(timeout)

    def _compile(self) -> None:
        """Compile and switch over (called by ``worker``: on its thread, or the loader's
        when eager)."""
        try:
            compiled = compile_lowered(self.lowered)
        except Exception as e:  # noqa: BLE001 - any failure keeps the interpreter serving
            self._fail(f"{type(e).__name__}: {e}")
            return
        self.compiled = compiled
        self._fn = compiled.fn
        self.run = self._fast_entry()
        self.state = "ready"
        self._done.set()

    def _fail(self, reason: str) -> None:
        """Give up: the interpreter keeps serving; ``describe()`` shows ``reason``."""
        self.error = reason
        self.state = "failed"
        self._done.set()

    def _fast_entry(self) -> Any:
        """The generated entry. Input and output names are bound as variables ``n<k>`` /
        ``o<k>`` (never pasted into the source: they are model text)."""
        low = self.lowered
        n_in = len(low.input_names)
        xs = [f"x{k}" for k in range(n_in)]
        args = ", ".join([*xs, *(f"P{i}" for i in range(len(low.params)))])
        same = " and ".join(f"x{k}.dtype is d{k}" for k in range(n_in)) or "True"
        if len(low.output_names) == 1:
            result = "{o0: r}"
        else:
            result = "{" + ", ".join(f"o{k}: r[{k}]" for k in range(len(low.output_names))) + "}"
        src = "\n".join([
            "def run(feeds, outputs=None):",
            "    if outputs is None:",
            "        try:",
            f"            if len(feeds) == {n_in}:",
            *[f"                x{k} = feeds[n{k}]" for k in range(n_in)],
            f"                if {same}:",
            f"                    r = fn({args})",
            f"                    return {result}",
            "        except Exception:",
            "            pass",
            "    return slow(feeds, outputs)",
        ])  # fmt: skip
        env: dict[str, Any] = {"fn": self._fn, "slow": self._slow}
        env.update({f"P{i}": p for i, p in enumerate(low.params)})
        # The canonical (native byte order) dtype objects: ``is`` fails for any other.
        env.update({f"d{k}": np.dtype(dt.name) for k, dt in enumerate(low.input_dtypes)})
        env.update({f"n{k}": n for k, n in enumerate(low.input_names)})
        env.update({f"o{k}": n for k, n in enumerate(low.output_names)})
        exec(compile(src, "<tfrt_py native entry>", "exec"), env)
        return env["run"]

    def _slow(self, feeds: Mapping[str, Any], outputs: Mapping[str, Any] | None) -> Any:
        args = self._check(feeds)
        names = self.lowered.output_names
        bufs = {} if not outputs else dict(outputs)
        if bufs:
            check_output_buffers(bufs, names, args)
        ready = [
            a
            if a.flags.c_contiguous and a.flags.writeable and a.dtype.isnative
            else np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
            for a in args
        ]
        try:
            r = self._fn(*ready, *self.lowered.params)
            vals = list(r) if isinstance(r, tuple) else [r]
        except Exception:  # noqa: BLE001 - the interpreter raises the executor's error
            vals = [np.array(v) for v in self._program.run(args)]
        out: dict[str, Any] = {}
        for name, v in zip(names, vals):
            buf = bufs.get(name)
            if buf is not None:
                if buf.shape != v.shape or buf.dtype != v.dtype:
                    raise InputError(
                        f"outputs[{name!r}]: buffer is {buf.dtype}{list(buf.shape)}, "
                        f"the output is {v.dtype}{list(v.shape)}"
                    )
                np.copyto(buf, v)
                v = buf
            out[name] = v
        return out

    def describe(self) -> str:
        """One line for ``Model.describe()``."""
        n, units = self.lowered.n_nodes, self.lowered.units
        if self.state == "compiling":
            return (
                f"native: compiling {n} nodes ({units} compile units) in the background; "
                "the sync interpreter serves"
            )
        if self.state == "failed":
            return f"native: compilation failed ({self.error}); the sync interpreter serves"
        c = self.compiled
        assert c is not None
        how = "loaded from the disk cache" if c.cache_hit else "compiled"
        return (
            f"native: {n} nodes as one numba function ({units} compile units), {how} in "
            f"{c.seconds:.2f} s ({c.path})"
        )
