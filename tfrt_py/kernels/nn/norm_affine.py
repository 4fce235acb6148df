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
for other dtypes, NumPy's three steps. A tensor of ``SPLIT_MIN_ELEMENTS`` or more is cut
into blocks of channels on the native threads (DenseNet-121's 62 at two threads, Zen 4:
4.07 ms on one thread before). Thread-safe; any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib.activations import Epilogue, _act_row, _jit_act, _params
from ..lib.jit import Jitted, frozen, inline
from .conv_direct import _numpy_act, act_fns

__all__ = ["AFFINE_ACT", "AFFINE_ACT_PAR", "SPLIT_MIN_ELEMENTS", "batch_norm_act_fn"]


@inline
def _affine_rows(  # pragma: no cover - numba only
    x: Any, a: Any, s: Any, y: Any, act: int, p: Any, r0: int, r1: int
) -> None:  # fmt: skip
    """``y[i, c, :] = act(x[i, c, :] * a[c] + s[c])`` for the (image, channel) rows
    ``r0 <= i*C + c < r1`` of (N, C, P) C-contiguous arrays (``y`` may be ``x``)."""
    ch = x.shape[1]
    for r in range(r0, r1):
        i, c = r // ch, r % ch
        ac = a[c]
        row = y[i, c]
        src = x[i, c]
        for k in range(x.shape[2]):
            row[k] = src[k] * ac
        _act_row(row, s[c], act, p)


def _affine_act(  # pragma: no cover - numba only
    x: Any, a: Any, s: Any, y: Any, act: int, p: Any
) -> None:  # fmt: skip
    """Every row of ``_affine_rows``, on the caller."""
    _affine_rows(x, a, s, y, act, p, 0, x.shape[0] * x.shape[1])


def _affine_act_par(  # pragma: no cover - numba only
    x: Any, a: Any, s: Any, y: Any, act: int, p: Any, edges: Any
) -> None:  # fmt: skip
    """``_affine_rows`` over the blocks of rows between consecutive ``edges``, in a
    ``prange`` loop on native threads (``concurrency.native_threads``)."""
    for b in numba.prange(edges.shape[0] - 1):
        _affine_rows(x, a, s, y, act, p, edges[b], edges[b + 1])


def _warm(fn: Any) -> None:
    f = np.float32
    x = np.ones((1, 2, 3), f)
    fn(x, frozen(np.ones(2, f)), frozen(np.zeros(2, f)), np.zeros((1, 2, 3), f), 1,
       _params(Epilogue("Relu"), np.dtype(f)))  # fmt: skip


def _warm_par(fn: Any) -> None:
    f = np.float32
    x = np.ones((1, 2, 3), f)
    fn(x, frozen(np.ones(2, f)), frozen(np.zeros(2, f)), np.zeros((1, 2, 3), f), 1,
       _params(Epilogue("Relu"), np.dtype(f)), np.array([0, 1, 2], np.int64))  # fmt: skip


AFFINE_ACT = Jitted(_affine_act, _warm, helpers=(_act_row, _affine_rows))
AFFINE_ACT_PAR = Jitted(_affine_act_par, _warm_par, helpers=(_act_row, _affine_rows),
                        parallel=True)  # fmt: skip
#: A tensor of at least this many elements is split by channels over the intra-op
#: threads (``norm_channel``'s bound).
SPLIT_MIN_ELEMENTS = 1 << 16
#: numba, set by ``Jitted(parallel=True)`` before the parallel loop above compiles.
numba: Any = None


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
    # compiled here, at load, where calls may split (not in the first split call)
    par = AFFINE_ACT_PAR.get() if kernel is not None and intra_pool().threads > 1 else None
    fns = act_fns(epi)

    def batch_norm_act(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.ndim < 3 or x.shape[1] != a1.shape[0] or x.dtype != dt:
            raise ValueError(f"BatchNormAct: input {x.shape} {x.dtype}, {a1.shape[0]} channels")
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, dt)
        if kernel is not None and x.size:
            xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            n, c = x.shape[:2]
            x3, y3 = xc.reshape(n, c, -1), y.reshape(n, c, -1)
            threads = intra_pool().threads
            if par is not None and threads > 1 and x.size >= SPLIT_MIN_ELEMENTS and n * c >= 4:
                parts = min(2 * native_threads.enter(threads), n * c)  # blocks of channels
                par(x3, a1, s1, y3, act, params, native_threads.edges(n * c, parts))
            else:
                kernel(x3, a1, s1, y3, act, params)
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
