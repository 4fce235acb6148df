"""A compiled 2-D MaxPool on the depthwise kernel's polyphase grid (helper of ``pool``).

``plan_max_pool`` / ``run_max_pool``: per channel the input plane is copied into
``conv_direct``'s phase planes (filled with -inf, so padding never wins), and every kernel
tap is one contiguous ``max`` loop over the whole output grid; the crop writes the output.
NaN propagates as with ``np.maximum`` (a window holding NaN gives NaN). float32/float64,
no Indices output; None from ``plan_max_pool`` (numba missing, ``$TFRT_PY_JIT=0``, other
dtypes) keeps ``pool``'s NumPy fold (one strided ``np.maximum`` per tap).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..common import scratch
from ..jit import Jitted
from .conv_direct import depthwise_plan

__all__ = ["MaxPoolPlan", "plan_max_pool", "run_max_pool"]


def _max_pool2d(  # pragma: no cover - numba only
    x: Any, out: Any, tab: Any, ninf: Any, kh_: int, kw_: int, xp: Any, acc: Any
) -> None:
    """out[n, c] = max over the window; see ``conv_direct._depthwise2d`` for ``tab``."""
    n_, c_ = x.shape[0], x.shape[1]
    oh_, ow_ = out.shape[2], out.shape[3]
    q, sw, span, n_taps = tab[0], tab[1], tab[2], kh_ * kw_
    runs = tab[3 + n_taps :]
    n_runs = runs.shape[0] // 4
    for i in range(xp.shape[0]):
        xp[i] = ninf
    for n in range(n_):
        for c in range(c_):
            xc = x[n, c]
            # unsigned offsets and no view per run or output row (the plan's entries are
            # >= 0), as in ``conv_direct._depthwise2d``
            for j in range(n_runs):
                src = xc[runs[4 * j]]
                c0, cnt = np.uint64(runs[4 * j + 1]), np.uint64(runs[4 * j + 2])
                d0, su = np.uint64(runs[4 * j + 3]), np.uint64(sw)
                if sw == 1:
                    for i in range(cnt):
                        xp[d0 + i] = src[c0 + i]
                else:
                    for i in range(cnt):
                        xp[d0 + i] = src[c0 + i * su]
            first = xp[tab[3] :]
            for t in range(span):
                acc[t] = first[t]
            for k in range(1, n_taps):
                src = xp[tab[3 + k] :]
                for t in range(span):
                    a = acc[t]
                    v = src[t]
                    acc[t] = v if (v > a) | (v != v) else a  # no short circuit: vectorizes
            oc = out[n, c]
            for oh in range(oh_):
                ab = np.uint64(oh) * np.uint64(q)
                for i in range(ow_):
                    oc[oh, i] = acc[ab + np.uint64(i)]


def _warm(fn: Any) -> None:
    f = np.float32
    x, y = np.zeros((1, 1, 3, 3), f), np.zeros((1, 1, 2, 2), f)
    tab, n_xp, n_acc = depthwise_plan(x.shape, (1, 1, 2, 2), y.shape, (1, 1), (0, 0, 0, 0), (1, 1))
    fn(x, y, tab, f(-np.inf), 2, 2, np.zeros(n_xp, f), np.zeros(n_acc, f))


_MAX_POOL = Jitted(_max_pool2d, _warm)


class MaxPoolPlan(NamedTuple):
    """What ``run_max_pool`` needs for one input shape, made once."""

    fn: Any
    tab: np.ndarray
    xp_len: int
    acc_len: int
    kernel: tuple[int, int]
    out_shape: tuple[int, ...]


def plan_max_pool(
    x_shape: tuple[int, ...],
    kernel: tuple[int, ...],
    out_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads_begin: tuple[int, ...],
    dilations: tuple[int, ...],
    dtype: np.dtype,
) -> MaxPoolPlan | None:
    """The plan of a 2-D MaxPool for one input shape, or None (see the module doc)."""
    fn = _MAX_POOL.get()
    if fn is None or dtype not in (np.float32, np.float64) or len(x_shape) != 4:
        return None
    kh, kw = kernel[0], kernel[1]
    st = (strides[0], strides[1])
    pads = (pads_begin[0], pads_begin[1], 0, 0)
    dil = (dilations[0], dilations[1])
    tab, xp_len, acc_len = depthwise_plan(x_shape, (1, 1, kh, kw), out_shape, st, pads, dil)
    return MaxPoolPlan(fn, tab, xp_len, acc_len, (kh, kw), out_shape)


def run_max_pool(plan: MaxPoolPlan, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The pooled ``x`` (C-contiguous, the plan's dtype) into ``out`` (C-contiguous) or a
    new array."""
    dt = x.dtype
    y = np.empty(plan.out_shape, dt) if out is None else out
    xp = scratch(0, (plan.xp_len,), dt)
    acc = scratch(1, (plan.acc_len,), dt)
    plan.fn(x, y, plan.tab, dt.type(-np.inf), plan.kernel[0], plan.kernel[1], xp, acc)
    return y
