"""Kernels (nn): recurrent layers -- RNN, GRU, LSTM, all opsets.

Contract (ONNX): ``X`` is ``[seq, batch, input]`` (``[batch, seq, input]`` with layout=1);
``W``/``R``/``B`` hold per-direction gate weights in ONNX gate order (GRU ``z r h``, LSTM
``i o f c``); optional ``sequence_lens``, ``initial_h`` (``initial_c`` and peepholes ``P`` for
LSTM). Outputs ``Y`` ``[seq, dirs, batch, hidden]`` (``[batch, seq, dirs, hidden]`` with
layout=1), ``Y_h`` (and ``Y_c``) ``[dirs, batch, hidden]`` (``[batch, dirs, hidden]``).
Steps past a batch entry's ``sequence_lens`` give 0 in ``Y`` and keep the state.

Load time: when W, R, B (and P) are constants, the builder transposes the weights, sums the
biases, concatenates the directions' input weights and builds each direction's cell closure,
so a call is one input projection ``X @ W^T`` for all steps and directions, then per step one
matmul of the recurrent part (two for GRU with linear_before_reset=0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import float_compute_dtype
from ..registry import KernelRegistry
from .rnn_common import Activation, RnnSpec, Step, run_direction, seq_masks

__all__ = ["register_kernels"]

#: (input weights ``[I, dirs*G*H]``, summed bias ``[dirs*G*H]``, one step per direction)
PrepResult = tuple[np.ndarray, np.ndarray, list[Step]]
#: ``prep(W, R, B, P, dtype)``: run at load for constant weights, else per call.
Prep = Callable[[np.ndarray, np.ndarray, Any, Any, np.dtype], PrepResult]


def _clipped(f: Activation, clip: float | None) -> Activation:
    """``f`` applied to its input clipped to [-clip, clip] (ONNX: clip acts on activations'
    inputs)."""
    if clip is None:
        return f

    def g(x: np.ndarray) -> np.ndarray:
        return f(np.clip(x, -clip, clip, out=x))

    return g


def _split_bias(B: Any, nd: int, G: int, H: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(Wb, Rb), each ``[nd, G*H]`` in ``dtype``; zeros when B is omitted."""
    if B is None:
        z = np.zeros((nd, G * H), dtype)
        return z, z
    B = np.asarray(B, dtype=dtype).reshape(nd, 2 * G * H)
    return B[:, : G * H], B[:, G * H :]


# -- cells: each factory returns one direction's step(xt, h, c) -> (h_new, c_new) ------------


def _rnn_step(RT: np.ndarray, f: Activation) -> Step:
    def step(xt: np.ndarray, h: np.ndarray, c: Any) -> tuple[np.ndarray, Any]:
        g = h @ RT
        g += xt
        return f(g), None

    return step


def _gru_step_lbr(RT: np.ndarray, rbh: np.ndarray, f: Activation, g: Activation) -> Step:
    """linear_before_reset=1: ``h~ = g(x Wh + r * (H Rh + Rbh) + Wbh)``."""
    H = RT.shape[0]

    def step(xt: np.ndarray, h: np.ndarray, c: Any) -> tuple[np.ndarray, Any]:
        a = h @ RT
        zr = a[:, : 2 * H]
        zr += xt[:, : 2 * H]
        f(zr)
        hh = a[:, 2 * H :]
        hh += rbh
        hh *= zr[:, H:]
        hh += xt[:, 2 * H :]
        g(hh)
        hn = h - hh  # (1 - z) * h~ + z * H  ==  h~ + z * (H - h~)
        hn *= zr[:, :H]
        hn += hh
        return hn, None

    return step


def _gru_step(RT: np.ndarray, f: Activation, g: Activation) -> Step:
    """linear_before_reset=0: ``h~ = g(x Wh + (r * H) Rh + Rbh + Wbh)``."""
    H = RT.shape[0]
    RT_zr = np.ascontiguousarray(RT[:, : 2 * H])
    RT_h = np.ascontiguousarray(RT[:, 2 * H :])

    def step(xt: np.ndarray, h: np.ndarray, c: Any) -> tuple[np.ndarray, Any]:
        zr = h @ RT_zr
        zr += xt[:, : 2 * H]
        f(zr)
        hh = (zr[:, H:] * h) @ RT_h
        hh += xt[:, 2 * H :]
        g(hh)
        hn = h - hh
        hn *= zr[:, :H]
        hn += hh
        return hn, None

    return step


