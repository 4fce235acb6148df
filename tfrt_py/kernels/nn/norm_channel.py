"""LayerNormalization over the channel axis of an (N, C, *spatial) tensor, in place of
``Transpose(channels last) -> LayerNormalization(axis -1) -> Transpose(channels first)``
(ConvNeXt's LayerNorm2d as torch.onnx writes it; ``compiler/fuse_vision`` rewrites the
three into one ``tfrt_py.fused::ChannelLayerNorm``).

Normalizing each pixel's C values in the channels-first layout needs no transposes: the
sums run over channel rows, which are contiguous runs of pixels, so every loop is a
vector loop over pixels (the channels-last rows of 40-320 values behind strided
transposed views took ~2.4 ns per element; this takes ~0.3).

``channel_layer_norm(x, scale, bias, eps, out)``: ``y = (x - mean) / sqrt(var + eps) *
scale[c] + bias[c]``, mean and (biased) variance over the C values of each pixel. float32
with numba: per pixel, the sum and sum of squares accumulate in float64 (as the row kernel
``norm_jit`` and onnxruntime do) and the normalization runs in float32; blocks of 512
pixels keep the sums in L1; large inputs split their pixels over the intra-op threads.
Other dtypes, or without numba: NumPy, two passes in the input's dtype (as the ONNX
reference). Thread-safe; any thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..lib.jit import Jitted

__all__ = ["channel_layer_norm", "channel_layer_norm_fn"]

#: Inputs of at least this many elements split their pixels over the intra-op threads.
SPLIT_MIN_ELEMENTS = 1 << 16
_BLOCK = 512


def _channel_ln_f32(  # pragma: no cover - numba only
    x: Any, scale: Any, bias: Any, eps: float, y: Any, p0: int, p1: int
) -> None:
    """y[:, :, p0:p1] for x, y (N, C, S) C-contiguous float32; ``bias`` empty: none."""
    n_, c_ = x.shape[0], x.shape[1]
    has_b = bias.shape[0] > 0
    inv_c = 1.0 / c_
    s = np.empty(_BLOCK, np.float64)
    q = np.empty(_BLOCK, np.float64)
    mf = np.empty(_BLOCK, np.float32)
    iv = np.empty(_BLOCK, np.float32)
    for n in range(n_):
        for b0 in range(p0, p1, _BLOCK):
            m = min(_BLOCK, p1 - b0)
            for t in range(m):
                s[t] = 0.0
                q[t] = 0.0
            for c in range(c_):
                xr = x[n, c, b0 : b0 + m]
                for t in range(m):
                    v = np.float64(xr[t])
                    s[t] += v
                    q[t] += v * v
            for t in range(m):
                mean = s[t] * inv_c
                var = q[t] * inv_c - mean * mean
                var = 0.0 if var < 0.0 else var
                mf[t] = np.float32(mean)
                iv[t] = np.float32(1.0 / math.sqrt(var + eps))
            for c in range(c_):
                xr = x[n, c, b0 : b0 + m]
                yr = y[n, c, b0 : b0 + m]
                g = scale[c]
                if has_b:
                    bc = bias[c]
                    for t in range(m):
                        yr[t] = (xr[t] - mf[t]) * iv[t] * g + bc
                else:
                    for t in range(m):
                        yr[t] = (xr[t] - mf[t]) * iv[t] * g


def _warm(fn: Any) -> None:
    f = np.float32
    x = np.zeros((1, 2, 3), f)
    fn(x, np.ones(2, f), np.zeros(2, f), 1e-5, np.empty_like(x), 0, 3)


_CHANNEL_LN = Jitted(_channel_ln_f32, _warm)

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop below compiles.
numba: Any = None


def _channel_ln_par(
    x: Any, scale: Any, bias: Any, eps: float, y: Any, edges: Any
) -> None:  # pragma: no cover - numba only
    """``_channel_ln_f32`` over the pixel blocks between consecutive ``edges`` in a
    ``prange`` loop on native threads (``concurrency.native_threads``)."""
    for i in numba.prange(edges.shape[0] - 1):
        _channel_ln_f32(x, scale, bias, eps, y, edges[i], edges[i + 1])


def _warm_par(fn: Any) -> None:
    f = np.float32
    x = np.zeros((1, 2, 3), f)
    fn(x, np.ones(2, f), np.zeros(2, f), 1e-5, np.empty_like(x), np.array([0, 1, 3], np.int64))


_CHANNEL_LN_PAR = Jitted(_channel_ln_par, _warm_par, helpers=(_channel_ln_f32,), parallel=True)
_NO_BIAS = np.zeros(0, np.float32)


def _numpy(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    d = x - x.mean(axis=1, keepdims=True)
    var = (d * d).mean(axis=1, keepdims=True)
    y = d / np.sqrt(var + x.dtype.type(eps)) * scale.reshape(shape)
    if bias is not None:
        y += bias.reshape(shape)
    return y.astype(x.dtype, copy=False)


def channel_layer_norm_fn() -> Callable[..., np.ndarray]:
    """``fn(x, scale, bias, eps, out=None)`` (see the module doc); whether the compiled
    loop is used is settled here, at load."""
    compiled = _CHANNEL_LN.get()

    def channel_layer_norm(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float,
        out: np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        f32 = np.float32
        if (
            compiled is None or x.dtype != f32 or x.ndim < 3 or x.size == 0
            or scale.dtype != f32 or (bias is not None and bias.dtype != f32)
            or (out is not None and not out.flags.c_contiguous)
        ):  # fmt: skip
            y = _numpy(x, scale, bias, eps)
            if out is not None:
                out[...] = y
                return out
            return y
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        y = np.empty_like(xc) if out is None or np.may_share_memory(out, xc) else out
        x3 = xc.reshape(xc.shape[0], xc.shape[1], -1)
        y3 = y.reshape(x3.shape)
        b = _NO_BIAS if bias is None else bias
        pixels = x3.shape[2]
        pool = intra_pool()
        if pool.threads == 1 or x.size < SPLIT_MIN_ELEMENTS or pixels < 2 * _BLOCK:
            compiled(x3, scale, b, eps, y3, 0, pixels)
        elif (par := _CHANNEL_LN_PAR.get()) is not None:  # pixel blocks on native threads
            parts = min(2 * native_threads.enter(pool.threads), pixels // _BLOCK)
            par(x3, scale, b, eps, y3, native_threads.edges(pixels, parts))
        else:
            parts = min(2 * pool.threads, pixels // _BLOCK)
            edges = [pixels * i // parts for i in range(parts + 1)]

            def part(a: int, e: int) -> Callable[[], None]:
                return lambda: compiled(x3, scale, b, eps, y3, a, e)

            pool.run([part(edges[i], edges[i + 1]) for i in range(parts)])
        if out is not None and y is not out:
            out[...] = y
            return out
        return y

    return channel_layer_norm


def channel_layer_norm(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, eps: float
) -> np.ndarray:
    """One-off ``channel_layer_norm_fn()(x, scale, bias, eps)`` (tests)."""
    return channel_layer_norm_fn()(x, scale, bias, eps)
