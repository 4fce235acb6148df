"""Scalar expressions for elementwise ONNX ops in the generated numba code.

``expr(op, args, attrs, t)`` returns one expression computing the op on scalar operands
``args`` (expressions; ``"None"`` for an omitted optional input) of float type ``t``
(the generated module's alias ``f4``/``f8``). Constants are wrapped in ``t(...)`` so the
arithmetic stays in the model's dtype, as NumPy's kernels do (Python scalars are weak);
attribute values reach the text only through ``source.literal`` (numbers; anything else
raises TypeError, and the lowering declines).
The formulas follow the NumPy kernels in ``tfrt_py.kernels`` step by step; libm may
differ from NumPy's by an ulp. Pure functions: no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .source import literal

__all__ = ["SCALAR_OPS", "expr"]


def _c(t: str, x: Any) -> str:
    """A constant of type ``t``: ``x`` (an attribute value) must be a number; a string or
    anything else is a TypeError (the lowering declines)."""
    if isinstance(x, np.ndarray) and x.size == 1:
        x = x.reshape(()).item()
    if isinstance(x, (bool, int, np.bool_, np.integer)):
        x = float(x)
    return f"{t}({literal(x)})"


def _relu(a: list[str], at: dict[str, Any], t: str) -> str:
    # np.maximum(x, 0) propagates NaN: "x < 0" is False for NaN.
    return f"({t}(0.0) if {a[0]} < {t}(0.0) else {a[0]})"


def _leaky(a: list[str], at: dict[str, Any], t: str) -> str:
    x, al = a[0], _c(t, at.get("alpha", 0.01))
    return f"({x} if {x} >= {t}(0.0) else {x} * {al})"


def _elu_like(alpha: float, gamma: float) -> Callable[[list[str], dict[str, Any], str], str]:
    def f(a: list[str], at: dict[str, Any], t: str) -> str:
        x = a[0]
        al = _c(t, at.get("alpha", alpha))
        r = f"({x} if {x} > {t}(0.0) else {al} * np.expm1({x}))"
        g = at.get("gamma", gamma)
        return r if g == 1.0 else f"({_c(t, g)} * {r})"

    return f


def _hard_sigmoid(a: list[str], at: dict[str, Any], t: str) -> str:
    al, be = _c(t, at.get("alpha", 0.2)), _c(t, at.get("beta", 0.5))
    return f"min(max({a[0]} * {al} + {be}, {t}(0.0)), {t}(1.0))"


def _hard_swish(a: list[str], at: dict[str, Any], t: str) -> str:
    x = a[0]
    return f"({x} * min(max({x} * {_c(t, 1 / 6)} + {t}(0.5), {t}(0.0)), {t}(1.0)))"


def _clip(a: list[str], at: dict[str, Any], t: str) -> str:
    x = a[0]
    lo = a[1] if len(a) > 1 and a[1] != "None" else None
    hi = a[2] if len(a) > 2 and a[2] != "None" else None
    if lo is None and "min" in at:
        lo = _c(t, at["min"])
    if hi is None and "max" in at:
        hi = _c(t, at["max"])
    if lo is not None:
        x = f"({lo} if {x} < {lo} else {x})"
    if hi is not None:
        x = f"({hi} if {x} > {hi} else {x})"
    return x


def _horner(z: str, coeffs: Any, t: str) -> str:
    expr_ = _c(t, float(coeffs[0]))
    for c in coeffs[1:]:
        expr_ = f"({expr_} * {z} + {_c(t, float(c))})"
    return expr_


def _gelu(a: list[str], at: dict[str, Any], t: str) -> str:
    """GELU: the erf form ``x (erf(x / sqrt 2) + 1) / 2``, with float32 erf as the
    interpreter's (``kernels/lib/erf.erf_f32``: clamped to [-4, 4], ``t P(t^2) / Q(t^2)``, a
    branch-free expression LLVM vectorizes) and float64 libm's ``erf``; or the tanh form
    (``approximate`` "tanh"; float32 as ``x sigmoid(2u)`` with ``kern_math.expf``, which
    the module then imports: ``lower._assemble``)."""
    from ...kernels.lib.erf import _P32, _Q32

    x = a[0]
    approx = at.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    if approx == "tanh":
        inner = f"{_c(t, math.sqrt(2.0 / math.pi))} * ({x} + {_c(t, 0.044715)} * {x} * {x} * {x})"
        if t == "f4":  # x sigmoid(2u) = x (1 + tanh u) / 2, with kern_math's vectorizable expf
            return f"({x} / ({t}(1.0) + expf({t}(-2.0) * {inner})))"
        return f"({x} * ({t}(1.0) + np.tanh({inner})) * {t}(0.5))"
    if approx != "none":
        raise TypeError("Gelu approximate must be none or tanh")
    if t == "f8":
        return f"({x} * (math.erf({x} * {_c(t, 1.0 / math.sqrt(2.0))}) + {t}(1.0)) * {t}(0.5))"
    v = f"({x} * {_c(t, 1.0 / math.sqrt(2.0))})"
    # clamped as the interpreter's loop does it: a NaN passes through both tests
    c = f"({t}(4.0) if {v} > {t}(4.0) else ({t}(-4.0) if {v} < {t}(-4.0) else {v}))"
    z = f"({c} * {c})"
    erf = f"({_horner(z, _P32, t)} * {c} / {_horner(z, _Q32, t)})"
    return f"(({erf} + {t}(1.0)) * {x} * {t}(0.5))"


def _swish(a: list[str], at: dict[str, Any], t: str) -> str:
    """x * sigmoid(alpha x) = x / (1 + exp(-alpha x)) (SiLU at alpha 1: Llama's MLP),
    float32 through kern_math's vectorizable expf."""
    x, na = a[0], _c(t, -float(at.get("alpha", 1.0)))
    exp = "expf" if t == "f4" else "np.exp"
    return f"({x} / ({t}(1.0) + {exp}({na} * {x})))"


def _exp(a: list[str], at: dict[str, Any], t: str) -> str:
    """float32 through ``fastmath.expf_rn``: libm's correctly rounded ``expf`` (what numba's
    ``np.exp`` calls, one call per element), the same values, in a loop LLVM vectorizes."""
    return f"expf_rn({a[0]})" if t == "f4" else f"np.exp({a[0]})"


def _unary(fmt: str) -> Callable[[list[str], dict[str, Any], str], str]:
    return lambda a, at, t: fmt.format(x=a[0], t=t)


def _binary(fmt: str) -> Callable[[list[str], dict[str, Any], str], str]:
    return lambda a, at, t: fmt.format(a=a[0], b=a[1], t=t)


SCALAR_OPS: dict[str, Callable[[list[str], dict[str, Any], str], str]] = {
    "Relu": _relu,
    "LeakyRelu": _leaky,
    "Elu": _elu_like(1.0, 1.0),
    "Selu": _elu_like(1.67326319217681884765625, 1.05070102214813232421875),
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Clip": _clip,
    "Gelu": _gelu,
    "Swish": _swish,
    "Sigmoid": _unary("({t}(1.0) / ({t}(1.0) + np.exp(-{x})))"),
    "Tanh": _unary("np.tanh({x})"),
    "Exp": _exp,
    "Log": _unary("np.log({x})"),
    "Sqrt": _unary("np.sqrt({x})"),
    "Abs": _unary("abs({x})"),
    "Neg": _unary("(-{x})"),
    "Reciprocal": _unary("({t}(1.0) / {x})"),
    "Floor": _unary("np.floor({x})"),
    "Ceil": _unary("np.ceil({x})"),
    "Sin": _unary("np.sin({x})"),
    "Cos": _unary("np.cos({x})"),
    "Softsign": _unary("({x} / ({t}(1.0) + abs({x})))"),
    # np.sign's: +0.0 for either zero, NaN kept (a OneClassSVM's decision to +1 / -1)
    "Sign": _unary(
        "({t}(1.0) if {x} > {t}(0.0) else ({t}(-1.0) if {x} < {t}(0.0) "
        "else ({t}(0.0) if {x} == {t}(0.0) else {x})))"
    ),
    "Identity": _unary("{x}"),
    "Add": _binary("({a} + {b})"),
    "Sub": _binary("({a} - {b})"),
    "Mul": _binary("({a} * {b})"),
    "Div": _binary("({a} / {b})"),
    "Pow": _binary("({a} ** {b})"),
    # np.maximum/np.minimum propagate NaN from either side.
    "Max": _binary("({a} if {a} >= {b} or {a} != {a} else {b})"),
    "Min": _binary("({a} if {a} <= {b} or {a} != {a} else {b})"),
}


def expr(op: str, args: list[str], attrs: dict[str, Any], t: str) -> str:
    """The expression for ``op`` (KeyError if it has none)."""
    return SCALAR_OPS[op](args, attrs, t)
