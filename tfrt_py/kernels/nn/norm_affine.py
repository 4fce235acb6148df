"""An inference BatchNormalization that no conv before it could take, with the activation
after it, as one pass: ``y = act(x * a[c] + s[c])`` over an (N, C, *spatial) float32
tensor (``tfrt_py.fused::BatchNormAct``, from ``compiler/fuse_vision``).

Pre-activation networks normalize a conv's input, not its output: DenseNet's
``Concat -> BatchNormalization -> Relu -> Conv`` (58 of them in DenseNet-121, 4.4 ms of
BatchNormalization and 4.1 of Relu of a 69 ms call on one Zen 4 thread), where the
BatchNormalization took NumPy's multiply and add and the Relu its own pass: three passes
over tensors of up to 3 MB. Here each channel's run of pixels is scaled into the output
and finished there (``activations._act_row``: the shift, then the activation) while it is
in L1: 1x256x56x56 608 -> 93 µs, 1x1024x14x14 160 -> 20 (one Zen 4 thread, in cache).
The products and sums are NumPy's (a multiply, then an add: no fused multiply-add), so the
values are the unfused nodes' bits for ReLU, Clip and no activation. Without numba, or
for other dtypes, NumPy's three steps. Thread-safe; any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..lib.activations import Epilogue, _act_row, _jit_act, _params
from ..lib.jit import Jitted, frozen
from .conv_direct import _numpy_act, act_fns

__all__ = ["AFFINE_ACT", "batch_norm_act_fn"]


def _affine_act(  # pragma: no cover - numba only
    x: Any, a: Any, s: Any, y: Any, act: int, p: Any
) -> None:  # fmt: skip
    """``y[i, c, :] = act(x[i, c, :] * a[c] + s[c])`` over (N, C, P) C-contiguous arrays
    (``y`` may be ``x``)."""
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            ac = a[c]
            row = y[i, c]
            src = x[i, c]
            for k in range(x.shape[2]):
                row[k] = src[k] * ac
            _act_row(row, s[c], act, p)


def _warm(fn: Any) -> None:
    f = np.float32
    x = np.ones((1, 2, 3), f)
    fn(x, frozen(np.ones(2, f)), frozen(np.zeros(2, f)), np.zeros((1, 2, 3), f), 1,
       _params(Epilogue("Relu"), np.dtype(f)))  # fmt: skip


AFFINE_ACT = Jitted(_affine_act, _warm, helpers=(_act_row,))


def batch_norm_act_fn(
    a: np.ndarray, s: np.ndarray, epi: Epilogue
) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
    """``fn(x, out)``: ``epi``'s activation of ``x * a + s`` per channel (axis 1) of an
    (N, C, *spatial) float32 ``x``, into ``out`` (C-contiguous, may be ``x``) or a new
    array. ``a``, ``s``: (C,) float32, the folded BatchNormalization."""
    dt = np.dtype(np.float32)
    a1, s1 = frozen(np.ascontiguousarray(a, dt)), frozen(np.ascontiguousarray(s, dt))
    act, params = _jit_act(epi, dt), _params(epi, dt)
    kernel = AFFINE_ACT.get()
    fns = act_fns(epi)

    def batch_norm_act(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.ndim < 3 or x.shape[1] != a1.shape[0] or x.dtype != dt:
            raise ValueError(f"BatchNormAct: input {x.shape} {x.dtype}, {a1.shape[0]} channels")
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, dt)
        if kernel is not None and x.size:
            xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            n, c = x.shape[:2]
            kernel(xc.reshape(n, c, -1), a1, s1, y.reshape(n, c, -1), act, params)
        else:
            bshape = (1, -1, *(1,) * (x.ndim - 2))
            np.multiply(x, a1.reshape(bshape), out=y)
            y += s1.reshape(bshape)
            _numpy_act(y, epi, fns)
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    return batch_norm_act
