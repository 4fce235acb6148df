"""Kernels (contrib): Attention-1 of the com.microsoft domain (BERT/GPT-2 self-attention with
the Q/K/V projections merged into one weight, as onnxruntime's transformer optimizer and
its GPT-2 exporter write it).

``(input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?) ->
(output, present?)``:

* ``qkv = input @ weights (+ bias)``, split into Q, K, V of ``qkv_hidden_sizes`` (default
  three equal parts), each into ``num_heads`` heads.
* ``past`` ``(2, B, N, P, H)`` is prepended to K and V; ``present`` is ``(2, B, N, P+S, H)``.
* Scores ``scale * Q K^T`` (scale default ``1/sqrt(head size)``) plus ``attention_bias``
  (broadcast from ``(B or 1, N or 1, S, T)``) plus the mask as an *additive*
  ``mask_filter_value`` (default -10000, as onnxruntime: a fully masked row is uniform,
  not NaN); softmax over the T keys; times V; heads merged to ``(B, S, N * Hv)``. The
  mask and the causal frontier are one additive bias term, ``attention_bias`` the one
  added before it, and the rest is ``lib/sdpa``'s ``softmax_attention`` (in blocks of
  query rows for float32).
* ``mask_index`` forms: ``(B,)`` end positions (keys at or after masked: right padding);
  ``(2B,)`` end positions then start positions (keys before the start masked too: left
  padding); ``(B, T)`` and ``(B, S, T)`` raw masks (0 masked); ``(B, 1, M, M)`` (Megatron
  GPT-2: rows ``P..P+S-1``, columns ``0..T-1`` of the square, 0 masked; onnxruntime's CPU
  provider does not implement this form, so it is checked against its definition only).
* ``unidirectional=1`` (when S > 1): query ``i`` does not see keys after ``P + i`` at all
  (a ``-inf`` bias: their weight is exactly 0, whatever the mask says of the others, as in
  onnxruntime 1.32: a row whose visible keys are all masked spreads its weight over those
  keys).

The additive mask made from a small ``mask_index`` (<= ``_MASK_MEMO_MAX`` elements, its
additive form <= ``_MASK_MEMO_BYTES``) is kept per kernel, keyed by the mask's bytes and
the shapes (at most ``_MASK_MEMO`` of them), and a mask that masks nothing is not added
at all: BERT's ``(B,)`` lengths of a
batch without padding cost a dict lookup, not five NumPy calls.

Refused at load: ``do_rotary=1`` and ``past_present_share_buffer=1`` (decoder kernels'
options; onnxruntime's CPU Attention runs neither). Inputs are float32 (float64 kept,
float16 computed in float32 and cast back).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from ..base import ComputeFn, Cost, KernelContext
from ..common import ShapeMemo, float_compute_dtype, to_ints
from ..lib.gemm import matmul_into
from ..lib.linear_par import Serial, serial_for
from ..lib.sdpa import compile_at_build, softmax_attention
from ..registry import KernelRegistry
from .activation import MS_DOMAIN

__all__ = ["register_kernels"]


def _key_mask(
    mask: np.ndarray, b: int, s: int, t: int, past: int, fill: float, dt: np.dtype
) -> np.ndarray:
    """The additive mask of ``mask_index`` as ``(B, 1 or S, T)`` (0 where attended,
    ``fill`` where masked)."""
    keys = np.arange(t)
    if mask.ndim == 1:
        n = mask.shape[0]
        if n not in (b, 2 * b):
            raise ValueError(
                f"Attention: a 1-D mask_index has batch ({b}) or 2 x batch entries, not {n}"
            )
        ends = np.clip(mask[:b].astype(np.int64), 0, t)
        masked = keys[None, :] >= ends[:, None]
        if n == 2 * b:
            starts = np.minimum(mask[b:].astype(np.int64), t)
            masked |= keys[None, :] < starts[:, None]
        raw = masked[:, None, :]
    elif mask.ndim == 2:
        if mask.shape != (b, t):
            raise ValueError(f"Attention: a 2-D mask_index is (batch, total length) {(b, t)}")
        raw = (mask <= 0)[:, None, :]
    elif mask.ndim == 3:
        if mask.shape != (b, s, t):
            raise ValueError(f"Attention: a 3-D mask_index is (B, S, T) {(b, s, t)}")
        raw = mask <= 0
    elif mask.ndim == 4:
        if mask.shape[0] != b or mask.shape[1] != 1 or mask.shape[2] < past + s:
            raise ValueError("Attention: a 4-D mask_index is (batch, 1, max_len, max_len)")
        if mask.shape[3] < t:
            raise ValueError("Attention: a 4-D mask_index is narrower than the total length")
        raw = mask[:, 0, past : past + s, :t] <= 0
    else:
        raise ValueError(f"Attention: mask_index of rank {mask.ndim} is not supported")
    return np.where(raw, fill, 0.0).astype(dt)


#: Masks of at most this many elements are memoized per kernel ...
_MASK_MEMO_MAX = 1024
#: ... when their additive form takes at most this many bytes (a request cannot make the
#: memo hold more than _MASK_MEMO times this) ...
_MASK_MEMO_BYTES = 1 << 14
#: ... at most this many of them (the memo is emptied when full: a mask per length of
#: variable-length text, 8..128 tokens, emptied a memo of 64 every few calls).
_MASK_MEMO = 256


@lru_cache(maxsize=64)
def _future(s: int, t: int, past: int, dt: np.dtype) -> np.ndarray:
    """The (S, T) additive bias hiding the keys after ``past + i`` from query ``i`` (-inf
    there, 0 elsewhere; read-only)."""
    later = np.arange(t)[None, :] > (np.arange(s)[:, None] + past)
    bias = np.where(later, -np.inf, 0.0).astype(dt)
    bias.flags.writeable = False
    return bias


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: Any,
           attention_bias: Any, causal: bool, past: int, dt: np.dtype) -> np.ndarray:  # fmt: skip
    """The heads (B, N, S|T, H) attended and merged to (B, S, N * Hv) in ``dt``: scores
    ``scale * q k^T`` plus ``attention_bias`` then the additive ``mask`` (onnxruntime's
    rounding of a masked row), with ``causal`` (S > 1) query ``i`` not seeing keys after
    ``past + i`` (a -inf bias: their weight exactly 0); softmax; times V
    (``lib.sdpa.softmax_attention``, the heads' rows written into the merged output in
    place). Shared by com.microsoft Attention and MultiHeadAttention."""
    b, n, s, _ = q.shape
    hv = v.shape[3]
    if causal and s > 1:  # never a whole row: key past + i is seen
        fut = _future(s, k.shape[2], past, q.dtype)
        mask = fut if mask is None else mask + fut
    ab = attention_bias
    terms = mask if ab is None else ab if mask is None else (ab, mask)
    y = np.empty((b, s, n, hv), q.dtype)
    softmax_attention(q, k, v, scale, y.transpose(0, 2, 1, 3), bias=terms)
    return y.reshape(b, s, n * hv).astype(dt, copy=False)


_NOT_MADE = object()


def _sizes(ctx: KernelContext, heads: int) -> tuple[int, int, int] | None:
    """The checked ``qkv_hidden_sizes`` (None: three equal parts); UnsupportedOpError for
    the forms refused at load (module doc)."""
    sizes_attr = ctx.attr("qkv_hidden_sizes", None)
    if heads <= 0:
        raise ctx.unsupported(f"num_heads={heads} must be positive")
    if int(ctx.attr("do_rotary", 0)):
        raise ctx.unsupported("do_rotary=1 is not supported")
    if int(ctx.attr("past_present_share_buffer", 0)):
        raise ctx.unsupported("past_present_share_buffer=1 is not supported")
    sizes = to_ints(sizes_attr) if sizes_attr is not None else None
    if sizes is not None:
        if len(sizes) != 3 or sizes[0] != sizes[1] or min(sizes) <= 0:
            raise ctx.unsupported(f"qkv_hidden_sizes={list(sizes)}: need 3 sizes, Q's = K's")
        if any(d % heads for d in sizes):
            raise ctx.unsupported("qkv_hidden_sizes must be multiples of num_heads")
    if ctx.has_input(4) and sizes is not None and sizes[2] != sizes[0]:
        raise ctx.unsupported("past needs equal Q, K and V hidden sizes")
    return None if sizes is None else (sizes[0], sizes[1], sizes[2])


def _mask_memo(fill: float) -> tuple[Any, dict[tuple[Any, ...], np.ndarray | None]]:
    """(``additive_mask(mask, b, s, t, p, cdt)``, its memo): ``_key_mask`` as (B, 1, 1 or
    S, T), None when it masks nothing; memoized for small masks (read-only arrays)."""
    masks: ShapeMemo[tuple[Any, ...], np.ndarray | None] = ShapeMemo(_MASK_MEMO)

    def additive_mask(
        mask: np.ndarray, b: int, s: int, t: int, p: int, cdt: np.dtype
    ) -> np.ndarray | None:
        if mask.size > _MASK_MEMO_MAX:
            return _key_mask(mask, b, s, t, p, fill, cdt)[:, None]
        key = (mask.dtype.str, mask.shape, mask.tobytes(), b, s, t, p, cdt.str)
        got = masks.get(key, _NOT_MADE)
        if got is _NOT_MADE:
            add = _key_mask(mask, b, s, t, p, fill, cdt)[:, None]
            add.flags.writeable = False
            got = add if add.any() else None
            if add.nbytes > _MASK_MEMO_BYTES:
                return got
            masks.put(key, got)
        return got  # type: ignore[return-value]

    return additive_mask, masks


def _packed_projection(ctx: KernelContext) -> tuple[Any, Any, Serial] | None:
    """(weights, bias, their one-thread packed product with the bias added as it stores)
    for constant float32 weights and bias (``linear_par.serial_for``: NumPy's gemm packs
    the weights again on every call); None otherwise, or without the packed kernel."""
    w, b = ctx.const_input(1), ctx.const_input(2)
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    if ctx.has_input(2) and (b is None or b.dtype != np.float32 or b.shape != (w.shape[1],)):
        return None
    serial = serial_for([], b, w)
    return None if serial is None else (w, b, serial)


def _attention(ctx: KernelContext) -> ComputeFn:
    """Attention-1 (com.microsoft): ``(input, weights, bias?, mask_index?, past?,
    attention_bias?, past_sequence_length?) -> (output, present?)``; the softmax attention
    itself is ``lib.sdpa``'s, the masks its additive bias."""
    heads = int(ctx.attr("num_heads"))
    causal_attr = bool(ctx.attr("unidirectional", 0))
    scale_attr = float(ctx.attr("scale", 0.0))
    sizes = _sizes(ctx, heads)
    want_present = ctx.has_output(1)
    n_out = ctx.n_outputs
    additive_mask, masks = _mask_memo(float(ctx.attr("mask_filter_value", -10000.0)))
    packed = _packed_projection(ctx)
    compile_at_build(ctx.input_dtype(0))

    def attention(
        input: np.ndarray,
        weights: np.ndarray,
        bias: np.ndarray | None = None,
        mask_index: np.ndarray | None = None,
        past: np.ndarray | None = None,
        attention_bias: np.ndarray | None = None,
        past_sequence_length: np.ndarray | None = None,
        *,
        qkv: np.ndarray | None = None,
    ) -> Any:
        """``qkv``: the projection already made (rows of Q, K and V for ``input``'s batch
        and sequence: QAttention's integer product); ``input`` and ``weights`` then give
        only the shapes and dtype."""
        if input.ndim != 3:
            raise ValueError("Attention: input must be 3-D (batch, sequence, hidden)")
        b, s, _ = input.shape
        dt = input.dtype
        cdt = float_compute_dtype(dt)
        total = weights.shape[1]
        dq, dk, dv = sizes if sizes is not None else (total // 3,) * 3
        if dq + dk + dv != total or (sizes is None and total % 3):
            raise ValueError(f"Attention: weights have {total} columns, not Q+K+V sizes")
        if dq % heads:
            raise ValueError(f"Attention: hidden size {dq} is not a multiple of {heads} heads")
        hq, hv = dq // heads, dv // heads
        x = input.reshape(b * s, -1)
        if x.dtype != cdt:
            x = x.astype(cdt)
        if qkv is not None:
            pass
        elif packed is not None and weights is packed[0] and bias is packed[1]:
            qkv = packed[2].packed_product(x, None)
        if qkv is None:  # many rows (split over the threads by rows), or another dtype
            qkv = matmul_into(np.ascontiguousarray(x), weights.astype(cdt, copy=False))
            if bias is not None:
                qkv += bias
        q = qkv[:, :dq].reshape(b, s, heads, hq).transpose(0, 2, 1, 3)
        k = qkv[:, dq : dq + dk].reshape(b, s, heads, hq).transpose(0, 2, 1, 3)
        v = qkv[:, dq + dk :].reshape(b, s, heads, hv).transpose(0, 2, 1, 3)
        p = 0
        if past is not None:
            if past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != b:
                raise ValueError("Attention: past must be (2, batch, heads, past, head size)")
            p = past.shape[3]
            k = np.concatenate((past[0].astype(cdt, copy=False), k), axis=2)
            v = np.concatenate((past[1].astype(cdt, copy=False), v), axis=2)
        t = p + s
        add = None if mask_index is None else additive_mask(mask_index, b, s, t, p, cdt)
        y = attend(q, k, v, scale_attr or 1.0 / math.sqrt(hq), add, attention_bias,
                   causal_attr, p, dt)  # fmt: skip
        if n_out == 1:
            return y
        present = np.stack((k, v)).astype(dt, copy=False) if want_present else None
        return (y, present) + (None,) * (n_out - 2)

    attention.mask_memo = masks  # type: ignore[attr-defined]  # read by tests
    return attention


def _attention_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    """The projection (2 * B*S * Hin * 3D) and the two score products (4 * B*S*T*D)."""
    if len(ins) < 2 or len(ins[0]) != 3 or len(ins[1]) != 2:
        return Cost(0.0, 0.0)
    b, s, hin = ins[0]
    cols = ins[1][1]
    t = s + (ins[4][3] if len(ins) > 4 and len(ins[4]) == 5 else 0)
    d = cols / 3
    flops = 2.0 * b * s * hin * cols + 4.0 * b * s * t * d
    moved = 4.0 * (b * s * hin + hin * cols + sum(math.prod(o) for o in outs))
    return Cost(flops, moved)


def register_kernels(registry: KernelRegistry) -> None:
    """Register Attention (com.microsoft)."""
    registry.add("Attention", _attention, domain=MS_DOMAIN, since=1, cost=_attention_cost)
