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
    to hold 0 mapped onto uint8 (an empty range, all zeros, scale 1 as onnxruntime's);
    returns (codes, scale, zero point). A float32 ``x`` of
    finite values takes one compiled call (``_dynamic``: the range, the scale and zero
    point, the codes: the same steps); NaN or infinity, or numba off, the NumPy path."""
    f32 = np.float32
    fn = _DYNAMIC.get() if x.dtype == f32 and x.size else None
    if fn is not None:
        flat = np.ascontiguousarray(x).reshape(-1)
        y = np.empty(x.shape, np.uint8)
        params = np.empty(2, f32)
        if fn(flat, flat.view(np.int32), y.reshape(-1), params):
            return y, params[0], np.uint8(params[1])
    with np.errstate(over="ignore", invalid="ignore"):  # the limits' range, NaN: no warnings
        maxx = f32(max(0.0, float(x.max()))) if x.size else f32(0)
        minx = f32(min(0.0, float(x.min()))) if x.size else f32(0)
        scale = f32(1.0) if maxx == minx else f32(maxx - minx) / f32(255)  # onnxruntime's
        zp = np.rint(min(255.0, max(0.0, float(f32(0) - minx / scale))))
        y = np.divide(x, scale, dtype=f32)
        np.rint(y, out=y)
        y += f32(zp)
        np.clip(y, 0, 255, out=y)
        return y.astype(np.uint8), f32(scale), np.uint8(zp)


def _dynamic(x, bits, y, params):  # pragma: no cover - numba only
    """``dynamic_quantize`` of flat float32 ``x`` (``bits``: the same memory as int32) into
    ``y``; ``params`` gets (scale, zero point). False (nothing written) when ``x`` holds
    NaN or infinity. The range is found on the bits, where loops vectorize without
    fast-math: a positive float's bits order as the float does, and the most negative
    value has the largest magnitude bits among the sign-set ones."""
    top = np.int32(0)  # the largest positive value's bits (0: none above 0)
    neg = np.int32(0)  # the magnitude bits of the most negative value
    low = np.int32(0x7FFFFFFF)
    for i in range(bits.shape[0]):
        b = bits[i]
        top = b if b > top else top
        m = b & low if b < 0 else np.int32(0)
        neg = m if m > neg else neg
    if top >= np.int32(0x7F800000) or neg >= np.int32(0x7F800000):
        return False  # infinity or NaN: the NumPy path's arithmetic
    both = np.empty(2, np.int32)
    both[0] = top
    both[1] = neg
    f = both.view(np.float32)
    maxx = f[0]
    minx = -f[1]
    scale = np.float32(1.0) if maxx == minx else np.float32(maxx - minx) / np.float32(255)
    q = np.float64(np.float32(np.float32(0) - np.float32(minx / scale)))
    zp = np.float32(np.rint(min(255.0, max(0.0, q))))
    magic = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds half to even
    for i in range(x.shape[0]):
        v = x[i] / scale  # |v| <= 255 + 1: x lies within the range the scale covers
        v = ((v + magic) - magic) + zp
        y[i] = min(max(v, np.float32(0)), np.float32(255))
    params[0] = scale
    params[1] = zp
    return True


def _warm_dynamic(fn: Any) -> None:
    x = np.ones(3, np.float32)
    fn(x, x.view(np.int32), np.empty(3, np.uint8), np.empty(2, np.float32))


_DYNAMIC = Jitted(_dynamic, _warm_dynamic)


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
