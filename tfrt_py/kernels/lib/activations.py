"""The activations a compiled epilogue applies, shared by the convolutions' and the Linear
kernels' epilogues: ``Epilogue`` (an activation by ONNX op name, or ``SiLU``, with its
float parameters), ``ACTIVATIONS`` (name -> the compiled loops' code), ``_params`` (the
parameter vector the loops read) and ``_act_row``, the one-row loop every compiled
epilogue calls (plain Python: numba compiles it inside its callers, which name it among
their ``jit.Jitted`` helpers so a change here renews their disk caches).

For float32 the compiled loops apply every activation (Sigmoid and SiLU by the rational
logistic that onnxruntime's MLAS and Eigen use: absolute error <= 2.2e-7, NaN kept; GELU by
``gelu_jit``'s erf); for float64, Sigmoid, SiLU and Gelu run after the compiled pass as
NumPy ufuncs (``numpy_act_after``). Stateless; any thread.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from .erf import _P32, _Q32, POLY_Z_FLOOR

__all__ = ["ACTIVATIONS", "PARAMS_LEN", "Epilogue", "numpy_act_after"]

#: Activation name -> code used by the compiled loops. Sigmoid and SiLU run after the
#: compiled pass in their own loop (``sigmoid_jit``: a vectorizable exp; a compiled
#: loop calling libm's exp per element was 5x slower than NumPy on EfficientNet), or as
#: NumPy ufuncs.
ACTIVATIONS = {
    "": 0,
    "Relu": 1,
    "Clip": 2,
    "HardSwish": 3,
    "HardSigmoid": 4,
    "Sigmoid": 5,
    "SiLU": 6,
    "LeakyRelu": 7,
    "Gelu": 8,  # erf form; compiled for float32 in conv_blocked, NumPy after elsewhere
}


class Epilogue(NamedTuple):
    """What follows the convolution: an optional residual input added after the bias, then
    an activation (``""`` for none) with its parameters (Clip: min, max; HardSigmoid and
    LeakyRelu: alpha, beta; unused ones 0)."""

    act: str = ""
    alpha: float = 0.0
    beta: float = 0.0
    residual: bool = False

    @property
    def trivial(self) -> bool:
        return not self.act and not self.residual


#: Activations the compiled loops apply to float32 only (their constants are float32
#: approximations); float64 runs them as NumPy ufuncs after the compiled pass.
_NUMPY_ACTS = frozenset({"Sigmoid", "SiLU", "Gelu"})


def numpy_act_after(epi: Epilogue, dt: np.dtype) -> bool:
    """Whether ``_numpy_act`` applies ``epi``'s activation after the compiled pass."""
    return epi.act in _NUMPY_ACTS and dt != np.float32


def _jit_act(epi: Epilogue, dt: np.dtype) -> int:
    """The activation code the compiled loop applies (0 when NumPy applies it after)."""
    return 0 if numpy_act_after(epi, dt) else ACTIVATIONS[epi.act]


#: erf GELU's constants for ``_act_row`` (code 8): 1/sqrt 2, the clamp [-4, 4] and
#: ``erf.erf_f32``'s float32 rational P (7) and Q (5), as ``gelu_jit`` computes it.
_GELU_CONSTS = (
    1.0 / math.sqrt(2.0),
    -4.0,
    4.0,
    *(float(c) for c in _P32),
    *(float(c) for c in _Q32),
)


#: The logistic for ``_act_row`` (codes 5, 6), float32: x clamped to [-18, 18], then
#: 0.5 + x P(x^2) / Q(x^2), clamped to [0, 1] -- Eigen's fast float logistic, the one
#: onnxruntime's MLAS evaluates (P: alpha 9, 7, 5, 3, 1; Q: beta 10, 8, ..., 0).
_LOGISTIC = (
    -18.0, 18.0,
    4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
    2.48287947061529e-01,
    6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
    1.16817656904453e-01, 9.93151921023180e-01,
)  # fmt: skip


#: The length of ``_params``' vector (what a kernel's warm-up passes in its place).
PARAMS_LEN = 36


