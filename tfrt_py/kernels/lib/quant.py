"""The one requantize of the integer kernels (QLinearMatMul, QLinearConv, ...).

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

__all__ = ["requantize"]


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
