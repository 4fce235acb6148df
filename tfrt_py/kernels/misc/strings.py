"""Kernels (misc): strings -- StringNormalizer, StringConcat, StringSplit, RegexFullMatch,
TfIdfVectorizer.

String tensors are NumPy object arrays of Python ``str``. StringNormalizer drops stop-word
elements (case-sensitively or not) from a ``[C]`` or ``[1, C]`` input, then applies the case
change; an all-dropped input yields ``[""]`` / ``[[""]]``. StringSplit follows Python's
``str.split`` (no or empty delimiter: runs of whitespace; ``maxsplit`` splits at most),
padding with ``""``. RegexFullMatch uses Python's ``re`` (the spec says RE2; the common
subset agrees). TfIdfVectorizer counts (skip-)n-grams per row against the pool; weights are
indexed by output column, as ONNX Runtime and the reference do.
"""

from __future__ import annotations

import re
from itertools import chain, repeat
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _string_normalizer(ctx: KernelContext) -> ComputeFn:
    """StringNormalizer-10: ``X [C] or [1, C] -> Y [C'] or [1, C']``."""
    action = _str(ctx.attr("case_change_action", "NONE"))
    sensitive = bool(ctx.attr("is_case_sensitive", 0))
    stops = [_str(s) for s in ctx.attr("stopwords", [])]
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ctx.unsupported(f"case_change_action {action!r}")
    stop_set = frozenset(stops) if sensitive else frozenset(s.lower() for s in stops)
    change = {"LOWER": str.lower, "UPPER": str.upper}.get(action)

    def string_normalizer(X: np.ndarray) -> np.ndarray:
        items = X.reshape(-1).tolist()
        if stop_set:
            if sensitive:
                items = [s for s in items if s not in stop_set]
            else:
                items = [s for s in items if s.lower() not in stop_set]
        if change is not None:
            items = [change(s) for s in items]
        if not items:
            items = [""]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(1, -1) if X.ndim == 2 else out

    return string_normalizer


