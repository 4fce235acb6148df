"""The kernel of ``DictLinear``, the fused op of ``compiler/fuse_dict.py``, in the private
domain ``tfrt_py.fused``: ``DictVectorizer -> [Normalizer L1 | L2] -> LinearClassifier |
LinearRegressor [-> Normalizer of the scores]`` as one node (attribute ``stages``, as
``TextVectorize``'s, and ``dtype``, the vectorizer's output dtype; the node's outputs are
the last stage's).

The fast path takes a map, or a list or tuple of maps, whose values are numbers: each
map's keys found in the vocabulary (a dict built at load; unknown keys are ignored, as
the DictVectorizer ignores them), their values rounded to the vectorizer's output dtype,
the row's norm over them, and the products with those columns' coefficients only
(float64 sums), then the model's own kernel built with identity coefficients
(``text.head_on_scores``: its intercepts, post transform and labels) on those scores.
Within float32 rounding of the unfused nodes; no ``[N, vocabulary]`` row is made. One
map under a SOFTMAX classifier with integer labels takes ``text.softmax_row``. Anything
else (another input, a value NumPy would not make a number, a coefficient that is not
finite) runs the stages' own kernels one after the other, with their errors.

Load-time state only (read-only after); any thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..base import ComputeFn, Cost, KernelContext
from ..registry import KernelRegistry
from .domain import DOMAIN
from .text import HEADS, Stage, head_coefficients, head_on_scores, softmax_row, stage_ctx

__all__ = ["register_kernels"]

_F64 = np.float64


class _DictScores:
    """The linear model's products over maps (see the module docstring): ``one(map)`` ->
    float64 ``(outputs,)``, ``many(maps)`` -> float32 ``(len(maps), outputs)``, both
    before the intercepts. Raises TypeError or ValueError for a value that is no number.
    ``one`` takes the values as float64 (within float32 rounding of the dense row's)."""

    def __init__(self, vocab: list[Any], dtype: np.dtype, coefs: np.ndarray, norm: str) -> None:
        self.get = {k: i for i, k in enumerate(vocab)}.get
        self.dtype, self.norm = dtype, norm
        self.w_t = np.ascontiguousarray(coefs.T, dtype=_F64)  # (vocabulary, outputs)
        self.outputs = coefs.shape[0]

    def _known(self, m: Mapping[Any, Any]) -> tuple[list[int], list[Any]]:
        found, vals = list(map(self.get, m)), list(m.values())
        if None in found:
            kept = [(j, v) for j, v in zip(found, vals) if j is not None]
            return [j for j, _ in kept], [v for _, v in kept]
        return found, vals  # type: ignore[return-value]  # (no None among them)

    def _normed(self, v: np.ndarray, row: np.ndarray | None, n: int) -> np.ndarray:
        if not self.norm:
            return v
        w = np.abs(v) if self.norm == "L1" else v * v
        d = np.bincount(row, w, minlength=n) if row is not None else np.array([w.sum()])
        if self.norm == "L2":
            d = np.sqrt(d)
        d[d == 0] = 1
        return v / (d[row] if row is not None else d[0])

    def one(self, m: Mapping[Any, Any]) -> np.ndarray:
        cols, vals = self._known(m)
        if not cols:
            return np.zeros(self.outputs, _F64)
        v = self._normed(np.array(vals, _F64), None, 1)
        y: np.ndarray = v @ self.w_t.take(cols, axis=0)
        return y

    def many(self, maps: Sequence[Mapping[Any, Any]]) -> np.ndarray:
        n = len(maps)
        got = [self._known(m) for m in maps]
        lens = np.fromiter((len(c) for c, _ in got), np.intp, n)
        out = np.zeros((n, self.outputs), np.float32)
        if not lens.sum():
            return out
        cols = np.fromiter((j for c, _ in got for j in c), np.intp, int(lens.sum()))
        vals = np.array([x for _, v in got for x in v], self.dtype).astype(_F64)
        row = np.repeat(np.arange(n, dtype=np.intp), lens)
        part = self.w_t[cols] * self._normed(vals, row, n)[:, None]
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        out[row[starts]] = np.add.reduceat(part, starts, axis=0)
        return out


def _maps(x: Any) -> list[Mapping[Any, Any]] | None:
    """The maps of an input the fast path takes, or None."""
    if isinstance(x, Mapping):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(m, Mapping) for m in x):
        return list(x)
    return None


def _dict_linear(registry: KernelRegistry) -> Callable[[KernelContext], ComputeFn]:
    def build(ctx: KernelContext) -> ComputeFn:
        stages: Sequence[Stage] = list(ctx.attr("stages"))
        ops = [s[0] for s in stages]
        if ops[0] != "DictVectorizer" or not any(op in HEADS for op in ops):
            raise ctx.unsupported("DictLinear fuses a DictVectorizer and a linear model")
        fns = [registry.lookup(s[1], s[0], s[2], s[3]).build(stage_ctx(ctx, s)) for s in stages]
        head_at = next(i for i, op in enumerate(ops) if op in HEADS)
        post = fns[head_at + 1] if head_at + 1 < len(ops) else None

        def stages_one_by_one(x: Any) -> Any:
            y = x
            for fn in fns[: head_at + 1]:
                y = fn(y)
            return y if post is None else (y[0], post(y[1]))

        front = dict(stages[0][4])
        vocab = list(front.get("string_vocabulary") or front.get("int64_vocabulary") or ())
        norm = str(dict(stages[1][4]).get("norm", "MAX")) if ops[1] == "Normalizer" else ""
        coefs = head_coefficients(ctx, stages[head_at], len(vocab)) if vocab else None
        if coefs is None or norm not in ("", "L1", "L2") or not np.isfinite(coefs).all():
            return stages_one_by_one
        dtype = np.dtype(str(ctx.attr("dtype", "float32")))
        if dtype.kind not in "fiu":
            return stages_one_by_one
        scores = _DictScores(vocab, dtype, coefs, norm)
        on_scores = head_on_scores(registry, ctx, stages[head_at], scores.outputs)
        post_stage = stages[head_at + 1] if post is not None else None
        quick = softmax_row(stages[head_at], post_stage, scores.outputs)

        def dict_linear(x: Any) -> Any:
            maps = _maps(x)
            if maps is None:
                return stages_one_by_one(x)
            try:
                if quick is not None and len(maps) == 1:
                    return quick.row(scores.one(maps[0]).tolist())
                y = on_scores(scores.many(maps))
            except (TypeError, ValueError, OverflowError):
                return stages_one_by_one(x)  # the stages' own error, or their answer
            return y if post is None else (y[0], post(y[1]))

        return dict_linear

    return build


def _cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    y = float(math.prod(outs[0])) if outs and outs[0] else 1.0
    return Cost(200.0 + 4.0 * y, 200.0 + 4.0 * y)


def register_kernels(registry: KernelRegistry) -> None:
    """Register ``DictLinear`` into ``registry`` (its stages are built from it)."""
    registry.add("DictLinear", _dict_linear(registry), domain=DOMAIN, cost=_cost)
