"""Continuous batching of a served decoder's generations: the decode steps of every stream
in flight run as one batched step of the model.

Each generation keeps its own state (``generation.Steps``: its tokens, its end, its
sampling). A new generation's first step (its prompt) runs with the other new prompts of
about its length (left-padded to the longest, masked) and gives its cache; then it takes
a row of the batch (``gen_cache.BatchCache``: every row's cache in one
buffer per cache tensor, kept from tick to tick, left-padded to the longest row with
``attention_mask`` zero on the padding, written in place when the model's presents are
``Concat(past, new)``). Each tick of the one scheduler task runs every seated
generation's next step as one call: one token per row, each row's own ``position_ids``.
Every row's logits go back to its Steps, which choose its token exactly as a lone
generation would (a row sees the same positions and keys; the padding is masked out): the
greedy rows' tokens come from one argmax over the tick's logits (``Steps.took``), a
sampling row draws its own; a seated row's Steps keeps neither cache nor mask
(``Steps.keep_outside``: the batch's buffers hold them). A
generation that finished, failed, passed its deadline or whose reader went away leaves
the batch at the next tick; the others go on. At most ``MAX_BATCH`` rows are seated; the
others wait for a row. The model's weights are read once a tick for all rows, which is
what pays on a CPU; a cache is copied only when its row joins or the batch reshapes.

Only for decoders that take ``attention_mask`` and ``position_ids`` (a padded row needs
both) and whose rows may be padded on the left (not GroupQueryAttention's: it counts a
row's tokens from its start); ``GenerationBatcher.fits`` says so, and the server
generates the others alone.

Runs on the server's event loop: ``stream`` in the request's task, the scheduler in a task
of its own started by the first stream; the model's calls are ``run_async`` (the loop
stays free). After a call of prompts the scheduler yields to the loop once, so that their
first tokens are written before the next tick is prepared (~0.2 ms sooner for a lone
stream; the seated rows' tick starts that much later). Nothing here is thread-safe: one
loop owns a batcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import field
from typing import Any

import numpy as np

from ..errors import DeadlineExceeded
from ..generation import Deadline, Steps
from ..records import record
from .gen_cache import BatchCache

__all__ = ["MAX_BATCH", "GenerationBatcher"]

#: The most generations one batched step carries (the rest wait for a row).
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
        self._new: list[_Stream] = []  # before their first step
        self._waiting: list[_Stream] = []  # for a row of the batch
        self._cache = BatchCache(self.dec)
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
        return dec.attention_mask is not None and dec.position_ids is not None and dec.pads_left

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
        """The scheduler: the prompts of new generations (batched by length), then one
        batched step of every seated one, until none is left. A fault of its own ends
        every generation with it (none waits forever)."""
        try:
            while self._new or self._waiting or self._cache.rows:
                prompted = False
                while self._new:
                    group = self._prompts()
                    if group:
                        await self._first(group)
                        prompted = True
                if prompted:  # their first tokens go out before the next tick is prepared
                    await asyncio.sleep(0)
                timeout = self._seat()
                if self._cache.rows:
                    await self._tick(timeout)
                await asyncio.sleep(0)  # new requests join the next tick
        except BaseException as e:
            for s in [*self._new, *self._waiting, *self._cache.rows]:
                s.tokens.put_nowait(e if isinstance(e, Exception) else None)
            self._new, self._waiting = [], []
            self._cache = BatchCache(self.dec)
            raise

    def _prompts(self) -> list[_Stream]:
        """The next new generations whose prompts run as one call: the first waiting and
        the others within a factor of two of its length (less padding), up to
        ``MAX_BATCH``; the rest stay for the next call."""
        ids = self.dec.input_ids
        self._new = [s for s in self._new if not s.gone]
        if not self._new:
            return []
        n = self._new[0].steps.feeds[ids].shape[1]
        group: list[_Stream] = []
        rest: list[_Stream] = []
        for s in self._new:
            fits = len(group) < MAX_BATCH and n <= 2 * s.steps.feeds[ids].shape[1] <= 4 * n
            (group if fits else rest).append(s)
        self._new = rest
        return group

    async def _first(self, group: list[_Stream]) -> None:
        """The prompts of ``group`` as one call (left-padded to the longest, the padding
        masked), each row's cache coming out of it; then each waits for a row."""
        ids = self.dec.input_ids
        group, timeout = self._in_time(group)
        if not group:
            return
        lengths = [s.steps.feeds[ids].shape[1] for s in group]
        feeds = group[0].steps.feeds if len(group) == 1 else self._prompt_feeds(group, lengths)
        try:
            out = await self.model.run_async(feeds, timeout=timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the generations' answer
            for s in group:
                self._end(s, e)
            return
        width = max(lengths)
        for r, (s, n) in enumerate(zip(group, lengths)):
            mine = out if len(group) == 1 else self._prompt_row(out, r, width - n)
            if self._advance(s, mine):
                self._waiting.append(s)

    def _prompt_feeds(self, group: list[_Stream], lengths: list[int]) -> dict[str, Any]:
        """The feeds of ``group``'s prompts as one batch, each row left-padded."""
        dec, k, width = self.dec, len(group), max(lengths)
        assert dec.attention_mask is not None and dec.position_ids is not None
        feeds: dict[str, Any] = {}
        for name, dt in ((dec.input_ids, dec.ids_dtype), (dec.attention_mask, dec.mask_dtype),
                         (dec.position_ids, dec.positions_dtype)):  # fmt: skip
            a = feeds[name] = np.zeros((k, width), dt)
            for r, (s, n) in enumerate(zip(group, lengths)):
                a[r, width - n :] = s.steps.feeds[name][0]
        for c in dec.cache:
            feeds[c.past] = c.empty(k)
        return feeds

    def _prompt_row(self, out: dict[str, Any], r: int, pad: int) -> dict[str, Any]:
        """Row ``r``'s outputs of a batched prompt call, as its own call would give them
        (its cache without the padding: a view, copied when the row joins)."""
        dec = self.dec
        mine = {dec.logits: out[dec.logits][r : r + 1]}
        for c in dec.cache:
            mine[c.present] = out[c.present][r : r + 1][
                (*(slice(None),) * c.axis, slice(pad, None))
            ]
        return mine

    def _seat(self) -> float | None:
        """Rows out for the generations that went away or ran out of time; rows in for
        those waiting, up to ``MAX_BATCH``. The seconds left to the seated ones."""
        cache = self._cache
        for s in [s for s in cache.rows if s.gone]:
            cache.leave(s)
        while self._waiting and len(cache.rows) < MAX_BATCH:
            s = self._waiting.pop(0)
            if not s.gone:
                cache.join(s, s.steps.feeds)
                s.steps.keep_outside()  # the batch's buffers hold its cache and mask now
        ready, timeout = self._in_time(cache.rows)
        for s in [s for s in cache.rows if s not in ready]:
            cache.leave(s)
        return timeout

    def _in_time(self, streams: list[_Stream]) -> tuple[list[_Stream], float | None]:
        """Those of ``streams`` before their deadlines (the others ended with it), and the
        seconds left to the first of those deadlines (None: none has one)."""
        ready: list[_Stream] = []
        left: list[float] = []
        for s in streams:
            try:
                t = s.deadline.left()
            except DeadlineExceeded as e:
                self._end(s, e)
                continue
            ready.append(s)
            if t is not None:
                left.append(t)
        return ready, min(left, default=None)

    async def _tick(self, timeout: float | None) -> None:
        """One batched step of every seated generation (``timeout``: ``_seat``'s)."""
        cache, dec = self._cache, self.dec
        rows = list(cache.rows)
        feeds, outputs = cache.feeds([s.steps for s in rows])
        try:
            out = await self.model.run_async(feeds, timeout=timeout, outputs=outputs)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - every row of the step hears of it
            for s in rows:
                self._end(s, e)
            self._cache = BatchCache(dec)  # a call past its deadline may still write there
            return
        cache.advanced(out)
        self.ticks += 1
        self.rows += len(rows)
        logits = out[dec.logits]
        # every greedy row's token in one call (a row that samples picks its own)
        greedy = logits[:, -1, :].argmax(axis=-1).astype(np.int64)
        for i, s in enumerate(rows):
            steps = s.steps
            if steps.greedy:
                tok = steps.took(greedy[i : i + 1], None)
            else:
                tok = steps.advance({dec.logits: logits[i : i + 1]})
            if not self._took(s, tok):
                cache.leave(s)

    def _advance(self, s: _Stream, out: dict[str, Any]) -> bool:
        """``s``'s token from its step's ``out``; False once it is finished."""
        return self._took(s, s.steps.advance(out))

    def _took(self, s: _Stream, tok: np.ndarray) -> bool:
        """``s``'s step chose ``tok``: to its reader; False once it is finished."""
        s.tokens.put_nowait(int(tok[0]) if s.flat else tok)
        if s.steps.done:
            self._end(s, None)
            return False
        return True

    @staticmethod
    def _end(s: _Stream, error: BaseException | None) -> None:
        s.tokens.put_nowait(error)