def _lstm_step(
    RT: np.ndarray,
    f: Activation,
    g: Activation,
    h_act: Activation,
    input_forget: bool,
    fused: bool,
) -> Step:
    """No peepholes: one activation call covers the i, o, f gates (contiguous columns).

    ``fused``: f is a sigmoid on pre-halved inputs and g, h are Tanh, so one ``tanh`` over
    all four gates plus ``0.5 * t + 0.5`` on i, o, f computes every gate."""
    H = RT.shape[0]
    n_sig = 2 * H if input_forget else 3 * H
    h_out = np.tanh if fused else (lambda x: h_act(x.copy()))

    def step(xt: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, Any]:
        a = h @ RT
        a += xt
        if fused:
            np.tanh(a, out=a)
            s = a[:, :n_sig]
            s *= 0.5
            s += 0.5
            cc = a[:, 3 * H :]
        else:
            f(a[:, :n_sig])
            cc = g(a[:, 3 * H :])
        fg = 1 - a[:, :H] if input_forget else a[:, 2 * H : 3 * H]
        cc *= a[:, :H]
        cn = fg * c
        cn += cc
        hn = h_out(cn)
        hn *= a[:, H : 2 * H]
        return hn, cn

    return step


def _lstm_step_peep(
    RT: np.ndarray,
    p: np.ndarray,
    f: Activation,
    g: Activation,
    h_act: Activation,
    input_forget: bool,
) -> Step:
    """Peepholes ``p = [Pi, Po, Pf]``: i, f see C(t-1), o sees C(t)."""
    H = RT.shape[0]
    pi, po, pf = (np.ascontiguousarray(p[k * H : (k + 1) * H]) for k in range(3))

    def step(xt: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, Any]:
        a = h @ RT
        a += xt
        i = a[:, :H]
        i += pi * c
        f(i)
        if input_forget:
            fg = 1 - i
        else:
            fg = a[:, 2 * H : 3 * H]
            fg += pf * c
            f(fg)
        cc = g(a[:, 3 * H :])
        cc *= i
        cn = fg * c
        cn += cc
        o = a[:, H : 2 * H]
        o += po * cn
        f(o)
        hn = h_act(cn.copy())
        hn *= o
        return hn, cn

    return step


def _sigmoid_prehalved(x: np.ndarray) -> np.ndarray:
    """Sigmoid of ``2 x``: the weights feeding it were halved at load (saves one op)."""
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5
    return x


