"""Picking the next token from the last position's logits: greedy (argmax, the first of
ties, as torch) or sampled after temperature, top-k and top-p in transformers' order and
with its rules (top-k keeps every logit >= the k-th largest; top-p keeps the smallest set
of most likely tokens whose probability reaches ``top_p``, at least one). Sampling draws
from the caller's ``numpy.random.Generator``, so a seed repeats a generation exactly.
"""

from __future__ import annotations

import numpy as np

from .prompts import Settings

__all__ = ["pick"]


def pick(logits: np.ndarray, s: Settings, rng: np.random.Generator | None) -> np.ndarray:
    """The next token of each row of ``logits`` [batch, vocab], as int64 [batch]."""
    if not s.do_sample:
        return logits.argmax(axis=-1).astype(np.int64)
    assert rng is not None
    scores = logits.astype(np.float64) / s.temperature
    vocab = scores.shape[-1]
    if 0 < s.top_k < vocab:
        kth = np.partition(scores, vocab - s.top_k, axis=-1)[:, vocab - s.top_k, None]
        scores = np.where(scores < kth, -np.inf, scores)
    if s.top_p < 1.0:
        scores = _top_p(scores, s.top_p)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
    chosen = (cdf > u).argmax(axis=-1)
    return chosen.astype(np.int64)


def _top_p(scores: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as transformers sorts
    ordered = np.take_along_axis(scores, order, axis=-1)
    probs = np.exp(ordered - ordered[:, -1:])
    probs /= probs.sum(axis=-1, keepdims=True)
    drop = np.cumsum(probs, axis=-1) <= 1.0 - top_p
    drop[:, -1] = False  # the most likely token always stays
    out = scores.copy()
    np.put_along_axis(out, order, np.where(drop, -np.inf, ordered), axis=-1)
    return out
