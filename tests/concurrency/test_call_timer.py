"""The process-wide deadline timer (``tfrt_py.calls``) outlives anything a call gives it.

The timer is one daemon thread for the whole process: if it dies, no deadline fires again
in that process. These tests hand it what used to end it and then check that a later
deadline still fires. (Waits are generous bounds on a hang, never timing assertions.)
"""

from __future__ import annotations

import threading

from tfrt_py.calls import CallContext


def _expires(timeout: float = 0.05) -> bool:
    """Whether a fresh call with ``timeout`` is stopped by the timer (waits up to 30 s)."""
    stopped = threading.Event()
    call = CallContext(timeout)
    call.on_stop(stopped.set)
    try:
        return stopped.wait(30) and call.reason == "deadline"
    finally:
        call.finish()


def test_an_on_stop_callback_that_raises_does_not_end_the_timer() -> None:
    ran: list[str] = []

    def bad() -> None:
        ran.append("bad")
        raise RuntimeError("a callback's own fault")

    call = CallContext(0.01)
    call.on_stop(bad)
    call.on_stop(lambda: ran.append("after"))  # the next callback still runs
    assert _expires()
    assert ran == ["bad", "after"]
    call.finish()


def test_huge_and_infinite_deadlines_stay_queued_and_others_still_fire() -> None:
    far = [CallContext(t) for t in (1e300, float("inf"), 2.0**63 / 1e6)]
    assert _expires()
    assert not any(c.stop for c in far)
    for c in far:
        c.finish()
