"""Step chains: a generation's steps on a streamed model as one pipeline run.

A decode step reads every stage of a streamed decoder. Run step by step, each step's first
stage is read only once the step before has finished (its last stage computed, its token
chosen): the disk idles for a stage's compute and the generation's own work on every
step. A chain keeps one run (``run_batches(..., chained=True)``) across the steps of one
generation: while the last stage of step ``t`` computes, the first stage of step ``t + 1``
is already being read, and the feeds of step ``t + 1`` (which depend on step ``t``'s
logits) are taken only when the run needs them.

Who owns what: one generation owns its chain and calls it from one thread (or task) at a
time; ``close``/``aclose`` ends the run (a read under way finishes first; one that has not
started is dropped). Between steps the run is parked, as any ``run_batches`` iterator
between results: another call on the model preempts it, and the chain's next step waits
for the arena again and re-reads what it had read ahead (``pipeline`` and ``gate``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import numpy as np

from ..calls import CallContext, set_current
from ..feeds import fill_outputs
from .pipeline import StreamedProgram

__all__ = ["AsyncStepChain", "StepChain"]


class StepChain:
    """``run(feeds)`` per step of one generation, on the calling thread."""

    def __init__(self, prog: StreamedProgram) -> None:
        self._next: Mapping[str, Any] | None = None
        self._results = prog.run_batches(self._feeds(), window=1, chained=True)

    def _feeds(self) -> Iterator[Mapping[str, Any]]:
        while (feeds := self._next) is not None:
            self._next = None
            yield feeds

    def run(
        self,
        feeds: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None = None,
        call: CallContext | None = None,
    ) -> dict[str, np.ndarray]:
        """One step's outputs (``outputs``: filled in place). ``call``: its deadline, checked
        by the stage kernels computed here. A failure ends the chain (and its run)."""
        self._next = feeds
        prev = set_current(call) if call is not None else None
        try:
            results = next(self._results)
        finally:
            if call is not None:
                set_current(prev)
                call.finish()
        return results if outputs is None else fill_outputs(results, outputs)

    def close(self) -> None:
        self._next = None
        self._results.close()


class AsyncStepChain:
    """``await run(feeds)`` per step of one generation; stages compute on the host's pool."""

    def __init__(self, prog: StreamedProgram) -> None:
        self._next: Mapping[str, Any] | None = None
        self._results = prog.run_batches_async(self._feeds(), window=1, chained=True)

    async def _feeds(self) -> AsyncIterator[Mapping[str, Any]]:
        while (feeds := self._next) is not None:
            self._next = None
            yield feeds

    async def run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        self._next = feeds
        results = await self._results.__anext__()
        return results if outputs is None else fill_outputs(results, outputs)

    async def aclose(self) -> None:
        self._next = None
        await self._results.aclose()
