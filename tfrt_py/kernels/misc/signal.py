"""Kernels (misc): signal processing -- DFT, STFT, HannWindow, HammingWindow, BlackmanWindow,
MelWeightMatrix.

Complex tensors use ONNX's layout: a trailing dimension of 2 (real, imaginary); real signals
have a trailing dimension of 1. Transforms run on ``numpy.fft`` and are returned in the
input's dtype. DFT-17 takes ``axis`` as an attribute (default 1), DFT-20 as an optional
input (default -2); ``onesided`` forward is an RFFT (one-sided spectrum), ``onesided``
inverse an IRFFT (real output, default length ``2 * (n - 1)``). Windows and the mel matrix
are computed once at load when their inputs are constants (each call returns a copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def _to_complex(x: np.ndarray) -> np.ndarray:
    """ONNX ``(..., 1)`` real or ``(..., 2)`` complex layout -> NumPy array without it."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.dtype == np.float32 or x.dtype == np.float64:
        return np.ascontiguousarray(x).view(np.complex64 if x.dtype == np.float32 else complex)[
            ..., 0
        ]
    return x[..., 0] + 1j * x[..., 1]


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A complex NumPy array -> ONNX ``(..., 2)`` layout of ``dtype``."""
    out = np.empty((*c.shape, 2), dtype=dtype)
    out[..., 0] = c.real
    out[..., 1] = c.imag
    return out


def _scalar(ctx: KernelContext, i: int) -> int | None:
    v = ctx.const_input(i)
    return None if v is None else int(v.reshape(-1)[0])


def _dft(ctx: KernelContext) -> ComputeFn:
    """DFT-17/20: ``(input, dft_length?, axis?) -> output`` (axis input from opset 20)."""
    inverse = bool(ctx.attr("inverse", 0))
    onesided = bool(ctx.attr("onesided", 0))
    axis_input = ctx.opset >= 20
    axis_fixed = int(ctx.attr("axis", 1)) if not axis_input else _scalar(ctx, 2)
    if axis_input and not ctx.has_input(2):
        axis_fixed = -2
    len_fixed = _scalar(ctx, 1)
    has_len = ctx.has_input(1)

    def dft(
        x: np.ndarray, dft_length: np.ndarray | None = None, axis: np.ndarray | None = None
    ) -> np.ndarray:
        rank = x.ndim
        ax = axis_fixed if axis_fixed is not None else int(axis)  # type: ignore[arg-type]
        ax = ax % rank
        if len_fixed is not None:
            n = len_fixed
        elif has_len and dft_length is not None:
            n = int(dft_length)
        elif inverse and onesided:
            n = 2 * (x.shape[ax] - 1)
        else:
            n = x.shape[ax]
        c = _to_complex(x)
        if inverse:
            if onesided:
                return np.fft.irfft(c, n=n, axis=ax).astype(x.dtype, copy=False)[..., None]
            return _from_complex(np.fft.ifft(c, n=n, axis=ax), x.dtype)
        if onesided and not np.iscomplexobj(c):
            return _from_complex(np.fft.rfft(c, n=n, axis=ax), x.dtype)
        res = np.fft.fft(c, n=n, axis=ax)
        if onesided:
            res = res.take(np.arange(n // 2 + 1), axis=ax)
        return _from_complex(res, x.dtype)

    return dft


def _stft(ctx: KernelContext) -> ComputeFn:
    """STFT-17: ``(signal, frame_step, window?, frame_length?) -> output``,
    ``[batch, frames, bins, 2]``."""
    onesided = bool(ctx.attr("onesided", 1))

    def stft(
        signal: np.ndarray,
        frame_step: np.ndarray,
        window: np.ndarray | None = None,
        frame_length: np.ndarray | None = None,
    ) -> np.ndarray:
        step = int(frame_step)
        if frame_length is not None:
            flen = int(frame_length)
        elif window is not None:
            flen = window.shape[0]
        else:
            flen = signal.shape[-2]
        c = _to_complex(signal)  # (batch, length)
        frames = np.lib.stride_tricks.sliding_window_view(c, flen, axis=1)[:, ::step]
        if window is not None:
            frames = frames * window
        if onesided and not np.iscomplexobj(frames):
            res = np.fft.rfft(frames, n=flen, axis=-1)
        else:
            res = np.fft.fft(frames, n=flen, axis=-1)
            if onesided:
                res = res[..., : flen // 2 + 1]
        return _from_complex(res, signal.dtype)

    return stft


def _hann(n: np.ndarray, n1: float) -> np.ndarray:
    return np.sin(n * np.pi / n1) ** 2


def _hamming(n: np.ndarray, n1: float) -> np.ndarray:
    alpha = 25.0 / 46.0
    return alpha - np.cos(n * np.pi * 2 / n1) * (1 - alpha)


def _blackman(n: np.ndarray, n1: float) -> np.ndarray:
    return 0.42 - 0.5 * np.cos(n * np.pi * 2 / n1) + 0.08 * np.cos(n * np.pi * 4 / n1)


def _window_builder(formula: Any) -> Any:
    def build(ctx: KernelContext) -> Any:
        """Hann/Hamming/BlackmanWindow-17: ``size -> window[size]`` (float64 math)."""
        periodic = bool(ctx.attr("periodic", 1))
        dtype = ctx.elem_dtype(ctx.attr("output_datatype", 1), "output_datatype")

        def make(size: int) -> np.ndarray:
            n1 = size if periodic else size - 1
            return np.asarray(formula(np.arange(size, dtype=np.float64), n1)).astype(dtype)

        size_c = _scalar(ctx, 0)
        if size_c is not None:
            fixed = make(size_c)
            return lambda size: fixed.copy()

        def window(size: np.ndarray) -> np.ndarray:
            return make(int(size))

        return window

    return build


def _mel_matrix(
    num_mel_bins: int, dft_length: int, sample_rate: float, lower: float, upper: float
) -> np.ndarray:
    """The ONNX MelWeightMatrix (as its reference computes it), float64."""
    n_spec = dft_length // 2 + 1
    bins = np.arange(num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    step = (high_mel - low_mel) / bins.shape[0]
    hz = 700 * np.expm1((bins * step + low_mel) / 2595 * np.log(10))
    points = (((dft_length + 1) * hz) // sample_rate).astype(int)
    out = np.zeros((n_spec, num_mel_bins))
    for i in range(num_mel_bins):
        lo, center, hi = points[i], points[i + 1], points[i + 2]
        if center == lo:
            out[center, i] = 1
        else:
            j = np.arange(lo, center + 1)
            out[j, i] = (j - lo) / float(center - lo)
        if hi > center:
            j = np.arange(center, hi)
            out[j, i] = (hi - j) / float(hi - center)
    return out


def _mel_weight_matrix(ctx: KernelContext) -> ComputeFn:
    """MelWeightMatrix-17: ``(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
    upper_edge_hertz) -> [dft_length // 2 + 1, num_mel_bins]``."""
    dtype = ctx.elem_dtype(ctx.attr("output_datatype", 1), "output_datatype")

    def mel_weight_matrix(
        num_mel_bins: np.ndarray,
        dft_length: np.ndarray,
        sample_rate: np.ndarray,
        lower_edge_hertz: np.ndarray,
        upper_edge_hertz: np.ndarray,
    ) -> np.ndarray:
        return _mel_matrix(
            int(num_mel_bins),
            int(dft_length),
            sample_rate.item(),
            float(lower_edge_hertz),
            float(upper_edge_hertz),
        ).astype(dtype)

    consts = [ctx.const_input(i) for i in range(5)]
    if all(c is not None for c in consts):
        fixed = mel_weight_matrix(*consts)  # type: ignore[arg-type]
        return lambda *args: fixed.copy()
    return mel_weight_matrix


def register_kernels(registry: KernelRegistry) -> None:
    """Register DFT, STFT, the three windows and MelWeightMatrix."""
    registry.add("DFT", _dft, since=17)
    registry.add("STFT", _stft, since=17)
    registry.add("HannWindow", _window_builder(_hann), since=17)
    registry.add("HammingWindow", _window_builder(_hamming), since=17)
    registry.add("BlackmanWindow", _window_builder(_blackman), since=17)
    registry.add("MelWeightMatrix", _mel_weight_matrix, since=17)
