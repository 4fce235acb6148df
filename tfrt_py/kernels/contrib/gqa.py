"""Kernels (contrib): GroupQueryAttention-1 of the com.microsoft domain, the attention of
onnxruntime-genai's decoders (Llama, Phi, Qwen, Mistral exports of its model builder).

``(query, key, value, past_key?, past_value?, seqlens_k, total_sequence_length,
cos_cache?, sin_cache?) -> (output, present_key, present_value)``:

* ``query`` ``(B, S, N*H)``, ``key``/``value`` ``(B, S, Nkv*H)`` (``num_heads`` N,
  ``kv_num_heads`` Nkv dividing it); the past ``(B, Nkv, P, H)`` (absent: P = 0). Packed
  QKV (no ``key`` and ``value``: what the model builder writes) is one ``query``
  ``(B, S, (N + 2 Nkv) * H)``, its queries, keys and values side by side.
* ``seqlens_k[b]`` is row ``b``'s total length minus one. A first prompt (no past) starts
  every row at 0 (a row shorter than S is padded on the right); after a past, row ``b``'s
  new tokens start at ``a_b = seqlens_k[b] + 1 - S`` (``P`` when the rows are even).
* With ``do_rotary=1`` the new queries and keys are rotated first (``cos_cache``/
  ``sin_cache`` ``(max positions, H/2)``; halves, or pairs with ``rotary_interleaved=1``)
  at positions ``a_b + i``.
* ``present`` ``(B, Nkv, P + S, H)``: row ``b``'s past up to ``a_b``, then its new
  entries, then zeros (one concatenation when every row starts at P).
* Query ``i`` of row ``b`` sees keys ``j <= a_b + i`` (causal) and ``j <= seqlens_k[b]``,
  and with ``local_window_size = w > 0`` only ``j > a_b + i - w``; scores ``scale * q
  k^T`` (default ``1/sqrt(H)``), with ``softcap = c > 0`` capped to ``c * tanh(x / c)``;
  softmax; times V; query head ``h`` reads KV head ``h // (N / Nkv)``.

Refused at load, naming the option: a ``value`` without a ``key``, ``position_ids``,
``attention_bias`` and ``head_sink`` inputs, ``smooth_softmax``, quantized caches. At run
time a past buffer longer than ``seqlens_k`` allows (the shared past/present buffer form,
``past_present_share_buffer``) is an error: this kernel grows the cache by concatenation.
Checked against onnxruntime's CPU provider (tests/kernels/test_contrib_gqa.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import ComputeFn, Cost, KernelContext
from ..lib.sdpa import attention_steps, compile_at_build, softmax_attention
from ..registry import KernelRegistry
from . import gqa_jit
from .activation import MS_DOMAIN

__all__ = ["register_kernels"]

_REFUSED_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink"}


def _grown(past: np.ndarray | None, new: np.ndarray, start: np.ndarray, p: int) -> np.ndarray:
    """The present cache (B, heads, P + S, H): each row's past up to its ``start``, then
    its new entries (the rest zero); one concatenation when every row starts at P."""
    if past is None or p == 0:
        return new
    if (start == p).all():
        return np.concatenate([past, new], axis=2)
    out = np.zeros((*new.shape[:2], p + new.shape[2], new.shape[3]), new.dtype)
    for r, at in enumerate(start.tolist()):
        out[r, :, :at] = past[r, :, :at]
        out[r, :, at : at + new.shape[2]] = new[r]
    return out


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """``x`` (B, heads, S, H) rotated by ``cos``/``sin`` (B, 1, S, H/2)."""
    c, s = cos, sin
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
        return out
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _unpacked(qkv: np.ndarray, heads: int, kv_heads: int) -> tuple[np.ndarray, ...]:
    """Packed QKV ``(B, S, (N + 2 Nkv) * H)`` as views of its queries, keys and values."""
    if qkv.ndim != 3 or qkv.shape[-1] % (heads + 2 * kv_heads):
        raise ValueError(f"GroupQueryAttention: packed QKV {qkv.shape} does not fit {heads} "
                         f"heads and {kv_heads} KV heads")  # fmt: skip
    h = qkv.shape[-1] // (heads + 2 * kv_heads)
    q, kv = heads * h, kv_heads * h
    return qkv[..., :q], qkv[..., q : q + kv], qkv[..., q + kv :]


def _gqa(ctx: KernelContext) -> ComputeFn:
    heads = int(ctx.attr("num_heads"))
    kv_heads = int(ctx.attr("kv_num_heads"))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise ctx.unsupported(f"num_heads {heads} is not a multiple of kv_num_heads {kv_heads}")
    scale_attr = float(ctx.attr("scale", 0.0))
    softcap = float(ctx.attr("softcap", 0.0))
    window = int(ctx.attr("local_window_size", -1))
    rotary = bool(ctx.attr("do_rotary", 0))
    interleaved = bool(ctx.attr("rotary_interleaved", 0))
    if int(ctx.attr("smooth_softmax", 0)):
        raise ctx.unsupported("smooth_softmax=1 is not supported")
    packed = not ctx.has_input(1)
    if packed and ctx.has_input(2):
        raise ctx.unsupported("a value input without a key input is not supported")
    for i, name in _REFUSED_INPUTS.items():
        if ctx.has_input(i):
            raise ctx.unsupported(f"the {name} input is not supported")
    if rotary and not (ctx.has_input(7) and ctx.has_input(8)):
        raise ctx.unsupported("do_rotary=1 needs cos_cache and sin_cache")

    flags = int(rotary) | (2 if interleaved else 0)
    compile_at_build(ctx.input_dtype(0))

    def _small(query: np.ndarray, key: np.ndarray, value: np.ndarray, past_key: Any,
               past_value: Any, start: np.ndarray, lens: np.ndarray, cos_cache: Any,
               sin_cache: Any, n: int, head: int, p: int) -> Any:  # fmt: skip
        """The compiled pass (``gqa_jit``) for a small float32 call, else None."""
        b, s, _ = query.shape
        if softcap > 0 or s * (p + s) * n * head > gqa_jit.MAX_WORK:
            return None
        fn = gqa_jit.kernel()
        f4 = np.dtype(np.float32)
        arrays = [query, key, value] + ([past_key, past_value] if p else [])
        arrays += [cos_cache, sin_cache] if rotary else []
        if fn is None or any(a is None or a.dtype != f4 for a in arrays):
            return None
        none = np.zeros((b, kv_heads, 0, head), f4)
        tab = np.zeros((1, max(1, head // 2)), f4)
        out = np.empty((b, s, n, head), f4)
        pk = np.empty((b, kv_heads, p + s, head), f4)
        pv = np.empty((b, kv_heads, p + s, head), f4)
        fn(np.ascontiguousarray(query).reshape(b, s, n, head),
           np.ascontiguousarray(key).reshape(b, s, kv_heads, head),
           np.ascontiguousarray(value).reshape(b, s, kv_heads, head),
           np.ascontiguousarray(past_key) if p else none,
           np.ascontiguousarray(past_value) if p else none, start, lens,
           np.ascontiguousarray(cos_cache) if rotary else tab,
           np.ascontiguousarray(sin_cache) if rotary else tab, flags,
           f4.type(scale_attr or 1.0 / math.sqrt(head)), window, out, pk, pv)  # fmt: skip
        return out.reshape(b, s, n * head), pk, pv

    def gqa(query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
            past_key: np.ndarray | None = None, past_value: np.ndarray | None = None,
            seqlens_k: np.ndarray | None = None, total: Any = None,
            cos_cache: np.ndarray | None = None, sin_cache: np.ndarray | None = None,
            *_: Any) -> Any:  # fmt: skip
        if packed:
            query, key, value = _unpacked(query, heads, kv_heads)
        assert key is not None and value is not None
        b, s, width = query.shape
        head = width // heads
        if width % heads or key.shape[-1] != kv_heads * head or key.shape[:2] != (b, s):
            raise ValueError(f"GroupQueryAttention: query {query.shape} and key {key.shape} "
                             f"do not fit {heads} heads and {kv_heads} KV heads")  # fmt: skip
        p = 0 if past_key is None else past_key.shape[2]
        lens = np.asarray(seqlens_k, dtype=np.int64).reshape(-1)
        if lens.shape[0] != b:
            raise ValueError(f"GroupQueryAttention: seqlens_k has {lens.shape[0]} rows, not {b}")
        if (lens >= p + s).any():
            raise ValueError("GroupQueryAttention: seqlens_k passes the past and the new "
                             "tokens (a shared past/present buffer is not supported)")  # fmt: skip
        # where each row's new tokens go: after its own past (seqlens_k + 1 - S), or at 0
        # for a first prompt (no past; a row shorter than S is padded on the right)
        start = np.zeros(b, np.int64) if p == 0 else lens + 1 - s
        if (start < 0).any() or (start > p).any():
            raise ValueError("GroupQueryAttention: seqlens_k does not fit the past and the "
                             "new tokens")  # fmt: skip
        if rotary:
            assert cos_cache is not None and sin_cache is not None
            last = int(start.max()) + s - 1
            if last >= cos_cache.shape[0]:
                raise ValueError(f"GroupQueryAttention: position {last} is past the "
                                 f"rotary cache of {cos_cache.shape[0]}")  # fmt: skip
        small = _small(query, key, value, past_key, past_value, start, lens, cos_cache,
                       sin_cache, heads, head, p)  # fmt: skip
        if small is not None:
            return small
        q = query.reshape(b, s, heads, head).transpose(0, 2, 1, 3)
        k = key.reshape(b, s, kv_heads, head).transpose(0, 2, 1, 3)
        v = value.reshape(b, s, kv_heads, head).transpose(0, 2, 1, 3)
        pos = start[:, None] + np.arange(s)[None]  # (B, S)
        if rotary:
            assert cos_cache is not None and sin_cache is not None
            cos, sin = cos_cache[pos][:, None], sin_cache[pos][:, None]  # (B, 1, S, H/2)
            q, k = _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)
        k = _grown(past_key, k, start, p)
        v = _grown(past_value, v, start, p)
        keys = np.arange(p + s)[None, None, :]
        rows = pos[:, :, None]  # (B, S, 1)
        hidden = (keys > rows) | (keys > lens[:, None, None])  # causal; the row's length
        if window > 0:
            hidden = hidden | (keys <= rows - window)
        dt = query.dtype
        bias = np.where(hidden, np.float32(-np.inf), np.float32(0)).astype(dt)[:, None]
        scale = scale_attr or 1.0 / math.sqrt(head)
        if softcap > 0:
            y = attention_steps(q, k, v, scale, bias=bias, grouped=True, softcap=softcap)[0]
        else:
            y = softmax_attention(q, k, v, scale, bias=bias, grouped=True)
        out = y.transpose(0, 2, 1, 3).reshape(b, s, heads * head).astype(dt, copy=False)
        return out, k.astype(dt, copy=False), v.astype(dt, copy=False)

    return gqa


def _gqa_cost(ctx: KernelContext, ins: list[tuple[int, ...]],
              outs: list[tuple[int, ...]]) -> Cost:  # fmt: skip
    if not ins or len(ins[0]) != 3:
        return Cost(0.0, 0.0)
    b, s, width = ins[0]
    t = s + (ins[3][2] if len(ins) > 3 and len(ins[3]) == 4 else 0)
    return Cost(4.0 * b * s * t * width, 4.0 * sum(math.prod(o) for o in outs if o))


def register_kernels(registry: KernelRegistry) -> None:
    """Register GroupQueryAttention (com.microsoft)."""
    registry.add("GroupQueryAttention", _gqa, domain=MS_DOMAIN, since=1, cost=_gqa_cost)
