"""One generation's state, step by step, shared by ``generate``, ``stream`` and
``generate_async`` (they differ only in how each step's ``run`` is called).

The first step feeds the whole (left-padded) prompt with an empty cache; each later step
feeds the token just chosen, the mask grown by one column, the next position, and the
``present`` outputs of the step before as the ``past`` inputs. When the model grows its
cache by ``Concat(past, new)`` (``Decoder.in_place``) and the cache passes
``IN_PLACE_BYTES``, each cache moves (once) into a buffer of the generation's final
length: a step then feeds the buffer's first ``P`` positions as ``past`` and hands the
first ``P + S`` as the ``present`` output buffer (``run(..., outputs=)``), so the model
writes only the new rows and no step copies the cache. Below that size the copy costs
less than a call with output buffers (their checks: ~0.1-0.2 ms a step on a 2-core Xeon).
Positions count tokens, not padding (``cumsum(mask) - 1``, as transformers computes
them), so a left-padded row gets the positions it would get alone. A row that produced
an end-of-sequence token is finished: it is fed ``pad`` from then on and its tokens are
``pad``; the generation ends when every row has finished or ``max_new_tokens`` were made.

Owned by one caller, on one thread at a time (an async generator's steps may hop threads;
they never overlap).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import Decoder
from .prompts import Prompt, Settings
from .sampling import pick

__all__ = ["IN_PLACE_BYTES", "Steps"]

#: The cache size (all layers, keys and values) from which a generation keeps its cache in
#: one buffer written in place: a copy of 1 MiB costs about what the output buffers' checks
#: cost per step (``benchmarks/generate.py``'s steps at past 16..512 show both).
IN_PLACE_BYTES = 1 << 20


class Steps:
    """Feeds for the next step (``feeds``), and the tokens each step's outputs give
    (``advance``). ``done`` once every row finished or the budget is spent."""

    def __init__(self, dec: Decoder, prompt: Prompt, s: Settings,
                 rng: np.random.Generator | None) -> None:  # fmt: skip
        self._dec = dec
        self._s = s
        self._rng = rng
        batch = prompt.ids.shape[0]
        self._mask = prompt.mask
        self._position = np.maximum(np.cumsum(prompt.mask, axis=1) - 1, 0)
        #: right-padded rows (``Decoder.pads_left`` false): where each prompt ends
        self._last = None if dec.pads_left else prompt.mask.sum(axis=1) - 1
        self._finished = np.zeros(batch, bool)
        self._eos = np.array(sorted(s.eos), np.int64)
        self.made = 0
        self.done = False
        self._outside = False  # ``keep_outside``
        self.feeds: dict[str, Any] = {dec.input_ids: prompt.ids}
        #: the output buffers of the next step (None: the model allocates its outputs)
        self.outputs: dict[str, Any] | None = None
        self._length = 0  # cache positions filled
        self._final = prompt.ids.shape[1] + s.max_new_tokens
        self._buffers: list[np.ndarray] = []
        #: the cache length from which the cache lives in buffers written in place
        self._in_place_at = IN_PLACE_BYTES // max(1, dec.bytes_per_token(batch))
        if dec.in_place and prompt.ids.shape[1] >= self._in_place_at:
            self._buffers = [c.buffer(batch, self._final) for c in dec.cache]
            self._feed_cache(prompt.ids.shape[1])
        else:
            for c in dec.cache:
                self.feeds[c.past] = c.empty(batch)
        self._feed_mask_and_positions(self._position)

    def _feed_cache(self, new: int) -> None:
        """The buffers' views for a step adding ``new`` positions to ``_length``."""
        self.outputs = {}
        for c, buf in zip(self._dec.cache, self._buffers):
            self.feeds[c.past] = buf[c.upto(self._length)]
            self.outputs[c.present] = buf[c.upto(self._length + new)]

    def _feed_mask_and_positions(self, positions: np.ndarray) -> None:
        dec = self._dec
        if dec.attention_mask is not None:
            self.feeds[dec.attention_mask] = self._mask.astype(dec.mask_dtype, copy=False)
        self._feed_positions(positions)

    def _feed_positions(self, positions: np.ndarray) -> None:
        dec = self._dec
        if dec.position_ids is not None:
            self.feeds[dec.position_ids] = positions.astype(dec.positions_dtype, copy=False)

    def advance(self, out: dict[str, Any]) -> np.ndarray:
        """The tokens (int64 [batch]) the step that returned ``out`` chose; sets up the
        next step's feeds (or ``done``). A caller that keeps the cache and the mask itself
        (batched serving) calls ``keep_outside`` first; ``out`` then needs only the
        logits."""
        logits = np.asarray(out[self._dec.logits])
        if self._last is None:
            last = logits[:, -1, :]
        else:  # a right-padded prompt: each row's own last token
            last, self._last = logits[np.arange(len(logits)), self._last], None
        return self.took(pick(last, self._s, self._rng), out)

    @property
    def greedy(self) -> bool:
        """Whether the next tokens are the argmax of the step's last position (so a caller
        running many generations' steps as one may pick them all at once: ``took``)."""
        return not self._s.do_sample and self._last is None

    def keep_outside(self) -> None:
        """From now on the caller keeps this generation's cache and attention mask (batched
        serving's ``BatchCache``, which fed them from ``feeds`` once): later steps feed
        only the token and its position, and ``took`` does not read ``out``."""
        self._outside = True

    def took(self, tokens: np.ndarray, out: dict[str, Any] | None) -> np.ndarray:
        """``advance`` once the tokens are picked: ``tokens`` (int64 [batch], which this
        Steps may change and returns) are what the step that returned ``out`` chose (its
        logits are not read here); sets up the next step's feeds (or ``done``)."""
        dec, s = self._dec, self._s
        tokens[self._finished] = s.pad
        self.made += 1
        eos = self._eos
        if eos.size == 1:  # np.isin costs ~8 µs a step; a compare, under 1
            self._finished |= tokens == eos[0]
        elif eos.size:
            self._finished |= (tokens[:, None] == eos).any(axis=1)
        self.done = self.made >= s.max_new_tokens or bool(self._finished.all())
        if self.done:
            self.feeds, self.outputs = {}, None
            return tokens
        batch = len(tokens)
        nxt = self._position[:, -1:] + 1
        self._length += int(self.feeds[dec.input_ids].shape[1])
        self._position = nxt
        self.feeds = {dec.input_ids: tokens[:, None].astype(dec.ids_dtype)}
        if self._outside:
            self._feed_positions(nxt)
            return tokens
        assert out is not None
        self._mask = np.concatenate([self._mask, np.ones((batch, 1), np.int64)], axis=1)
        if not self._buffers and dec.in_place and self._length >= self._in_place_at:
            self._buffers = [c.buffer(batch, self._final) for c in dec.cache]
            for c, buf in zip(dec.cache, self._buffers):  # the one copy of the cache
                buf[c.upto(self._length)] = out[c.present]
        if self._buffers:
            self._feed_cache(1)
        else:
            for c in dec.cache:
                self.feeds[c.past] = out[c.present]
        self._feed_mask_and_positions(nxt)
        return tokens
