"""A Linear's product in row blocks on native threads with its bias and activation done
inside each block, by the thread that computed it, while the block is in cache.

``gemm.matmul_into`` splits a big product into row blocks on native threads; before,
the Linear's epilogue (a bias add and an activation: NumPy calls and compiled loops)
then ran over the whole output on the caller alone: ViT-Tiny's MLP (197x192 @ 192x768
+ GELU, twelve of them) waited for one thread's GELU over 151k elements after a split
product, MobileViT's (1024x64 @ 64x128 + SiLU) likewise. Here a ``Fused`` spec -- the
bias as one value per column and one activation ``conv_direct`` compiles (Relu, Clip,
HardSwish, HardSigmoid, Sigmoid, SiLU, LeakyRelu, GELU's erf form) -- runs per block in
the same ``prange`` iteration as the block's gemm (NumPy's BLAS on the block's rows:
leading dimensions, no copies).

The activations are ``conv_direct._act_row``'s: Sigmoid/SiLU use MLAS's rational
logistic and GELU ``erf.erf_f32``'s rational erf (float32 only: float64 keeps the
NumPy steps), so results agree with the step kernels to float32 rounding, not bit for
bit. numba only (``fused_for`` returns None without it). Thread-safe: no state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import blas
from .jit import CONTRACT, Jitted
from .nn.conv_direct import ACTIVATIONS, Epilogue, _act_row, _params, numpy_act_after

__all__ = ["Fused", "fused_for"]

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles, and
#: NumPy's BLAS gemm (``blas.register``, its ``prepare``).
numba: Any = None
_sgemm: Any = None
_dgemm: Any = None


class Fused(NamedTuple):
    """What ``run_fused`` does after each block's product: ``y += bias`` (length 0: no
    bias), then ``conv_direct``'s activation ``act`` with ``params``. Immutable."""

    bias: np.ndarray
    act: int
    params: np.ndarray
    kernel: Any  # the compiled _linear_par

    def run(self, a: np.ndarray, w: np.ndarray, out: np.ndarray, edges: Any) -> bool:
        """``out = act(a @ w + bias)`` in the row blocks between ``edges`` on native
        threads (the caller has entered them), when every array is C-contiguous of the
        bias's dtype; False (nothing done) otherwise."""
        dt = self.params.dtype
        if a.dtype != dt or w.dtype != dt or out.dtype != dt:
            return False
        if not (a.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous):
            return False
        if self.bias.shape[0] not in (0, w.shape[1]):
            return False
        self.kernel(a, w, out, self.bias, edges, self.act, self.params)
        return True


def _linear_par(  # pragma: no cover - numba only
    a: Any, w: Any, y: Any, b: Any, edges: Any, act: int, p: Any
) -> None:
    """y[r0:r1] = act(a[r0:r1] @ w + b) for the row blocks between consecutive ``edges``,
    in a ``prange`` loop on native threads. ``a`` (M, K), ``w`` (K, N), ``y`` (M, N)
    C-contiguous, one dtype; ``b`` (N,) or empty."""
    k = a.shape[1]
    n = w.shape[1]
    has_b = b.shape[0] > 0
    zero, one = p[2], p[3]
    neg0 = -zero
    sz = y.itemsize
    for q in numba.prange(edges.shape[0] - 1):
        r0, r1 = edges[q], edges[q + 1]
        # addresses in uint64 (uint64 + int64 would be a float64 in numba's typing)
        pa = a.ctypes.data + np.uint64(r0 * k * sz)
        pc = y.ctypes.data + np.uint64(r0 * n * sz)
        if sz == 4:
            _sgemm(101, 111, 111, r1 - r0, n, k, one, pa, k, w.ctypes.data, n, zero, pc, n)
        else:
            _dgemm(101, 111, 111, r1 - r0, n, k, one, pa, k, w.ctypes.data, n, zero, pc, n)
        for r in range(r0, r1):
            row = y[r]
            if has_b:
                for j in range(n):
                    row[j] += b[j]
            if act != 0:
                _act_row(row, neg0, act, p)


def _warm(fn: Any) -> None:
    for t in (np.float32, np.float64):
        a, w, y = np.ones((2, 3), t), np.ones((3, 4), t), np.zeros((2, 4), t)
        fn(a, w, y, np.zeros(4, t), np.array([0, 1, 2], np.int64), 1, np.zeros(35, t))


def _prepare(module_globals: dict[str, Any]) -> bool:
    return blas.register(module_globals)


_LINEAR_PAR = Jitted(
    _linear_par, _warm, helpers=(_act_row,), fastmath=CONTRACT, parallel=True, prepare=_prepare
)


def _epilogue_of(op: str, attrs: dict[str, Any]) -> Epilogue | None:
    """conv_direct's Epilogue computing a Linear's activation step (op, attributes), or
    None for another step."""
    if op == "Relu":
        return Epilogue(act="Relu")
    if op == "Sigmoid":
        return Epilogue(act="Sigmoid")
    if op == "Swish" and float(attrs.get("alpha", 1.0)) == 1.0:
        return Epilogue(act="SiLU")
    if op == "Gelu" and attrs.get("approximate", "none") in ("none", b"none"):
        return Epilogue(act="Gelu")
    if op == "HardSwish":
        return Epilogue(act="HardSwish")
    if op == "HardSigmoid":
        return Epilogue(act="HardSigmoid", alpha=float(attrs.get("alpha", 0.2)),
                        beta=float(attrs.get("beta", 0.5)))  # fmt: skip
    if op == "LeakyRelu":
        return Epilogue(act="LeakyRelu", alpha=float(attrs.get("alpha", 0.01)))
    return None


def fused_for(
    steps: list[tuple[str, int, dict[str, Any], tuple[int, ...]]],
    bias: np.ndarray | None,
    dtype: np.dtype,
) -> Fused | None:
    """The fused epilogue for a Linear of this dtype whose steps are ``steps`` (at most
    one activation reading only the product) and whose bias is ``bias`` (one value per
    column, or None), or None when it has none (no bias and no step), another step, or
    numba's native threads are not there."""
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    if len(steps) > 1 or (steps and tuple(steps[0][3]) != (-1,)):
        return None
    epi = _epilogue_of(steps[0][0], steps[0][2]) if steps else Epilogue()
    if epi is None or numpy_act_after(epi, dtype) or (bias is None and not steps):
        return None
    if bias is not None and (bias.dtype != dtype or bias.ndim != 1):
        return None
    kernel = _LINEAR_PAR.get()
    if kernel is None:
        return None
    b = np.zeros(0, dtype) if bias is None else np.ascontiguousarray(bias)
    return Fused(b, ACTIVATIONS[epi.act], _params(epi, dtype), kernel)