def _direction_weights(
    spec: RnnSpec, d: int, W: np.ndarray, R: np.ndarray, bias: np.ndarray, n_sig: int, dt: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Direction ``d``'s (W [G*H, I], R^T [H, G*H], bias [G*H], halved).

    When the first activation is a plain Sigmoid (no clip), the rows of its ``n_sig`` gate
    columns are halved, since ``sigmoid(x) = 0.5 * tanh(x / 2) + 0.5``."""
    Wd = np.array(W[d], dtype=dt)
    Rd = np.array(R[d], dtype=dt)
    bd = np.array(bias[d], dtype=dt)
    halved = n_sig > 0 and spec.clip is None and spec.act_names[d][0] == "sigmoid"
    if halved:
        Wd[:n_sig] *= 0.5
        Rd[:n_sig] *= 0.5
        bd[:n_sig] *= 0.5
    return Wd, np.ascontiguousarray(Rd.T), bd, halved


def _join(Ws: list[np.ndarray], biases: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``[I, nd*G*H]``: every direction's W transposed side by side, and the joined bias."""
    return np.ascontiguousarray(np.concatenate(Ws, axis=0).T), np.concatenate(biases)


def _rnn_prep(spec: RnnSpec) -> Prep:
    def prep(W: np.ndarray, R: np.ndarray, B: Any, P: Any, dt: np.dtype) -> PrepResult:
        nd, H = spec.num_directions, R.shape[-1]
        Wb, Rb = _split_bias(B, nd, 1, H, dt)
        bias = Wb + Rb
        Ws, bs, steps = [], [], []
        for d in range(nd):
            Wd, RT, bd, _ = _direction_weights(spec, d, W, R, bias, 0, dt)
            Ws.append(Wd)
            bs.append(bd)
            steps.append(_rnn_step(RT, _clipped(spec.acts[d][0], spec.clip)))
        return (*_join(Ws, bs), steps)

    return prep


def _gru_prep(spec: RnnSpec, linear_before_reset: bool) -> Prep:
    def prep(W: np.ndarray, R: np.ndarray, B: Any, P: Any, dt: np.dtype) -> PrepResult:
        nd, H = spec.num_directions, R.shape[-1]
        Wb, Rb = _split_bias(B, nd, 3, H, dt)
        bias = Wb + Rb
        if linear_before_reset:
            bias[:, 2 * H :] = Wb[:, 2 * H :]  # Rbh goes inside r * (...)
        Ws, bs, steps = [], [], []
        for d in range(nd):
            Wd, RT, bd, halved = _direction_weights(spec, d, W, R, bias, 2 * H, dt)
            Ws.append(Wd)
            bs.append(bd)
            f = _sigmoid_prehalved if halved else _clipped(spec.acts[d][0], spec.clip)
            g = _clipped(spec.acts[d][1], spec.clip)
            if linear_before_reset:
                steps.append(_gru_step_lbr(RT, np.ascontiguousarray(Rb[d, 2 * H :]), f, g))
            else:
                steps.append(_gru_step(RT, f, g))
        return (*_join(Ws, bs), steps)

    return prep


def _lstm_prep(spec: RnnSpec, input_forget: bool) -> Prep:
    def prep(W: np.ndarray, R: np.ndarray, B: Any, P: Any, dt: np.dtype) -> PrepResult:
        nd, H = spec.num_directions, R.shape[-1]
        Wb, Rb = _split_bias(B, nd, 4, H, dt)
        bias = Wb + Rb
        Pa = None if P is None else np.array(P, dtype=dt).reshape(nd, 3 * H)
        Ws, bs, steps = [], [], []
        for d in range(nd):
            Wd, RT, bd, halved = _direction_weights(spec, d, W, R, bias, 3 * H, dt)
            Ws.append(Wd)
            bs.append(bd)
            f, g, h_act = (_clipped(a, spec.clip) for a in spec.acts[d])
            if halved:
                f = _sigmoid_prehalved
            if Pa is None:
                fused = halved and spec.act_names[d][1:] == ("tanh", "tanh")
                steps.append(_lstm_step(RT, f, g, h_act, input_forget, fused))
            else:
                p = Pa[d] * 0.5 if halved else Pa[d]
                steps.append(_lstm_step_peep(RT, p, f, g, h_act, input_forget))
        return (*_join(Ws, bs), steps)

    return prep


# -- the generic compute ----------------------------------------------------------------------


def _prepare_constant(
    ctx: KernelContext, spec: RnnSpec, prep: Prep, has_c: bool
) -> tuple[Any, ...] | None:
    """(dtype, H, input weights, bias, steps) prepared at load when W, R, B (and P) are
    constants, else None (prepared per call)."""
    W_c, R_c, B_c = ctx.const_input(1), ctx.const_input(2), ctx.const_input(3)
    P_c = ctx.const_input(7) if has_c else None
    if (
        W_c is None
        or R_c is None
        or (B_c is None and ctx.has_input(3))
        or (P_c is None and has_c and ctx.has_input(7))
    ):
        return None
    dt0 = float_compute_dtype(W_c.dtype)
    prepared = (dt0, R_c.shape[-1], *prep(W_c, R_c, B_c, P_c, dt0))
    if spec.hidden_size is not None and spec.hidden_size != R_c.shape[-1]:
        raise ctx.unsupported(f"hidden_size {spec.hidden_size} but R is {R_c.shape}")
    return prepared


def _build(ctx: KernelContext, spec: RnnSpec, G: int, prep: Prep, has_c: bool) -> Any:
    """The compute function shared by the three ops; ``G`` gates per direction."""
    nd = spec.num_directions
    reverse = spec.reverse
    layout = spec.layout
    n_out = ctx.n_outputs
    want = tuple(ctx.has_output(i) for i in range(n_out))
    prepared = _prepare_constant(ctx, spec, prep, has_c)

    def compute(
        X: np.ndarray,
        W: np.ndarray,
        R: np.ndarray,
        B: Any = None,
        seq_lens: Any = None,
        h0: Any = None,
        c0: Any = None,
        P: Any = None,
    ) -> tuple:
        out_dtype = X.dtype
        if prepared is not None:
            dt, H, WT, bias, steps = prepared
        else:
            dt = float_compute_dtype(W.dtype)
            H = R.shape[-1]
            WT, bias, steps = prep(W, R, B, P, dt)
        if layout:
            X = X.swapaxes(0, 1)
            if h0 is not None:
                h0 = h0.swapaxes(0, 1)
            if c0 is not None:
                c0 = c0.swapaxes(0, 1)
        T, batch, I = X.shape
        XW = np.asarray(X, dtype=dt).reshape(T * batch, I) @ WT
        XW += bias
        XW = XW.reshape(T, batch, nd * G * H)
        masks = seq_masks(seq_lens, T, batch)
        Y = (np.empty if masks is None else np.zeros)((T, nd, batch, H), dt)
        Yh = np.empty((nd, batch, H), dt)
        Yc = np.empty((nd, batch, H), dt) if has_c else None
        for d in range(nd):
            h = np.zeros((batch, H), dt) if h0 is None else np.asarray(h0[d], dtype=dt)
            c = None
            if has_c:
                c = np.zeros((batch, H), dt) if c0 is None else np.asarray(c0[d], dtype=dt)
            xw = XW[:, :, d * G * H : (d + 1) * G * H]
            h, c = run_direction(steps[d], xw, h, c, Y, d, reverse[d], masks)
            Yh[d] = h
            if Yc is not None:
                Yc[d] = c
        if layout:  # back to batch-major
            outs: list[Any] = [Y.transpose(2, 0, 1, 3), Yh.swapaxes(0, 1)]
            outs.append(None if Yc is None else Yc.swapaxes(0, 1))
        else:
            outs = [Y, Yh, Yc]
        return tuple(
            np.ascontiguousarray(o, dtype=out_dtype) if w else None
            for o, w in zip(outs[:n_out], want, strict=True)
        )

    if n_out == 1:

        def compute1(*args: Any) -> Any:
            return compute(*args)[0]

        return compute1
    return compute


def _rnn(ctx: KernelContext) -> ComputeFn:
    """RNN: ``H = f(X W^T + H R^T + Wb + Rb)``; activations default Tanh."""
    spec = RnnSpec.parse(ctx, ("Tanh",))
    return _build(ctx, spec, 1, _rnn_prep(spec), has_c=False)


def _gru(ctx: KernelContext) -> ComputeFn:
    """GRU (gates z, r, h; f=Sigmoid, g=Tanh by default); linear_before_reset from opset 3."""
    spec = RnnSpec.parse(ctx, ("Sigmoid", "Tanh"))
    lbr = bool(ctx.attr("linear_before_reset", 0))
    return _build(ctx, spec, 3, _gru_prep(spec, lbr), has_c=False)


def _lstm(ctx: KernelContext) -> ComputeFn:
    """LSTM (gates i, o, f, c; f=Sigmoid, g=h=Tanh by default), peepholes P, input_forget
    (forget gate = 1 - input gate)."""
    spec = RnnSpec.parse(ctx, ("Sigmoid", "Tanh", "Tanh"))
    input_forget = bool(ctx.attr("input_forget", 0))
    return _build(ctx, spec, 4, _lstm_prep(spec, input_forget), has_c=True)


def register_kernels(registry: KernelRegistry) -> None:
    """Register RNN, GRU and LSTM (opset 1 onwards; layout from 14 via the attribute)."""
    registry.add("RNN", _rnn, since=1)
    registry.add("GRU", _gru, since=1)
    registry.add("LSTM", _lstm, since=1)
