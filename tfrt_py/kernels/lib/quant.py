"""The one requantize of the integer kernels (QLinearMatMul, QLinearConv, ...), and the
helpers their exact integer products on float BLAS share (``exact_dtype``, the operands
minus their zero points).

``requantize(acc, scale, y_zp, default)``: an integer accumulator times a float scale (the
inputs' scales over the output's, broadcast to ``acc``), plus the output zero point,
rounded half to even and saturated to the output type -- the zero point's dtype, or
``default`` when there is none (ONNX: the output takes y_zero_point's type). Computed in
float32, as MLAS's requantize does (float64 rounds some products to the other side of .5:
a quantized ResNet-18 ended 7e-3 of its output scale from onnxruntime; float32 matches it
bit for bit). Stateless; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .jit import Jitted

__all__ = [
    "check_constants", "dynamic_quantize", "exact_dtype", "minus_zero_point_cols",
    "minus_zero_point_rows", "quantize_codes", "requantize",
]  # fmt: skip


def requantize(acc: np.ndarray, scale: Any, y_zp: Any, default: np.dtype) -> np.ndarray:
    """``saturate(rint(acc * scale) + y_zp)`` in the output's integer type."""
    r = acc.astype(np.float32) * np.asarray(scale, dtype=np.float32)
    odt = default if y_zp is None else np.asarray(y_zp).dtype
    np.rint(r, out=r)
    if y_zp is not None:
        r += np.asarray(y_zp, dtype=np.float32)
    info = np.iinfo(odt)
    np.clip(r, info.min, info.max, out=r)
    return r.astype(odt)


def check_constants(ctx: Any, scales: dict[int, int], zero_points: dict[int, int]) -> None:
    """Load-time checks of a quantized op's constant scales and zero points (inputs not
    given, or given at run time, are left to the kernel): each scale input ``i`` holds one
    value or ``scales[i]`` values (0: one only; -1: any number), all positive and finite;
    each zero point ``i`` one value or ``zero_points[i]`` (likewise). A bad model is refused with
    ``ctx.unsupported`` (the node named), never run to a wrong answer."""
    for table, what in ((scales, "scale"), (zero_points, "zero point")):
        for i, per_axis in table.items():
            if not ctx.has_input(i):
                continue
            c = ctx.const_input(i)
            if c is None:
                continue
            a = np.asarray(c)
            if a.size != 1 and per_axis >= 0 and (per_axis == 0 or a.size != per_axis):
                want = "one value" if per_axis == 0 else f"one value or {per_axis}"
                raise ctx.unsupported(f"input {i} ({what}) has {a.size} values: {want} expected")
            if what == "scale":
                f = a.astype(np.float64)
                if not np.all(np.isfinite(f)) or np.any(f <= 0):
                    raise ctx.unsupported(f"input {i} (scale) holds {f.reshape(-1)[:4]}: "
                                          "scales must be positive and finite")  # fmt: skip


_F32_MAX_K = (2**24) // (255 * 255)


def exact_dtype(k: int) -> type[np.floating[Any]]:
    """The float type in which a product of 8-bit operands over ``k`` terms is exact on
    BLAS: float32 while every partial sum stays below 2**24 (k <= 258), else float64."""
    return np.float32 if k <= _F32_MAX_K else np.float64


def minus_zero_point_rows(a: np.ndarray, zp: Any, cdt: Any) -> np.ndarray:
    """A - zero point; a 1-D zero point (or scale) is per row of A."""
    af = a.astype(cdt)
    if zp is not None:
        z = np.asarray(zp)
        if z.ndim == 1 and z.size > 1:
            z = z.reshape(-1, 1)
        af -= z.astype(cdt)
    return af


