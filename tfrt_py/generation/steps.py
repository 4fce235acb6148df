"""One generation's state, step by step, shared by ``generate``, ``stream`` and
``generate_async`` (they differ only in how each step's ``run`` is called).

The first step feeds the whole (left-padded) prompt with an empty cache; each later step
feeds the token just chosen, the mask grown by one column, the next position, and the
``present`` outputs of the step before as the ``past`` inputs. Positions count tokens, not
padding (``cumsum(mask) - 1``, as transformers computes them), so a left-padded row gets
the positions it would get alone. A row that produced an end-of-sequence token is
finished: it is fed ``pad`` from then on and its tokens are ``pad``; the generation ends
when every row has finished or ``max_new_tokens`` were made.

Owned by one caller, on one thread at a time (an async generator's steps may hop threads;
they never overlap).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .decoder import Decoder
from .prompts import Prompt, Settings
from .sampling import pick

__all__ = ["Steps"]


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
        self._finished = np.zeros(batch, bool)
        self._eos = np.array(sorted(s.eos), np.int64)
        self.made = 0
        self.done = False
        self.feeds: dict[str, Any] = {dec.input_ids: prompt.ids}
        for c in dec.cache:
            self.feeds[c.past] = c.empty(batch)
        self._feed_mask_and_positions(self._position)

    def _feed_mask_and_positions(self, positions: np.ndarray) -> None:
        dec = self._dec
        if dec.attention_mask is not None:
            self.feeds[dec.attention_mask] = self._mask.astype(dec.mask_dtype, copy=False)
        if dec.position_ids is not None:
            self.feeds[dec.position_ids] = positions.astype(dec.positions_dtype, copy=False)

    def advance(self, out: dict[str, Any]) -> np.ndarray:
        """The tokens (int64 [batch]) the step that returned ``out`` chose; sets up the
        next step's feeds (or ``done``)."""
        dec, s = self._dec, self._s
        logits = np.asarray(out[dec.logits])
        tokens = pick(logits[:, -1, :], s, self._rng)
        tokens[self._finished] = s.pad
        self.made += 1
        if self._eos.size:
            self._finished |= np.isin(tokens, self._eos)
        self.done = self.made >= s.max_new_tokens or bool(self._finished.all())
        if self.done:
            self.feeds = {}
            return tokens
        batch = len(tokens)
        nxt = self._position[:, -1:] + 1
        self._position = nxt
        self._mask = np.concatenate([self._mask, np.ones((batch, 1), np.int64)], axis=1)
        self.feeds = {dec.input_ids: tokens[:, None].astype(dec.ids_dtype)}
        for c in dec.cache:
            self.feeds[c.past] = out[c.present]
        self._feed_mask_and_positions(nxt)
        return tokens
