"""Kernels (nn): Attention (opset 23+).

Attention follows the ONNX spec (and its reference implementation) for opsets 23, 24 and 25:
3-D ``(B, S, H*D)`` or 4-D ``(B, H, S, D)`` inputs, MHA/GQA/MQA head grouping (query head
``h`` uses KV head ``h // (Hq // Hkv)``), a bool or float ``attn_mask`` broadcastable to
``(B, Hq, Sq, T)`` (a shorter last dim is padded with ``-inf``/``False``), bottom-right causal
alignment (offset = past length, or ``nonpad_kv_seqlen - Sq`` per batch), sliding windows
(opset 25), the ``nonpad_kv_seqlen`` padding mask (opset 24), ``past``/``present`` key and
value caches, ``softcap``, ``softmax_precision`` and the four ``qk_matmul_output`` modes. A
fully masked query row yields zeros (not NaN) in ``Y`` and in mode-3 ``qk_matmul_output``.

The masks become one additive bias (and the rows it hides entirely); the softmax attention
itself is ``lib/sdpa``'s: in blocks of query rows for float32 (``softmax_attention``), step
by step otherwise and whenever a ``qk_matmul_output``, ``softcap`` or ``softmax_precision``
needs the intermediates (``attention_steps``). float16 inputs are computed in float32 and
cast back (NumPy has no fast float16 matmul); bfloat16 inputs are computed step by step in
bfloat16 as the spec's pattern says. GQA never repeats K/V (``sdpa``'s ``grouped`` heads).
The other transformer ops live in ``transformer``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from ...ir.dtypes import ElemType
from ..base import ComputeFn, KernelContext
from ..common import float_compute_dtype
from ..lib.sdpa import attention_steps, compile_at_build, softmax_attention
from ..registry import KernelRegistry

__all__ = ["register_kernels"]

_NEG_INF = float("-inf")

#: The element types ``softmax_precision`` may name.
_PRECISIONS = frozenset({ElemType.FLOAT, ElemType.FLOAT16, ElemType.DOUBLE, ElemType.BFLOAT16})


def precision_dtype(ctx: KernelContext, code: int) -> np.dtype:
    """The NumPy dtype of a ``softmax_precision`` attribute value (load time)."""
    if int(code) not in _PRECISIONS:
        raise ctx.unsupported(f"softmax_precision={code} is not a float type")
    return ctx.elem_dtype(code, "softmax_precision")


def _allowed(diff: np.ndarray, causal: bool, left: int, right: int) -> np.ndarray:
    """Which (query, key) pairs the causal frontier and the window keep, from ``diff`` =
    query position - key position."""
    allowed = np.ones(diff.shape, dtype=bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return allowed


@lru_cache(maxsize=256)
def _structural_bias(
    sq: int, t: int, offset: int, causal: bool, left: int, right: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray | None]:
    """The (Sq, T) additive bias of the causal frontier and the window, for a scalar offset,
    and the (Sq, 1) mask of fully masked rows (None when there are none). Read-only."""
    diff = (np.arange(sq)[:, None] + offset) - np.arange(t)[None, :]
    allowed = _allowed(diff, causal, left, right)
    bias = np.where(allowed, 0.0, _NEG_INF).astype(dtype)
    bias.flags.writeable = False
    empty = np.logical_not(allowed.any(axis=1, keepdims=True))
    return bias, (empty if empty.any() else None)


def _batch_structural_bias(
    sq: int, t: int, offsets: np.ndarray, causal: bool, left: int, right: int, dtype: np.dtype
) -> np.ndarray:
    """The (B, 1, Sq, T) bias of causal frontier and window for per-batch offsets."""
    diff = (np.arange(sq)[None, :, None] + offsets.reshape(-1, 1, 1)) - np.arange(t)
    allowed = _allowed(diff, causal, left, right)
    return np.where(allowed, 0.0, _NEG_INF).astype(dtype)[:, None]


def mask_to_bias(mask: np.ndarray, t: int, dtype: np.dtype) -> np.ndarray:
    """An attn_mask as an additive bias of ``dtype`` with last dim padded to ``t``."""
    if mask.dtype == np.bool_:
        bias = np.where(mask, 0.0, _NEG_INF).astype(dtype)
    else:
        bias = mask.astype(dtype, copy=False)
    pad = t - bias.shape[-1]
    if pad > 0:
        widths = [(0, 0)] * (bias.ndim - 1) + [(0, pad)]
        bias = np.pad(bias, widths, constant_values=_NEG_INF)
    return bias


class _Options(NamedTuple):
    """Attention's attributes, checked (load time)."""

    scale: float | None
    causal: bool
    q_heads: int | None
    kv_heads: int | None
    softcap: float
    qk_mode: int
    left: int
    right: int
    precision: np.dtype | None


