"""A compiled walk for ``tree.Forest.leaves``: every (row, tree) pair taken to its leaf
without NumPy's four or five ``take`` calls per level for all pairs at once (a 20-tree
forest of depth 6 on one row: 27 µs, most of it those calls).

``walker()`` gives ``fn(x, nodes, thr, flags, meta, out)`` over a ``Forest``'s arrays as
``pack`` lays them out: ``x`` a C-contiguous (N, F) array of the forest's dtype, ``thr``
its thresholds, ``out`` (N, trees) intp, filled with the combined index of the leaf each
pair reaches -- what the NumPy walk gives: the condition as ``op`` says (``tree``'s LEQ,
LT, GTE, GT, EQ, NEQ codes: one comparison for every node; ``MIXED``: ``x < t`` where
``use_lt``, ``x == t`` where ``use_eq``), true for a NaN feature where ``nanflag``, and
the next index ``nxt[2 i + condition]``. A pair stops at its leaf (an index of
``n_nodes`` or more), where the NumPy walk loops on it until ``depth``. Tree by tree (its
nodes stay in cache), blocks of ``_ROWS`` rows a level at a time (100 trees of depth 10,
2 cores, AVX2: 22 against 50 µs on one row, 0.7-0.8x NumPy's walk at 64 and 1000 rows).
Set membership (BRANCH_MEMBER) is not here: such a forest keeps NumPy's walk.

The arrays are the Forest's, which its constructor checked (every index in range, no
cycle, features inside the row), so the walk reads inside them. None without numba
(``lib/jit.py``). Any thread (no GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import Jitted

__all__ = ["MIXED", "pack", "walker"]

#: ``op`` where the modes mix (a single one is its ``tree`` code, 0..5).
MIXED = 6
#: Rows walked together through one tree, a level at a time: their loads do not wait on
#: each other (one row at a time, each level's load waits on the one before: 1.5x slower
#: than NumPy's walk at 64 rows and more).
_ROWS = 64


def _walk(x: Any, nodes: Any, thr: Any, flags: Any, meta: Any, out: Any
          ) -> None:  # fmt: skip  # pragma: no cover - numba only
    n = x.shape[0]
    n_trees, n_nodes, depth, op = meta[0], meta[1], meta[2], meta[3]
    nan_any = meta[4] != 0
    base = 2 * n_nodes  # nodes: [next of 2 i and 2 i + 1 | features | roots]
    cur = np.empty(min(n, _ROWS), np.intp)
    for k in range(n_trees):
        root = nodes[base + n_nodes + k]
        for i0 in range(0, n, _ROWS):
            m = min(n - i0, _ROWS)
            cur[:m] = root
            for _ in range(depth):  # a level of every row of the block: independent loads
                moved = False
                for r in range(m):
                    idx = cur[r]
                    if idx >= n_nodes:
                        continue
                    moved = True
                    v = x[i0 + r, nodes[base + idx]]
                    th = thr[idx]
                    if op == 0:
                        c = v <= th
                    elif op == 1:
                        c = v < th
                    elif op == 2:
                        c = v >= th
                    elif op == 3:
                        c = v > th
                    elif op == 4:
                        c = v == th
                    elif op == 5:
                        c = v != th
                    else:
                        f = flags[idx]
                        c = (v < th and (f & 2) != 0) or (v == th and (f & 4) != 0)
                    if nan_any and v != v and (flags[idx] & 1) != 0:
                        c = True
                    cur[r] = nodes[2 * idx + (1 if c else 0)]
                if not moved:
                    break
            for r in range(m):
                out[i0 + r, k] = cur[r]


def pack(roots: Any, feat: Any, nxt: Any, n_nodes: int, depth: int, op: int, nanflag: Any,
         use_lt: Any, use_eq: Any) -> tuple[Any, Any, Any]:  # fmt: skip
    """(nodes, flags, meta): a Forest's arrays as the walk takes them (each numba argument
    costs its dispatch a type check: six, not twelve). ``nodes`` intp: the next indices
    of the internal nodes, their features, the roots; ``flags`` uint8 per internal node:
    bit 0 NaN is true, bit 1 ``x < t`` counts, bit 2 ``x == t`` counts; ``meta`` intp:
    trees, internal nodes, depth, ``op``, whether any NaN flag is set."""
    nodes = np.concatenate([nxt[: 2 * n_nodes], feat[:n_nodes], roots]).astype(np.intp)
    flags = np.zeros(max(n_nodes, 1), np.uint8)
    for bit, a in ((1, nanflag), (2, use_lt), (4, use_eq)):
        if a is not None:
            flags[:n_nodes] |= np.where(a[:n_nodes], bit, 0).astype(np.uint8)
    nan_any = nanflag is not None and bool(nanflag.any())
    meta = np.array([len(roots), n_nodes, depth, op, int(nan_any)], np.intp)
    return nodes, flags, meta


def _warm(fn: Any) -> None:
    nodes, flags, meta = pack(np.zeros(1, np.intp), np.zeros(1, np.intp), np.zeros(2, np.intp),
                              0, 0, 0, None, None, None)  # fmt: skip
    for dt in (np.float32, np.float64):
        fn(np.zeros((1, 1), dt), nodes, np.zeros(1, dt), flags, meta, np.empty((1, 1), np.intp))


_WALK = Jitted(_walk, _warm)


def walker() -> Any:
    """The compiled walk, or None (numba missing, ``$TFRT_PY_JIT=0``, or held back)."""
    return _WALK.get()
