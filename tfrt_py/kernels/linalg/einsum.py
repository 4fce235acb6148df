"""Kernels (linalg): Einsum.

Two-operand equations (the common case: attention, bilinear forms, batched matmuls) are
compiled per operand shapes into transpose + reshape + one BLAS matmul (+ a transpose of
the result), which beats ``np.einsum(optimize=...)``'s per-call path handling by tens of
microseconds. Diagonals (a label repeated in one operand) and broadcast batch labels fall
back to ``np.einsum``. One operand runs on NumPy's C einsum; three or more use a
contraction path planned at load when shapes are static, else once per shapes.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ShapeMemo, compute_dtype
from ..registry import KernelRegistry

__all__ = ["parse_einsum", "register_kernels"]


def parse_einsum(eq: str, ranks: list[int]) -> tuple[list[str], str]:
    """Expand ``...`` into private labels and make the output explicit.

    Returns the input terms and output term as strings of single-character labels
    (ellipsis dims become characters above U+0100, right-aligned as NumPy broadcasts)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {eq!r} has {len(terms)} operands, got {len(ranks)}")
    n_ell = 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            n_ell = max(n_ell, r - len(t.replace("...", "")))
    ell = "".join(chr(0x100 + i) for i in range(n_ell))
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k :] if k else "")
        if len(t) != r:
            raise ValueError(f"term {t!r} of equation {eq!r} does not match rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in out_terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + "".join(sorted(ch for ch, c in counts.items() if c == 1 and ch not in ell))
    return out_terms, out


class _Plan2(NamedTuple):
    a_sum: tuple[int, ...]  # axes of A summed away first (labels only in A)
    b_sum: tuple[int, ...]
    a_perm: tuple[int, ...]
    b_perm: tuple[int, ...]
    a_shape: tuple[int, ...]  # A as (batch, M, K) or (M, K)
    b_shape: tuple[int, ...]
    r_shape: tuple[int, ...]  # result as (*batch, *a_keep, *b_keep)
    r_perm: tuple[int, ...] | None  # to the output order, None when already in it


def _plan2(ta: str, tb: str, out: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> _Plan2 | None:
    """The matmul plan of ``ta,tb->out``, or None when np.einsum must do it."""
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb) or len(set(out)) != len(out):
        return None
    if any(ch not in ta and ch not in tb for ch in out):
        return None
    a_sum = tuple(i for i, ch in enumerate(ta) if ch not in tb and ch not in out)
    b_sum = tuple(i for i, ch in enumerate(tb) if ch not in ta and ch not in out)
    ta2 = "".join(ch for ch in ta if ch in tb or ch in out)
    tb2 = "".join(ch for ch in tb if ch in ta or ch in out)
    da = {ch: sa[ta.index(ch)] for ch in ta2}
    db = {ch: sb[tb.index(ch)] for ch in tb2}
    if any(da[ch] != db[ch] for ch in ta2 if ch in db):
        return None  # a broadcast (size-1) label
    batch = [ch for ch in out if ch in ta2 and ch in tb2]
    contract = [ch for ch in ta2 if ch in tb2 and ch not in out]
    a_keep = [ch for ch in ta2 if ch not in tb2]
    b_keep = [ch for ch in tb2 if ch not in ta2]
    a_perm = tuple(ta2.index(ch) for ch in batch + a_keep + contract)
    b_perm = tuple(tb2.index(ch) for ch in batch + contract + b_keep)
    nb = math.prod(da[ch] for ch in batch)
    m = math.prod(da[ch] for ch in a_keep)
    k = math.prod(da[ch] for ch in contract)
    n = math.prod(db[ch] for ch in b_keep)
    a_shape: tuple[int, ...] = (nb, m, k) if batch else (m, k)
    b_shape: tuple[int, ...] = (nb, k, n) if batch else (k, n)
    r_labels = batch + a_keep + b_keep
    r_shape = tuple(da[ch] for ch in batch + a_keep) + tuple(db[ch] for ch in b_keep)
    r_perm = tuple(r_labels.index(ch) for ch in out)
    ident = r_perm == tuple(range(len(r_perm)))
    return _Plan2(
        a_sum, b_sum, a_perm, b_perm, a_shape, b_shape, r_shape, None if ident else r_perm
    )


def _run2(plan: _Plan2, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if plan.a_sum:
        a = a.sum(axis=plan.a_sum)
    if plan.b_sum:
        b = b.sum(axis=plan.b_sum)
    r = np.matmul(
        a.transpose(plan.a_perm).reshape(plan.a_shape),
        b.transpose(plan.b_perm).reshape(plan.b_shape),
    ).reshape(plan.r_shape)
    return r if plan.r_perm is None else r.transpose(plan.r_perm)


def _einsum(ctx: KernelContext) -> ComputeFn:
    """Einsum(Inputs...) -> the equation's result; ONNX implicit-output rules (ellipsis
    dims first, then labels used once, alphabetically). float16/bfloat16 compute in
    float32 and round back once."""
    eq = ctx.attr("equation")
    if isinstance(eq, (bytes, bytearray)):
        eq = eq.decode()
    eq = str(eq).replace(" ", "")
    n = ctx.n_inputs
    if len(eq.split("->")[0].split(",")) != n:
        raise ctx.unsupported(f"equation {eq!r} does not match {n} inputs")
    dt = ctx.input_dtype(0)
    wide = dt is not None and compute_dtype(np.dtype(dt)) != dt

    if n == 1:

        def einsum1(x: np.ndarray) -> np.ndarray:
            if wide or compute_dtype(x.dtype) != x.dtype:
                return np.asarray(np.einsum(eq, x.astype(np.float32))).astype(x.dtype)
            return np.asarray(np.einsum(eq, x))

        return einsum1

    if n == 2:
        plans: ShapeMemo[Any, _Plan2 | None] = ShapeMemo()

        def einsum2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            key = (a.shape, b.shape)
            try:
                plan = plans[key]
            except KeyError:
                (ta, tb), out = parse_einsum(eq, [a.ndim, b.ndim])
                plan = plans.put(key, _plan2(ta, tb, out, a.shape, b.shape))
            odt = a.dtype
            cast = wide or compute_dtype(odt) != odt
            if cast:
                a, b = a.astype(np.float32), b.astype(np.float32)
            if plan is None:
                r = np.asarray(np.einsum(eq, a, b, optimize=True))
            else:
                r = _run2(plan, a, b)
            return r.astype(odt) if cast else r

        return einsum2

    paths: ShapeMemo[Any, Any] = ShapeMemo()
    types = [ctx.input_type(i) for i in range(n)]
    if all(t is not None and t.is_static for t in types):
        shapes = [tuple(t.shape) for t in types]  # type: ignore[union-attr,arg-type]
        dummies = [np.empty(sh, np.float32) for sh in shapes]
        try:
            paths[tuple(shapes)] = np.einsum_path(eq, *dummies, optimize="greedy")[0]
        except ValueError as e:
            raise ctx.unsupported(f"equation {eq!r}: {e}") from e

    def einsum(*ops: np.ndarray) -> np.ndarray:
        key = tuple(o.shape for o in ops)
        path = paths.get(key)
        if path is None:
            path = paths.put(key, np.einsum_path(eq, *ops, optimize="greedy")[0])
        odt = ops[0].dtype
        if wide or compute_dtype(odt) != odt:
            ops = tuple(o.astype(np.float32) for o in ops)
            return np.asarray(np.einsum(eq, *ops, optimize=path)).astype(odt)
        return np.asarray(np.einsum(eq, *ops, optimize=path))

    return einsum


def register_kernels(registry: KernelRegistry) -> None:
    """Register Einsum."""
    registry.add("Einsum", _einsum, since=12)
