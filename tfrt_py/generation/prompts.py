"""Prompts and generation settings, checked before anything runs: every failure is an
``InputError`` that says what was wrong, so a caller (or the server, as a 400) learns it
before the first token and the model is untouched.

A prompt is one sequence (a list of ints or a 1-D array: tokens come back as ints) or a
batch (a list of lists or a 2-D array: tokens come back as arrays of one per row). Rows of
different lengths are padded on the left, as decoders need (the new token of every row
then sits in the last column), or on the right for GroupQueryAttention models (their
``seqlens_k`` counts each row's tokens from its start; ``Decoder.pads_left``); an
``attention_mask`` given with a 2-D array says which entries are padding already.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..records import record
from .decoder import Decoder

__all__ = ["MAX_CACHE_BYTES", "MAX_NEW_TOKENS", "Prompt", "Settings", "read_prompt"]

#: The most tokens one call may ask for.
MAX_NEW_TOKENS = 1 << 15
#: The most bytes a call's cache may grow to (every cache tensor at the final length).
MAX_CACHE_BYTES = 4 << 30
#: The most rows one call may generate for.
MAX_BATCH = 4096


@record(frozen=True)
class Prompt:
    """``ids`` [batch, length] (left-padded), ``mask`` the same shape (1 = a token, 0 =
    padding), ``flat``: the caller gave one sequence (tokens come back as ints)."""

    ids: np.ndarray
    mask: np.ndarray
    flat: bool


@record(frozen=True)
class Settings:
    """How to pick tokens and when to stop (see ``GenerationMixin.generate``)."""

    max_new_tokens: int
    eos: frozenset[int]
    pad: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float


def read_prompt(dec: Decoder, input_ids: Any, attention_mask: Any) -> Prompt:
    """``input_ids`` (and ``attention_mask``) as a left-padded Prompt; InputError when the
    prompt is empty, not integers, out of the vocabulary, or ragged without a mask input."""
    flat, rows = _rows(input_ids)
    if not rows or any(len(r) == 0 for r in rows):
        raise InputError("input_ids: the prompt is empty (generate() needs one token at least)")
    if len(rows) > MAX_BATCH:
        raise InputError(f"input_ids: {len(rows)} rows; at most {MAX_BATCH} per call")
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dec.ids_dtype)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):  # the padding on the side the model takes it
        at = slice(width - len(r), width) if dec.pads_left else slice(0, len(r))
        ids[i, at], mask[i, at] = r, 1
    if attention_mask is not None:
        mask = _given_mask(attention_mask, ids.shape, flat)
        if not dec.pads_left and not (np.diff(mask, axis=1) <= 0).all():
            raise InputError("attention_mask: this model's GroupQueryAttention takes rows "
                             "padded on the right (ones, then zeros)")  # fmt: skip
    if dec.attention_mask is None and not mask.all():
        raise InputError("input_ids: rows of different lengths (or a mask with zeros) need "
                         "an attention_mask input, and this model has none")  # fmt: skip
    if (mask.sum(axis=1) == 0).any():
        raise InputError("attention_mask: a row masks every token of its prompt")
    check_tokens(dec, ids[mask != 0], "input_ids")
    return Prompt(ids, mask, flat)


def _rows(input_ids: Any) -> tuple[bool, list[np.ndarray]]:
    if isinstance(input_ids, np.ndarray):
        arr = input_ids
    elif isinstance(input_ids, Sequence) and not isinstance(input_ids, (str, bytes)):
        if input_ids and all(_is_row(r) for r in input_ids):
            return False, [_int_row(r) for r in input_ids]
        arr = np.asarray(input_ids, dtype=object) if input_ids else np.zeros(0, np.int64)
    else:
        raise InputError(f"input_ids must be a list of token ids or an integer array, "
                         f"got {type(input_ids).__name__}")  # fmt: skip
    if arr.ndim == 1:
        return True, [_int_row(arr)]
    if arr.ndim == 2:
        return False, [_int_row(r) for r in arr]
    raise InputError(f"input_ids must be 1-D (one prompt) or 2-D (a batch), got {arr.ndim}-D")


def _is_row(r: Any) -> bool:
    return isinstance(r, (np.ndarray, Sequence)) and not isinstance(r, (str, bytes))


def _int_row(r: Any) -> np.ndarray:
    arr = np.asarray(r, dtype=object) if not isinstance(r, np.ndarray) else r
    if arr.ndim != 1:
        raise InputError("input_ids: each row must be a flat list of token ids")
    if arr.dtype.kind not in "iu":
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in arr):
            raise InputError("input_ids: token ids must be integers")
        if any(not -(2**63) <= int(t) < 2**63 for t in arr):
            raise InputError("input_ids: a token id is out of range")
    return arr.astype(np.int64)


def _given_mask(mask: Any, shape: tuple[int, ...], flat: bool) -> np.ndarray:
    m = np.asarray(mask)
    if flat and m.ndim == 1:
        m = m[None]
    if m.shape != shape or m.dtype.kind not in "iub" or not np.isin(m, (0, 1)).all():
        raise InputError(f"attention_mask must be 0/1 integers shaped like input_ids "
                         f"{shape}, got {m.dtype} {m.shape}")  # fmt: skip
    return m.astype(np.int64)


def check_tokens(dec: Decoder, ids: np.ndarray, what: str) -> None:
    """InputError if an id lies outside [0, vocab) (or is negative when vocab is unknown)."""
    if ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or (dec.vocab is not None and hi >= dec.vocab):
        bad = lo if lo < 0 else hi
        limit = f"[0, {dec.vocab})" if dec.vocab is not None else ">= 0"
        raise InputError(f"{what}: token id {bad} is outside the vocabulary ({limit})")


def read_settings(dec: Decoder, prompt: Prompt, max_new_tokens: Any, eos_token_id: Any,
                  pad_token_id: Any, do_sample: Any, temperature: Any, top_k: Any,
                  top_p: Any) -> Settings:  # fmt: skip
    """The checked settings of one call (InputError for anything out of range)."""
    n = _int(max_new_tokens, "max_new_tokens")
    if not 1 <= n <= MAX_NEW_TOKENS:
        raise InputError(f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {n}")
    batch, length = prompt.ids.shape
    total = length + n
    if dec.max_positions is not None and total > dec.max_positions:
        raise InputError(f"the prompt ({length} tokens) and max_new_tokens ({n}) exceed "
                         f"the model's {dec.max_positions} positions")  # fmt: skip
    cache = dec.bytes_per_token(batch) * total
    if cache > MAX_CACHE_BYTES:
        gib = 2**30
        raise InputError(
            f"the cache would grow to {cache / gib:.2f} GiB (limit "
            f"{MAX_CACHE_BYTES / gib:.2f} GiB): ask for fewer rows or tokens"
        )
    eos = _token_set(dec, eos_token_id)
    pad = _int(pad_token_id, "pad_token_id") if pad_token_id is not None else min(eos, default=0)
    t = _float(temperature, "temperature")
    if not (np.isfinite(t) and t > 0):
        raise InputError(f"temperature must be a finite number > 0, got {temperature!r:.50}")
    k = _int(top_k, "top_k") if top_k is not None else 0
    p = _float(top_p, "top_p") if top_p is not None else 1.0
    if k < 0 or not 0.0 < p <= 1.0:
        raise InputError(
            f"top_k must be >= 0 and top_p in (0, 1], got {top_k!r:.50}, {top_p!r:.50}"
        )
    return Settings(n, eos, pad, bool(do_sample), t, k, p)


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(f"{what} must be an integer, got {v!r:.50}")
    return int(v)


def _float(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a number, got {v!r:.50}")
    return float(v)


def _token_set(dec: Decoder, eos: Any) -> frozenset[int]:
    if eos is None:
        return frozenset()
    if isinstance(eos, (int, np.integer)):
        ids = [eos]
    elif isinstance(eos, (list, tuple, set, frozenset, np.ndarray)) and len(eos) <= 1024:
        ids = list(eos)
    else:
        raise InputError(f"eos_token_id must be a token id or a list of them, got {eos!r:.50}")
    out = frozenset(_int(t, "eos_token_id") for t in ids)
    check_tokens(dec, np.array(sorted(out), np.int64), "eos_token_id")
    return out
