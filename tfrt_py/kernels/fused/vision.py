"""Kernels for the fused ops of the vision passes, in the private domain ``tfrt_py.fused``.

``Conv(X, W, B?, R?)`` (from ``fuse_conv``): ONNX Conv's attributes plus ``activation``
(a name from ``kernels.nn.conv_direct.ACTIVATIONS``, ``""`` for none), ``alpha``,
``beta`` (the activation's parameters: Clip's bounds, HardSigmoid's and LeakyRelu's
alpha/beta) and ``residual`` (1 when R is present: a tensor of the output's shape added
after the bias). Computes ``act(conv(X, W) + B + R)`` with the epilogue applied in one
pass over the conv result (``conv_with_epilogue``). Supports ``out=``.

``ChannelLayerNorm(X, scale, bias?)`` (from ``fuse_vision``): attribute ``epsilon``;
LayerNormalization over axis 1 alone of an (N, C, *spatial) tensor
(``kernels/nn/norm_channel.py``). Supports ``out=``.

``MatMulTransB(A, B, [sa, sb])`` (from ``fuse_transformer``): ``sa sb A @ swapaxes(B, -1, -2)`` with
NumPy's broadcasting over the leading axes; BLAS reads the transposed view directly (a
column-major operand), so the Transpose costs no copy. Supports ``out=``.

``SoftmaxAttention(Q, K, V, [sa, sb, s])`` (from ``fuse_transformer``): ``softmax(sa sb s Q
@ swapaxes(K, -1, -2), axis=-1) @ V`` in blocks of query rows (``kernels/lib/sdpa.py``); the
one-element scalings are optional (None where absent).
Supports ``out=``.

``SqueezeExcite(X, W1, B1, W2, B2)`` (from ``fuse_vision``): GlobalAveragePool, two 1x1
convolutions and the channel scaling in one kernel (``kernels/nn/squeeze_excite.py``).

``BatchNormAct(X, a, s)`` (from ``fuse_vision``): attributes ``activation``, ``alpha``,
``beta``; an inference BatchNormalization folded to a per-channel scale ``a`` and shift
``s`` (axis 1) and the activation after it, one pass (``kernels/nn/norm_affine.py``).
Supports ``out=``, input 0's buffer included.

``GroupNorm(X, gamma, beta)`` (from ``fuse_vision``): attributes ``groups``, ``epsilon``,
``activation`` (``Relu`` or ``""``); torch's GroupNorm with its per-channel affine and a
ReLU in one pass over each group (``kernels/nn/norm_group_jit.py``). Supports ``out=``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import OUT_INPLACE, Cost, KernelContext, KernelFlags
from ..lib.gemm import matmul_batched_into
from ..lib.sdpa import compile_at_build, softmax_attention
from ..nn.conv import Epilogue, conv_cost, conv_with_epilogue
from ..nn.norm_affine import batch_norm_act_fn
from ..nn.norm_channel import channel_layer_norm_fn
from ..nn.norm_group_jit import group_norm, group_norm_kernel
from ..nn.squeeze_excite import squeeze_excite_fn
from ..registry import KernelRegistry
from .domain import DOMAIN

__all__ = ["register_kernels"]


def _fused_conv(ctx: KernelContext) -> Any:
    """The fused Conv: ``fn(X, W, B=None, R=None, out=None)``."""
    epi = Epilogue(
        str(ctx.attr("activation", "")),
        float(ctx.attr("alpha", 0.0)),
        float(ctx.attr("beta", 0.0)),
        bool(ctx.attr("residual", 0)),
    )
    return conv_with_epilogue(ctx, epi)


def _batch_norm_act(ctx: KernelContext) -> Any:
    """BatchNormAct: ``fn(x, a, s, out=None)``, the folded scale and shift read at load."""
    a, s = ctx.const_input(1), ctx.const_input(2)
    if a is None or s is None or a.ndim != 1 or s.shape != a.shape:
        raise ctx.unsupported("BatchNormAct needs constant (C,) scale and shift")
    epi = Epilogue(str(ctx.attr("activation", "")), float(ctx.attr("alpha", 0.0)),
                   float(ctx.attr("beta", 0.0)))  # fmt: skip
    fn = batch_norm_act_fn(a, s, epi)

    def batch_norm_act(x: np.ndarray, _a: Any, _s: Any, out: Any = None) -> np.ndarray:
        return fn(x, out)

    return batch_norm_act


def _channel_layer_norm(ctx: KernelContext) -> Any:
    """ChannelLayerNorm: ``fn(x, scale, bias=None, out=None)``."""
    eps = float(ctx.attr("epsilon", 1e-5))
    norm = channel_layer_norm_fn()

    def channel_layer_norm(
        x: np.ndarray, scale: np.ndarray, bias: Any = None, out: Any = None
    ) -> np.ndarray:
        if x.ndim < 2 or scale.shape != (x.shape[1],):
            raise ValueError(
                f"ChannelLayerNorm {ctx.node_name!r}: input {x.shape}, scale {scale.shape}"
            )
        return norm(x, scale, bias, eps, out)

    return channel_layer_norm


def _channel_norm_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    n = float(math.prod(ins[0])) if ins else 0.0
    return Cost(8.0 * n, 8.0 * n)


def _group_norm(ctx: KernelContext) -> Any:
    """GroupNorm: ``fn(x, gamma, beta, out=None)``, the affine read at load."""
    gamma, beta = ctx.const_input(1), ctx.const_input(2)
    if gamma is None or beta is None:
        raise ctx.unsupported("GroupNorm needs a constant scale and bias")
    g, b = gamma.reshape(-1), beta.reshape(-1)
    groups, eps = int(ctx.attr("groups", 1)), float(ctx.attr("epsilon", 1e-5))
    relu = str(ctx.attr("activation", "")) == "Relu"
    fn = group_norm_kernel()

    def group_norm_fn(x: np.ndarray, _g: Any, _b: Any, out: Any = None) -> np.ndarray:
        return group_norm(x, g.astype(x.dtype, copy=False), b.astype(x.dtype, copy=False),
                          groups, eps, relu, out, fn)  # fmt: skip

    return group_norm_fn


def _squeeze_excite(ctx: KernelContext) -> Any:
    """SqueezeExcite: ``fn(x, W1, B1=None, W2, B2=None, out=None)`` -> ``x * act2(W2 @
    act1(W1 @ mean(x) + B1) + B2)`` per image and channel (``fuse_vision``), one compiled
    pass (``kernels/nn/squeeze_excite.py``)."""
    w1, w2 = ctx.const_input(1), ctx.const_input(3)
    if w1 is None or w2 is None:
        raise ctx.unsupported("SqueezeExcite needs constant weights")
    epi1, epi2 = (
        Epilogue(str(ctx.attr(f"activation{i}", "")), float(ctx.attr(f"alpha{i}", 0.0)),
                 float(ctx.attr(f"beta{i}", 0.0)))
        for i in (1, 2)
    )  # fmt: skip
    fn = squeeze_excite_fn(w1, ctx.const_input(2), w2, ctx.const_input(4), epi1, epi2)

    def squeeze_excite(
        x: np.ndarray, _w1: Any, _b1: Any, _w2: Any, _b2: Any, out: np.ndarray | None = None
    ) -> np.ndarray:
        return fn(x, out)

    return squeeze_excite


def _squeeze_excite_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    x = float(math.prod(ins[0])) if ins and ins[0] else 0.0
    w = sum(float(math.prod(s)) for s in ins[1:] if s)
    return Cost(2.0 * x + 4.0 * w, 8.0 * x + 4.0 * w)


def _matmul_transb(ctx: KernelContext) -> Any:
    """MatMulTransB: ``fn(a, b, sa=None, sb=None, out=None) -> (sa * a) @ (sb * b).swapaxes(-1,
    -2)``, the one-element scalings ``sa``/``sb`` (``fuse_transformer``) applied to the
    product as one factor."""

    def matmul_transb(a: np.ndarray, b: np.ndarray, *scales: Any, out: Any = None) -> Any:
        if not scales:
            return matmul_batched_into(a, b, out, trans_b=True)
        alpha = 1.0
        for s in scales:
            if s is not None:
                alpha *= float(np.asarray(s).reshape(-1)[0])
        return matmul_batched_into(a, b, out, trans_b=True, alpha=alpha)

    return matmul_transb


def _softmax_attention(ctx: KernelContext) -> Any:
    """SoftmaxAttention: ``fn(q, k, v, sa=None, sb=None, s=None, out=None)``."""
    compile_at_build(ctx.input_dtype(0))

    def softmax_attention_fn(
        q: np.ndarray, k: np.ndarray, v: np.ndarray, *scales: Any, out: Any = None
    ) -> Any:
        alpha = 1.0
        for s in scales:
            if s is not None:
                alpha *= float(np.asarray(s).reshape(-1)[0])
        return softmax_attention(q, k, v, alpha, out)

    return softmax_attention_fn


def _softmax_attention_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    if len(ins) < 3 or not outs or len(ins[0]) < 2 or len(ins[1]) < 2:
        return Cost(0.0, 0.0)
    scores = float(math.prod(ins[0][:-1])) * ins[1][-2]
    flops = 2.0 * scores * (ins[0][-1] + outs[0][-1]) + 8.0 * scores
    return Cost(flops, 4.0 * sum(math.prod(s) for s in (*ins[:3], outs[0])))


def _matmul_transb_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    if len(ins) < 2 or not outs or not ins[0]:
        return Cost(0.0, 0.0)
    y = float(math.prod(outs[0]))
    k = ins[0][-1]
    return Cost(2.0 * y * k, 4.0 * (math.prod(ins[0]) + math.prod(ins[1]) + y))


def register_kernels(registry: KernelRegistry) -> None:
    """Register the vision passes' fused ops into ``registry``."""
    out = KernelFlags(supports_out=True)
    registry.add("Conv", _fused_conv, domain=DOMAIN, flags=out, cost=conv_cost)
    registry.add("MatMulTransB", _matmul_transb, domain=DOMAIN, flags=out, cost=_matmul_transb_cost)
    registry.add(
        "SoftmaxAttention",
        _softmax_attention,
        domain=DOMAIN,
        flags=out,
        cost=_softmax_attention_cost,
    )
    registry.add(
        "ChannelLayerNorm", _channel_layer_norm, domain=DOMAIN, flags=out, cost=_channel_norm_cost
    )
    registry.add(
        "SqueezeExcite", _squeeze_excite, domain=DOMAIN, flags=out, cost=_squeeze_excite_cost
    )
    registry.add("GroupNorm", _group_norm, domain=DOMAIN, flags=out, cost=_channel_norm_cost)
    registry.add("BatchNormAct", _batch_norm_act, domain=DOMAIN, flags=OUT_INPLACE,
                 cost=_channel_norm_cost)  # fmt: skip
