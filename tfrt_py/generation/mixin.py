"""``Model.generate``, ``Model.stream`` and ``Model.generate_async``: token-by-token
generation on a KV-cache decoder (``decoder.py`` says which models qualify), named as users
of transformers expect.

Each step is one ``run`` (or ``run_async``) of the model, so every executor, deadline and
``max_concurrency`` bound applies per step, and concurrent generations on one model are as
safe as concurrent ``run`` calls. Everything a call is given is checked before the first
step (``prompts.py``); a failed step raises the model's own error and leaves the model
usable. ``timeout`` bounds the whole generation (DeadlineExceeded).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np

from ..calls import check_timeout
from ..errors import DeadlineExceeded

if TYPE_CHECKING:  # imported where a model first generates: ``import tfrt_py`` skips them
    from ..streaming.chain import AsyncStepChain, StepChain
    from .decoder import Decoder
    from .prompts import Prompt
    from .steps import Steps

__all__ = ["Deadline", "GenerateOptions", "GenerationMixin", "start"]


class GenerateOptions(TypedDict, total=False):
    """The keywords of ``generate``, ``stream`` and ``generate_async`` (see ``generate``)."""

    attention_mask: Any
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | np.random.Generator | None
    timeout: float | None


class Deadline:
    """What is left of a generation's ``timeout`` (None: no deadline)."""

    def __init__(self, timeout: Any) -> None:
        self.timeout = check_timeout(timeout)
        self._end = None if self.timeout is None else time.monotonic() + self.timeout

    def left(self) -> float | None:
        if self._end is None:
            return None
        left = self._end - time.monotonic()
        if left <= 0:
            assert self.timeout is not None
            raise DeadlineExceeded(self.timeout)
        return left

    def exceeded(self, e: DeadlineExceeded) -> DeadlineExceeded:
        """``e`` (a step's deadline) restated as the generation's."""
        return DeadlineExceeded(self.timeout or e.timeout, e.node_name, e.op_type)


