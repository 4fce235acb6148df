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
from collections.abc import Callable
from itertools import chain, repeat
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["TfIdfTable", "normalizer_parts", "register_kernels"]


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


Case = Callable[[str], str]


def normalizer_parts(ctx: KernelContext) -> tuple[Case | None, frozenset[str], bool]:
    """A StringNormalizer node's (case change or None, stop words, case sensitive), read
    at load (``ctx.unsupported`` on an unknown action). The kernel and the fused text
    front (``fused.text``) use them."""
    action = _str(ctx.attr("case_change_action", "NONE"))
    sensitive = bool(ctx.attr("is_case_sensitive", 0))
    stops = [_str(s) for s in ctx.attr("stopwords", [])]
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ctx.unsupported(f"case_change_action {action!r}")
    stop_set = frozenset(stops) if sensitive else frozenset(s.lower() for s in stops)
    return {"LOWER": str.lower, "UPPER": str.upper}.get(action), stop_set, sensitive


def _string_normalizer(ctx: KernelContext) -> ComputeFn:
    """StringNormalizer-10: ``X [C] or [1, C] -> Y [C'] or [1, C']``."""
    change, stop_set, sensitive = normalizer_parts(ctx)

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


class TfIdfTable:
    """TfIdfVectorizer-9's attributes as a lookup: every (skip-)n-gram of the pool in
    ``[min_gram_length, max_gram_length]`` -> its output column, the mode and weights.
    Built at load (``ctx.unsupported`` on a bad attribute); read-only after, any thread.
    The TfIdfVectorizer kernel and the fused text front (``fused.text``) count with it."""

    def __init__(self, ctx: KernelContext) -> None:
        mode = _str(ctx.attr("mode"))
        if mode not in ("TF", "IDF", "TFIDF"):
            raise ctx.unsupported(f"mode {mode!r}")
        self.mode = mode
        min_n = int(ctx.attr("min_gram_length"))
        max_n = int(ctx.attr("max_gram_length"))
        self.max_skip = int(ctx.attr("max_skip_count"))
        counts_attr = [int(c) for c in ctx.attr("ngram_counts")]
        indexes = [int(i) for i in ctx.attr("ngram_indexes")]
        pool_ints = ctx.attr("pool_int64s", None)
        pool_strs = ctx.attr("pool_strings", None)
        if (pool_ints is None) == (pool_strs is None):
            raise ctx.unsupported("exactly one of pool_int64s and pool_strings must be set")
        pool: list[Any] = [int(v) for v in pool_ints] if pool_ints is not None else []
        if pool_strs is not None:
            pool = [_str(v) for v in pool_strs]
        self.pool = frozenset(pool)
        weights_attr = ctx.attr("weights", None)
        self.out_size = out_size = max(indexes) + 1 if indexes else 0
        self.weights: np.ndarray | None = None
        if weights_attr is not None and len(weights_attr):
            self.weights = np.zeros(out_size, dtype=np.float32)
            w = np.asarray(weights_attr, dtype=np.float32)[:out_size]
            self.weights[: len(w)] = w
        # n-gram (tuple) -> output column, for the lengths in [min_n, max_n].
        table: dict[tuple[Any, ...], int] = {}
        gram_id = 0
        for n, start in enumerate(counts_attr, start=1):
            end = counts_attr[n] if n < len(counts_attr) else len(pool)
            for pos in range(start, end - n + 1, n):
                if min_n <= n <= max_n:
                    table.setdefault(tuple(pool[pos : pos + n]), indexes[gram_id])
                gram_id += 1
        self.table = table
        # no key is longer than ngram_counts has entries: longer lengths cannot match (and a
        # model's max_gram_length of 2**62 must not make a list of that many)
        self.lengths = [n for n in range(max(min_n, 1), min(max_n, len(counts_attr)) + 1)]
        self.unigrams = {k[0]: v for k, v in table.items() if len(k) == 1}  # no tuple per token
        self.has_unigrams = 1 in self.lengths
        self.unigrams_only = self.lengths == [1]

    def row_columns(self, row: list[Any]) -> list[int]:
        """The output column of every n-gram of ``row`` in the table, with repeats."""
        get = self.unigrams.get
        cols = [c for c in map(get, row) if c is not None] if self.has_unigrams else []
        size, table = len(row), self.table
        # a gram spans at least skip + 2 tokens: larger skips fit no gram of this row
        for skip in range(min(self.max_skip, size - 2) + 1):
            step = skip + 1
            for n in self.lengths:
                if n == 1:
                    continue  # counted above: unigrams do not depend on the skip
                span = (n - 1) * step
                for s in range(size - span):
                    col = table.get(tuple(row[s : s + span + 1 : step]))
                    if col is not None:
                        cols.append(col)
        return cols

    def counts(self, per_row: list[list[int]]) -> np.ndarray:
        """float32 ``[len(per_row), out_size]``: each row's columns counted."""
        freq = np.zeros((len(per_row), self.out_size), dtype=np.float32)
        total = sum(map(len, per_row))
        if total <= _FEW_TOKENS:  # a few columns: NumPy's calls cost more
            for counts, cols in zip(freq, per_row):
                for col in cols:
                    counts[col] += 1
        else:
            lens = np.fromiter(map(len, per_row), np.intp, len(per_row))
            cols_ = np.fromiter(chain.from_iterable(per_row), np.intp, total)
            at = np.repeat(np.arange(len(per_row), dtype=np.intp) * self.out_size, lens) + cols_
            np.add.at(freq.reshape(-1), at, np.float32(1))
        return freq

    def count_tokens(self, rows: list[list[Any]], get: Callable[..., Any]) -> np.ndarray:
        """float32 ``[len(rows), out_size]``: each row's unigrams counted, ``get`` (a
        ``dict.get``) giving a token's column (or the default for one not in the pool).
        Every token's column by one dict lookup at C speed, then one scatter-add."""
        lens = np.fromiter(map(len, rows), np.intp, len(rows))
        flat = list(chain.from_iterable(rows))
        cols = np.fromiter(map(get, flat, repeat(-1)), np.intp, len(flat))
        at = np.repeat(np.arange(len(rows), dtype=np.intp) * self.out_size, lens) + cols
        freq = np.zeros((len(rows), self.out_size), dtype=np.float32)
        np.add.at(freq.reshape(-1), at[cols >= 0], np.float32(1))
        return freq

    def weigh(self, freq: np.ndarray) -> np.ndarray:
        """The mode applied to counts ``freq`` (in place where it can)."""
        if self.mode == "IDF":
            freq = (freq > 0).astype(np.float32)
            if self.weights is not None:
                freq *= self.weights
        elif self.mode == "TFIDF" and self.weights is not None:
            freq *= self.weights
        return freq


