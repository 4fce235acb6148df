"""Kernels (nn): the transformer ops besides Attention -- RotaryEmbedding, SwiGLU,
CausalConvWithState, LinearAttention and FlexAttention (ai.onnx.preview).

* RotaryEmbedding-23: 4-D ``(B, H, S, D)`` or 3-D ``(B, S, H*D)`` input (``num_heads``),
  half-split or ``interleaved`` rotation of the first ``rotary_embedding_dim`` features,
  caches gathered by ``position_ids`` or given per ``(B, S)``.
* RotaryEmbedding-1 (com.microsoft): the same rotation, inputs ``(input, position_ids,
  cos_cache, sin_cache)``, ``position_ids`` per ``(B, S)`` or one offset.
* SwiGLU-28: ``Swish_alpha(A) * B`` with equal shapes.
* CausalConvWithState-27: depthwise causal 1-D convolution with carried state, optional
  fused SiLU; returns ``(output, present_state)``.
* LinearAttention-27: the recurrent linear/gated/delta/gated_delta update, sequential over
  time in float32 (state ``(B, Hkv, dk, dv)``), GQA by sharing each KV state.
* FlexAttention-1 (ai.onnx.preview): scaled dot-product attention with optional
  ``score_mod``/``prob_mod`` subgraphs, softmax in ``softmax_precision`` (float32 default,
  float64 for double inputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import CONTROL_FLOW, OUT, ComputeFn, KernelContext
from ..common import float_compute_dtype
from ..registry import KernelRegistry
from .attention import precision_dtype

__all__ = ["register_kernels"]


def _rotary_embedding(ctx: KernelContext) -> ComputeFn:
    """RotaryEmbedding-23: ``(X, cos_cache, sin_cache, position_ids?) -> Y``."""
    interleaved = bool(ctx.attr("interleaved", 0))
    rot_attr = int(ctx.attr("rotary_embedding_dim", 0))
    num_heads = int(ctx.attr("num_heads", 0))

    def rotary_embedding(
        X: np.ndarray,
        cos_cache: np.ndarray,
        sin_cache: np.ndarray,
        position_ids: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        if position_ids is not None:
            cos_cache = cos_cache[position_ids]
            sin_cache = sin_cache[position_ids]
        # Caches are (B, S, rd/2); view X as heads-last or heads-second accordingly.
        if X.ndim == 4:
            x4 = X  # (B, H, S, D)
            cos = cos_cache[:, None]
            sin = sin_cache[:, None]
        else:
            if num_heads <= 0:
                raise ValueError("RotaryEmbedding: 3-D input needs num_heads")
            x4 = X.reshape(X.shape[0], X.shape[1], num_heads, -1)  # (B, S, H, D)
            cos = cos_cache[:, :, None]
            sin = sin_cache[:, :, None]
        d = x4.shape[-1]
        rd = rot_attr or d
        half = rd // 2
        if out is None:
            out = np.empty(X.shape, dtype=X.dtype)
        o4 = out.reshape(x4.shape)
        if interleaved:
            x1, x2 = x4[..., 0:rd:2], x4[..., 1:rd:2]
            o1, o2 = o4[..., 0:rd:2], o4[..., 1:rd:2]
        else:
            x1, x2 = x4[..., :half], x4[..., half:rd]
            o1, o2 = o4[..., :half], o4[..., half:rd]
        np.multiply(cos, x1, out=o1)
        o1 -= sin * x2
        np.multiply(sin, x1, out=o2)
        o2 += cos * x2
        if rd < d:
            o4[..., rd:] = x4[..., rd:]
        return out

    return rotary_embedding


def _swiglu(ctx: KernelContext) -> ComputeFn:
    """SwiGLU-28: ``(A, B) -> A * sigmoid(alpha * A) * B``."""
    alpha = float(ctx.attr("alpha", 1.0))

    def swiglu(A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        cdt = float_compute_dtype(A.dtype)
        g = np.multiply(A, cdt.type(-alpha), dtype=cdt)
        np.exp(g, out=g)
        g += 1
        np.divide(A, g, out=g, casting="unsafe")
        g *= B
        if out is None:
            return g if g.dtype == A.dtype else g.astype(A.dtype)
        np.copyto(out, g, casting="unsafe")
        return out

    return swiglu


def _causal_conv_with_state(ctx: KernelContext) -> ComputeFn:
    """CausalConvWithState-27: ``(input, weight, bias?, past_state?) ->
    (output, present_state)``; depthwise, causal, optional fused SiLU."""
    activation = ctx.attr("activation", "none")
    if isinstance(activation, bytes):
        activation = activation.decode()
    if activation not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation {activation!r}")
    silu = activation != "none"

    def causal_conv_with_state(
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray | None = None,
        past_state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        b, c, length = x.shape
        k = weight.shape[2]
        cdt = float_compute_dtype(x.dtype)
        if past_state is None:
            padded = np.zeros((b, c, length + k - 1), dtype=x.dtype)
            padded[:, :, k - 1 :] = x
        else:
            padded = np.concatenate((past_state.astype(x.dtype, copy=False), x), axis=2)
        w = weight.reshape(c, k).astype(cdt, copy=False)
        acc = np.multiply(padded[:, :, 0:length], w[:, 0:1], dtype=cdt)
        for j in range(1, k):
            acc += padded[:, :, j : j + length] * w[:, j : j + 1]
        if bias is not None:
            acc += bias.astype(cdt, copy=False)[:, None]
        if x.dtype != cdt:
            acc = acc.astype(x.dtype).astype(np.float32) if silu else acc
        if silu:
            sig = np.negative(acc)
            np.exp(sig, out=sig)
            sig += 1
            acc = acc / sig
        output = acc if acc.dtype == x.dtype else acc.astype(x.dtype)
        present = padded[:, :, padded.shape[2] - (k - 1) :].copy()
        return output, present

    return causal_conv_with_state


def _linear_attention(ctx: KernelContext) -> ComputeFn:
    """LinearAttention-27: ``(query, key, value, past_state?, decay?, beta?) ->
    (output, present_state)``; all 3-D packed except the 4-D state."""
    rule = ctx.attr("update_rule", "gated_delta")
    if isinstance(rule, bytes):
        rule = rule.decode()
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.unsupported(f"update_rule {rule!r}")
    hq = int(ctx.attr("q_num_heads"))
    hkv = int(ctx.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.unsupported("q_num_heads must be a positive multiple of kv_num_heads")
    scale_attr = float(ctx.attr("scale", 0.0))
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    if gating != ctx.has_input(4):
        raise ctx.unsupported(f"update_rule {rule!r} {'needs' if gating else 'forbids'} decay")
    if delta != ctx.has_input(5):
        raise ctx.unsupported(f"update_rule {rule!r} {'needs' if delta else 'forbids'} beta")
    group = hq // hkv
    f32 = np.float32

    def linear_attention(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        past_state: np.ndarray | None = None,
        decay: np.ndarray | None = None,
        beta: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        b, t, _ = query.shape
        dk = query.shape[2] // hq
        dv = value.shape[2] // hkv
        # (T, B, Hkv, G, dk) so that each step reads one contiguous slab.
        q = query.reshape(b, t, hkv, group, dk).transpose(1, 0, 2, 3, 4).astype(f32)
        k = key.reshape(b, t, hkv, dk).transpose(1, 0, 2, 3).astype(f32)
        v = value.reshape(b, t, hkv, dv).transpose(1, 0, 2, 3).astype(f32)
        g = None
        if decay is not None:
            g = np.exp(decay.astype(f32))
            g = g.reshape(b, t, hkv, -1).transpose(1, 0, 2, 3)[..., None]  # (T,B,Hkv,dk|1,1)
        bt = None
        if beta is not None:
            bt = beta.astype(f32).reshape(b, t, -1).transpose(1, 0, 2)[..., None]  # (T,B,h,1)
        if past_state is not None:
            state = past_state.astype(f32)  # a fresh copy
            state_dtype = past_state.dtype
        else:
            state = np.zeros((b, hkv, dk, dv), dtype=f32)
            state_dtype = query.dtype
        scale = scale_attr if scale_attr != 0.0 else 1.0 / float(np.sqrt(dk))
        out = np.empty((t, b, hkv, group, dv), dtype=f32)
        for i in range(t):
            if g is not None:
                state *= g[i]
            kt = k[i]
            vt = v[i]
            if bt is not None:
                retrieved = np.matmul(kt[:, :, None, :], state)[:, :, 0]  # (B, Hkv, dv)
                vt = bt[i] * (vt - retrieved)
            state += kt[..., :, None] * vt[..., None, :]
            np.matmul(q[i], state, out=out[i])
        out *= scale
        output = out.transpose(1, 0, 2, 3, 4).reshape(b, t, hq * dv).astype(query.dtype)
        return output, state.astype(state_dtype, copy=False)

    return linear_attention


def _flex_attention(ctx: KernelContext) -> ComputeFn:
    """FlexAttention-1 (ai.onnx.preview): ``(Q, K, V, *captured) -> Y`` with optional
    ``score_mod`` / ``prob_mod`` subgraphs (each one tensor in, one tensor out)."""
    scale_attr = ctx.attr("scale", None)
    sm_code = ctx.attr("softmax_precision", None)
    sm_fixed = None if sm_code is None else precision_dtype(ctx, sm_code)
    score_mod = ctx.subgraph("score_mod") if "score_mod" in ctx.attrs else None
    prob_mod = ctx.subgraph("prob_mod") if "prob_mod" in ctx.attrs else None

    def flex_attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray, *captured: Any) -> Any:
        b, hq, sq, d = Q.shape
        hkv, t = K.shape[1], K.shape[2]
        group = hq // hkv
        sdt = sm_fixed if sm_fixed is not None else float_compute_dtype(Q.dtype)
        cdt = float_compute_dtype(Q.dtype)
        scale = 1.0 / float(np.sqrt(d)) if scale_attr is None else float(scale_attr)
        qs = np.empty(Q.shape, dtype=cdt)
        np.multiply(Q, cdt.type(scale), out=qs, casting="unsafe")
        kc = K.astype(cdt, copy=False)
        scores = np.matmul(qs.reshape(b, hkv, group * sq, d), kc.swapaxes(-1, -2))
        x = scores.reshape(b, hq, sq, t).astype(sdt, copy=False)
        if score_mod is not None:
            x = np.array(score_mod([x], captured)[0], dtype=sdt)
        x = x - x.max(axis=-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=-1, keepdims=True)
        if prob_mod is not None:
            x = np.asarray(prob_mod([x], captured)[0], dtype=sdt)
        vc = V.astype(sdt, copy=False)
        y = np.matmul(x.reshape(b, hkv, group * sq, t), vc)
        return y.reshape(b, hq, sq, y.shape[-1]).astype(V.dtype, copy=False)

    return flex_attention


def _ms_rotary_embedding(ctx: KernelContext) -> ComputeFn:
    """RotaryEmbedding-1 (com.microsoft, onnxruntime-genai's exports): ``(input,
    position_ids, cos_cache, sin_cache) -> output``, RotaryEmbedding-23's rotation with its
    inputs in this order; ``position_ids`` is ``(B, S)``, or one offset (positions
    ``offset + i``). Packed batching is refused."""
    if int(ctx.attr("is_packed_batching", 0)):
        raise ctx.unsupported("is_packed_batching=1 is not supported")
    rotate = _rotary_embedding(ctx)

    def ms_rotary_embedding(x: np.ndarray, position_ids: np.ndarray, cos_cache: np.ndarray,
                            sin_cache: np.ndarray) -> np.ndarray:  # fmt: skip
        pos = np.asarray(position_ids).astype(np.int64, copy=False)
        if pos.size == 1:  # an offset: the sequence's positions follow it
            seq = x.shape[2] if x.ndim == 4 else x.shape[1]
            pos = np.broadcast_to(pos.reshape(-1)[0] + np.arange(seq), (x.shape[0], seq))
        if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
            raise ValueError(f"RotaryEmbedding: a position is outside the cache of "
                             f"{cos_cache.shape[0]}")  # fmt: skip
        return rotate(x, cos_cache, sin_cache, pos)

    return ms_rotary_embedding


def register_kernels(registry: KernelRegistry) -> None:
    """Register RotaryEmbedding (23, and com.microsoft's), SwiGLU, CausalConvWithState,
    LinearAttention and FlexAttention (ai.onnx.preview)."""
    registry.add("RotaryEmbedding", _rotary_embedding, since=23, flags=OUT)
    registry.add("RotaryEmbedding", _ms_rotary_embedding, domain="com.microsoft", since=1)
    registry.add("SwiGLU", _swiglu, since=28, flags=OUT)
    registry.add("CausalConvWithState", _causal_conv_with_state, since=27)
    registry.add("LinearAttention", _linear_attention, since=27)
    registry.add(
        "FlexAttention", _flex_attention, domain="ai.onnx.preview", since=1, flags=CONTROL_FLOW
    )