def minus_zero_point_cols(b: np.ndarray, zp: Any, cdt: Any) -> np.ndarray:
    """B - zero point; a 1-D zero point is per column of B (broadcasts as is)."""
    bf = b.astype(cdt)
    if zp is not None:
        bf -= np.asarray(zp).astype(cdt)
    return bf


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """DynamicQuantizeLinear's arithmetic (float32, as onnxruntime): ``x``'s range widened
    to hold 0 mapped onto uint8; returns (codes, scale, zero point). A contiguous float32
    ``x`` takes NumPy's range and one compiled pass for the codes: the same steps."""
    f32 = np.float32
    codes = _CODES.get() if x.dtype == f32 and x.size else None
    if codes is not None:
        lo, hi = float(x.min()), float(x.max())  # NumPy's vector reductions; NaN if any
        if np.isfinite(lo) and np.isfinite(hi):
            maxx, minx = f32(max(0.0, hi)), f32(min(0.0, lo))
            scale = f32(1.0 if maxx == minx else (maxx - minx)) / f32(255)
            zp = np.rint(min(255.0, max(0.0, float(f32(0) - minx / scale))))
            y = np.empty(x.shape, np.uint8)
            codes(np.ascontiguousarray(x).reshape(-1), scale, f32(zp), y.reshape(-1))
            return y, f32(scale), np.uint8(zp)
    maxx = f32(max(0.0, float(x.max()))) if x.size else f32(0)
    minx = f32(min(0.0, float(x.min()))) if x.size else f32(0)
    scale = f32(1.0 if maxx == minx else (maxx - minx)) / f32(255)
    zp = np.rint(min(255.0, max(0.0, float(f32(0) - minx / scale))))
    y = np.divide(x, scale, dtype=f32)
    np.rint(y, out=y)
    y += f32(zp)
    np.clip(y, 0, 255, out=y)
    return y.astype(np.uint8), f32(scale), np.uint8(zp)


def _codes(x, scale, zp, y):  # pragma: no cover - numba only
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    for i in range(x.shape[0]):
        u = np.uint64(i)
        v = x[u] / scale  # |v| <= 255 + 1: x lies within the range the scale covers
        v = ((v + magic) - magic) + zp
        y[u] = min(max(v, np.float32(0)), np.float32(255))


def _warm_codes(fn: Any) -> None:
    fn(np.ones(3, np.float32), np.float32(1), np.float32(0), np.empty(3, np.uint8))


_CODES = Jitted(_codes, _warm_codes)


def quantize_codes(x: np.ndarray, scale: np.float32, zp: np.float32,
                   out_dtype: np.dtype) -> np.ndarray | None:  # fmt: skip
    """QuantizeLinear's per-tensor codes of float32 ``x`` in one compiled pass: ``x /
    scale`` in float32, rounded half to even, plus ``zp``, saturated to uint8/int8 -- the
    NumPy path's steps and results (NaN gives code 0, as its cast does); None where numba
    is off or the output is not 8-bit (the caller's NumPy path)."""
    fn = _QUANTIZE.get()
    if fn is None or x.dtype != np.float32 or out_dtype not in (np.uint8, np.int8):
        return None
    lo, hi = (0.0, 255.0) if out_dtype == np.uint8 else (-128.0, 127.0)
    y = np.empty(x.shape, out_dtype)
    fn(np.ascontiguousarray(x).reshape(-1), scale, zp, np.float32(lo), np.float32(hi),
       y.reshape(-1))  # fmt: skip
    return y


def _quantize(x, scale, zp, lo, hi, y):  # pragma: no cover - numba only
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    big = np.float32(4194304.0)  # 2**22: beyond it every code saturates anyway
    for i in range(x.shape[0]):
        u = np.uint64(i)
        v = x[u] / scale
        if v != v:  # NaN
            y[u] = 0
        else:
            v = min(max(v, -big), big)
            v = ((v + magic) - magic) + zp
            y[u] = min(max(v, lo), hi)


def _warm_quantize(fn: Any) -> None:
    for dt in (np.uint8, np.int8):
        fn(np.ones(3, np.float32), np.float32(1), np.float32(0), np.float32(0),
           np.float32(127), np.empty(3, dt))  # fmt: skip


_QUANTIZE = Jitted(_quantize, _warm_quantize)
