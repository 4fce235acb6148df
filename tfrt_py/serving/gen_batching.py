"""Continuous batching of a served decoder's generations: the decode steps of every stream
in flight run as one batched step of the model.

Each generation keeps its own state (``generation.Steps``: its tokens, its end, its
sampling) and its own cache. A new generation's first step (its prompt) runs alone; from
then on, each tick of the one scheduler task takes every live generation's next step and
runs them as one call: the caches left-padded to the longest (``attention_mask`` zero on
the padding), each row's own ``position_ids``, one token per row. Every row's logits and
the tail of its ``present`` outputs go back to its Steps, which choose its token exactly
as a lone generation would (a row sees the same positions and keys; the padding is masked
out). A generation that finished, failed, passed its deadline or whose reader went away
leaves the batch at the next tick; the others go on. The price: each tick copies every
live cache into the padded batch (the model's weights are read once for all rows, which
is what pays on a CPU).

Only for decoders that take ``attention_mask`` and ``position_ids`` (a padded row needs
both); ``GenerationBatcher.fits`` says so, and the server generates the others alone.

Runs on the server's event loop: ``stream`` in the request's task, the scheduler in a task
of its own started by the first stream; the model's calls are ``run_async`` (the loop
stays free). Nothing here is thread-safe: one loop owns a batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import field
from typing import Any

import numpy as np

from ..errors import DeadlineExceeded
from ..generation import Deadline, Steps
from ..records import record

__all__ = ["MAX_BATCH", "GenerationBatcher"]

#: The most generations one batched step carries (the rest wait for the next tick).
MAX_BATCH = 32


@record(eq=False)
class _Stream:
    steps: Steps
    deadline: Deadline
    flat: bool
    tokens: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    gone: bool = False  # the reader went away


class GenerationBatcher:
    """The batched decode steps of one served decoder (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.dec = model.decoder()
        self._new: list[_Stream] = []
        self._live: list[_Stream] = []
        self._task: asyncio.Task[None] | None = None
        #: batched steps run, and the rows they carried (read by tests and benchmarks)
        self.ticks = 0
        self.rows = 0

    @staticmethod
    def fits(model: Any) -> bool:
        """Whether ``model``'s generations can share steps (a mask and positions)."""
        try:
            dec = model.decoder()
        except ValueError:
            return False
        return dec.attention_mask is not None and dec.position_ids is not None

    async def stream(self, steps: Steps, deadline: Deadline, flat: bool) -> AsyncIterator[Any]:
        """The tokens of one checked generation (``generation.start(..., in_place=False)``):
        an int per step for one prompt; its errors are raised here. Leaving the iteration
        (a reader that went away) takes the generation out of the batch."""
        s = _Stream(steps, deadline, flat)
        self._new.append(s)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            while True:
                item = await s.tokens.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            s.gone = True

    async def _run(self) -> None:
        """The scheduler: first steps of new generations alone, then one batched step of
        every live one, until none is left. A fault of its own ends every generation with
        it (none waits forever)."""
        try:
            while self._new or self._live:
                while self._new:
                    s = self._new.pop(0)
                    if not s.gone:
                        await self._step([s])
                self._live = [s for s in self._live if not s.gone]
                if self._live:
                    await self._step(self._live[:MAX_BATCH])
                await asyncio.sleep(0)  # new requests join the next tick
        except BaseException as e:
            for s in [*self._new, *self._live]:
                s.tokens.put_nowait(e if isinstance(e, Exception) else None)
            self._new, self._live = [], []
            raise

    async def _step(self, batch: list[_Stream]) -> None:
        ready = []
        for s in batch:
            try:
                s.deadline.left()
                ready.append(s)
            except DeadlineExceeded as e:
                self._end(s, e)
        if not ready:
            return
        feeds, pads = self._feeds(ready) if len(ready) > 1 else (ready[0].steps.feeds, [0])
        try:
            left = [s.deadline.left() for s in ready]
            timeout = min((t for t in left if t is not None), default=None)
            out = await self.model.run_async(feeds, timeout=timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - every row of the step hears of it
            for s in ready:
                self._end(s, e)
            return
        self.ticks += 1
        self.rows += len(ready)
        for i, (s, pad) in enumerate(zip(ready, pads)):
            mine = out if len(ready) == 1 else self._row(out, i, pad)
            tok = s.steps.advance(mine)
            s.tokens.put_nowait(int(tok[0]) if s.flat else tok)
            if s.steps.done:
                self._end(s, None)
            elif s not in self._live:
                self._live.append(s)

    def _feeds(self, batch: list[_Stream]) -> tuple[dict[str, Any], list[int]]:
        """One step's feeds for ``batch`` (each a one-token step): the caches left-padded
        to the longest, the masks with zeros there; and each row's padding."""
        dec = self.dec
        first = batch[0].steps.feeds
        lengths = [int(s.steps.feeds[dec.cache[0].past].shape[dec.cache[0].axis]) for s in batch]
        longest = max(lengths)
        pads = [longest - n for n in lengths]
        feeds: dict[str, Any] = {
            dec.input_ids: np.concatenate([s.steps.feeds[dec.input_ids] for s in batch]),
            dec.position_ids: np.concatenate([s.steps.feeds[dec.position_ids] for s in batch]),
        }
        assert dec.attention_mask is not None and dec.position_ids is not None
        mask = np.zeros((len(batch), longest + 1), first[dec.attention_mask].dtype)
        for r, (s, pad) in enumerate(zip(batch, pads)):
            mask[r, pad:] = s.steps.feeds[dec.attention_mask][0]
        feeds[dec.attention_mask] = mask
        for c in dec.cache:
            buf = c.buffer(len(batch), longest)
            for r, (s, pad) in enumerate(zip(batch, pads)):
                row = slice(r, r + 1)
                buf[(row, *self._tail(c, 0, pad)[1:])] = 0  # masked, but never NaN
                buf[(row, *self._tail(c, pad, longest)[1:])] = s.steps.feeds[c.past]
            feeds[c.past] = buf
        return feeds, pads

    @staticmethod
    def _tail(c: Any, pad: int, end: int) -> tuple[slice, ...]:
        """The index of positions ``pad:end`` of cache ``c``."""
        return (*(slice(None),) * c.axis, slice(pad, end))

    def _row(self, out: dict[str, Any], r: int, pad: int) -> dict[str, Any]:
        """Row ``r``'s outputs as its own generation would have them (its cache without
        the padding)."""
        dec = self.dec
        mine = {dec.logits: out[dec.logits][r : r + 1]}
        for c in dec.cache:
            full = out[c.present][r : r + 1]
            end = full.shape[c.axis]
            mine[c.present] = full[self._tail(c, pad, end)]
        return mine

    def _end(self, s: _Stream, error: BaseException | None) -> None:
        with contextlib.suppress(ValueError):
            self._live.remove(s)
        s.tokens.put_nowait(error)
