"""Kernels (contrib): MultiHeadAttention-1 of the com.microsoft domain -- the attention
onnxruntime's transformer optimizer writes for T5, BART, Whisper, Stable Diffusion and
SAM-like graphs, with the projections left outside it (cross attention and decoders with
a past among them).

``(query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?, past_value?,
past_sequence_length?, cache_indirection?) -> (output, present_key?, present_value?)``,
``num_heads`` N:

* The forms of Q, K and V (D = N x H, Dv = N x Hv):
  - ``query (B, S, D)``, ``key (B, L, D)``, ``value (B, L, Dv)``; ``bias`` ``(D + D + Dv)``
    added to each before the heads are split;
  - packed QKV: ``query (B, L, N, 3, H)``, no key or value (``bias`` as above, per part);
  - packed KV: ``key (B, L, N, 2, H)``, no value and no bias;
  - cross attention with K and V already split into heads: ``key (B, N, L, H)``,
    ``value (B, N, L, Hv)``, no bias and no past (they *are* the cache: the present
    outputs are them).
* ``past_key``/``past_value`` ``(B, N, P, H)`` are put before the new K and V (T = P + L);
  ``present_key``/``present_value`` ``(B, N, T, H)`` are the results.
* Scores ``scale * Q K^T`` (default ``1/sqrt(H)``) plus ``attention_bias`` (broadcast from
  ``(B or 1, N or 1, S, T)``), then the key padding mask as an additive
  ``mask_filter_value`` (default -10000: a fully masked row is uniform, as onnxruntime):
  ``(B,)`` key lengths (keys at or past the length masked), ``(B, T)`` or ``(B, S, T)``
  with 0 masked; ``unidirectional=1`` hides key ``j > P + i`` from query ``i`` (weight
  exactly 0); softmax over T; times V; heads merged to ``(B, S, N * Hv)``. The softmax
  attention itself is ``lib/sdpa``'s, as for com.microsoft Attention (``attention.py``,
  whose mask memo and causal bias this kernel shares).

Refused at load, naming the input or output: ``past_sequence_length`` (the shared
past/present buffer of onnxruntime's GPU kernels), ``cache_indirection`` (beam search's
DecoderMaskedMultiHeadAttention form) and the ``qk`` output. Bad shapes, and the (3B + 2)
mask form of onnxruntime's CUDA kernels, fail the call with a message; the model stays
usable. Inputs are float32 (float16 is computed in float32 and cast back). Checked
against onnxruntime's CPU provider (tests/kernels/test_contrib_mha.py); its CPU kernel
does not run the packed forms, which the tests check against the unpacked model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import ComputeFn, Cost, KernelContext
from ..common import float_compute_dtype
from ..registry import KernelRegistry
from .activation import MS_DOMAIN
from .attention import _mask_memo, attend

__all__ = ["register_kernels"]

_REFUSED_INPUTS = {8: "past_sequence_length", 9: "cache_indirection"}


def _heads(x: np.ndarray, n: int, what: str) -> np.ndarray:
    """``(B, L, N * H)`` as ``(B, N, L, H)`` (a view)."""
    b, seq, d = x.shape
    if d % n:
        raise ValueError(f"MultiHeadAttention: {what} width {d} is not a multiple of {n} heads")
    return x.reshape(b, seq, n, d // n).transpose(0, 2, 1, 3)


def _with_bias(x: np.ndarray, bias: np.ndarray | None, lo: int, cdt: np.dtype) -> np.ndarray:
    """``x`` (last axis D wide) in ``cdt``, plus ``bias[lo:lo + D]`` when given."""
    x = x.astype(cdt, copy=False)
    if bias is None:
        return x
    return x + bias[lo : lo + x.shape[-1]].astype(cdt, copy=False)


def _qkv(
    query: np.ndarray,
    key: np.ndarray | None,
    value: np.ndarray | None,
    bias: np.ndarray | None,
    n: int,
    cdt: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(Q, K, V) as ``(B, N, S|L, H)`` stacks in ``cdt``, and whether K and V came split
    into heads (cross attention: no past may follow)."""
    if bias is not None and bias.ndim != 1:
        raise ValueError("MultiHeadAttention: bias must be 1-D (D + D + Dv)")
    if key is None:
        if query.ndim != 5 or query.shape[2] != n or query.shape[3] != 3 or value is not None:
            raise ValueError(
                "MultiHeadAttention: without key, query must be packed QKV (B, L, N, 3, H)"
            )
        d = n * query.shape[4]
        if bias is not None and bias.shape[0] != 3 * d:
            raise ValueError(f"MultiHeadAttention: bias has {bias.shape[0]} values, not {3 * d}")
        parts = []
        for j in range(3):
            x = query[:, :, :, j, :].astype(cdt, copy=False)
            if bias is not None:
                x = x + bias[j * d : (j + 1) * d].reshape(n, -1).astype(cdt, copy=False)
            parts.append(x.transpose(0, 2, 1, 3))
        return parts[0], parts[1], parts[2], False
    if query.ndim != 3:
        raise ValueError("MultiHeadAttention: query must be (batch, sequence, hidden)")
    b, _, d = query.shape
    if key.shape[0] != b or (value is not None and value.shape[0] != b):
        raise ValueError("MultiHeadAttention: query, key and value differ in batch size")
    if key.ndim == 5:
        if value is not None or bias is not None:
            raise ValueError("MultiHeadAttention: packed KV takes no value and no bias")
        if key.shape[2:4] != (n, 2) or n * key.shape[4] != d:
            raise ValueError("MultiHeadAttention: packed KV must be (B, L, N, 2, D / N)")
        q = _heads(query.astype(cdt, copy=False), n, "query")
        kv = key.astype(cdt, copy=False).transpose(3, 0, 2, 1, 4)
        return q, kv[0], kv[1], False
    if value is None:
        raise ValueError("MultiHeadAttention: key without value (and not packed KV)")
    if key.ndim == 4:
        if bias is not None:
            raise ValueError("MultiHeadAttention: bias is not allowed when key is 4-D")
        if value.ndim != 4 or key.shape[1] != n or value.shape[1] != n:
            raise ValueError("MultiHeadAttention: a 4-D key and value are (B, N, L, H)")
        if key.shape[3] * n != d or key.shape[2] != value.shape[2]:
            raise ValueError("MultiHeadAttention: 4-D key/value do not match query's heads")
        q = _heads(query.astype(cdt, copy=False), n, "query")
        return q, key.astype(cdt, copy=False), value.astype(cdt, copy=False), True
    if key.ndim != 3 or value.ndim != 3 or key.shape[2] != d or key.shape[1] != value.shape[1]:
        raise ValueError(
            "MultiHeadAttention: key (B, L, D) and value (B, L, Dv) must match query (B, S, D)"
        )
    if bias is not None and bias.shape[0] != 2 * d + value.shape[2]:
        raise ValueError(
            f"MultiHeadAttention: bias has {bias.shape[0]} values, not {2 * d + value.shape[2]}"
        )
    q = _heads(_with_bias(query, bias, 0, cdt), n, "query")
    k = _heads(_with_bias(key, bias, d, cdt), n, "key")
    v = _heads(_with_bias(value, bias, 2 * d, cdt), n, "value")
    return q, k, v, False


