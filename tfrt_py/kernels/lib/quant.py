"""The one requantize of the integer kernels (QLinearMatMul, QLinearConv, ...).

``requantize(acc, scale, y_zp, default)``: an integer accumulator times a float scale (the
inputs' scales over the output's, broadcast to ``acc``), plus the output zero point,
rounded half to even and saturated to the output type -- the zero point's dtype, or
``default`` when there is none (ONNX: the output takes y_zero_point's type). Computed in
float64, as onnxruntime's reference paths do for these ops. Stateless; any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["requantize"]


def requantize(acc: np.ndarray, scale: Any, y_zp: Any, default: np.dtype) -> np.ndarray:
    """``saturate(rint(acc * scale + y_zp))`` in the output's integer type."""
    r = acc.astype(np.float64, copy=False) * np.asarray(scale, dtype=np.float64)
    odt = default if y_zp is None else np.asarray(y_zp).dtype
    if y_zp is not None:
        r += np.asarray(y_zp, dtype=np.float64)
    info = np.iinfo(odt)
    np.rint(r, out=r)
    np.clip(r, info.min, info.max, out=r)
    return r.astype(odt)
