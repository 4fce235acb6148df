"""Per-call state of the dataflow executor, and its slow paths: errors, cancellation, If
gates. The hot loop (``dataflow.DataflowExecutor._drain``) touches only ``env``,
``tokens`` and ``stop``; everything here runs once ``stop`` is set, or for control flow.

Ownership: a ``Run`` is created by the calling thread and shared by every thread that runs
one of its kernels. ``env`` slots are written once each (by their producer) and read only
after a release; ``tokens`` lists are popped (atomic); everything else that more than one
thread mutates -- ``failures``, ``poison``, ``ifstate``, ``ctrl``, ``token`` -- is guarded
by ``lock``.

Nested runs: a non-strict Loop/Scan runs its body's first iteration as a child ``Run``
(``parent`` set, ``on_done`` called by whichever thread completes it); ``cancel`` cancels
the children in flight (``CtrlState.body``), ``abort`` reaches the top-level run.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from threading import Lock
from typing import Any

from ..calls import CallContext
from ..concurrency import AsyncValue, CancelToken, HostContext, LoopBridge
from .dataflow_schedule import IfGates

__all__ = ["CtrlState", "Run", "ready_list_factory"]

_COND, _THEN, _ELSE, _LAUNCHED = 1, 2, 4, 8  # If state bits; a poisoned gate sets bit << 4


class CtrlState:
    """One non-strict Loop/Scan in one run (``dataflow_control``), guarded by the run's
    ``lock``: ``phase`` WAITING (control gate not fired yet), RUNNING (iteration 0 in the
    child run ``body``), DONE (completed or forwarding an error); ``arrived``: bit k per
    capture group whose producer finished without error; ``bad``: one finished with an
    error; ``state``: the spec's iteration state while RUNNING; ``launcher``: the thread
    starting the child run (0 once it returned) and ``done_inline``: the child completed on
    that thread meanwhile, so the launcher releases the node (no nested drain)."""

    WAITING, RUNNING, DONE = 0, 1, 2
    __slots__ = ("arrived", "bad", "body", "done_inline", "launcher", "phase", "state")

    def __init__(self) -> None:
        self.phase = CtrlState.WAITING
        self.arrived = 0
        self.bad = False
        self.body: Run | None = None
        self.state: Any = None
        self.launcher = 0
        self.done_inline = False


class Run:
    """One call's state (see the module docstring for who may touch what)."""

    __slots__ = (
        "bridge",
        "call",
        "cancelled",
        "ctrl",
        "env",
        "failures",
        "host",
        "ifstate",
        "lock",
        "on_done",
        "parent",
        "poison",
        "pool_ok",
        "result",
        "stop",
        "token",
        "tokens",
    )

    def __init__(
        self,
        env: list[Any],
        tokens: list[list[int]],
        host: HostContext,
        bridge: LoopBridge | None,
        n_ifs: int,
        n_ctrl: int = 0,
        parent: Run | None = None,
        call: CallContext | None = None,
    ) -> None:
        #: the call's deadline/canceller (a child run shares its parent's), or None
        self.call: CallContext | None = call if parent is None else parent.call
        self.env = env
        self.tokens = tokens
        self.host = host
        self.bridge = bridge
        self.result: AsyncValue[list[Any]] = AsyncValue()
        self.lock = Lock()
        self.stop = False  # cancelled, or a kernel failed: the run loop takes the slow path
        self.cancelled = False
        self.failures: dict[int, BaseException] | None = None
        self.poison: set[int] | None = None  # indices with an error among their inputs
        self.ifstate = [0] * n_ifs if n_ifs else []
        self.ctrl = [CtrlState() for _ in range(n_ctrl)] if n_ctrl else []
        self.parent = parent
        #: called with ``inline`` by the thread that completes a child run (set by its parent)
        self.on_done: Callable[[bool], None] | None = None
        self.token: CancelToken | None = None  # made when the first async kernel spawns
        # False when the caller is one of the host's workers: waiting there for other pool
        # work could deadlock a saturated pool, so everything runs on the caller instead.
        self.pool_ok: bool = parent.pool_ok if parent is not None else not host.is_worker_thread()

    # -- cancellation ---------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop every thread before its next kernel; cancel spawned async kernels and child
        runs. (No lock: a child is registered before its launcher reads ``cancelled``.)"""
        self.cancelled = self.stop = True
        token = self.token
        if token is not None:
            token.cancel()
        for st in self.ctrl:
            body = st.body
            if body is not None:
                body.cancel()

    def cancel_token(self) -> CancelToken:
        """The run's token (made on first use); ``cancel()`` cancels what it guards."""
        token = self.token
        if token is None:
            with self.lock:
                token = self.token
                if token is None:
                    token = self.token = self.host.cancel_token()
                    token.add_callback(self.cancel)
        return token

    def abort(self, error: BaseException) -> None:
        """An error outside any kernel (a bug, or an interrupt): fail the whole call."""
        if self.parent is not None:
            self.parent.abort(error)
        self.cancelled = self.stop = True
        for st in self.ctrl:
            body = st.body
            if body is not None:
                body.cancel()
        if not self.result.is_available():
            with contextlib.suppress(RuntimeError):  # set concurrently by another thread
                self.result.set_error(error)

    # -- errors ---------------------------------------------------------------------------------
    def fail(self, i: int, error: BaseException, users: Sequence[int]) -> None:
        """Kernel ``i`` failed: record it; its ``users`` inherit the error."""
        with self.lock:
            if self.failures is None:
                self.failures = {}
            self.failures[i] = error
            self._poison(users)

    def should_run(self, i: int, users: Sequence[int]) -> bool:
        """Once ``stop`` is set: False if cancelled, or if ``i`` has an error among its
        inputs (then ``i`` does not run and its ``users`` inherit the error)."""
        if self.cancelled:
            return False
        poison = self.poison
        if poison is not None and i in poison:
            with self.lock:
                self._poison(users)
            return False
        return True

    def _poison(self, indices: Sequence[int]) -> None:  # caller holds self.lock
        if self.poison is None:
            self.poison = set()
        self.poison.update(indices)
        self.stop = True

    # -- non-strict If ----------------------------------------------------------------------------
    def fire_gate(self, gates: IfGates, role: int, g: int) -> int:
        """Gate ``g`` (role 0 cond, 1 then, 2 else) fired: return the If node to launch now
        (once: cond known and the chosen branch's captures ready), else -1. An If whose cond
        or chosen captures carry an error launches poisoned, i.e. forwards it."""
        bit = 1 << role
        with self.lock:
            st = self.ifstate[gates.ordinal] | bit
            if self.poison is not None and g in self.poison:
                st |= bit << 4
            launch = bad = False
            if st & _COND and not st & _LAUNCHED:
                if st & (_COND << 4):
                    launch = bad = True
                else:
                    try:
                        need = _THEN if bool(self.env[gates.cond_slot]) else _ELSE
                    except Exception:  # noqa: BLE001 - wait for both; the kernel will raise it
                        need = _THEN | _ELSE
                    if st & need == need:
                        launch, bad = True, bool(st & (need << 4))
            if launch:
                st |= _LAUNCHED
                if bad:
                    self._poison((gates.node,))
            self.ifstate[gates.ordinal] = st
        return gates.node if launch else -1


class _ShuffledReady(list[int]):
    """A ready list whose ``pop`` takes a seeded-random element (tests: no order
    dependence). The rng is shared by the executor's runs; ``random.Random`` is
    thread-safe for this use."""

    __slots__ = ("_rng",)
    _rng: random.Random

    def pop(self, index: Any = -1) -> int:
        j = self._rng.randrange(len(self))
        self[j], self[-1] = self[-1], self[j]
        return super().pop()


def ready_list_factory(seed: int | None) -> Callable[[list[int]], list[int]]:
    """``list`` (LIFO ready lists), or, with a seed, lists that pop in random order."""
    if seed is None:
        return list
    rng = random.Random(seed)

    def shuffled(items: list[int]) -> list[int]:
        ready = _ShuffledReady(items)
        ready._rng = rng
        return ready

    return shuffled
