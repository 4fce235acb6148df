"""A text batch's n-gram columns in one compiled pass (``text._Front.columns``): the
scanned bytes split into tokens (runs of bytes other than NUL and space) and rows (at NUL),
each token's id in the pool's vocabulary looked up in a hash table (``string_ids_jit``),
then each row's unigram columns and its (skip-)n-grams' -- the ids of ``n`` tokens
``skip + 1`` apart -- looked up in a second table keyed by id tuples. The columns come in
``TfIdfTable.row_columns``'s order (unigrams, then per skip per length per start), each
with its row, rows in order, which is ``_Sparse.scores_at``'s input: Python made a bytes
object per token, a tuple per n-gram and a dict lookup of each.

``GramTable(table)``: built at load from a ``TfIdfTable`` whose pool is matched by ASCII
runs (a key holding another character can never be a token of the scan: dropped).
``columns()`` gives ``fn(data, n_rows, blob, offs, slots, ucol, gkeys, glen, gcol, gslots,
meta, ids, starts, cols, rows) -> int``; ``meta`` = [has unigrams, max skip, lengths...];
``ids`` (int64, a token each) and ``starts`` (int64, ``n_rows + 1``) are scratch; writes
the found columns to ``cols`` and their rows to ``rows`` (intp, as many as fit) and returns
how many there are (more than fit: the caller calls again with room for them). None
without numba (``lib/jit.py``). Any thread (no GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...kernels.misc.strings import TfIdfTable
from ..lib.jit import Jitted
from .string_ids_jit import VocabTable, _find

__all__ = ["GramTable", "columns"]

_MIX = 0x9E3779B97F4A7C15  # the golden-ratio multiplier: ids of a gram spread over the slots
_MASK64 = (1 << 64) - 1


def _gram_hash(ids: tuple[int, ...]) -> int:
    """The slot hash of an id tuple, as ``_columns`` computes it (uint64, shifted once)."""
    h = len(ids)
    for i in ids:
        h = ((h ^ (i + 1)) * _MIX) & _MASK64
    return h >> 1


class GramTable:
    """The pool as token ids and id tuples (see the module docstring); read-only."""

    def __init__(self, table: TfIdfTable) -> None:
        keys = [k for k in table.table if all(isinstance(t, str) and t.isascii() for t in k)]
        vocab = sorted({t for k in keys for t in k})
        self.vocab = VocabTable(vocab)
        token_id = {t: i for i, t in enumerate(vocab)}
        self.ucol = np.full(len(vocab), -1, np.int64)
        grams = []
        for k in keys:
            if len(k) == 1:
                self.ucol[token_id[k[0]]] = table.table[k]
            else:
                grams.append((tuple(token_id[t] for t in k), table.table[k]))
        width = max((len(g) for g, _ in grams), default=1)
        self.gkeys = np.full((max(len(grams), 1), width), -1, np.int64)
        self.glen = np.zeros(max(len(grams), 1), np.int64)
        self.gcol = np.zeros(max(len(grams), 1), np.int64)
        size = 2
        while size < 2 * len(grams):
            size *= 2
        self.gslots = np.full(size, -1, np.int64)
        for g, (ids, col) in enumerate(grams):
            self.gkeys[g, : len(ids)] = ids
            self.glen[g], self.gcol[g] = len(ids), col
            h = _gram_hash(ids) & (size - 1)
            while self.gslots[h] >= 0:
                h = (h + 1) & (size - 1)
            self.gslots[h] = g
        lengths = [n for n in table.lengths if n > 1] if grams else []
        # skips past a row's length fit no gram (the pass stops there): 2**31 is as good as
        # a model's 2**62, and its + 1 cannot overflow
        skip = min(table.max_skip, 1 << 31)
        self.meta = np.array([int(table.has_unigrams), skip, *lengths], np.int64)
        #: columns a token gives at most without skips (its unigram, a gram per length)
        self.per_token = 1 + len(lengths)


def _columns(data: Any, n_rows: int, blob: Any, offs: Any, slots: Any, ucol: Any, gkeys: Any,
             glen: Any, gcol: Any, gslots: Any, meta: Any, ids: Any, starts: Any, cols: Any,
             rows: Any) -> int:  # fmt: skip  # pragma: no cover - numba only
    size = data.size
    row = 0
    start = -1
    t = 0
    starts[0] = 0
    for pos in range(size + 1):
        c = data[pos] if pos < size else 0
        if c != 0 and c != 32:
            if start < 0:
                start = pos
            continue
        if start >= 0:
            if t < ids.size:
                ids[t] = _find(data, start, pos, blob, offs, slots)
            t += 1
            start = -1
        if c == 0 and row < n_rows:
            row += 1
            starts[row] = t
    k = 0
    cap = cols.size
    mask = gslots.size - 1
    n_lens = meta.size - 2
    for r in range(n_rows):
        lo = starts[r]
        hi = starts[r + 1]
        if meta[0] != 0:
            for i in range(lo, hi):
                tok = ids[i]
                if tok >= 0 and ucol[tok] >= 0:
                    if k < cap:
                        cols[k] = ucol[tok]
                        rows[k] = r
                    k += 1
        for skip in range(meta[1] + 1):
            step = skip + 1
            if n_lens == 0 or (meta[2] - 1) * step >= hi - lo:
                break  # no gram of this row spans so far (the lengths ascend)
            for li in range(n_lens):
                n = meta[2 + li]
                span = (n - 1) * step
                for s in range(lo, hi - span):
                    h = np.uint64(n)
                    known = True
                    for q in range(n):
                        tok = ids[s + q * step]
                        if tok < 0:
                            known = False
                            break
                        h = (h ^ np.uint64(tok + 1)) * np.uint64(0x9E3779B97F4A7C15)
                    if not known:
                        continue
                    at = np.int64(h >> np.uint64(1)) & mask
                    while gslots[at] >= 0:
                        g = gslots[at]
                        if glen[g] == n:
                            same = True
                            for q in range(n):
                                if gkeys[g, q] != ids[s + q * step]:
                                    same = False
                                    break
                            if same:
                                if k < cap:
                                    cols[k] = gcol[g]
                                    rows[k] = r
                                k += 1
                                break
                        at = (at + 1) & mask
    return k


def _warm(fn: Any) -> None:
    v = VocabTable(["a", "b"])
    keys = np.array([[0, 1]], np.int64)
    one = np.ones(1, np.int64)
    meta = np.array([1, 0, 2], np.int64)
    fn(np.frombuffer(b"a b\x00b", np.uint8), 2, v.blob, v.offs, v.slots, np.arange(2), keys,
       one * 2, one, np.array([0, -1]), meta, np.empty(4, np.int64), np.empty(3, np.int64),
       np.empty(8, np.intp), np.empty(8, np.intp))  # fmt: skip


_COLUMNS = Jitted(_columns, _warm, helpers=(_find,))


def columns() -> Any:
    """The compiled pass, or None (numba missing, ``$TFRT_PY_JIT=0``, or held back)."""
    return _COLUMNS.get()
