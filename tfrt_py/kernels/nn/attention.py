"""Kernels (nn): Attention (opset 23+).

Attention follows the ONNX spec (and its reference implementation) for opsets 23, 24 and 25:
3-D ``(B, S, H*D)`` or 4-D ``(B, H, S, D)`` inputs, MHA/GQA/MQA head grouping (query head
``h`` uses KV head ``h // (Hq // Hkv)``), a bool or float ``attn_mask`` broadcastable to
``(B, Hq, Sq, T)`` (a shorter last dim is padded with ``-inf``/``False``), bottom-right causal
alignment (offset = past length, or ``nonpad_kv_seqlen - Sq`` per batch), sliding windows
(opset 25), the ``nonpad_kv_seqlen`` padding mask (opset 24), ``past``/``present`` key and
value caches, ``softcap``, ``softmax_precision`` and the four ``qk_matmul_output`` modes. A
fully masked query row yields zeros (not NaN) in ``Y`` and in mode-3 ``qk_matmul_output``.

float16 inputs are computed in float32 and cast back (NumPy has no fast float16 matmul);
bfloat16 inputs are computed step by step in bfloat16 as the spec's pattern says. GQA is done
without repeating K/V by folding the query group into the query-sequence axis of the matmul.
The other transformer ops live in ``transformer``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ...ir.dtypes import ElemType
from ..base import ComputeFn, KernelContext
from ..common import float_compute_dtype
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


def _attention(ctx: KernelContext) -> ComputeFn:
    """Attention-23/24/25: ``(Q, K, V, attn_mask?, past_key?, past_value?,
    nonpad_kv_seqlen?) -> (Y, present_key?, present_value?, qk_matmul_output?)``."""
    scale_attr = ctx.attr("scale", None)
    causal = bool(ctx.attr("is_causal", 0))
    q_heads_attr = ctx.attr("q_num_heads", None)
    kv_heads_attr = ctx.attr("kv_num_heads", None)
    softcap = float(ctx.attr("softcap", 0.0))
    qk_mode = int(ctx.attr("qk_matmul_output_mode", 0))
    left = int(ctx.attr("left_window_size", -1))
    right = int(ctx.attr("right_window_size", -1))
    sm_code = ctx.attr("softmax_precision", None)
    if qk_mode not in (0, 1, 2, 3):
        raise ctx.unsupported(f"qk_matmul_output_mode={qk_mode}")
    if left < -1 or right < -1:
        raise ctx.unsupported("window sizes must be -1 or nonnegative")
    sm_dtype = None if sm_code is None else precision_dtype(ctx, sm_code)
    want_present_k = ctx.has_output(1)
    want_present_v = ctx.has_output(2)
    want_qk = ctx.has_output(3)
    n_out = ctx.n_outputs
    windowed = left >= 0 or right >= 0
    structural = causal or windowed
    if ctx.has_input(4) != ctx.has_input(5):
        raise ctx.unsupported("past_key and past_value must be given together")

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
        is_3d = Q.ndim == 3
        B = Q.shape[0]
        if is_3d:
            if q_heads_attr is None or kv_heads_attr is None:
                raise ValueError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
            hq = int(q_heads_attr)
            hkv = int(kv_heads_attr)
            sq = Q.shape[1]
            Q4 = Q.reshape(B, sq, hq, -1).transpose(0, 2, 1, 3)
            K = K.reshape(B, K.shape[1], hkv, -1).transpose(0, 2, 1, 3)
            V = V.reshape(B, V.shape[1], hkv, -1).transpose(0, 2, 1, 3)
        else:
            Q4 = Q
            hq, sq = Q.shape[1], Q.shape[2]
            hkv = K.shape[1]
        d = Q4.shape[3]
        if past_key is not None and past_value is not None:
            offset = past_key.shape[2]
            K = np.concatenate((past_key, K), axis=2)
            V = np.concatenate((past_value, V), axis=2)
        else:
            offset = 0
        present_k = K
        present_v = V
        t = K.shape[2]
        group = hq // hkv
        scale = (1.0 / np.sqrt(d)) if scale_attr is None else float(scale_attr)

        # Scores: (B, Hkv, G*Sq, T), Q scaled while cast into a contiguous buffer.
        qs = np.empty(Q4.shape, dtype=cdt)
        if cdt.itemsize >= 4:
            np.multiply(Q4, cdt.type(scale), out=qs, casting="unsafe")
            kc = K if K.dtype == cdt else K.astype(cdt)
        else:  # computing in a 16-bit type: split the scale as the spec does
            root = cdt.type(np.sqrt(scale))
            np.multiply(Q4, root, out=qs)
            kc = K * root
        scores = np.matmul(qs.reshape(B, hkv, group * sq, d), kc.swapaxes(-1, -2))
        if scores.dtype != cdt:  # NumPy's bfloat16 matmul returns float32
            scores = scores.astype(cdt)
        s4 = scores.reshape(B, hq, sq, t)
        qk_out = None
        if want_qk and qk_mode == 0:
            qk_out = s4.copy()
        if softcap > 0.0:
            s4 /= softcap
            np.tanh(s4, out=s4)
            s4 *= softcap
        if want_qk and qk_mode == 1:
            qk_out = s4.copy()

        # Additive bias: attn_mask + causal/window frontier + nonpad padding.
        bias: np.ndarray | None = None
        empty_rows: np.ndarray | None = None
        cached = False
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
                bias, empty_rows, cached = sb2, sb_empty, True
            else:
                bias = bias + sb2
        if bias is not None:
            if not cached:
                em = np.isneginf(bias.max(axis=-1, keepdims=True))
                empty_rows = em if em.any() else None
            s4 += bias
        if want_qk and qk_mode == 2:
            qk_out = s4.copy()

        # Softmax over the last axis (in softmax_precision when given); rows with no
        # attendable key become zeros.
        x = s4 if sm_dtype is None or sm_dtype == cdt else s4.astype(sm_dtype)
        m = x.max(axis=-1, keepdims=True)
        if empty_rows is not None:
            m[np.isneginf(m)] = 0
        x -= m
        np.exp(x, out=x)
        ssum = x.sum(axis=-1, keepdims=True)
        if empty_rows is not None:
            ssum[ssum == 0] = 1
        x /= ssum
        if empty_rows is not None:
            x = np.where(empty_rows, x.dtype.type(0), x)
        if want_qk and qk_mode == 3:
            qk_out = x
        if x.dtype != cdt:
            x = x.astype(cdt)

        vc = V if V.dtype == cdt else V.astype(cdt)
        y = np.matmul(x.reshape(B, hkv, group * sq, t), vc)
        dv = y.shape[-1]
        y4 = y.reshape(B, hq, sq, dv)
        if is_3d:
            Y = y4.transpose(0, 2, 1, 3).astype(out_dtype).reshape(B, sq, hq * dv)
        else:
            Y = y4 if y4.dtype == out_dtype else y4.astype(out_dtype)
        if n_out == 1:
            return Y
        res: list[Any] = [Y, None, None, None][:n_out]
        if n_out > 1 and want_present_k:
            res[1] = present_k
        if n_out > 2 and want_present_v:
            res[2] = present_v
        if n_out > 3 and qk_out is not None:
            res[3] = qk_out.astype(out_dtype, copy=False)
        return tuple(res)

    return attention


def register_kernels(registry: KernelRegistry) -> None:
    """Register Attention."""
    registry.add("Attention", _attention, since=23)
