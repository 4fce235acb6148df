"""Kernels (ml): tree ensembles -- TreeEnsembleClassifier, TreeEnsembleRegressor (opsets 1 and 3,
``nodes_*`` attributes and their ``*_as_tensor`` twins) and TreeEnsemble (opset 5).

Builders parse the attributes into a ``TreeSpec`` and compile it (``tree.Forest``) for
the comparison dtype: float64 for float64 input, float32 otherwise (onnxruntime's
threshold type); a forest for another dtype is compiled on first use. Scores follow
onnxruntime, including its binary-classifier rules (one weight class and two labels:
the second score column is derived from the first, labels by threshold 0.5 or 0).

Outputs: classifiers give (label int64 or string, scores float32 (N, n_classes));
TreeEnsembleRegressor gives float32 (N, n_targets); TreeEnsemble gives X's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry
from . import tree_jit
from .common import ML_DOMAIN, as_2d, attr_floats, attr_ints, attr_strings, post_transform, probit
from .common import logistic as _logistic
from .tree import LEQ, MEMBER, MODE_NAMES, Forest, TreeSpec

__all__ = [
    "aggregate_name",
    "binary_base_rule",
    "parse_spec_v3",
    "parse_spec_v5",
    "register_kernels",
]

_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


# -- attribute parsing --------------------------------------------------------------------


def _spec_v3(ctx: KernelContext, prefix: str, n_targets: int) -> TreeSpec:
    """TreeSpec from nodes_* and {prefix}_* attributes (TreeEnsemble{Classifier,Regressor})."""
    tids = attr_ints(ctx, "nodes_treeids")
    nids = attr_ints(ctx, "nodes_nodeids")
    feats = attr_ints(ctx, "nodes_featureids")
    modes_s = attr_strings(ctx, "nodes_modes")
    values = attr_floats(ctx, "nodes_values", np.float64)
    tnodes = attr_ints(ctx, "nodes_truenodeids")
    fnodes = attr_ints(ctx, "nodes_falsenodeids")
    if tids is None or nids is None or modes_s is None:
        raise ctx.unsupported("nodes_treeids, nodes_nodeids and nodes_modes are required")
    n = len(tids)
    feats = feats if feats is not None else np.zeros(n, np.int64)
    values = values if values is not None else np.zeros(n)
    tnodes = tnodes if tnodes is not None else np.zeros(n, np.int64)
    fnodes = fnodes if fnodes is not None else np.zeros(n, np.int64)
    if any(len(a) != n for a in (nids, feats, modes_s, values, tnodes, fnodes)):
        raise ctx.unsupported("the nodes_* attributes differ in length")
    missing = attr_ints(ctx, "nodes_missing_value_tracks_true")
    missing = (missing if missing is not None and len(missing) == n else np.zeros(n)) != 0
    try:
        codes = np.array([-1 if m == "LEAF" else MODE_NAMES[m] for m in modes_s], np.int64)
    except KeyError as e:
        raise ctx.unsupported(f"unknown node mode {e.args[0]!r}") from None
    if (codes == MEMBER).any():
        raise ctx.unsupported("BRANCH_MEMBER is only defined for TreeEnsemble")

    utids, tinv = np.unique(tids, return_inverse=True)
    stride = int(nids.max()) + 1 if n else 1
    key = tinv * stride + nids
    order = np.argsort(key, kind="stable")
    skey = key[order]
    if n and (np.diff(skey) == 0).any():
        raise ctx.unsupported("a (tree id, node id) pair appears twice")

    def find(tree_pos: np.ndarray, node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = tree_pos * stride + node_ids
        p = np.minimum(np.searchsorted(skey, k), max(n - 1, 0))
        ok = (node_ids >= 0) & (node_ids < stride) & (skey[p] == k) if n else k < 0
        return order[p] if n else p, ok

    is_leaf = codes < 0
    internal = np.flatnonzero(~is_leaf)
    ref = np.empty(n, np.int64)
    ref[internal] = np.arange(len(internal))
    leaf_pos = np.flatnonzero(is_leaf)
    ref[leaf_pos] = ~np.arange(len(leaf_pos))
    tpos, tok = find(tinv[internal], tnodes[internal])
    fpos, fok = find(tinv[internal], fnodes[internal])
    if not (tok.all() and fok.all()):
        raise ctx.unsupported("a node's true or false child does not exist")
    _, first = np.unique(tinv, return_index=True)
    roots = ref[np.sort(first)]

    w_tids, w_nids, w_ids, w_vals = _weight_attrs(ctx, prefix)
    tp = np.minimum(np.searchsorted(utids, w_tids), max(len(utids) - 1, 0))
    known = (utids[tp] == w_tids) if len(utids) else np.zeros(len(w_tids), bool)
    wpos, wok = find(tp, w_nids)
    keep = known & wok
    keep[keep] = is_leaf[wpos[keep]]  # weights on internal nodes are never reached
    return TreeSpec(
        feature=feats[internal],
        threshold=values[internal].astype(np.float64),
        mode=codes[internal],
        missing_true=missing[internal],
        true_ref=ref[tpos],
        false_ref=ref[fpos],
        roots=roots,
        n_leaves=len(leaf_pos),
        leaf_index=~ref[wpos[keep]],
        leaf_target=w_ids[keep],
        leaf_weight=w_vals[keep].astype(np.float64),
        n_targets=n_targets,
    )


def _weight_attrs(
    ctx: KernelContext, prefix: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The leaf weights' ({prefix}_treeids, _nodeids, _ids, _weights); all empty when one is
    missing."""
    w_tids = attr_ints(ctx, f"{prefix}_treeids")
    w_nids = attr_ints(ctx, f"{prefix}_nodeids")
    w_ids = attr_ints(ctx, f"{prefix}_ids")
    w_vals = attr_floats(ctx, f"{prefix}_weights", np.float64)
    if w_tids is None or w_nids is None or w_ids is None or w_vals is None:
        w_tids = w_nids = w_ids = np.zeros(0, np.int64)
        w_vals = np.zeros(0)
    if not len(w_tids) == len(w_nids) == len(w_ids) == len(w_vals):
        raise ctx.unsupported(f"the {prefix}_* attributes differ in length")
    return w_tids, w_nids, w_ids, w_vals


