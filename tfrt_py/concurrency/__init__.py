"""Concurrency primitives: AsyncValue, run_when_ready, HostContext, Limiter.

Imports nothing else of tfrt_py and not NumPy: executors build on it, never the reverse.

* ``AsyncValue`` (``async_value``): pending -> available | error; ``and_then`` callbacks run
  on the fulfilling thread; awaitable from asyncio, uvloop and trio.
* ``HostContext`` (``host``): the worker pool, the bridge to event loops (``loop_bridge``),
  cancellation tokens; ``default_host()`` is created lazily.
"""

from __future__ import annotations

from .async_value import AsyncValue as AsyncValue
from .async_value import make_available as make_available
from .async_value import run_when_ready as run_when_ready
from .host import CancelToken as CancelToken
from .host import HostContext as HostContext
from .host import default_host as default_host
from .limiter import Limiter as Limiter
from .loop_bridge import AsyncioBridge as AsyncioBridge
from .loop_bridge import LoopBridge as LoopBridge
from .loop_bridge import TaskHandle as TaskHandle
from .loop_bridge import TrioBridge as TrioBridge
from .loop_bridge import current_bridge as current_bridge

__all__ = [
    "AsyncValue",
    "AsyncioBridge",
    "CancelToken",
    "HostContext",
    "Limiter",
    "LoopBridge",
    "TaskHandle",
    "TrioBridge",
    "current_bridge",
    "default_host",
    "make_available",
    "run_when_ready",
]
