"""Preparing a decoder's generation before traffic (``Model.warmup_generation``; ``tfrt-py
serve --warmup generate``).

A generation's steps are new input signatures on nearly every call (the past grows by one
token a step), so the native tier compiles one function per *box* of dims once the box is
hot (``native/runtime/tier.py``): until then the interpreter serves, and a fresh server's
first minute of streams runs at a fraction of its speed. This builds the feeds of the
steps a generation takes -- its prompt, and one-token steps at a few past lengths, for a
few batch sizes (a server batches concurrent streams' steps) -- and hands them to
``Model.warmup``, which compiles each one's box now (hot or not), waits, and makes the
tier's measured choice. ``first_step_feeds`` (a prompt's feeds) also serves the
benchmarks' and the server's generated feeds of a decoder.

Pure function of the model's decoder spec; runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["first_step_feeds", "step_feeds"]


def first_step_feeds(model: Any, batch: int = 1, length: int = 4) -> dict[str, Any] | None:
    """The feeds of a generation's first step (``batch`` prompts of ``length`` token 0,
    an empty cache): valid feeds for a decoder, whose inputs' dims are tied to each other
    (the mask spans past + new) as no generic dummy feed can know. None for a model that
    is not a KV-cache decoder."""
    from .decoder import read_decoder
    from .prompts import read_prompt, read_settings
    from .steps import Steps

    try:
        dec = read_decoder(model)
    except InputError:
        return None
    prompt = read_prompt(dec, [[0] * length] * batch, None)
    s = read_settings(dec, prompt, 1, None, None, False, 1.0, None, None)
    return Steps(dec, prompt, s, None).feeds


def step_feeds(model: Any, prompts: Sequence[int], pasts: Sequence[int],
               batches: Sequence[int]) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """For each batch size: the first step of ``prompts``-token prompts (token 0, mask
    all ones) and a one-token step after each of ``pasts`` cached positions (a zero cache,
    the mask all ones, positions after the past). ValueError for lengths or sizes < 1;
    InputError (``Model.decoder``) for a model that is not a KV-cache decoder."""
    if min((*prompts, *pasts, *batches), default=1) < 1:
        raise ValueError("warmup_generation: prompt lengths, pasts and batch sizes are >= 1")
    dec = model.decoder()
    items: list[dict[str, np.ndarray]] = []
    for b in batches:
        for n in prompts:
            first = first_step_feeds(model, batch=b, length=n)
            assert first is not None  # a decoder (model.decoder() said so)
            items.append(first)
        for p in pasts:
            feeds: dict[str, np.ndarray] = {dec.input_ids: np.zeros((b, 1), dec.ids_dtype)}
            if dec.attention_mask is not None:
                feeds[dec.attention_mask] = np.ones((b, p + 1), dec.mask_dtype)
            if dec.position_ids is not None:
                feeds[dec.position_ids] = np.full((b, 1), p, dec.positions_dtype)
            for c in dec.cache:
                shape = list(c.empty(b).shape)
                shape[c.axis] = p
                feeds[c.past] = np.zeros(shape, c.dtype)
            items.append(feeds)
    return items