@functools.lru_cache(maxsize=256)
def _params(epi: Epilogue, dt: np.dtype) -> np.ndarray:
    """[alpha, beta, 0, 1, 1/6, 1/2, inf, GELU's 15 (``_GELU_CONSTS``), the logistic's
    13 (``_LOGISTIC``), ``erf.POLY_Z_FLOOR``] in the compute dtype (typed constants for numba);
    cached: never written."""
    p = np.array(
        [epi.alpha, epi.beta, 0.0, 1.0, 1.0 / 6.0, 0.5, np.inf, *_GELU_CONSTS, *_LOGISTIC,
         POLY_Z_FLOOR],
        dtype=dt,
    )  # fmt: skip
    assert p.shape[0] == PARAMS_LEN
    return p


# -- compiled loops (plain Python; numba compiles them through jit.Jitted) ----------------


def _act_row(y: Any, bm: Any, act: int, p: Any) -> None:  # pragma: no cover - numba only
    """y = act(y + bm) over one contiguous row, in place, in one pass. No bias is
    ``bm = -0.0`` (``v + -0.0`` is ``v`` for every float, -0.0 and NaN included)."""
    n = y.shape[0]
    zero, one = p[2], p[3]
    # Relu and LeakyRelu are written so that every element is stored: LLVM turns
    # ``y[i] = zero if v < zero else v`` into a conditional store, which it does not
    # vectorize (a 144x3136 Relu took 193 µs that way, 30 µs as a clip to [0, inf]).
    if act == 0:
        for i in range(n):
            y[i] += bm
    elif act == 1:
        inf = p[6]
        for i in range(n):
            v = y[i] + bm
            v = zero if v < zero else v
            y[i] = inf if v > inf else v
    elif act == 2:
        lo, hi = p[0], p[1]
        for i in range(n):
            v = y[i] + bm
            v = lo if v < lo else v
            y[i] = hi if v > hi else v
    elif act == 3:
        sixth, half = p[4], p[5]
        for i in range(n):
            v = y[i] + bm
            t = v * sixth + half
            t = zero if t < zero else t
            t = one if t > one else t
            y[i] = v * t
    elif act == 4:
        a, b = p[0], p[1]
        for i in range(n):
            t = (y[i] + bm) * a + b
            t = zero if t < zero else t
            y[i] = one if t > one else t
    elif act == 7:
        a = p[0]
        for i in range(n):
            v = y[i] + bm
            y[i] = v * (a if v < zero else one)
    elif act == 5 or act == 6:  # Sigmoid, SiLU: the logistic (``_LOGISTIC``)
        lo, hi = p[22], p[23]
        a9, a7, a5, a3, a1 = p[24], p[25], p[26], p[27], p[28]
        b10, b8, b6, b4, b2, b0 = p[29], p[30], p[31], p[32], p[33], p[34]
        half, floor = p[5], p[35]
        silu = act == 6
        for i in range(n):
            v = y[i] + bm
            t = lo if v < lo else v  # NaN stays NaN through both
            t = hi if t > hi else t
            z = t * t
            z = floor if z < floor else z  # erf.POLY_Z_FLOOR: no subnormal terms
            pp = ((((a9 * z + a7) * z + a5) * z + a3) * z + a1) * t
            q = ((((b10 * z + b8) * z + b6) * z + b4) * z + b2) * z + b0
            s = pp / q + half
            s = zero if s < zero else s
            s = one if s > one else s
            y[i] = v * s if silu else s
    elif act == 8:  # GELU, erf form: gelu_jit's loop (float32 constants), written out
        # here rather than called: numba's disk cache keys a compiled function by its own
        # file, so a helper from gelu_jit.py would go stale in these loops' caches
        inv, m4, p4, half = p[7], p[8], p[9], p[5]
        c0, c1, c2, c3, c4, c5, c6 = p[10], p[11], p[12], p[13], p[14], p[15], p[16]
        d0, d1, d2, d3, d4 = p[17], p[18], p[19], p[20], p[21]
        floor = p[35]
        for i in range(n):
            v = y[i] + bm
            t = v * inv
            t = m4 if t < m4 else t
            t = p4 if t > p4 else t
            z = t * t
            z = floor if z < floor else z  # erf.POLY_Z_FLOOR: no subnormal terms
            pp = (((((c0 * z + c1) * z + c2) * z + c3) * z + c4) * z + c5) * z + c6
            q = (((d0 * z + d1) * z + d2) * z + d3) * z + d4
            y[i] = ((pp * t) / q + one) * v * half
