"""Kernels (elementwise): Cast and CastLike.

``fn(x, out=None)`` (CastLike: ``fn(x, like, out=None)``) returns x converted to the
target dtype; a cast to x's own dtype returns x itself (the executor copies aliases it
hands out). Numeric casts are NumPy's ``astype`` (C semantics: floats truncate toward
zero into integers, integers wrap). ONNX's extra rules:

* float8 E4M3FN/E4M3FNUZ/E5M2/E5M2FNUZ with ``saturate=1`` (the default): values beyond
  the type's range, and +/-inf, become +/-max; ``saturate=0`` is ml_dtypes' plain cast.
* FLOAT8E8M0: exponent-only, rounded as ``round_mode`` says ("up", "down", "nearest").
* strings (object arrays of str or bytes): to numbers via Python's float/int parsing
  ("INF", "-inf", "NaN" in any case, "1e-5"); numbers to strings via NumPy's ``str``.

bfloat16, the float8/float6/float4 types and int4/uint4/int2/uint2 are ml_dtypes dtypes,
as ``tfrt_py.ir.dtypes`` maps them.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ...ir.dtypes import ElemType, numpy_dtype
from ..base import OUT, ComputeFn, KernelContext
from ..registry import KernelRegistry

__all__ = ["register_kernels", "target_dtype"]

_SATURATING = frozenset(
    numpy_dtype(t)
    for t in (
        ElemType.FLOAT8E4M3FN,
        ElemType.FLOAT8E4M3FNUZ,
        ElemType.FLOAT8E5M2,
        ElemType.FLOAT8E5M2FNUZ,
    )
)
_E8M0 = numpy_dtype(ElemType.FLOAT8E8M0)
_STR = np.dtype(object)


# -- special conversions ------------------------------------------------------------------
def _to_string(x: np.ndarray) -> np.ndarray:
    if x.dtype == _STR:
        return x
    return x.astype(np.str_).astype(object)


def _parse_int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        return int(float(s))


def _from_string(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    flat = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1)]
    if dt.kind in "iu":
        vals = np.array(
            [_parse_int(s) for s in flat], dtype=np.int64 if dt.kind == "i" else np.uint64
        )
    else:
        vals = np.array([float(s) for s in flat], dtype=np.float64)
    return vals.astype(dt).reshape(x.shape)


def _saturate(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """float8 with saturation: clamp to the finite range first (NaN stays NaN)."""
    fi = ml_dtypes.finfo(dt)
    lo, hi = float(fi.min), float(fi.max)
    if x.dtype.kind != "f":
        x = x.astype(np.float32)
    r = np.asarray(np.maximum(x, lo))
    np.minimum(r, hi, out=r)
    return r.astype(dt)


def _to_e8m0(x: np.ndarray, saturate: bool, mode: str) -> np.ndarray:
    """float -> FLOAT8E8M0 (a biased power-of-two exponent byte; 0xFF is NaN)."""
    shape = np.shape(x)
    bits = np.asarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
    e = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.uint16)
    special = e == 0xFF  # inf / NaN
    if mode == "up":
        inc = (bits & np.uint32(0x7FFFFF)) != 0
    elif mode == "nearest":
        guard = (bits & np.uint32(0x400000)) != 0
        inc = guard & (((bits & np.uint32(0x3FFFFF)) != 0) | (e > 0))
    else:  # down
        inc = np.zeros(e.shape, dtype=np.bool_)
    inc &= ~special
    if saturate:
        inc &= e != 0xFE
    e += inc
    e[special] = 0xFF
    return e.astype(np.uint8).view(_E8M0).reshape(shape)


def make_cast(dt: np.dtype, saturate: bool = True, round_mode: str = "up") -> ComputeFn:
    """The conversion of any array to ``dt`` as ONNX Cast defines it: ``fn(x, out=None)``."""
    if dt == _STR:

        def cast_str(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            return _finish(_to_string(x), out)

        return cast_str
    if dt in _SATURATING and saturate:

        def cast_sat(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if x.dtype == dt:
                return _finish(x, out)
            if x.dtype == _STR:
                x = _from_string(x, np.dtype(np.float32))
            return _finish(_saturate(x, dt), out)

        return cast_sat
    if dt == _E8M0:

        def cast_e8m0(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
            if x.dtype == dt:
                return _finish(x, out)
            if x.dtype == _STR:
                x = _from_string(x, np.dtype(np.float32))
            return _finish(_to_e8m0(x, saturate, round_mode), out)

        return cast_e8m0

    def cast(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if x.dtype == _STR:
            return _finish(_from_string(x, dt), out)
        if out is None:
            return x.astype(dt, copy=False)
        np.copyto(out, x, casting="unsafe")
        return out

    return cast


def _finish(r: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return r
    np.copyto(out, r, casting="unsafe")
    return out


# -- builders -------------------------------------------------------------------------
def _options(ctx: KernelContext) -> tuple[bool, str]:
    saturate = bool(ctx.attr("saturate", 1))
    mode = ctx.attr("round_mode", "up")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("up", "down", "nearest"):
        raise ctx.unsupported(f"round_mode={mode!r}")
    return saturate, mode


def target_dtype(ctx: KernelContext, to: Any) -> np.dtype:
    """The NumPy dtype of an ONNX ``to`` attribute (an int, or a name in opset 1)."""
    if isinstance(to, bytes):
        to = to.decode()
    return ctx.elem_dtype(to, "to")


def _cast(ctx: KernelContext) -> ComputeFn:
    """Cast(x) to the ``to`` attribute's type; ``saturate`` (float8) and ``round_mode``
    (float8e8m0) as ONNX defines."""
    dt = target_dtype(ctx, ctx.attr("to"))
    saturate, mode = _options(ctx)
    return make_cast(dt, saturate, mode)


def _cast_like(ctx: KernelContext) -> ComputeFn:
    """CastLike(x, like): Cast to like's dtype (known at load when its type is)."""
    saturate, mode = _options(ctx)
    dt = ctx.input_dtype(1)
    if dt is not None:
        fn = make_cast(dt, saturate, mode)

        def cast_like(x: np.ndarray, like: np.ndarray, out: np.ndarray | None = None) -> Any:
            return fn(x, out)

        return cast_like

    def cast_like_dynamic(x: np.ndarray, like: np.ndarray, out: np.ndarray | None = None) -> Any:
        return make_cast(like.dtype, saturate, mode)(x, out)

    return cast_like_dynamic


def register_kernels(registry: KernelRegistry) -> None:
    """Register Cast and CastLike."""
    registry.add("Cast", _cast, since=1, flags=OUT)
    registry.add("CastLike", _cast_like, since=15, flags=OUT)
