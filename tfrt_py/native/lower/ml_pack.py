"""The numba-free half of the classic-ML lowerings: the codes the generated code passes
to the compiled kernels (``kern_post``, ``kern_svm``, ``kern_trees``) and the packing of a
tree ensemble into the arrays the tree walk reads. Imported at load (by ``ops_ml``)
whether or not numba is installed; the kernels themselves are imported only by the
generated modules.
"""

from __future__ import annotations

import numpy as np

from ...kernels.ml.tree import EQ, GT, GTE, LEQ, LT, MEMBER, NEQ, TreeSpec
from ...records import record

__all__ = [
    "AGG_CODES",
    "FOREST_ROW",
    "FOREST_ROWS",
    "KERNEL_CODES",
    "POST_CODES",
    "PackedForest",
    "pack_forest",
]

#: Post transforms (``kern_post.post``), onnxruntime's definitions.
POST_CODES = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}
#: SVM kernels (``kern_svm``).
KERNEL_CODES = {"LINEAR": 0, "POLY": 1, "RBF": 2, "SIGMOID": 3}
#: Tree aggregates (``kern_trees``).
AGG_CODES = {"SUM": 0, "AVERAGE": 0, "MIN": 1, "MAX": 2}
#: The forest walk per comparison kind (``PackedForest.kind``).
FOREST_ROW = ("forest_leq", "forest_lt", "forest_mixed")
#: The many-row walk per comparison kind (trees outside, rows inside).
FOREST_ROWS = ("forest_rows_leq", "forest_rows_lt", "forest_rows_mixed")


@record(frozen=True)
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


def _comparisons(
    spec: TreeSpec, mode: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(kind, flags per internal node, true and false references) as the walk compares (see
    the module docstring of ``native.kernels.trees``)."""
    missing = np.asarray(spec.missing_true, bool)
    modes = set(np.unique(mode).tolist())
    t_ref = np.asarray(spec.true_ref, np.int64)
    f_ref = np.asarray(spec.false_ref, np.int64)
    if modes <= {LEQ} or modes <= {LT}:
        return (0 if modes <= {LEQ} else 1), missing.astype(np.int32), t_ref, f_ref
    swap = np.isin(mode, (GT, GTE, NEQ))
    nan_true = (missing | (mode == NEQ)) ^ swap
    use_lt = np.isin(mode, (LEQ, LT, GT, GTE))
    use_eq = np.isin(mode, (LEQ, EQ, GT, NEQ))
    flags = (use_lt * 1 + use_eq * 2 + nan_true * 4).astype(np.int32)
    return 2, flags, np.where(swap, f_ref, t_ref), np.where(swap, t_ref, f_ref)


def _leaf_weights(spec: TreeSpec, n_leaves: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leaf weights summed per (leaf, target), in CSR form: (lptr int32, targets, sums
    float64). ValueError for a target or leaf out of range."""
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
    return lptr, u_tgt, sums


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
    kind, flags, true_k, false_k = _comparisons(spec, mode)
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
    lptr, ltgt, sums = _leaf_weights(spec, n_leaves)
    i32 = np.iinfo(np.int32)
    if max(2 * total, len(sums)) >= i32.max:
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
        ltgt=ltgt.astype(np.int32),
        lval=sums.astype(dtype),
        kind=kind,
        n_targets=int(spec.n_targets),
        max_feature=int(np.max(spec.feature, initial=-1)),
        depth=depth.astype(np.int32),
        n_internal=n,
    )
