"""Shared machinery of the recurrent kernels (RNN, GRU, LSTM).

Load time: ``RnnSpec.parse`` reads the attributes every recurrent op shares (direction,
hidden_size, layout, clip, activations with their alpha/beta), and ``make_activation``
turns an ONNX activation name into an in-place NumPy function.

Call time: ``run_direction`` drives one direction's time loop over a cell ``step``
function, handling ``sequence_lens`` masking; the cells themselves live in ``rnn.py``.

Conventions: time-major ``[seq, batch, ...]`` internally (layout 1 inputs are transposed on
entry and outputs on exit); the compute dtype is the input's for float32/float64 and
float32 for narrower floats (float16, bfloat16), cast back on output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...records import record
from ..base import KernelContext

__all__ = [
    "Activation",
    "RnnSpec",
    "Step",
    "make_activation",
    "run_direction",
    "seq_masks",
]

#: An activation applied in place to an array the cell owns; returns that array.
Activation = Callable[[np.ndarray], np.ndarray]
#: One time step of one direction: ``step(x_proj_t, H, C) -> (H_new, C_new)``; ``C`` is
#: ``None`` for cells without a cell state. Returns fresh arrays (never views of inputs).
Step = Callable[[np.ndarray, np.ndarray, Any], tuple[np.ndarray, Any]]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 0.5 * tanh(x / 2) + 0.5: no overflow warning for large |x|, unlike 1 / (1 + exp(-x)).
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


def _softsign(x: np.ndarray) -> np.ndarray:
    d = np.abs(x)
    d += 1
    return np.divide(x, d, out=x)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x, out=x)


# name (lower case) -> (uses alpha, uses beta, default alpha, default beta)
_PARAMS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
}


def make_activation(name: str, alpha: float, beta: float) -> Activation:
    """The in-place NumPy function for ONNX recurrent activation ``name``."""
    key = name.lower()
    if key == "sigmoid":
        return _sigmoid
    if key == "tanh":
        return _tanh
    if key == "relu":
        return _relu
    if key == "softsign":
        return _softsign
    if key == "softplus":
        return _softplus
    if key == "affine":

        def affine(x: np.ndarray) -> np.ndarray:
            x *= alpha
            x += beta
            return x

        return affine
    if key == "leakyrelu":

        def leaky_relu(x: np.ndarray) -> np.ndarray:
            return np.multiply(x, alpha, out=x, where=x < 0)

        return leaky_relu
    if key == "thresholdedrelu":

        def thresholded_relu(x: np.ndarray) -> np.ndarray:
            x[x < alpha] = 0  # ONNX: x if x >= alpha else 0
            return x

        return thresholded_relu
    if key == "scaledtanh":

        def scaled_tanh(x: np.ndarray) -> np.ndarray:
            x *= beta
            np.tanh(x, out=x)
            x *= alpha
            return x

        return scaled_tanh
    if key == "hardsigmoid":

        def hard_sigmoid(x: np.ndarray) -> np.ndarray:
            x *= alpha
            x += beta
            return np.clip(x, 0, 1, out=x)

        return hard_sigmoid
    if key == "elu":

        def elu(x: np.ndarray) -> np.ndarray:
            neg = x < 0
            e = np.expm1(np.minimum(x, 0))
            e *= alpha
            np.copyto(x, e, where=neg)
            return x

        return elu
    raise KeyError(name)


@record(frozen=True)
class RnnSpec:
    """The attributes every recurrent op shares, parsed once at load."""

    hidden_size: int | None
    num_directions: int
    reverse: tuple[bool, ...]  # per direction
    layout: int
    clip: float | None
    acts: tuple[tuple[Activation, ...], ...]  # per direction, the op's activations in order
    act_names: tuple[tuple[str, ...], ...]

    @staticmethod
    def parse(ctx: KernelContext, default_acts: Sequence[str]) -> RnnSpec:
        """Read direction/hidden_size/layout/clip/activations; unsupported -> load error."""
        direction = ctx.attr("direction", "forward")
        if isinstance(direction, bytes):
            direction = direction.decode()
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.unsupported(f"direction {direction!r}")
        nd = 2 if direction == "bidirectional" else 1
        reverse = (False, True) if nd == 2 else (direction == "reverse",)
        layout = int(ctx.attr("layout", 0))
        if layout not in (0, 1):
            raise ctx.unsupported(f"layout {layout}")
        clip = ctx.attr("clip", None)
        hidden = ctx.attr("hidden_size", None)
        n = len(default_acts)
        names = [
            a.decode() if isinstance(a, bytes) else str(a) for a in ctx.attr("activations", [])
        ]
        if not names:
            names = list(default_acts) * nd
        elif len(names) == n and nd == 2:
            names = names * 2  # lenient: the forward list also serves the reverse direction
        if len(names) != n * nd:
            raise ctx.unsupported(f"expected {n * nd} activations, got {len(names)}")
        alphas = list(ctx.attr("activation_alpha", []))
        betas = list(ctx.attr("activation_beta", []))
        fns: list[Activation] = []
        for name in names:
            params = _PARAMS.get(name.lower())
            if params is None:
                raise ctx.unsupported(f"activation {name!r}")
            uses_a, uses_b, alpha, beta = params
            # Alphas/betas are consumed in order by the activations that take them.
            if uses_a and alphas:
                alpha = float(alphas.pop(0))
            if uses_b and betas:
                beta = float(betas.pop(0))
            fns.append(make_activation(name, alpha, beta))
        acts = tuple(tuple(fns[d * n : (d + 1) * n]) for d in range(nd))
        act_names = tuple(tuple(x.lower() for x in names[d * n : (d + 1) * n]) for d in range(nd))
        return RnnSpec(
            None if hidden is None else int(hidden),
            nd,
            reverse,
            layout,
            None if clip is None else float(clip),
            acts,
            act_names,
        )


def seq_masks(seq_lens: np.ndarray | None, T: int, batch: int) -> np.ndarray | None:
    """``[T, batch, 1]`` bool of valid steps, or None when every sequence is full length."""
    if seq_lens is None:
        return None
    lens = np.asarray(seq_lens).reshape(-1)
    if lens.shape[0] != batch:
        raise ValueError(f"sequence_lens has {lens.shape[0]} entries for batch size {batch}")
    if (lens >= T).all():
        return None
    return (np.arange(T)[:, None] < lens[None, :])[:, :, None]


def run_direction(
    step: Step,
    xw: np.ndarray,
    H: np.ndarray,
    C: Any,
    Y: np.ndarray,
    d: int,
    reverse: bool,
    masks: np.ndarray | None,
) -> tuple[np.ndarray, Any]:
    """Run one direction over all steps, writing ``Y[t, d]``; return the final (H, C).

    ``xw`` is the input projection ``[T, batch, gates*hidden]``. With ``masks``, steps past
    a batch entry's length keep its state and leave ``Y`` (zero-initialised) at 0; in
    reverse, a sequence starts at its own last valid step.
    """
    T = xw.shape[0]
    ts = range(T - 1, -1, -1) if reverse else range(T)
    if masks is None:
        for t in ts:
            H, C = step(xw[t], H, C)
            Y[t, d] = H
        return H, C
    for t in ts:
        m = masks[t]
        Hn, Cn = step(xw[t], H, C)
        np.copyto(Y[t, d], Hn, where=m)
        H = np.where(m, Hn, H)
        if C is not None:
            C = np.where(m, Cn, C)
    return H, C