def _tfidf_vectorizer(ctx: KernelContext) -> ComputeFn:
    """TfIdfVectorizer-9: ``X [C] or [B, C] -> Y float32 [out] or [B, out]``."""
    t = TfIdfTable(ctx)
    unigram_get, out_size = t.unigrams.get, t.out_size

    def tfidf_vectorizer(X: np.ndarray) -> np.ndarray:
        rows = X.reshape(1, -1) if X.ndim < 2 else X
        if not t.table or not rows.size:
            freq = np.zeros((rows.shape[0], out_size), dtype=np.float32)
        elif rows.size > _FEW_TOKENS and t.unigrams_only:
            # unigrams only: every token's column by one dict lookup, then one scatter-add
            # (an item update per token from Python cost ~150 ns each)
            freq = np.zeros((rows.shape[0], out_size), dtype=np.float32)
            tokens = rows.reshape(-1).tolist()
            cols = np.fromiter(map(unigram_get, tokens, repeat(-1)), np.intp, len(tokens))
            at = np.arange(len(tokens), dtype=np.intp) // rows.shape[1] * out_size + cols
            np.add.at(freq.reshape(-1), at[cols >= 0], np.float32(1))
        else:
            freq = t.counts([t.row_columns(row) for row in rows.tolist()])
        freq = t.weigh(freq)
        return freq.reshape(-1) if X.ndim < 2 else freq

    return tfidf_vectorizer


def register_kernels(registry: KernelRegistry) -> None:
    """Register StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer."""
    registry.add("StringNormalizer", _string_normalizer, since=10)
    registry.add("StringConcat", _string_concat, since=20)
    registry.add("StringSplit", _string_split, since=20)
    registry.add("RegexFullMatch", _regex_full_match, since=20)
    registry.add("TfIdfVectorizer", _tfidf_vectorizer, since=9)
