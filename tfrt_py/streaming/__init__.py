"""Streamed execution: run models whose weights exceed a memory budget, stage by stage.

``tfrt_py.load(path, memory_budget=BYTES)`` hands off here (``load_streamed``) when the
model's weights exceed the budget: external-data weights stay on disk, the graph is cut
into stages at load, and while one stage computes an async transfer kernel reads the next
stage's weights into a double-buffered arena (TFRT's compute/transfer overlap for bulk
inference). See ``docs/streaming.md``.

Layering: above compiler/executors/frontends, below ``model.py`` (which imports this
package lazily, only for a load with ``memory_budget``).
"""

from __future__ import annotations

from typing import Any

from .loader import load_streamed as load_streamed
from .pipeline import DEFAULT_WINDOW as DEFAULT_WINDOW
from .pipeline import StreamedProgram as StreamedProgram
from .pipeline import StreamInfo as StreamInfo
from .pipeline import StreamStats as StreamStats
from .pipeline import run_each_async as run_each_async

__all__ = [
    "DEFAULT_WINDOW",
    "StreamInfo",
    "StreamStats",
    "StreamedProgram",
    "last_stats",
    "load_streamed",
    "run_each_async",
]


def last_stats(model: Any) -> StreamStats | None:
    """The figures of ``model``'s last finished streamed run (None: not streamed, or no run
    yet): compute, transfer, wait and wall seconds, bytes read."""
    prog = getattr(model, "runtime", None)
    return prog.last_stats if isinstance(prog, StreamedProgram) else None
