"""Strings to vocabulary ids in one compiled pass (``ml.encoder``'s path for a batch): the
strings joined with NUL and encoded to UTF-8 once (two C loops), then each NUL-separated
run hashed (FNV-1a over its bytes) and looked up in an open-addressing table of the
vocabulary's UTF-8 keys built at load. A dict lookup per string in Python costs ~35-45 ns
(a one-hot ColumnTransformer's two string columns at 1,000 rows: half its call); this
costs ~15-20.

``VocabTable(vocab)``: the table (``blob`` the keys' bytes end to end, ``offs`` where each
starts, ``slots`` a power of two at least twice the keys, each a key's index or -1).
``lookup()`` gives ``fn(data, blob, offs, slots, out) -> int``: ``data`` uint8, the joined
UTF-8; writes each run's id (-1: not in the vocabulary) to ``out`` (int64, one per run)
and returns the number of runs. UTF-8 with ``surrogatepass`` is one-to-one, so equal
bytes are equal strings. ``_find`` (one run's key index) serves ``text_grams_jit``
too. None without numba (``lib/jit.py``). Any thread (no GIL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..lib.jit import Jitted, inline

__all__ = ["VocabTable", "lookup"]

_OFFSET = 14695981039346656037
_PRIME = 1099511628211
_MASK64 = (1 << 64) - 1


def _fnv(b: bytes) -> int:
    """FNV-1a of ``b``, as ``_lookup`` computes it (uint64, shifted right once)."""
    h = _OFFSET
    for c in b:
        h = ((h ^ c) * _PRIME) & _MASK64
    return h >> 1


class VocabTable:
    """The vocabulary's lookup table (see the module docstring); built once at load."""

    def __init__(self, vocab: Sequence[str]) -> None:
        keys = [s.encode("utf-8", "surrogatepass") for s in vocab]
        size = 2
        while size < 2 * len(keys):
            size *= 2
        self.blob = np.frombuffer(b"".join(keys) or b"\x00", np.uint8)
        self.offs = np.zeros(len(keys) + 1, np.int64)
        self.offs[1:] = np.cumsum([len(k) for k in keys])
        self.slots = np.full(size, -1, np.int64)
        last = {k: i for i, k in enumerate(keys)}  # a repeated key: its last index, as a dict's
        for k, i in last.items():
            h = _fnv(k) & (size - 1)
            while self.slots[h] >= 0:
                h = (h + 1) & (size - 1)
            self.slots[h] = i


@inline
def _find(data: Any, start: int, end: int, blob: Any, offs: Any, slots: Any
          ) -> int:  # fmt: skip  # pragma: no cover - numba only
    """The key index of ``data[start:end]``, or -1."""
    h = np.uint64(14695981039346656037)
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    mask = slots.size - 1
    at = np.int64(h >> np.uint64(1)) & mask
    n = end - start
    while slots[at] >= 0:
        s = slots[at]
        a = offs[s]
        if offs[s + 1] - a == n:
            same = True
            for t in range(n):
                if blob[a + t] != data[start + t]:
                    same = False
                    break
            if same:
                return s
        at = (at + 1) & mask
    return -1


def _lookup(data: Any, blob: Any, offs: Any, slots: Any, out: Any
            ) -> int:  # fmt: skip  # pragma: no cover - numba only
    size = data.size
    start = 0
    k = 0
    for pos in range(size + 1):
        if pos < size and data[pos] != 0:
            continue
        if k < out.size:
            out[k] = _find(data, start, pos, blob, offs, slots)
        k += 1
        start = pos + 1
    return k


def _warm(fn: Any) -> None:
    t = VocabTable(["a", "bc"])
    fn(np.frombuffer(b"bc\x00x", np.uint8), t.blob, t.offs, t.slots, np.empty(2, np.int64))


_LOOKUP = Jitted(_lookup, _warm, helpers=(_find,))


def lookup() -> Any:
    """The compiled lookup, or None (numba missing, ``$TFRT_PY_JIT=0``, or held back)."""
    return _LOOKUP.get()
