"""Kernels (linalg): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

Per-tensor (scalar or one-element scale), per-axis (1-D scale along ``axis``) and blocked
(``block_size``, scale shaped like the input with ``ceil(D/block)`` along ``axis``)
quantization. Quantized types: uint8, int8, uint16, int16, int32 (dequantize only), and,
through ``ml_dtypes`` (an onnx dependency), int4, uint4, int2, uint2, float8 e4m3fn /
e4m3fnuz / e5m2 / e5m2fnuz, float4 e2m1; float8 e8m0 scales. Types NumPy cannot hold raise
at load.

QuantizeLinear: ``y = saturate(round_half_even(x / scale) + zero_point)``, the division in
``precision`` when given (opset 23+), else in NumPy's promotion of x and scale; float8
outputs clip to the finite range when ``saturate`` (default). DequantizeLinear:
``y = (x - zero_point) * scale`` in float32, cast to ``output_dtype`` or the scale's type.
Constant scales and zero points are laid out for broadcasting once, at load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..lib.quant import dynamic_quantize, quantize_codes
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

_INT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
    "uint2": (0, 3),
    "int2": (-2, 1),
}
_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_SMALL_FLOATS = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")


def _layout(value: np.ndarray, shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """Scale or zero point laid out to broadcast against an input of ``shape``."""
    if value.ndim == 0:
        return value
    if value.size == 1 and not block:
        return value.reshape(())
    rank = len(shape)
    ax = axis + rank if axis < 0 else axis
    if not block:
        dims = [1] * rank
        dims[ax] = value.size
        return value.reshape(dims)
    rep = np.repeat(value, block, axis=ax)
    if rep.shape[ax] != shape[ax]:
        rep = rep.take(np.arange(shape[ax]), axis=ax)
    return rep


class _Laid:
    """A constant scale or zero point laid out (as float32 when ``as_f32``) for the last
    input shape seen; recomputed only when the shape changes. Thread-safe: one tuple is
    swapped atomically."""

    __slots__ = ("as_f32", "axis", "block", "memo", "value")

    def __init__(self, value: np.ndarray, axis: int, block: int, as_f32: bool) -> None:
        self.value = value
        self.axis = axis
        self.block = block
        self.as_f32 = as_f32
        self.memo: tuple[tuple[int, ...], np.ndarray] | None = None

    def get(self, shape: tuple[int, ...]) -> np.ndarray:
        memo = self.memo
        if memo is not None and memo[0] == shape:
            return memo[1]
        laid = _layout(self.value, shape, self.axis, self.block)
        if self.as_f32:
            laid = laid.astype(np.float32)
        self.memo = (shape, laid)
        return laid


def _quantize_linear(ctx: KernelContext) -> ComputeFn:
    """QuantizeLinear-10..: ``(x, y_scale, y_zero_point?) -> y``."""
    axis = int(ctx.attr("axis", 1))
    block = int(ctx.attr("block_size", 0))
    saturate = bool(ctx.attr("saturate", 1))
    out_code = int(ctx.attr("output_dtype", 0))
    prec_code = ctx.attr("precision", None)
    prec = None if not prec_code else ctx.elem_dtype(prec_code, "precision")
    if block < 0:
        raise ctx.unsupported("block_size must be positive")
    zp_dtype = ctx.input_dtype(2) if ctx.has_input(2) else None
    if zp_dtype is None and ctx.const_input(2) is not None:
        zp_dtype = ctx.const_input(2).dtype  # type: ignore[union-attr]
    fixed = ctx.elem_dtype(out_code, "output_dtype") if out_code else zp_dtype
    if fixed is None and not ctx.has_input(2):
        fixed = np.dtype(np.uint8)
    if fixed is not None:
        _check_quant_type(ctx, fixed)

    c_scale = ctx.const_input(1)
    c_zp = ctx.const_input(2)
    _check_scale(ctx, c_scale)
    laid_scale = None if c_scale is None else _Laid(c_scale, axis, block, False)
    laid_zp = None if c_zp is None else _Laid(c_zp, axis, block, False)
    # per tensor, float32, to 8 bits (an input's Q in every QDQ model): one compiled pass
    one_pass = None
    zp_fixed = c_zp.size == 1 if c_zp is not None else not ctx.has_input(2)
    scale_fixed = c_scale is not None and c_scale.size == 1 and c_scale.dtype == np.float32
    if scale_fixed and zp_fixed and prec is None and fixed in (np.uint8, np.int8):
        zp0 = 0.0 if c_zp is None else float(np.asarray(c_zp).reshape(-1)[0])
        one_pass = (np.float32(c_scale.reshape(-1)[0]), np.float32(zp0))  # type: ignore[union-attr]

    def quantize_linear(
        x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None
    ) -> np.ndarray:
        shape = x.shape
        if one_pass is not None and x.dtype == np.float32:
            y = quantize_codes(x, one_pass[0], one_pass[1], fixed)  # type: ignore[arg-type]
            if y is not None:
                return y
        if laid_scale is not None:
            scale = laid_scale.get(shape)
        else:
            scale = y_scale if y_scale.ndim == 0 else _layout(y_scale, shape, axis, block)
        odt = fixed if fixed is not None else y_zero_point.dtype  # type: ignore[union-attr]
        if prec is not None:
            y = np.divide(x, scale, dtype=prec)
        else:
            if scale.dtype.kind == "V":  # ml_dtypes scale (e.g. float8e8m0)
                scale = scale.astype(np.float32)
            y = np.divide(x, scale)
            if y.dtype.kind != "f" and y.dtype.kind != "V":
                y = y.astype(np.float32)
        name = odt.name
        lim = _INT_RANGES.get(name)
        if lim is not None:
            if y.dtype.kind == "V":
                y = y.astype(np.float32)
            np.rint(y, out=y)
            if laid_zp is not None:
                y += laid_zp.get(shape)
            elif y_zero_point is not None:
                y += _layout(y_zero_point, shape, axis, block)
            np.clip(y, lim[0], lim[1], out=y)
            if odt.kind == "V":  # int4/uint4/int2/uint2 via an exact int8 cast
                return y.astype(np.int8).astype(odt)
            return y.astype(odt)
        if name in _FLOAT8:
            if saturate:
                fmax = float(_finfo_max(odt))
                y = np.clip(y, -fmax, fmax)
            return y.astype(odt)
        if y_zero_point is not None:
            y = y + _layout(y_zero_point, shape, axis, block).astype(np.float32)
        return y.astype(odt)

    return quantize_linear


def _check_scale(ctx: KernelContext, scale: np.ndarray | None) -> None:
    """A constant scale must be nonzero and finite: zero divides by zero in QuantizeLinear
    and turns every DequantizeLinear output into 0, a model fault, refused at load."""
    if scale is None or scale.size == 0:
        return
    v = np.asarray(scale)
    if v.dtype.kind == "V":  # ml_dtypes scale (e.g. float8e8m0)
        v = v.astype(np.float32)
    bad = ~np.isfinite(v) | (v == 0)
    if bad.any():
        first = float(v.reshape(-1)[int(np.argmax(bad.reshape(-1)))])
        raise ctx.unsupported(f"a scale is {first}: scales must be nonzero and finite")


def _finfo_max(dt: np.dtype) -> Any:
    import ml_dtypes

    return ml_dtypes.finfo(dt).max


def _check_quant_type(ctx: KernelContext, dt: np.dtype) -> None:
    if dt.name not in _INT_RANGES and dt.name not in _FLOAT8 and dt.name not in _SMALL_FLOATS:
        raise ctx.unsupported(f"{dt.name} is not a quantized type")


def _dequantize_linear(ctx: KernelContext) -> ComputeFn:
    """DequantizeLinear-10..: ``(x, x_scale, x_zero_point?) -> y``, float32 math."""
    axis = int(ctx.attr("axis", 1))
    block = int(ctx.attr("block_size", 0))
    out_code = int(ctx.attr("output_dtype", 0))
    fixed_out = ctx.elem_dtype(out_code, "output_dtype") if out_code else None
    f32 = np.dtype(np.float32)
    c_scale = ctx.const_input(1)
    c_zp = ctx.const_input(2)
    _check_scale(ctx, c_scale)
    laid_scale = None if c_scale is None else _Laid(c_scale, axis, block, True)
    laid_zp = None
    if c_zp is not None and c_zp.dtype.name not in _FLOAT8:
        laid_zp = _Laid(c_zp, axis, block, True)

    def dequantize_linear(
        x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None
    ) -> np.ndarray:
        odt = fixed_out if fixed_out is not None else x_scale.dtype
        shape = x.shape
        xf = x.astype(f32)
        if laid_zp is not None:
            xf -= laid_zp.get(shape)
        elif x_zero_point is not None and x.dtype.name not in _FLOAT8:
            xf -= _layout(x_zero_point, shape, axis, block).astype(f32, copy=False)
        if laid_scale is not None:
            xf *= laid_scale.get(shape)
        else:
            xf *= _layout(x_scale, shape, axis, block).astype(f32, copy=False)
        return xf if odt == f32 else xf.astype(odt)

    return dequantize_linear


def _dynamic_quantize_linear(ctx: KernelContext) -> ComputeFn:
    """DynamicQuantizeLinear-11: ``x -> (y uint8, y_scale float32 scalar, zp uint8)``."""

    def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        y, scale, zp = dynamic_quantize(x)
        return y, np.array(scale, dtype=x.dtype), np.array(zp, dtype=np.uint8)

    return dynamic_quantize_linear


def register_kernels(registry: KernelRegistry) -> None:
    """Register QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear."""
    registry.add("QuantizeLinear", _quantize_linear, since=10)
    registry.add("DequantizeLinear", _dequantize_linear, since=10)
    registry.add("DynamicQuantizeLinear", _dynamic_quantize_linear, since=11)