def _spec_v5(ctx: KernelContext) -> TreeSpec:
    """TreeSpec from TreeEnsemble (ai.onnx.ml 5) attributes."""
    feats = attr_ints(ctx, "nodes_featureids")
    splits = ctx.attr("nodes_splits")
    modes = ctx.attr("nodes_modes")
    tnodes = attr_ints(ctx, "nodes_truenodeids")
    fnodes = attr_ints(ctx, "nodes_falsenodeids")
    tleaf = attr_ints(ctx, "nodes_trueleafs")
    fleaf = attr_ints(ctx, "nodes_falseleafs")
    targets = attr_ints(ctx, "leaf_targetids")
    weights = np.asarray(ctx.attr("leaf_weights")).reshape(-1)
    roots = attr_ints(ctx, "tree_roots")
    if any(a is None for a in (feats, tnodes, fnodes, tleaf, fleaf, targets, roots)):
        raise ctx.unsupported("a required nodes_*/leaf_*/tree_roots attribute is missing")
    assert feats is not None and tnodes is not None and fnodes is not None
    assert tleaf is not None and fleaf is not None and targets is not None and roots is not None
    n = len(feats)
    splits = np.asarray(splits).reshape(-1)
    codes = np.asarray(modes, dtype=np.int64).reshape(-1)
    if any(len(a) != n for a in (splits, codes, tnodes, fnodes, tleaf, fleaf)):
        raise ctx.unsupported("the nodes_* attributes differ in length")
    if len(targets) != len(weights):
        raise ctx.unsupported("leaf_targetids and leaf_weights differ in length")
    if n and (codes.min() < LEQ or codes.max() > MEMBER):
        raise ctx.unsupported("nodes_modes values must be in 0..6")
    missing = attr_ints(ctx, "nodes_missing_value_tracks_true")
    missing = (missing if missing is not None and len(missing) == n else np.zeros(n)) != 0
    members: dict[int, np.ndarray] = {}
    member_nodes = np.flatnonzero(codes == MEMBER)
    if len(member_nodes):
        mv = ctx.attr("membership_values", None)
        if mv is None:
            raise ctx.unsupported("BRANCH_MEMBER nodes need membership_values")
        mv = np.asarray(mv, dtype=np.float64).reshape(-1)
        cuts = np.flatnonzero(np.isnan(mv))
        groups = np.split(mv, cuts)
        groups = [groups[0]] + [g[1:] for g in groups[1:]]
        if len(cuts) < len(member_nodes):
            raise ctx.unsupported("membership_values has fewer sets than member nodes")
        members = {int(node): groups[i] for i, node in enumerate(member_nodes)}
    true_ref = np.where(tleaf != 0, ~tnodes, tnodes)
    false_ref = np.where(fleaf != 0, ~fnodes, fnodes)
    n_leaves = len(weights)
    if ((tleaf != 0) & (tnodes >= n_leaves)).any() or ((fleaf != 0) & (fnodes >= n_leaves)).any():
        raise ctx.unsupported("a node refers to a leaf that does not exist")
    return TreeSpec(
        feature=feats,
        threshold=splits.astype(np.float64),
        mode=codes,
        missing_true=missing,
        true_ref=true_ref,
        false_ref=false_ref,
        roots=roots,
        n_leaves=n_leaves,
        leaf_index=np.arange(n_leaves, dtype=np.int64),
        leaf_target=targets,
        leaf_weight=weights.astype(np.float64),
        n_targets=int(ctx.attr("n_targets", 1)),
        members=members,
    )


