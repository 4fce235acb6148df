"""numba kernels for tree ensembles: one compiled walk for any forest (trees are data).

A forest is packed (``pack_forest``) into flat arrays, every tree's nodes contiguous:

* ``feat`` (int32), ``thr`` (the comparison dtype), ``flags`` (int32) per internal node;
* ``kids`` (int32, 2 per internal node): ``kids[2 i]`` where the condition is false,
  ``kids[2 i + 1]`` where it is true; ``>= 0`` an internal node, ``~k`` leaf ``k``;
* ``roots`` (int32 per tree, the same encoding);
* leaf weights in CSR form: ``lptr`` (int32, leaves + 1), ``ltgt`` (int32), ``lval``
  (the comparison dtype), one entry per (leaf, target) with the weights summed.

``kind`` picks the comparison: 0 ``x <= t`` (BRANCH_LEQ everywhere), 1 ``x < t``
(BRANCH_LT everywhere), both with ``flags`` = 1 where NaN goes to the true branch; 2 any
mix, canonicalized as in ``kernels.ml.tree`` (GT/GTE/NEQ swap their children): ``flags``
bit 0 "true when x < t", bit 1 "true when x == t", bit 2 "true when x is NaN". The walk
is branch-light: the condition is an integer added to the child index. Scores accumulate
in the comparison dtype in tree order (onnxruntime's order for one thread).

``pack_forest`` checks everything the walk trusts (indices in range, no cycles, features
inside the row) at load, so the compiled walk never reads out of bounds or loops forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from ..kernels.ml.tree import EQ, GT, GTE, LEQ, LT, MEMBER, NEQ, TreeSpec
from .kern_post import logistic, post, probit

__all__ = [
    "AGG_CODES",
    "FOREST_ROW",
    "PackedForest",
    "forest_leq",
    "forest_lt",
    "forest_mixed",
    "pack_forest",
    "tree_cls_finish",
    "tree_reg_finish",
]

AGG_CODES = {"SUM": 0, "AVERAGE": 0, "MIN": 1, "MAX": 2}


@dataclass(frozen=True)
class PackedForest:
    """The arrays of a forest (see the module docstring) and its sizes."""

    nodes: np.ndarray  # 4 per node: feature | flags << 28, threshold bits, false, true kid
    roots: np.ndarray
    lptr: np.ndarray
    ltgt: np.ndarray
    lval: np.ndarray
    kind: int
    n_targets: int
    max_feature: int
    depth: np.ndarray  # int32 per tree: steps to its deepest leaf
    n_internal: int  # leaves are nodes n_internal + k


def _tree_depths(kids: np.ndarray, roots: np.ndarray, n: int) -> np.ndarray:
    """Per tree, the longest root-to-leaf path in edges (``kids`` over the combined index
    space, internal nodes ``< n``); ValueError when the trees contain a cycle."""
    depth = np.zeros(len(roots), np.int64)
    node, tree = roots.copy(), np.arange(len(roots))
    keep = node < n
    node, tree = node[keep], tree[keep]
    level = 0
    while len(node):
        level += 1
        if level > n:
            raise ValueError("the trees contain a cycle")
        depth[tree] = level
        node = np.concatenate([kids[2 * node], kids[2 * node + 1]])
        tree = np.concatenate([tree, tree])
        keep = node < n
        pairs = np.unique(np.stack([node[keep], tree[keep]]), axis=1)
        node, tree = pairs[0], pairs[1]
    return depth


def pack_forest(spec: TreeSpec, dtype: np.dtype) -> PackedForest:
    """The packed arrays of ``spec`` for comparisons in ``dtype`` (float32/float64).
    ValueError for BRANCH_MEMBER (not lowered), bad references or a cycle."""
    dtype = np.dtype(dtype)
    n = len(spec.feature)
    mode = np.asarray(spec.mode, np.int64)
    if (mode == MEMBER).any():
        raise ValueError("BRANCH_MEMBER nodes have no native form")
    n_leaves = int(spec.n_leaves)
    for name, ref in (("true", spec.true_ref), ("false", spec.false_ref), ("root", spec.roots)):
        r = np.asarray(ref, np.int64)
        if len(r) and (r.max() >= n or (~r[r < 0]).max(initial=-1) >= n_leaves):
            raise ValueError(f"a {name} reference points to a node or leaf that does not exist")
    if n and int(np.asarray(spec.feature).min()) < 0:
        raise ValueError("a negative feature id")
    missing = np.asarray(spec.missing_true, bool)
    modes = set(np.unique(mode).tolist())
    t_ref = np.asarray(spec.true_ref, np.int64)
    f_ref = np.asarray(spec.false_ref, np.int64)
    if modes <= {LEQ} or modes <= {LT}:
        kind = 0 if modes <= {LEQ} else 1
        flags = missing.astype(np.int32)
        true_k, false_k = t_ref, f_ref
    else:
        kind = 2
        swap = np.isin(mode, (GT, GTE, NEQ))
        true_k = np.where(swap, f_ref, t_ref)
        false_k = np.where(swap, t_ref, f_ref)
        nan_true = (missing | (mode == NEQ)) ^ swap
        use_lt = np.isin(mode, (LEQ, LT, GT, GTE))
        use_eq = np.isin(mode, (LEQ, EQ, GT, NEQ))
        flags = (use_lt * 1 + use_eq * 2 + nan_true * 4).astype(np.int32)
    total = n + n_leaves

    def combined(ref: np.ndarray) -> np.ndarray:
        ref = np.asarray(ref, np.int64)
        return np.where(ref >= 0, ref, n + ~ref)

    # Leaves are nodes too (index n + k), looping on themselves: feature 0, threshold NaN
    # (every comparison false), no flags; every lane of a group then steps alike.
    kids = np.repeat(np.arange(total, dtype=np.int64), 2)
    kids[0 : 2 * n : 2], kids[1 : 2 * n : 2] = combined(false_k), combined(true_k)
    roots = combined(np.asarray(spec.roots, np.int64))
    depth = _tree_depths(kids, roots, n)
    thr = np.full(total, np.nan, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        thr[:n] = np.asarray(spec.threshold, np.float64).astype(dtype)
    feat = np.zeros(total, np.int32)
    feat[:n] = np.asarray(spec.feature, np.int64)
    flags = np.concatenate([flags, np.zeros(n_leaves, np.int32)])
    # Leaf weights, summed per (leaf, target), in CSR order.
    c = int(spec.n_targets)
    leaf = np.asarray(spec.leaf_index, np.int64)
    tgt = np.asarray(spec.leaf_target, np.int64)
    w = np.asarray(spec.leaf_weight, np.float64)
    if len(tgt) and (tgt.min() < 0 or tgt.max() >= c):
        raise ValueError(f"a leaf targets class/target {int(tgt.max())} of {c}")
    if len(leaf) and (leaf.min() < 0 or leaf.max() >= n_leaves):
        raise ValueError("a weight belongs to a leaf that does not exist")
    if c == 1:
        # one target: onnxruntime counts a leaf without weight as weight 0
        bare = np.setdiff1d(np.arange(n_leaves), leaf)
        leaf = np.concatenate([leaf, bare])
        tgt = np.concatenate([tgt, np.zeros(len(bare), np.int64)])
        w = np.concatenate([w, np.zeros(len(bare))])
    key = leaf * max(c, 1) + tgt
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.zeros(len(uniq))
    np.add.at(sums, inv, w)
    u_leaf, u_tgt = uniq // max(c, 1), uniq % max(c, 1)
    lptr = np.searchsorted(u_leaf, np.arange(n_leaves + 1)).astype(np.int32)
    i32 = np.iinfo(np.int32)
    if max(2 * total, len(uniq)) >= i32.max:
        raise ValueError("the forest is too large for int32 indices")
    if n and int(np.asarray(spec.feature).max()) >= 1 << 28:
        raise ValueError("a feature id above 2**28")
    it = np.int32 if dtype == np.float32 else np.int64
    nodes = np.zeros((total, 4), it)
    nodes[:, 0] = feat.astype(np.int64) | (flags.astype(np.int64) << 28)
    nodes[:, 1] = thr.view(it)
    nodes[:, 2], nodes[:, 3] = kids[0::2], kids[1::2]
    return PackedForest(
        nodes=nodes.ravel(),
        roots=roots.astype(np.int32),
        lptr=lptr,
        ltgt=u_tgt.astype(np.int32),
        lval=sums.astype(dtype),
        kind=kind,
        n_targets=c,
        max_feature=int(np.max(spec.feature, initial=-1)),
        depth=depth.astype(np.int32),
        n_internal=n,
    )


@njit(nogil=True, cache=False)
def _leaf(k, lptr, ltgt, lval, acc, ao, has, ho, agg):
    for e in range(lptr[k], lptr[k + 1]):
        tg = ltgt[e]
        w = lval[e]
        if agg == 0:
            acc[ao + tg] += w
        elif agg == 1:
            if w < acc[ao + tg]:
                acc[ao + tg] = w
        elif w > acc[ao + tg]:
            acc[ao + tg] = w
        has[ho + tg] = True


@njit(nogil=True, cache=False, inline="always")
def _c_leq(v, t, f):
    return (v <= t) | ((v != v) & (f != 0))


@njit(nogil=True, cache=False, inline="always")
def _c_lt(v, t, f):
    return (v < t) | ((v != v) & (f != 0))


@njit(nogil=True, cache=False, inline="always")
def _c_mixed(v, t, f):
    return ((v < t) & ((f & 1) != 0)) | ((v == t) & ((f & 2) != 0)) | ((v != v) & ((f & 4) != 0))


@njit(nogil=True, cache=False, inline="always")
def _step(x, xo, nodes, thr, i, cond):
    b = 4 * i
    f = nodes[b]
    return nodes[b + 2 + cond(x[xo + (f & 0xFFFFFFF)], thr[b + 1], f >> 28)]


def _walker(cond: Any) -> Any:
    """The walk for one comparison: trees in groups of LANES, stepped together for the
    group's depth (leaves loop on themselves), so the lanes' dependent loads overlap."""

    @njit(nogil=True, cache=False)
    def walk(x, xo, nodes, thr, roots, depth, n, lptr, ltgt, lval, acc, ao, has, ho,
             agg):  # fmt: skip
        n_trees = roots.size
        t = 0
        while t + LANES <= n_trees:
            i0 = roots[t + 0]
            i1 = roots[t + 1]
            i2 = roots[t + 2]
            i3 = roots[t + 3]
            i4 = roots[t + 4]
            i5 = roots[t + 5]
            i6 = roots[t + 6]
            i7 = roots[t + 7]
            d = depth[t]
            for j in range(1, LANES):
                d = max(d, depth[t + j])
            for _ in range(d):
                i0 = _step(x, xo, nodes, thr, i0, cond)
                i1 = _step(x, xo, nodes, thr, i1, cond)
                i2 = _step(x, xo, nodes, thr, i2, cond)
                i3 = _step(x, xo, nodes, thr, i3, cond)
                i4 = _step(x, xo, nodes, thr, i4, cond)
                i5 = _step(x, xo, nodes, thr, i5, cond)
                i6 = _step(x, xo, nodes, thr, i6, cond)
                i7 = _step(x, xo, nodes, thr, i7, cond)
                if (
                    i0 >= n
                    and i1 >= n
                    and i2 >= n
                    and i3 >= n
                    and i4 >= n
                    and i5 >= n
                    and i6 >= n
                    and i7 >= n
                ):
                    break
            _leaf(i0 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i1 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i2 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i3 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i4 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i5 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i6 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            _leaf(i7 - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            t += LANES
        while t < n_trees:
            i = roots[t]
            for _ in range(depth[t]):
                i = _step(x, xo, nodes, thr, i, cond)
            _leaf(i - n, lptr, ltgt, lval, acc, ao, has, ho, agg)
            t += 1

    return walk


LANES = 8
_walk_leq = _walker(_c_leq)
_walk_lt = _walker(_c_lt)
_walk_mixed = _walker(_c_mixed)


def _row(walk: Any) -> Any:
    """The per-row kernel over one walker: init, walk every tree, MIN/MAX fix-up."""

    @njit(nogil=True, cache=False)
    def forest_row(x, xo, nodes, thr, roots, depth, n, lptr, ltgt, lval, acc, ao, has, ho, c,
                   agg):  # fmt: skip
        for j in range(c):
            acc[ao + j] = 0 if agg == 0 else (np.inf if agg == 1 else -np.inf)
            has[ho + j] = False
        walk(x, xo, nodes, thr, roots, depth, n, lptr, ltgt, lval, acc, ao, has, ho, agg)
        if agg != 0:
            for j in range(c):
                if np.isinf(acc[ao + j]):
                    acc[ao + j] = 0

    return forest_row


#: Walk every tree for the row ``x[xo:]``; ``acc[ao:ao + c]`` gets the per-target SUM
#: (``agg`` 0), MIN (1) or MAX (2) of the weights reached (0 for a target no weight reached
#: under MIN/MAX), ``has[ho:ho + c]`` whether any weight reached it. One per ``kind``, so
#: a module compiles only the walk its forest needs.
forest_leq = _row(_walk_leq)
forest_lt = _row(_walk_lt)
forest_mixed = _row(_walk_mixed)
FOREST_ROW = ("forest_leq", "forest_lt", "forest_mixed")


@njit(nogil=True, cache=False)
def tree_cls_finish(acc, ao, has, ho, c, base, base_t, labels, bin_labels, binary_case,
                    all_positive, code, lab, lo, y, yo):  # fmt: skip
    """TreeEnsembleClassifier's scores and label from the summed votes ``acc`` and the
    ``has`` flags, with onnxruntime's rules (``kernels.ml.tree_ops``): ``lab[lo]`` gets the
    class index (or the 1/0 of ORT's binary fallback), ``y[yo:]`` the scores."""
    nb = base.size
    if c > 2:
        k = min(nb, c)
        for j in range(k):
            acc[ao + j] += base_t[j]
        best = -1
        for j in range(c):
            if not (has[ho + j] or j < k):
                continue
            v = acc[ao + j]
            if best < 0:
                best = j
                continue
            b = acc[ao + best]
            if v > b or (v != v and b == b):
                best = j
        lab[lo] = labels[max(best, 0)]
        for j in range(c):
            y[yo + j] = acc[ao + j]
        post(y, yo, c, code)
        return
    if c == 1:
        s = float(acc[ao]) + (base[nb - 1] if nb else 0.0)
        lab[lo] = 1 if s > 0 else 0
        y[yo] = s
        return
    h0, h1 = has[ho], has[ho + 1]
    s0, s1 = float(acc[ao]), float(acc[ao + 1])
    two = True
    if nb == 2:
        t1 = base[1] + s0 if h1 else s1 + base[1]
        s0 = -t1 if h1 else s0 + base[0]
        s1 = t1
    elif nb == 1:
        s0 = s0 + base[0]
        two = h1
    elif nb == 0:
        two = h1
    s0 = s0 if h0 else 0.0
    s1 = s1 if h1 else 0.0
    y[yo] = s0
    y[yo + 1] = s1
    s0 = float(y[yo])  # rounded to the output dtype, as the NumPy kernel's
    pos = float(y[yo + 1]) if h1 else s0
    if binary_case:
        win = pos > 0.5 if all_positive else pos > 0
        mode = 0 if all_positive else 2
    else:
        win = pos > 0
        mode = 3 if nb == 0 else -1
    lab[lo] = (labels[1] if win else labels[0]) if bin_labels else (1 if win else 0)
    if two:
        post(y, yo, 2, code)
    elif code == 4:
        y[yo] = probit(s0)
        y[yo + 1] = 0
    elif code == 2 and mode >= 0:
        y[yo] = logistic(-s0)
        y[yo + 1] = logistic(s0)
    elif mode == 0:
        y[yo] = 1 - s0
        y[yo + 1] = s0
    elif mode == 2 or mode == 3:
        y[yo] = -s0
        y[yo + 1] = s0
    else:
        y[yo] = s0
        y[yo + 1] = 0


@njit(nogil=True, cache=False)
def tree_reg_finish(acc, ao, has, ho, c, n_trees, avg, base_t, use_base, code, y,
                    yo):  # fmt: skip
    """TreeEnsembleRegressor/TreeEnsemble: AVERAGE divides by the tree count; base values
    are added (a target no leaf voted for stays 0 when there are several); then the post
    transform, in ``y``'s dtype."""
    for j in range(c):
        v = acc[ao + j]
        if avg:
            v = v / n_trees
        if use_base:
            v = v + base_t[j]
            if c > 1 and not has[ho + j]:
                v = 0.0
        y[yo + j] = v
    post(y, yo, c, code)
