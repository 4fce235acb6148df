"""Vectorized tree-ensemble evaluation shared by the ai.onnx.ml tree ops.

At load time a ``TreeSpec`` (internal nodes, leaves and roots in the op-neutral form the
builders parse the attributes into) is compiled into a ``Forest``: flat arrays indexed by
one combined node index (internal nodes first, then leaves) holding the feature id, the
threshold, and the next index for "condition false" / "condition true" at ``2 i`` /
``2 i + 1``. Leaves point to themselves, so every (row, tree) pair walks exactly
``depth`` steps and all of them are evaluated at once with a handful of ``take`` calls
per step, never a Python loop over rows or nodes; where numba is on, the kernel builder
gives the forest ``tree_jit``'s compiled walk instead (``Forest.use_walk``), which takes
each pair to its leaf in one loop.

Comparison semantics follow onnxruntime: thresholds are converted to the comparison dtype
(float32 unless the input is float64) and a NaN feature goes to the true branch when the
node's missing-value track is true (or the mode is BRANCH_NEQ, where NaN != t holds).
Mixed modes are canonicalized to LEQ/LT/EQ by swapping children (GT = not LEQ, ...).
Set membership (TreeEnsemble 5, BRANCH_MEMBER) is a sorted lookup of complex keys
``node + 1j * value``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

import numpy as np

from ...records import record
from .tree_jit import MIXED, pack

__all__ = ["EQ", "GT", "GTE", "LEQ", "LT", "MEMBER", "NEQ", "Forest", "TreeSpec"]

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)
MODE_NAMES = {
    "BRANCH_LEQ": LEQ,
    "BRANCH_LT": LT,
    "BRANCH_GTE": GTE,
    "BRANCH_GT": GT,
    "BRANCH_EQ": EQ,
    "BRANCH_NEQ": NEQ,
    "BRANCH_MEMBER": MEMBER,
}
_SAME_MODE_OPS = {
    LEQ: np.less_equal,
    LT: np.less,
    GTE: np.greater_equal,
    GT: np.greater,
    EQ: np.equal,
    NEQ: np.not_equal,
}
# Rows x trees x targets elements gathered at once before the work is split by rows.
_CHUNK = 1 << 21
# Rows x trees walked at once: small enough for the working set to stay in cache.
_WALK_BLOCK = 1 << 15


@record
class TreeSpec:
    """Trees in neutral form. References: ``j >= 0`` is internal node j, ``~k`` leaf k."""

    feature: np.ndarray  # int64 (n_nodes,)
    threshold: np.ndarray  # float (n_nodes,)
    mode: np.ndarray  # int (n_nodes,) codes LEQ..MEMBER
    missing_true: np.ndarray  # bool (n_nodes,)
    true_ref: np.ndarray  # int64 (n_nodes,)
    false_ref: np.ndarray  # int64 (n_nodes,)
    roots: np.ndarray  # int64 refs (n_trees,)
    n_leaves: int
    leaf_index: np.ndarray  # int64 (n_entries,): the leaf of each weight entry
    leaf_target: np.ndarray  # int64 (n_entries,)
    leaf_weight: np.ndarray  # float (n_entries,)
    n_targets: int
    members: dict[int, np.ndarray] = field(default_factory=dict)


class Forest:
    """A compiled ensemble: ``leaves(X)`` gives the leaf reached in every tree,
    ``aggregate`` the per-target SUM/AVERAGE/MIN/MAX of their weights and ``has_score``
    whether a row reached any weight for a target."""

    def __init__(self, spec: TreeSpec, dtype: np.dtype) -> None:
        self.dtype = dtype = np.dtype(dtype)
        n_nodes = len(spec.feature)
        n_total = n_nodes + spec.n_leaves
        self.n_nodes = n_nodes
        self.n_trees = len(spec.roots)
        self.n_targets = spec.n_targets

        def combined(ref: np.ndarray) -> np.ndarray:
            ref = np.asarray(ref, dtype=np.int64)
            return np.where(ref >= 0, ref, n_nodes + ~ref)

        true_next = combined(spec.true_ref)
        false_next = combined(spec.false_ref)
        if n_nodes and (true_next.max() >= n_total or false_next.max() >= n_total):
            raise ValueError("a node refers to a node or leaf that does not exist")
        self.roots = combined(spec.roots).astype(np.intp)
        self.depth = _depth(true_next, false_next, self.roots, n_nodes)
        mode = np.asarray(spec.mode, dtype=np.int64)
        modes = set(np.unique(mode).tolist())
        missing = np.asarray(spec.missing_true, dtype=bool)

        feat = np.zeros(n_total, dtype=np.intp)
        feat[:n_nodes] = spec.feature
        self.max_feature = int(feat.max()) if n_total else -1
        thr = np.zeros(n_total, dtype=dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            thr[:n_nodes] = spec.threshold
        nxt = np.repeat(np.arange(n_total, dtype=np.intp), 2)  # leaves loop on themselves
        nanflag = np.zeros(n_total, dtype=bool)
        self.same_op = None
        #: the compiled walk and its arrays (``use_walk``), or None: NumPy's walk
        self._compiled: tuple[Any, tuple[Any, ...]] | None = None
        self.op_code = MIXED
        if len(modes) == 1 and MEMBER not in modes:
            self.op_code = modes.pop()
            self.same_op = _SAME_MODE_OPS[self.op_code]
            nxt[0 : 2 * n_nodes : 2] = false_next
            nxt[1 : 2 * n_nodes : 2] = true_next
            nanflag[:n_nodes] = missing
            self.use_lt = self.use_eq = None
        else:
            swap = np.isin(mode, (GT, GTE, NEQ))
            nxt[0 : 2 * n_nodes : 2] = np.where(swap, true_next, false_next)
            nxt[1 : 2 * n_nodes : 2] = np.where(swap, false_next, true_next)
            nan_true = missing | (mode == NEQ)
            nanflag[:n_nodes] = nan_true ^ swap
            use_lt = np.zeros(n_total, dtype=bool)
            use_eq = np.zeros(n_total, dtype=bool)
            use_lt[:n_nodes] = np.isin(mode, (LEQ, LT, GT, GTE))
            use_eq[:n_nodes] = np.isin(mode, (LEQ, EQ, GT, NEQ))
            self.use_lt, self.use_eq = use_lt, use_eq
        self.feat, self.thr, self.nxt = feat, thr, nxt
        self.nanflag = nanflag if nanflag.any() else None
        self.member_keys = _member_keys(spec.members, dtype) if spec.members else None
        self._compile_weights(spec, n_total)

    def use_walk(self, walk: Any) -> None:
        """Walk with ``walk`` (``tree_jit.walker()``; the kernel builder's, at load), its
        arrays packed now. Set membership keeps NumPy's walk."""
        if walk is None or self.member_keys is not None:
            return
        nodes, flags, meta = pack(self.roots, self.feat, self.nxt, self.n_nodes, self.depth,
                                  self.op_code, self.nanflag, self.use_lt, self.use_eq)  # fmt: skip
        self._compiled = (walk, (nodes, self.thr, flags, meta))

    # -- leaves ---------------------------------------------------------------------------
    def leaves(self, X: np.ndarray) -> np.ndarray:
        """(N, n_trees) combined indices of the leaves reached; X is (N, F) of ``dtype``."""
        n, f = X.shape
        if f <= self.max_feature:
            raise ValueError(f"input has {f} features, the trees use feature {self.max_feature}")
        t = self.n_trees
        compiled = self._compiled
        if compiled is not None and X.dtype == self.dtype and X.flags.c_contiguous:
            out = np.empty((n, t), dtype=np.intp)
            compiled[0](X, *compiled[1], out)
            return out
        step = max(1, _WALK_BLOCK // max(t, 1))
        if n <= step:
            return self._walk(X).reshape(n, t)
        out = np.empty((n, t), dtype=np.intp)
        for s in range(0, n, step):
            out[s : s + step] = self._walk(X[s : s + step]).reshape(-1, t)
        return out

    def _walk(self, X: np.ndarray) -> np.ndarray:
        n, f = X.shape
        t = self.n_trees
        idx = self.roots.copy() if n == 1 else np.tile(self.roots, n)
        flat = X.reshape(-1)
        off = None if n == 1 else np.repeat(np.arange(0, n * f, f, dtype=np.intp), t)
        feat, thr, nxt = self.feat, self.thr, self.nxt
        same_op, nanflag, members = self.same_op, self.nanflag, self.member_keys
        pos = np.empty_like(idx)
        x = np.empty(len(idx), dtype=flat.dtype)
        th = np.empty(len(idx), dtype=thr.dtype)
        cond = np.empty(len(idx), dtype=bool)
        for _ in range(self.depth):
            feat.take(idx, out=pos, mode="clip")
            if off is not None:
                pos += off
            flat.take(pos, out=x, mode="clip")
            thr.take(idx, out=th, mode="clip")
            if same_op is not None:
                same_op(x, th, out=cond)
            else:
                cond = (np.less(x, th) & self.use_lt.take(idx)) | (  # type: ignore[union-attr]
                    np.equal(x, th) & self.use_eq.take(idx)  # type: ignore[union-attr]
                )
                if members is not None:
                    q = idx + 1j * x
                    p = np.searchsorted(members, q)
                    np.minimum(p, len(members) - 1, out=p)
                    cond |= members.take(p) == q
            if nanflag is not None:
                cond |= np.isnan(x) & nanflag.take(idx)
            idx += idx
            idx += cond
            nxt.take(idx, out=idx, mode="clip")
        return idx

    # -- weights --------------------------------------------------------------------------
    def _compile_weights(self, spec: TreeSpec, n_total: int) -> None:
        c = self.n_targets
        leaf = np.asarray(spec.leaf_index, dtype=np.int64) + self.n_nodes
        tgt = np.asarray(spec.leaf_target, dtype=np.int64)
        w = np.asarray(spec.leaf_weight, dtype=np.float64)
        if len(tgt) and (tgt.min() < 0 or tgt.max() >= c):
            raise ValueError(f"a leaf targets class/target {int(tgt.max())} of {c}")
        dense = np.zeros((n_total, c), dtype=np.float64)
        np.add.at(dense, (leaf, tgt), w)
        has = np.zeros((n_total, c), dtype=bool)
        has[leaf, tgt] = True
        bare = None
        if c == 1:
            # one target: onnxruntime counts a leaf without weight as weight 0
            bare = ~has[:, 0] & (np.arange(n_total) >= self.n_nodes)
            has[bare, 0] = True
        self.has = has
        dt = self.dtype
        self._entries = (leaf, tgt, w, bare, n_total)
        self._tables: dict[str, np.ndarray] = {}
        # Single weight per leaf and one target per tree (GBM multiclass, regressors):
        # SUM is a gather of one value per (row, tree) and a small matmul.
        self.single: np.ndarray | None = None
        self.tree_onehot: np.ndarray | None = None
        counts = has.sum(axis=1)
        owner, shared = _owners(self)
        is_leaf = np.arange(n_total) >= self.n_nodes
        leaf_owned = is_leaf & (owner >= 0)
        if c == 1:
            self.single = dense[:, 0].astype(dt)
        else:
            self._tables["SUM"] = dense.astype(dt)
        if c > 1 and counts.max(initial=0) <= 1 and not shared:
            target_of = np.where(counts > 0, has.argmax(axis=1), -1)
            sel = leaf_owned & (target_of >= 0)
            pairs = np.unique(np.stack([owner[sel], target_of[sel]], axis=1), axis=0)
            if len(pairs) == 0 or len(np.unique(pairs[:, 0])) == len(pairs):
                onehot = np.zeros((self.n_trees, c), dtype=dt)
                onehot[pairs[:, 0], pairs[:, 1]] = 1
                self.single = dense.sum(axis=1).astype(dt)
                self.tree_onehot = onehot
        # Per target: does every row certainly / never get a weight (for has_score logic)?
        lacking = np.zeros((self.n_trees, c), dtype=np.int64)
        np.add.at(lacking, owner[leaf_owned], ~has[leaf_owned])
        always = (lacking == 0).any(axis=0) if not shared else np.zeros(c, dtype=bool)
        never = ~has.any(axis=0)
        self.has_static: np.ndarray | None = always if not (~always & ~never).any() else None
        self.always_has = bool(always.all())

    def _table(self, how: str) -> np.ndarray:
        """The (n_total, n_targets) MIN or MAX table: ±inf where a leaf has no weight."""
        t = self._tables.get(how)
        if t is None:
            leaf, tgt, w, bare, n_total = self._entries
            lo = how == "MIN"
            t = np.full((n_total, self.n_targets), np.inf if lo else -np.inf)
            (np.minimum if lo else np.maximum).at(t, (leaf, tgt), w)
            if bare is not None:
                t[bare, 0] = 0
            t = self._tables[how] = t.astype(self.dtype)
        return t

    def aggregate(self, idx: np.ndarray, how: str) -> np.ndarray:
        """(N, n_targets) SUM / AVERAGE / MIN / MAX of the leaf weights in ``dtype``.

        MIN/MAX give 0 where a row reached no weight for a target (onnxruntime's rule)."""
        if how == "SUM" or how == "AVERAGE":
            if self.single is None:
                out = self._dense_reduce(idx, self._tables["SUM"], np.add.reduce)
            elif self.tree_onehot is not None:
                out = self.single.take(idx) @ self.tree_onehot
            else:
                out = np.add.reduce(self.single.take(idx), axis=1, keepdims=True)
            if how == "AVERAGE":
                out /= self.n_trees
            return out
        table = self._table(how)
        red = np.minimum.reduce if how == "MIN" else np.maximum.reduce
        out = self._dense_reduce(idx, table, red)
        out[np.isinf(out)] = 0
        return out

    def _dense_reduce(self, idx: np.ndarray, table: np.ndarray, red: Any) -> np.ndarray:
        n, t = idx.shape
        c = self.n_targets
        if n * t * c <= _CHUNK:
            return red(table.take(idx, axis=0), axis=1)
        out = np.empty((n, c), dtype=table.dtype)
        step = max(1, _CHUNK // max(1, t * c))
        for s in range(0, n, step):
            out[s : s + step] = red(table.take(idx[s : s + step], axis=0), axis=1)
        return out

    def has_score(self, idx: np.ndarray) -> np.ndarray:
        """(N, n_targets) bool: did the row reach at least one weight for the target."""
        if self.has_static is not None:
            return np.broadcast_to(self.has_static, (idx.shape[0], self.n_targets))
        return np.asarray(self.has.take(idx, axis=0).any(axis=1))


def _depth(true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray, n_nodes: int) -> int:
    """Longest root-to-leaf path in edges; a cycle among internal nodes is an error."""
    depth = 0
    frontier = np.unique(roots[roots < n_nodes])
    while len(frontier):
        depth += 1
        if depth > n_nodes:
            raise ValueError("the trees contain a cycle")
        nxt = np.concatenate([true_next[frontier], false_next[frontier]])
        frontier = np.unique(nxt[nxt < n_nodes])
    return depth


def _member_keys(members: dict[int, np.ndarray], dtype: np.dtype) -> np.ndarray:
    keys = [
        node + 1j * np.asarray(vals, dtype=dtype).astype(np.float64)
        for node, vals in members.items()
    ]
    return np.sort(np.concatenate(keys)) if keys else np.zeros(0, np.complex128)


def _owners(forest: Forest) -> tuple[np.ndarray, bool]:
    """The tree owning each combined index (-1 if unreachable), and whether any node or
    leaf is reachable from two trees."""
    n_nodes = forest.n_nodes
    owner = np.full(len(forest.feat), -1, dtype=np.int64)
    owner[forest.roots] = np.arange(forest.n_trees)
    shared = len(np.unique(forest.roots)) != forest.n_trees
    frontier = np.unique(forest.roots[forest.roots < n_nodes])
    while len(frontier):
        kids = np.concatenate([forest.nxt[2 * frontier], forest.nxt[2 * frontier + 1]])
        parents = np.concatenate([owner[frontier], owner[frontier]])
        prev = owner[kids]
        shared = shared or bool(((prev >= 0) & (prev != parents)).any())
        owner[kids] = parents
        shared = shared or bool((owner[kids] != parents).any())
        frontier = np.unique(kids[(kids < n_nodes) & (prev < 0)])
    return owner, shared