def _string_concat(ctx: KernelContext) -> ComputeFn:
    """StringConcat-20: ``(X, Y) -> X + Y`` elementwise with broadcasting."""

    def string_concat(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        out = np.add(X.astype(object, copy=False), Y.astype(object, copy=False), dtype=object)
        return np.asarray(out, dtype=object)

    return string_concat


def _string_split(ctx: KernelContext) -> ComputeFn:
    """StringSplit-20: ``X -> (Y [*X.shape, max_pieces], Z int64 [*X.shape])``."""
    delim = _str(ctx.attr("delimiter", "")) or None
    maxsplit_attr = ctx.attr("maxsplit", None)
    maxsplit = -1 if maxsplit_attr is None else int(maxsplit_attr)

    def string_split(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pieces = [s.split(delim, maxsplit) for s in X.reshape(-1).tolist()]
        counts = np.array([len(p) for p in pieces], dtype=np.int64)
        width = int(counts.max()) if counts.size else 0
        Y = np.full((len(pieces), width), "", dtype=object)
        for i, p in enumerate(pieces):
            Y[i, : len(p)] = p
        return Y.reshape((*X.shape, width)), counts.reshape(X.shape)

    return string_split


def _regex_full_match(ctx: KernelContext) -> ComputeFn:
    """RegexFullMatch-20: ``X -> bool`` (whole-string match of ``pattern``)."""
    pattern = _str(ctx.attr("pattern"))
    try:
        match = re.compile(pattern).fullmatch
    except re.error as e:
        raise ctx.unsupported(f"invalid pattern {pattern!r}: {e}") from e

    def regex_full_match(X: np.ndarray) -> np.ndarray:
        flat = [match(s) is not None for s in X.reshape(-1).tolist()]
        return np.array(flat, dtype=bool).reshape(X.shape)

    return regex_full_match


#: Up to this many tokens TfIdfVectorizer counts in Python (a scatter-add's NumPy calls
#: cost several microseconds).
_FEW_TOKENS = 256


def _tfidf_vectorizer(ctx: KernelContext) -> ComputeFn:
    """TfIdfVectorizer-9: ``X [C] or [B, C] -> Y float32 [out] or [B, out]``."""
    mode = _str(ctx.attr("mode"))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ctx.unsupported(f"mode {mode!r}")
    min_n = int(ctx.attr("min_gram_length"))
    max_n = int(ctx.attr("max_gram_length"))
    max_skip = int(ctx.attr("max_skip_count"))
    counts_attr = [int(c) for c in ctx.attr("ngram_counts")]
    indexes = [int(i) for i in ctx.attr("ngram_indexes")]
    pool_ints = ctx.attr("pool_int64s", None)
    pool_strs = ctx.attr("pool_strings", None)
    if (pool_ints is None) == (pool_strs is None):
        raise ctx.unsupported("exactly one of pool_int64s and pool_strings must be set")
    pool: list[Any] = [int(v) for v in pool_ints] if pool_ints is not None else []
    if pool_strs is not None:
        pool = [_str(v) for v in pool_strs]
    weights_attr = ctx.attr("weights", None)
    out_size = max(indexes) + 1 if indexes else 0
    weights = None
    if weights_attr is not None and len(weights_attr):
        weights = np.zeros(out_size, dtype=np.float32)
        w = np.asarray(weights_attr, dtype=np.float32)[:out_size]
        weights[: len(w)] = w

    # n-gram (tuple) -> output column, for the lengths in [min_n, max_n].
    table: dict[tuple[Any, ...], int] = {}
    gram_id = 0
    for n, start in enumerate(counts_attr, start=1):
        end = counts_attr[n] if n < len(counts_attr) else len(pool)
        for pos in range(start, end - n + 1, n):
            if min_n <= n <= max_n:
                table.setdefault(tuple(pool[pos : pos + n]), indexes[gram_id])
            gram_id += 1
    lengths = [n for n in range(max(min_n, 1), max_n + 1)]
    unigrams = {k[0]: v for k, v in table.items() if len(k) == 1}  # no tuple per token

    unigram_get = unigrams.get
    has_unigrams = 1 in lengths

    def row_columns(row: list[Any]) -> list[int]:
        """The output column of every n-gram of ``row`` in the table, with repeats."""
        cols = [c for c in map(unigram_get, row) if c is not None] if has_unigrams else []
        size = len(row)
        for skip in range(max_skip + 1):
            step = skip + 1
            for n in lengths:
                if n == 1:
                    continue  # counted above: unigrams do not depend on the skip
                span = (n - 1) * step
                for s in range(size - span):
                    col = table.get(tuple(row[s : s + span + 1 : step]))
                    if col is not None:
                        cols.append(col)
        return cols

    def tfidf_vectorizer(X: np.ndarray) -> np.ndarray:
        rows = X.reshape(1, -1) if X.ndim < 2 else X
        freq = np.zeros((rows.shape[0], out_size), dtype=np.float32)
        if table and rows.size <= _FEW_TOKENS:  # a few tokens: NumPy's calls cost more
            for r, row in enumerate(rows.tolist()):
                counts = freq[r]
                for col in row_columns(row):
                    counts[col] += 1
        elif table and rows.size and lengths == [1]:
            # unigrams only: every token's column by one dict lookup, then one scatter-add
            # (an item update per token from Python cost ~150 ns each)
            tokens = rows.reshape(-1).tolist()
            cols = np.fromiter(map(unigram_get, tokens, repeat(-1)), np.intp, len(tokens))
            at = np.arange(len(tokens), dtype=np.intp) // rows.shape[1] * out_size + cols
            np.add.at(freq.reshape(-1), at[cols >= 0], np.float32(1))
        elif table and rows.shape[0]:
            per_row = [row_columns(row) for row in rows.tolist()]
            counts = np.fromiter(map(len, per_row), np.intp, len(per_row))
            cols = np.fromiter(chain.from_iterable(per_row), np.intp, int(counts.sum()))
            at = np.repeat(np.arange(len(per_row), dtype=np.intp) * out_size, counts) + cols
            np.add.at(freq.reshape(-1), at, np.float32(1))
        if mode == "IDF":
            freq = (freq > 0).astype(np.float32)
            if weights is not None:
                freq *= weights
        elif mode == "TFIDF" and weights is not None:
            freq *= weights
        return freq.reshape(-1) if X.ndim < 2 else freq

    return tfidf_vectorizer


def register_kernels(registry: KernelRegistry) -> None:
    """Register StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer."""
    registry.add("StringNormalizer", _string_normalizer, since=10)
    registry.add("StringConcat", _string_concat, since=20)
    registry.add("StringSplit", _string_split, since=20)
    registry.add("RegexFullMatch", _regex_full_match, since=20)
    registry.add("TfIdfVectorizer", _tfidf_vectorizer, since=9)
