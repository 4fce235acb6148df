"""GroupNorm with a per-channel affine and an optional ReLU in one compiled pass over each
group (the ``tfrt_py.fused::GroupNorm`` that ``compiler/fuse_vision`` makes of torch's
opset-17 export: Reshape to (N, G, -1), InstanceNormalization with unit scale, Reshape back,
Mul, Add, Relu -- five passes and a copy; RetinaNet's and FCOS's heads have 40 of them).

``group_norm(x, gamma, beta, groups, eps, relu, out, fn)``: ``x`` (N, C, ...) float, ``gamma``
and ``beta`` (C,) of its dtype; each image's elements in ``groups`` equal flat blocks (as
the Reshape makes them: a block may end inside a channel), each normalized by its mean and
biased variance, then ``* gamma[c] + beta[c]`` per element's channel, then ReLU when
``relu``. float32 on the compiled kernel: the block's sums in float64 (``norm_jit``'s four
partial sums), ``x * (inv * gamma) + (beta - mean * inv * gamma)`` in float32, when ``fn``
(``group_norm_kernel()``, asked at load) is given; else NumPy (``norm_group.row_stats``).
ValueError when the shapes do not fit. Any thread (the compiled loop releases the GIL).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lib.jit import CONTRACT, Jitted
from ..lib.norm_jit import _f32_scale, _row_sums
from .norm_group import row_stats

__all__ = ["group_norm", "group_norm_kernel"]


def _group_norm_f32(
    x: Any, gamma: Any, beta: Any, hw: int, groups: int, eps: float, relu: bool, out: Any
) -> None:  # pragma: no cover - numba only
    size = x.shape[1] // groups
    inv_n = 1.0 / size
    zero = np.float32(0.0)
    for n in range(x.shape[0]):
        xi, oi = x[n], out[n]
        for g in range(groups):
            e = g * size
            end = e + size
            s, q = _row_sums(xi[e:end], size)
            m, inv = _f32_scale(s, q, inv_n, eps)
            while e < end:
                c = e // hw
                stop = min(end, (c + 1) * hw)
                sc = inv * gamma[c]
                sh = beta[c] - m * sc
                xs, ys = xi[e:stop], oi[e:stop]  # slices: indexed from e, it did not vectorize
                if relu:
                    for j in range(xs.shape[0]):
                        v = xs[j] * sc + sh
                        ys[j] = zero if v < zero else v  # NaN stays NaN
                else:
                    for j in range(xs.shape[0]):
                        ys[j] = xs[j] * sc + sh
                e = stop


def _warm(fn: Any) -> None:
    x = np.ones((1, 8), np.float32)
    fn(x, np.ones(2, np.float32), np.zeros(2, np.float32), 4, 2, 1e-5, True, np.empty_like(x))


_GROUP_NORM = Jitted(_group_norm_f32, _warm, helpers=(_row_sums, _f32_scale), fastmath=CONTRACT)


def group_norm_kernel() -> Any:
    """The compiled float32 loop (see the module doc), or None when NumPy must run."""
    return _GROUP_NORM.get()


def group_norm(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, groups: int, eps: float, relu: bool,
    out: np.ndarray | None = None, fn: Any = None,
) -> np.ndarray:  # fmt: skip
    """See the module doc. Returns ``out`` (a new array when None)."""
    if x.ndim < 2 or gamma.shape != (x.shape[1],) or beta.shape != gamma.shape:
        raise ValueError(f"GroupNorm: input {x.shape}, scale {gamma.shape}, bias {beta.shape}")
    n = x.shape[0]
    per_image = x.size // n if n else 0
    if groups < 1 or per_image % groups:
        raise ValueError(f"GroupNorm: {per_image} elements an image not in {groups} groups")
    y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, x.dtype)
    if fn is not None and x.dtype == np.float32 and per_image:
        xc = np.ascontiguousarray(x)
        fn(xc.reshape(n, -1), gamma.astype(np.float32, copy=False),
           beta.astype(np.float32, copy=False), per_image // x.shape[1], groups, eps, relu,
           y.reshape(n, -1))  # fmt: skip
    elif per_image:
        d, _, inv = row_stats(x.reshape(n * groups, -1), eps)
        d *= inv
        affine = (1, -1) + (1,) * (x.ndim - 2)
        z = d.reshape(x.shape) * gamma.reshape(affine) + beta.reshape(affine)
        np.copyto(y, np.maximum(z, 0, out=z) if relu else z, casting="unsafe")
    if out is not None and y is not out:
        out[...] = y
        return out
    return y