def start(model: Any, input_ids: Any, max_new_tokens: int, kw: GenerateOptions,
          in_place: bool = True) -> tuple[Steps, Prompt, Deadline]:  # fmt: skip
    """One generation on ``model``, checked and ready for its first step: its Steps, its
    Prompt and its Deadline (InputError/TypeError for anything wrong, before a step).
    ``in_place=False`` keeps the cache in the model's outputs (a caller that batches the
    steps of many generations moves the caches itself), as does an executor that would
    copy each whole cache into its buffer (``Executor.writes_concat_in_place``: the
    native tier's compiled code and the async executor make ``present`` apart; there one
    copy, the model's own Concat, is the least a step can do)."""
    from .prompts import read_prompt, read_settings
    from .steps import Steps

    unknown = set(kw) - set(GenerateOptions.__annotations__)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)!r:.200}")
    dec = model.decoder()
    if dec.in_place and not (in_place and model.runtime.writes_concat_in_place):
        dec = dataclasses.replace(dec, in_place=False)
    prompt = read_prompt(dec, input_ids, kw.get("attention_mask"))
    s = read_settings(dec, prompt, max_new_tokens, kw.get("eos_token_id"),
                      kw.get("pad_token_id"), kw.get("do_sample", False),
                      kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p"))  # fmt: skip
    deadline = Deadline(kw.get("timeout"))
    rng = None
    if s.do_sample:
        seed = kw.get("seed")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return Steps(dec, prompt, s, rng), prompt, deadline


class GenerationMixin:
    """The generation methods of ``tfrt_py.Model`` (which supplies ``run``, ``run_async``,
    ``inputs``, ``outputs`` and ``graph``)."""

    _decoder: Decoder | None = None

    def decoder(self) -> Decoder:
        """This model's generation signature (cached); InputError when it is not a
        KV-cache decoder."""
        dec = self._decoder
        if dec is None:
            from .decoder import read_decoder

            dec = self._decoder = read_decoder(self)
        return dec

    def _begin(self, input_ids: Any, max_new_tokens: int,
               kw: GenerateOptions) -> tuple[Steps, Prompt, Deadline]:  # fmt: skip
        return start(self, input_ids, max_new_tokens, kw)

    def warmup_generation(self, prompts: Sequence[int] = (16,), pasts: Sequence[int] = (16, 128),
                          batches: Sequence[int] = (1,)) -> float:  # fmt: skip
        """Prepare the steps a generation takes (``Model.warmup`` on each): for every batch
        size, the first step of prompts of each length in ``prompts`` and a one-token step
        after each of ``pasts`` cached positions -- on the native tier, each one's box of
        dims compiled now and awaited, so that a generation's steps up to those lengths
        run compiled from the first token. Seconds taken. InputError for a model that is
        not a KV-cache decoder; ValueError for lengths or sizes < 1."""
        from .warm import step_feeds

        return float(self.warmup(step_feeds(self, prompts, pasts, batches)))  # type: ignore[attr-defined]

    def generate(self, input_ids: Any, max_new_tokens: int = 20,
                 **kw: Unpack[GenerateOptions]) -> np.ndarray:  # fmt: skip
        """The prompt followed by the generated tokens: 1-D for one prompt (a list of ints
        or a 1-D array), [batch, length] for a batch (rows left-padded with ``pad_token_id``
        where they were shorter, and padded on the right after their end token).

        Keywords (transformers' names): ``attention_mask`` (with a 2-D batch already
        padded), ``eos_token_id`` (an id or a list; a row ends after one), ``pad_token_id``
        (default: the smallest eos id, else 0), ``do_sample`` with ``temperature``,
        ``top_k``, ``top_p`` and ``seed`` (an int or a ``numpy.random.Generator``), and
        ``timeout`` (seconds for the whole call). InputError for a bad prompt or setting,
        before anything runs."""
        steps, prompt, deadline = self._begin(input_ids, max_new_tokens, kw)
        made = []
        chain = self._chain()
        try:
            while not steps.done:
                made.append(steps.advance(self._step(steps, deadline, chain)))
        finally:
            if chain is not None:
                chain.close()
        out = np.concatenate([prompt.ids.astype(np.int64), np.stack(made, axis=1)], axis=1)
        return out[0] if prompt.flat else out

    def stream(self, input_ids: Any, max_new_tokens: int = 20,
               **kw: Unpack[GenerateOptions]) -> Iterator[Any]:  # fmt: skip
        """``generate``'s new tokens as they are made: an int per step for one prompt, an
        int64 array (one per row) for a batch. Nothing runs until the first ``next``; the
        settings are checked when ``stream`` is called."""
        steps, prompt, deadline = self._begin(input_ids, max_new_tokens, kw)
        return self._stream(steps, prompt.flat, deadline)

    def _stream(self, steps: Steps, flat: bool, deadline: Deadline) -> Iterator[Any]:
        chain = self._chain()
        try:
            while not steps.done:
                tokens = steps.advance(self._step(steps, deadline, chain))
                yield int(tokens[0]) if flat else tokens
        finally:
            if chain is not None:
                chain.close()

    def _chain(self, asynchronous: bool = False) -> Any:
        """A streamed model's step chain for one generation (each step's first stage read
        while the step before computes: ``streaming.chain``; ``AsyncStepChain`` when
        ``asynchronous``), or None: each step is a ``run``, as with ``max_concurrency``
        (each step takes a slot)."""
        rt = self.runtime  # type: ignore[attr-defined]
        if rt.name != "stream" or getattr(self, "_limiter", None) is not None:
            return None
        from ..streaming import chain

        return (chain.AsyncStepChain if asynchronous else chain.StepChain)(rt)

    def _step(self, steps: Steps, deadline: Deadline, chain: StepChain | None) -> dict[str, Any]:
        try:
            if chain is not None:
                call = self._call(deadline.left())  # type: ignore[attr-defined]
                return chain.run(steps.feeds, steps.outputs, call)
            return self.run(steps.feeds, steps.outputs, timeout=deadline.left())  # type: ignore[attr-defined]
        except DeadlineExceeded as e:
            raise deadline.exceeded(e) from None

    def generate_async(self, input_ids: Any, max_new_tokens: int = 20,
                       **kw: Unpack[GenerateOptions]) -> AsyncIterator[Any]:  # fmt: skip
        """``stream`` for asyncio, uvloop and trio: ``async for tok in
        model.generate_async(ids, max_new_tokens=64, timeout=5)``. Each step is a
        ``run_async``, so the loop is never blocked; cancelling the consuming task stops
        the generation at the step in flight (no further step starts); ``timeout`` bounds
        the whole generation (DeadlineExceeded). The settings are checked when
        ``generate_async`` is called, as ``stream``'s are."""
        steps, prompt, deadline = self._begin(input_ids, max_new_tokens, kw)
        return self._stream_async(steps, prompt.flat, deadline)

    async def _stream_async(self, steps: Steps, flat: bool,
                            deadline: Deadline) -> AsyncIterator[Any]:  # fmt: skip
        from anyio.lowlevel import checkpoint_if_cancelled  # not at import: cold start

        chain = self._chain(asynchronous=True)
        try:
            while not steps.done:
                await checkpoint_if_cancelled()  # a step that never suspended still stops here
                try:
                    if chain is not None:
                        out = await self._chain_step(chain, steps, deadline)
                    else:
                        out = await self.run_async(  # type: ignore[attr-defined]
                            steps.feeds, timeout=deadline.left(), outputs=steps.outputs
                        )
                except DeadlineExceeded as e:
                    raise deadline.exceeded(e) from None
                tokens = steps.advance(out)
                yield int(tokens[0]) if flat else tokens
        finally:
            if chain is not None:
                await chain.aclose()

    async def _chain_step(self, chain: AsyncStepChain, steps: Steps,
                          deadline: Deadline) -> dict[str, Any]:  # fmt: skip
        """One step on ``chain`` within the generation's deadline (else the model's
        ``timeout``): past it the step is cancelled (which ends the chain's run)."""
        import anyio

        left = deadline.left()
        if left is None:
            left = getattr(self, "_timeout", None)
        if left is None:
            return await chain.run(steps.feeds, steps.outputs)
        with anyio.move_on_after(left):
            return await chain.run(steps.feeds, steps.outputs)
        raise DeadlineExceeded(left)