def _options(ctx: KernelContext) -> _Options:
    """The node's attributes; UnsupportedOpError for values outside the spec."""
    qk_mode = int(ctx.attr("qk_matmul_output_mode", 0))
    left = int(ctx.attr("left_window_size", -1))
    right = int(ctx.attr("right_window_size", -1))
    sm_code = ctx.attr("softmax_precision", None)
    if qk_mode not in (0, 1, 2, 3):
        raise ctx.unsupported(f"qk_matmul_output_mode={qk_mode}")
    if left < -1 or right < -1:
        raise ctx.unsupported("window sizes must be -1 or nonnegative")
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.unsupported("past_key and past_value must be given together")
    scale, q_heads, kv_heads = (ctx.attr(n, None) for n in ("scale", "q_num_heads", "kv_num_heads"))
    return _Options(
        None if scale is None else float(scale),
        bool(ctx.attr("is_causal", 0)),
        None if q_heads is None else int(q_heads),
        None if kv_heads is None else int(kv_heads),
        float(ctx.attr("softcap", 0.0)),
        qk_mode,
        left,
        right,
        None if sm_code is None else precision_dtype(ctx, sm_code),
    )


def _bias(
    attn_mask: np.ndarray | None,
    nonpad_kv_seqlen: np.ndarray | None,
    sq: int,
    t: int,
    offset: int,
    cdt: np.dtype,
    opt: _Options,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The additive bias of attn_mask, the causal/window frontier and the nonpad padding
    (None: none), and the mask of the query rows it hides entirely (None: none)."""
    causal, left, right = opt.causal, opt.left, opt.right
    structural = causal or left >= 0 or right >= 0
    bias: np.ndarray | None = None
    if attn_mask is not None:
        bias = mask_to_bias(attn_mask, t, cdt)
    if nonpad_kv_seqlen is not None:
        lens = nonpad_kv_seqlen.astype(np.int64).reshape(-1)
        if structural:
            sb = _batch_structural_bias(sq, t, lens - sq, causal, left, right, cdt)
            bias = sb if bias is None else bias + sb
        pad = np.where(np.arange(t) < lens[:, None], 0.0, _NEG_INF).astype(cdt)
        pad = pad.reshape(-1, 1, 1, t)
        bias = pad if bias is None else bias + pad
    elif structural:
        sb2, sb_empty = _structural_bias(sq, t, offset, causal, left, right, cdt)
        if bias is None:
            return sb2, sb_empty
        bias = bias + sb2
    if bias is None:
        return None, None
    em = np.isneginf(bias.max(axis=-1, keepdims=True))
    return bias, (em if em.any() else None)


def _attention(ctx: KernelContext) -> ComputeFn:
    """Attention-23/24/25: ``(Q, K, V, attn_mask?, past_key?, past_value?,
    nonpad_kv_seqlen?) -> (Y, present_key?, present_value?, qk_matmul_output?)``; the
    softmax attention itself is ``lib.sdpa``'s (its steps when a tap, softcap or softmax
    precision asks for them)."""
    opt = _options(ctx)
    scale_attr, q_heads, kv_heads, softcap, sm_dtype = (
        opt.scale, opt.q_heads, opt.kv_heads, opt.softcap, opt.precision
    )  # fmt: skip
    want_k, want_v, n_out = ctx.has_output(1), ctx.has_output(2), ctx.n_outputs
    tap = opt.qk_mode if ctx.has_output(3) else None
    steps = tap is not None or softcap > 0.0
    masked = opt.causal or opt.left >= 0 or opt.right >= 0
    compile_at_build(ctx.input_dtype(0))

    def attention(
        Q: np.ndarray,
        K: np.ndarray,
        V: np.ndarray,
        attn_mask: np.ndarray | None = None,
        past_key: np.ndarray | None = None,
        past_value: np.ndarray | None = None,
        nonpad_kv_seqlen: np.ndarray | None = None,
    ) -> Any:
        out_dtype = Q.dtype
        cdt = out_dtype if out_dtype.kind == "V" else float_compute_dtype(out_dtype)
        is_3d, B = Q.ndim == 3, Q.shape[0]
        if is_3d:
            if q_heads is None or kv_heads is None:
                raise ValueError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
            hq, sq = q_heads, Q.shape[1]
            Q4 = Q.reshape(B, sq, hq, -1).transpose(0, 2, 1, 3)
            K = K.reshape(B, K.shape[1], kv_heads, -1).transpose(0, 2, 1, 3)
            V = V.reshape(B, V.shape[1], kv_heads, -1).transpose(0, 2, 1, 3)
        else:
            Q4, hq, sq = Q, Q.shape[1], Q.shape[2]
        offset = 0
        if past_key is not None and past_value is not None:
            offset = past_key.shape[2]
            K = np.concatenate((past_key, K), axis=2)
            V = np.concatenate((past_value, V), axis=2)
        present_k, present_v, t, dv = K, V, K.shape[2], V.shape[3]
        scale = (1.0 / np.sqrt(Q4.shape[3])) if scale_attr is None else scale_attr
        bias = empty = None
        if masked or attn_mask is not None or nonpad_kv_seqlen is not None:
            bias, empty = _bias(attn_mask, nonpad_kv_seqlen, sq, t, offset, cdt, opt)
        if Q4.dtype != cdt or K.dtype != cdt or V.dtype != cdt:
            Q4, K, V = (x.astype(cdt, copy=False) for x in (Q4, K, V))
        # a 3-D Y is (B, Sq, Hq, Dv): the heads' rows go into it in place (float32/64)
        Yb = np.empty((B, sq, hq, dv), out_dtype) if is_3d else None
        out = None
        if Yb is not None and out_dtype == cdt and cdt.kind == "f":
            out = Yb.transpose(0, 2, 1, 3)
        precision = None if sm_dtype is None or sm_dtype == cdt else sm_dtype
        qk = None
        if steps or precision is not None:
            y4, qk = attention_steps(
                Q4, K, V, scale, bias=bias, empty=empty, grouped=True, softcap=softcap,
                precision=precision, tap=tap, out=out,
            )  # fmt: skip
        else:
            y4 = softmax_attention(Q4, K, V, scale, out, bias=bias, empty=empty, grouped=True)
        if Yb is None:
            Y = y4 if y4.dtype == out_dtype else y4.astype(out_dtype)
        else:
            if y4 is not out:
                np.copyto(Yb.transpose(0, 2, 1, 3), y4, casting="unsafe")
            Y = Yb.reshape(B, sq, hq * dv)
        if n_out == 1:
            return Y
        qk_out = None if qk is None else qk.astype(out_dtype, copy=False)
        return (Y, present_k if want_k else None, present_v if want_v else None, qk_out)[:n_out]

    return attention


def register_kernels(registry: KernelRegistry) -> None:
    """Register Attention."""
    registry.add("Attention", _attention, since=23)