class _Forests:
    """The compiled forest per comparison dtype (compiled on first use; thread-safe since
    a race only compiles the same forest twice)."""

    def __init__(self, ctx: KernelContext, spec: TreeSpec, cmp_dtype: Callable[[Any], Any]):
        self.spec = spec
        self.cmp_dtype = cmp_dtype
        self.by_dtype: dict[np.dtype, Forest] = {}
        self.walk = tree_jit.walker()  # asked once, at build (a cold start rebuilds)
        try:
            self.get(cmp_dtype(ctx.input_dtype(0) or _F32))
        except ValueError as e:
            raise ctx.unsupported(str(e)) from None

    def get(self, dt: np.dtype) -> Forest:
        f = self.by_dtype.get(dt)
        if f is None:
            f = Forest(self.spec, dt)
            f.use_walk(self.walk)
            self.by_dtype[dt] = f
        return f


def _cmp_dtype(dt: Any) -> np.dtype:
    return _F64 if np.dtype(dt) == _F64 else _F32


def _features(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    x2 = as_2d(np.asarray(x))
    if x2.dtype != dt:
        x2 = x2.astype(dt)
    return np.ascontiguousarray(x2)


def _aggregate_name(ctx: KernelContext, value: Any) -> str:
    if isinstance(value, int):
        if not 0 <= value < 4:
            raise ctx.unsupported(f"aggregate_function {value} is not one of 0..3")
        return _AGGREGATES[value]
    if value not in _AGGREGATES:
        raise ctx.unsupported(f"aggregate_function {value!r} is not supported")
    return str(value)


# -- regressors ---------------------------------------------------------------------------


def _tree_ensemble_regressor(ctx: KernelContext) -> ComputeFn:
    """TreeEnsembleRegressor: X (N, F) numeric -> Y float32 (N, n_targets).

    Y = aggregate(leaf weights) (+ base_values when it has n_targets entries), then
    post_transform."""
    n_targets = int(ctx.attr("n_targets", 1))
    spec = _spec_v3(ctx, "target", n_targets)
    how = _aggregate_name(ctx, ctx.attr("aggregate_function", "SUM"))
    _, transform = post_transform(ctx)
    base = attr_floats(ctx, "base_values", np.float64)
    forests = _Forests(ctx, spec, _cmp_dtype)
    return _regressor(forests, how, base, transform, _F32)


def _tree_ensemble(ctx: KernelContext) -> ComputeFn:
    """TreeEnsemble (ai.onnx.ml 5): X (N, F) float -> Y (N, n_targets) of X's dtype."""
    spec = _spec_v5(ctx)
    how = _aggregate_name(ctx, int(ctx.attr("aggregate_function", 1)))
    _, transform = post_transform(ctx, int(ctx.attr("post_transform", 0)))
    forests = _Forests(ctx, spec, _cmp_dtype)
    return _regressor(forests, how, None, transform, None)


def _regressor(
    forests: _Forests,
    how: str,
    base: np.ndarray | None,
    transform: Callable[[np.ndarray], np.ndarray],
    out_dtype: np.dtype | None,
) -> Callable[..., Any]:
    n_targets = forests.spec.n_targets
    use_base = base is not None and len(base) == n_targets
    bases = {dt: base.astype(dt) for dt in (_F32, _F64)} if use_base and base is not None else {}
    cmp_dtype = forests.cmp_dtype

    def tree_regressor(x: np.ndarray) -> np.ndarray:
        dt = cmp_dtype(x.dtype)
        forest = forests.get(dt)
        x2 = _features(x, dt)
        idx = forest.leaves(x2)
        y = forest.aggregate(idx, how)
        if use_base:
            y += bases[dt]
            if n_targets > 1 and not forest.always_has:
                # onnxruntime: a target no leaf voted for stays 0, base value or not
                y = np.where(forest.has_score(idx), y, 0).astype(dt, copy=False)
        y = transform(y)
        return y.astype(out_dtype or x.dtype, copy=False)

    return tree_regressor


# -- classifier ---------------------------------------------------------------------------


def _tree_ensemble_classifier(ctx: KernelContext) -> ComputeFn:
    """TreeEnsembleClassifier: X (N, F) numeric -> (label (N,) int64 or string,
    scores float32 (N, n_classes)), with onnxruntime's score and label rules."""
    ints = attr_ints(ctx, "classlabels_int64s")
    strs = attr_strings(ctx, "classlabels_strings")
    if strs:
        labels: np.ndarray = np.array(strs, dtype=object)
    elif ints is not None and len(ints):
        labels = ints
    else:
        raise ctx.unsupported("classlabels_int64s or classlabels_strings is required")
    n_classes = len(labels)
    spec = _spec_v3(ctx, "class", n_classes)
    tname, transform = post_transform(ctx)
    base = attr_floats(ctx, "base_values", np.float64)
    base = np.zeros(0) if base is None else base
    forests = _Forests(ctx, spec, _cmp_dtype)
    binary_case = n_classes == 2 and len(np.unique(spec.leaf_target)) == 1
    # ORT's non-binary-case 2-class fallback labels are the literal 1 / 0 (or their index
    # for string labels).
    raw_pos = labels[1] if strs or binary_case else np.int64(1)
    raw_neg = labels[0] if strs or binary_case else np.int64(0)
    if n_classes == 2:
        return _two_class_classifier(
            forests, labels, base, (raw_neg, raw_pos), binary_case, (tname, transform)
        )
    if n_classes > 2:
        finalize = _many_class_finalize(forests, labels, base, transform)
    else:
        finalize = _one_class_finalize(base, raw_pos if strs else 1, raw_neg if strs else 0)
    cmp_dtype = forests.cmp_dtype

    def tree_classifier(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dt = cmp_dtype(x.dtype)
        forest = forests.get(dt)
        x2 = _features(x, dt)
        idx = forest.leaves(x2)
        s = forest.aggregate(idx, "SUM")
        label, scores = finalize(s, forest, idx)
        return np.asarray(label, dtype=labels.dtype), scores.astype(np.float32, copy=False)

    return tree_classifier


_Finalize = Callable[[np.ndarray, Forest, np.ndarray], tuple[Any, np.ndarray]]


def _many_class_finalize(
    forests: _Forests, labels: np.ndarray, base: np.ndarray, transform: Callable[..., Any]
) -> _Finalize:
    """(label, scores) from the summed votes of more than two classes: base values added to
    the first classes; the label is the best class that got a vote or a base value."""
    n_classes = len(labels)
    k = min(len(base), n_classes)
    # Every class beyond the base values surely gets a vote: argmax needs no has-mask.
    some = next(iter(forests.by_dtype.values()))
    plain_argmax = some.has_static is not None and bool(some.has_static[k:].all())

    def finalize(s: np.ndarray, forest: Forest, idx: np.ndarray) -> tuple[Any, np.ndarray]:
        if k:
            s[:, :k] += base[:k].astype(s.dtype)
        if plain_argmax:
            pick = s.argmax(axis=1)
        else:
            has = forest.has_score(idx).copy()
            has[:, :k] = True
            pick = np.where(has, s, -np.inf).argmax(axis=1)
        return labels.take(pick), transform(s)

    return finalize


def _one_class_finalize(base: np.ndarray, pos_label: Any, neg_label: Any) -> _Finalize:
    """(label, scores) of one class: the last base value added, the label by the sign."""
    nb = len(base)

    def finalize(s: np.ndarray, forest: Forest, idx: np.ndarray) -> tuple[Any, np.ndarray]:
        s = s + (base[-1] if nb else 0)
        return np.where(s[:, 0] > 0, pos_label, neg_label), s

    return finalize


def binary_base_rule(select: Callable[[Any, Any, Any], Any]) -> Callable[..., tuple[Any, ...]]:
    """onnxruntime's base values on a two-class classifier's score columns, for NumPy columns
    (``select`` np.where) and compiled scalars alike: ``(s0, s1, h1, base, nb) -> (s0, s1,
    two)``, ``two`` true where both columns are scores (``h1``: class 1 got a vote)."""

    def add_binary_base(s0: Any, s1: Any, h1: Any, base: Any, nb: int) -> tuple[Any, ...]:
        two: Any = True
        if nb == 2:
            t1 = select(h1, base[1] + s0, s1 + base[1])
            s0 = select(h1, -t1, s0 + base[0])
            s1 = t1
        elif nb == 1:
            s0 = s0 + base[0]
            two = h1
        elif nb == 0:
            two = h1
        return s0, s1, two

    return add_binary_base


def _two_class_classifier(
    forests: _Forests,
    labels: np.ndarray,
    base: np.ndarray,
    raw_labels: tuple[Any, Any],
    binary_case: bool,
    post: tuple[str, Callable[..., Any]],
) -> ComputeFn:
    """TreeEnsembleClassifier with two classes: the positive score picks one of
    ``raw_labels`` (negative, positive); where class 1 got no vote, the second score column
    is derived from the first as onnxruntime does (``binary_case``: one weight class)."""
    raw_neg, raw_pos = raw_labels
    tname, transform = post
    add_binary_base = binary_base_rule(np.where)
    nb = len(base)
    all_positive = bool((forests.spec.leaf_weight >= 0).all())
    threshold = 0.5 if binary_case and all_positive else 0
    # onnxruntime's one-column cases: 0 (1 - s, s), 2 and 3 (-s, s), -1 (s, 0)
    if binary_case:
        mode = 0 if all_positive else 2
    else:
        mode = 3 if nb == 0 else -1
    cmp_dtype = forests.cmp_dtype

    def tree_classifier_two(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dt = cmp_dtype(x.dtype)
        forest = forests.get(dt)
        idx = forest.leaves(_features(x, dt))
        s = forest.aggregate(idx, "SUM")
        has = forest.has_score(idx)
        h0, h1 = has[:, 0], has[:, 1]
        s0, s1, two = add_binary_base(s[:, 0], s[:, 1], h1, base, nb)
        # onnxruntime writes 0 for a class no leaf voted for, base value or not
        s0 = np.where(h0, s0, 0).astype(s.dtype, copy=False)
        s1 = np.where(h1, s1, 0).astype(s.dtype, copy=False)
        label = np.where(np.where(h1, s1, s0) > threshold, raw_pos, raw_neg)
        scores = transform(np.stack([s0, s1], axis=1).astype(s.dtype, copy=False))
        if two is not True:
            if tname == "PROBIT":
                one = np.stack([probit(s0), np.zeros_like(s0)], axis=1)
            elif tname == "LOGISTIC" and mode >= 0:
                one = np.stack([_logistic(-s0), _logistic(s0)], axis=1)
            elif mode == 0:
                one = np.stack([1 - s0, s0], axis=1)
            elif mode in (2, 3):
                one = np.stack([-s0, s0], axis=1)
            else:
                one = np.stack([s0, np.zeros_like(s0)], axis=1)
            scores = np.where(two[:, None], scores, one)
        return np.asarray(label, dtype=labels.dtype), scores.astype(np.float32, copy=False)

    return tree_classifier_two


def register_kernels(registry: KernelRegistry) -> None:
    """Register TreeEnsembleClassifier, TreeEnsembleRegressor and TreeEnsemble (5+)."""
    registry.add("TreeEnsembleClassifier", _tree_ensemble_classifier, domain=ML_DOMAIN, since=1)
    registry.add("TreeEnsembleRegressor", _tree_ensemble_regressor, domain=ML_DOMAIN, since=1)
    registry.add("TreeEnsemble", _tree_ensemble, domain=ML_DOMAIN, since=5)


#: Attribute parsing, shared with the native tier's lowering (``tfrt_py.native.lower.ops_ml``),
#: so both read a model the same way.
parse_spec_v3 = _spec_v3
parse_spec_v5 = _spec_v5
aggregate_name = _aggregate_name
