"""Kernels (contrib): the quantized transformer ops onnxruntime's ``quantize_dynamic`` writes
into a model its transformer optimizer fused -- QAttention and QEmbedLayerNormalization.

QAttention's projection runs on the integer kernel (``lib.qgemm_rows``) where its weight,
scales, zero points and bias are constants, then the float Attention
(``attention.Attention``) on its rows, as onnxruntime computes in float after its integer
product. Otherwise, and for QEmbedLayerNormalization, the 8-bit operands are dequantized
(``(q - zero_point) * scale``, float32; QAttention's weight scale and zero point may be per
column) and the float op's kernel runs. Constant operands are dequantized once, at load.

* QAttention-1: ``(input, weight, bias, input_scale, weight_scale, mask_index?,
  input_zero_point?, weight_zero_point?, past?) -> (output, present?)``.
* QEmbedLayerNormalization-1: ``(input_ids, segment_ids?, word_embedding, position_embedding,
  segment_embedding?, gamma, beta, mask?, word/position/segment/gamma/beta scales, the same
  zero points) -> (layernorm_out, mask_index)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Node, Value
from ..base import ComputeFn, KernelContext
from ..lib.qgemm_rows import IntegerWeights
from .activation import MS_DOMAIN
from .attention import _attention
from .norm import _embed_layer_normalization
from .quantized import dequantize

__all__ = ["register_kernels"]

_F32 = np.float32


def _inner(ctx: KernelContext, op: str, picks: list[int]) -> KernelContext:
    """A context for the float op over the node's inputs at ``picks`` (-1: absent); fresh
    output values, so the model's graph is not touched."""
    node = ctx.node
    ins: list[Value | None] = [node.inputs[i] if 0 <= i < len(node.inputs) else None for i in picks]
    outs = [None if v is None else Value(v.name, v.type) for v in node.outputs]
    return KernelContext(Node(op, ins, outs, dict(node.attrs), name=node.name, domain=MS_DOMAIN,
                              opset=1))  # fmt: skip


def _const_dequantized(ctx: KernelContext, q: int, s: int, z: int, what: str) -> np.ndarray | None:
    """The operand dequantized at load when it, its scale and zero point are constant."""
    if not ctx.has_input(q):
        return None
    vals = [ctx.const_input(i) if ctx.has_input(i) else None for i in (q, s, z)]
    if vals[0] is None or vals[1] is None or (ctx.has_input(z) and vals[2] is None):
        return None
    try:
        return dequantize(vals[0], vals[1], vals[2], what)
    except (TypeError, ValueError) as e:
        raise ctx.unsupported(str(e)) from e


def _integer_qkv(ctx: KernelContext) -> tuple[IntegerWeights, np.ndarray, np.ndarray] | None:
    """QAttention's projection on the integer kernel: (the packed weight, its scale and the
    bias padded to the kernel's columns) when the weight, its scale and zero point and the
    bias are constants of the right sizes; None otherwise (the float projection)."""
    w, ws, b = ctx.const_input(1), ctx.const_input(4), ctx.const_input(2)
    wz = ctx.const_input(7) if ctx.has_input(7) else None
    if w is None or ws is None or b is None or (ctx.has_input(7) and wz is None):
        return None
    plan = IntegerWeights.make(w, wz)
    if plan is None:
        return None
    n = w.shape[1]
    scale = np.asarray(ws, _F32).reshape(-1)
    bias = np.asarray(b)
    if scale.size not in (1, n) or not np.all(np.isfinite(scale)) or bias.shape != (n,):
        return None
    return plan, plan.padded(np.broadcast_to(scale, (n,))), plan.padded(bias.astype(_F32))


def _qattention(ctx: KernelContext) -> ComputeFn:
    """QAttention: the projection ``(input - zp) @ (weight - wzp) * (input_scale *
    weight_scale) + bias`` on the integer kernel where its operands are constants (as
    onnxruntime's, in float32 after the int32 sums), else on the dequantized operands;
    then the float Attention."""
    attention = _attention(_inner(ctx, "Attention", [0, 1, 2, 5, 8]))
    w_const = _const_dequantized(ctx, 1, 4, 7, "QAttention weight")
    integer = _integer_qkv(ctx)

    def qattention(input: np.ndarray, weight: np.ndarray, bias: np.ndarray, input_scale: Any,
                   weight_scale: Any, mask_index: Any = None, input_zero_point: Any = None,
                   weight_zero_point: Any = None, past: Any = None) -> Any:  # fmt: skip
        if np.asarray(input_scale).size != 1:
            raise ValueError("QAttention: input_scale must hold one value")
        w = w_const
        if w is None:
            w = dequantize(weight, weight_scale, weight_zero_point, "QAttention weight")
        if integer is not None and input.ndim == 3:
            plan, scale, b = integer
            a_scale = _F32(np.asarray(input_scale, _F32).reshape(()))
            qkv = plan.product_scaled(input, input_zero_point, scale, b, a_scale)
            if qkv is not None:
                rows = qkv.reshape(-1, qkv.shape[-1])
                return attention(qkv, w, bias, mask_index, past, qkv=rows)
        x = dequantize(input, input_scale, input_zero_point, "QAttention input")
        return attention(x, w, bias, mask_index, past)

    return qattention


_TABLES = ((2, 8, 13, "word_embedding"), (3, 9, 14, "position_embedding"),
           (4, 10, 15, "segment_embedding"), (5, 11, 16, "gamma"), (6, 12, 17, "beta"))  # fmt: skip


def _qembed_layer_normalization(ctx: KernelContext) -> ComputeFn:
    embed = _embed_layer_normalization(
        _inner(ctx, "EmbedLayerNormalization", [0, 1, 2, 3, 4, 5, 6, 7])
    )
    consts = [_const_dequantized(ctx, q, s, z, f"QEmbedLayerNormalization {what}")
              for q, s, z, what in _TABLES]  # fmt: skip

    def qembed_layer_normalization(input_ids: np.ndarray, segment_ids: Any, *rest: Any) -> Any:
        args = list(rest) + [None] * (16 - len(rest))  # inputs 2..17
        tables: list[Any] = []
        for (q, s, z, what), c in zip(_TABLES, consts):
            if c is not None or args[q - 2] is None:
                tables.append(c)
            else:
                tables.append(dequantize(args[q - 2], args[s - 2], args[z - 2],
                                          f"QEmbedLayerNormalization {what}"))  # fmt: skip
        word, pos, seg, gamma, beta = tables
        return embed(input_ids, segment_ids, word, pos, seg, gamma, beta, args[5])

    return qembed_layer_normalization


def register_kernels(registry: Any) -> None:
    """Register QAttention and QEmbedLayerNormalization."""
    registry.add("QAttention", _qattention, domain=MS_DOMAIN, since=1)
    registry.add("QEmbedLayerNormalization", _qembed_layer_normalization, domain=MS_DOMAIN,
                 since=1)  # fmt: skip
