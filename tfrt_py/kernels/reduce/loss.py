"""Kernels (reduce): NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+).

Inputs: scores/log-probabilities ``x`` [N, C, d1, ...], integer targets [N, d1, ...], an
optional per-class ``weight`` [C]. ``loss[n, d] = -x[n, target[n, d], d] * weight[target]``
(weight 1 when omitted); positions whose target equals ``ignore_index`` get loss 0 and
weight 0. ``reduction``: "none" (loss of the target's shape), "sum", or "mean" (default:
sum of losses / sum of the applied weights). SoftmaxCrossEntropyLoss first takes
``log_prob = log_softmax(scores, axis=1)`` and may return it as a second output. Outputs
keep the input's float dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import attr_str
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _nll_fn(ctx: KernelContext) -> Any:
    """The shared NLL core ``nll(logp, target, weight) -> loss`` for this node."""
    reduction = attr_str(ctx, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.unsupported(f"reduction={reduction!r}")
    ii_attr = ctx.attr("ignore_index", None)
    ii = None if ii_attr is None else int(ii_attr)

    def nll(x: np.ndarray, t: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        dt = x.dtype
        mask = None
        if ii is not None:
            mask = t == ii
            if mask.any():
                t = np.where(mask, 0, t)
            else:
                mask = None
        t = t.astype(np.intp, copy=False)
        g = np.take_along_axis(x, np.expand_dims(t, 1), axis=1)
        loss = np.negative(g.reshape(t.shape))
        wt: np.ndarray | None = None
        if w is not None:
            wt = np.take(w, t).astype(dt, copy=False)
            if mask is not None:
                wt = np.where(mask, 0, wt).astype(dt, copy=False)
        elif mask is not None:
            wt = np.logical_not(mask).astype(dt)
        if wt is not None:
            loss *= wt
        if reduction == "none":
            return loss
        total = loss.sum(dtype=dt)
        if reduction == "sum":
            return np.asarray(total, dtype=dt)
        denom = wt.sum(dtype=dt) if wt is not None else loss.size
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(total / denom, dtype=dt)

    return nll


def _negative_log_likelihood_loss(ctx: KernelContext) -> ComputeFn:
    """NegativeLogLikelihoodLoss: ``fn(input, target, weight=None) -> loss``."""
    nll = _nll_fn(ctx)

    def nll_loss(x: np.ndarray, target: np.ndarray, weight: Any = None) -> np.ndarray:
        return nll(x, target, weight)

    return nll_loss


def _softmax_cross_entropy_loss(ctx: KernelContext) -> ComputeFn:
    """SoftmaxCrossEntropyLoss: ``fn(scores, labels, weights=None) -> loss`` or
    ``(loss, log_prob)`` when the node has two outputs."""
    nll = _nll_fn(ctx)
    n_out = ctx.n_outputs
    want_log_prob = ctx.has_output(1)

    def sce(x: np.ndarray, labels: np.ndarray, weights: Any = None) -> Any:
        y = x - np.maximum.reduce(x, axis=1, keepdims=True)
        s = np.add.reduce(np.exp(y), axis=1, keepdims=True)
        np.log(s, out=s)
        y -= s
        loss = nll(y, labels, weights)
        if n_out == 1:
            return loss
        return (loss, y if want_log_prob else None) + (None,) * (n_out - 2)

    return sce


def register_kernels(registry: KernelRegistry) -> None:
    """Register NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""
    registry.add("NegativeLogLikelihoodLoss", _negative_log_likelihood_loss, since=12)
    registry.add("SoftmaxCrossEntropyLoss", _softmax_cross_entropy_loss, since=12)
