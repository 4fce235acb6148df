"""com.microsoft NhwcMaxPool: MaxPool over (N, H, W, C) 8-bit codes, as onnxruntime's
contrib op (what its NHWC transformer makes of a quantized CNN's MaxPool, and what the
``channels_last`` pass makes of ours): the window's max of each channel, padding never
selected; pads/auto_pad, strides, dilations, ceil_mode as MaxPool.

Compiled: per output row on native threads, each window tap one vector max over the
pixel's channels. Without numba: MaxPool's kernel on the NCHW transpose. Any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.threads import intra_pool
from ..base import ComputeFn, KernelContext
from ..lib.jit import Jitted
from ..registry import KernelRegistry
from .conv_common import conv_geometry, parse_spatial

__all__ = ["register_kernels"]

numba: Any = None  # set by Jitted(parallel=True) before the loop below compiles
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _nhwc_max_pool(x, geo, fill, y):  # pragma: no cover - numba only
    # geo: kh, kw, sh, sw, dh, dw, pad top, pad left
    n_, h_, w_, c_ = x.shape
    kh, kw, sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    oh_, ow_ = y.shape[1], y.shape[2]
    for row in numba.prange(n_ * oh_):
        n = row // oh_
        oh = row - n * oh_
        for ow in range(ow_):
            out = y[n, oh, ow]
            first = True
            for i in range(kh):
                ih = oh * sh - pt + i * dh
                if ih < 0 or ih >= h_:
                    continue
                for j in range(kw):
                    iw = ow * sw - pl + j * dw
                    if iw < 0 or iw >= w_:
                        continue
                    src = x[n, ih, iw]
                    if first:
                        for c in range(c_):
                            out[np.uint64(c)] = src[np.uint64(c)]
                        first = False
                    else:
                        for c in range(c_):
                            uc = np.uint64(c)
                            out[uc] = max(out[uc], src[uc])
            if first:  # a window wholly in the padding (only with odd pads): the type's min
                for c in range(c_):
                    out[np.uint64(c)] = fill


def _warm(fn: Any) -> None:
    geo = np.array([3, 3, 2, 2, 1, 1, 1, 1], np.int64)
    for dt in _EIGHT_BIT:
        fn(np.ones((1, 4, 4, 2), dt), geo, 0, np.empty((1, 2, 2, 2), dt))


_POOL = Jitted(_nhwc_max_pool, _warm, parallel=True)


def _nhwc_max_pool_kernel(ctx: KernelContext) -> ComputeFn:
    """NhwcMaxPool(X) -> Y, both channels-last, X uint8 or int8."""
    sp = parse_spatial(ctx)
    if sp.kernel_shape is None or len(sp.kernel_shape) != 2:
        raise ctx.unsupported("NhwcMaxPool takes a 2-D kernel_shape")
    ceil_mode = bool(int(ctx.attr("ceil_mode", 0)))
    kernel, strides, dil, pads = sp.resolve()

    def nhwc_max_pool(x: np.ndarray) -> np.ndarray:
        if x.ndim != 4 or x.dtype not in _EIGHT_BIT:
            raise ValueError(f"NhwcMaxPool takes 4-D uint8/int8, not {x.dtype} of rank {x.ndim}")
        begin, _, out = conv_geometry(x.shape[1:3], kernel, strides, dil, pads, sp.auto_pad,
                                      ceil_mode)  # fmt: skip
        y = np.empty((x.shape[0], out[0], out[1], x.shape[3]), x.dtype)
        fn = _POOL.get()
        geo = np.array([*kernel, *strides, *dil, *begin], np.int64)
        fill = int(np.iinfo(x.dtype).min)
        if fn is not None:
            if y.size:
                native_threads.enter_for(y.size * kernel[0] * kernel[1], intra_pool().threads)
                fn(np.ascontiguousarray(x), geo, fill, y)
            return y
        # NumPy: the max over each tap's strided view, padding as the type's minimum
        ends = [(out[a] - 1) * strides[a] + (kernel[a] - 1) * dil[a] + 1 for a in (0, 1)]
        hp, wp = max(ends[0], x.shape[1] + begin[0]), max(ends[1], x.shape[2] + begin[1])
        padded = np.full((x.shape[0], hp, wp, x.shape[3]), fill, x.dtype)
        padded[:, begin[0] : begin[0] + x.shape[1], begin[1] : begin[1] + x.shape[2]] = x
        y.fill(fill)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                tap = padded[:, i * dil[0] :: strides[0], j * dil[1] :: strides[1]]
                np.maximum(y, tap[:, : out[0], : out[1]], out=y)
        return y

    return nhwc_max_pool


def register_kernels(registry: KernelRegistry) -> None:
    """Register com.microsoft NhwcMaxPool."""
    registry.add("NhwcMaxPool", _nhwc_max_pool_kernel, domain="com.microsoft", since=1)
