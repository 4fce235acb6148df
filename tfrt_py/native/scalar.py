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
    "Sigmoid": _unary("({t}(1.0) / ({t}(1.0) + np.exp(-{x})))"),
    "Tanh": _unary("np.tanh({x})"),
    "Exp": _unary("np.exp({x})"),
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