def _check_mask(mask: np.ndarray, b: int, s: int, t: int) -> None:
    """The key padding mask forms this kernel takes (module doc); ValueError otherwise."""
    if mask.shape in ((b,), (b, t), (b, s, t)):
        return
    raise ValueError(
        f"MultiHeadAttention: key_padding_mask {mask.shape} is not (B,) {(b,)}, (B, T) "
        f"{(b, t)} or (B, S, T) {(b, s, t)}"
    )


def _check_bias(ab: np.ndarray, b: int, n: int, s: int, t: int) -> None:
    """``attention_bias`` is (B or 1, N or 1, S, T); ValueError otherwise."""
    if ab.ndim == 4 and ab.shape[2:] == (s, t) and ab.shape[0] in (1, b) and ab.shape[1] in (1, n):
        return
    raise ValueError(
        f"MultiHeadAttention: attention_bias {ab.shape} is not (B or 1, N or 1, S, T) "
        f"with B, N, S, T = {b}, {n}, {s}, {t}"
    )


def _mha(ctx: KernelContext) -> ComputeFn:
    """MultiHeadAttention (com.microsoft), the module doc's contract."""
    heads = int(ctx.attr("num_heads", 0))
    if heads <= 0:
        raise ctx.unsupported(f"num_heads={heads} must be positive")
    for slot, name in _REFUSED_INPUTS.items():
        if ctx.has_input(slot):
            raise ctx.unsupported(f"the {name} input is not supported")
    if ctx.n_outputs > 3 and ctx.has_output(3):
        raise ctx.unsupported("the qk output is not supported")
    causal = bool(ctx.attr("unidirectional", 0))
    scale_attr = float(ctx.attr("scale", 0.0))
    additive_mask, _ = _mask_memo(float(ctx.attr("mask_filter_value", -10000.0)))
    want_present = ctx.has_output(1) or ctx.has_output(2)
    n_out = ctx.n_outputs

    def mha(
        query: np.ndarray,
        key: np.ndarray | None = None,
        value: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        key_padding_mask: np.ndarray | None = None,
        attention_bias: np.ndarray | None = None,
        past_key: np.ndarray | None = None,
        past_value: np.ndarray | None = None,
        *_refused: Any,
    ) -> Any:
        dt = query.dtype
        cdt = float_compute_dtype(dt)
        q, k, v, split = _qkv(query, key, value, bias, heads, cdt)
        b, _, s, hq = q.shape
        if (past_key is None) != (past_value is None):
            raise ValueError("MultiHeadAttention: past_key and past_value go together")
        if past_key is not None and past_value is not None:
            if split:
                raise ValueError("MultiHeadAttention: no past with a 4-D key and value")
            if past_key.ndim != 4 or past_value.ndim != 4:
                raise ValueError("MultiHeadAttention: the past is (B, N, P, H)")
            if past_key.shape[:2] != (b, heads) or past_value.shape[:2] != (b, heads):
                raise ValueError("MultiHeadAttention: the past's batch or heads differ")
            if past_key.shape[2] != past_value.shape[2]:
                raise ValueError("MultiHeadAttention: past_key and past_value differ in length")
            if past_key.shape[3] != hq or past_value.shape[3] != v.shape[3]:
                raise ValueError("MultiHeadAttention: the past's head size differs")
            p = past_key.shape[2]
            k = np.concatenate((past_key.astype(cdt, copy=False), k), axis=2)
            v = np.concatenate((past_value.astype(cdt, copy=False), v), axis=2)
        else:
            p = 0
        t = k.shape[2]
        add = None
        if key_padding_mask is not None:
            _check_mask(key_padding_mask, b, s, t)
            add = additive_mask(key_padding_mask, b, s, t, p, cdt)
        if attention_bias is not None:
            _check_bias(attention_bias, b, heads, s, t)
        y = attend(q, k, v, scale_attr or 1.0 / math.sqrt(hq), add, attention_bias, causal,
                   p, dt)  # fmt: skip
        if n_out == 1:
            return y
        outs: list[Any] = [y]
        if want_present:
            outs += [np.ascontiguousarray(k, dtype=dt), np.ascontiguousarray(v, dtype=dt)]
        return tuple(outs + [None] * (n_out - len(outs)))

    return mha


def _mha_cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    """The two score products, 4 * B*S*T*D (T from the present when it is an output)."""
    if not ins or not outs or len(outs[0]) != 3:
        return Cost(0.0, 0.0)
    b, s, dv = outs[0]
    t = outs[1][2] if len(outs) > 1 and len(outs[1]) == 4 else s
    flops = 4.0 * b * s * t * dv
    moved = 4.0 * (sum(math.prod(i) for i in ins) + sum(math.prod(o) for o in outs))
    return Cost(flops, moved)


def register_kernels(registry: KernelRegistry) -> None:
    """Register MultiHeadAttention (com.microsoft)."""
    registry.add("MultiHeadAttention", _mha, domain=MS_DOMAIN, since=1, cost=_mha_cost)
