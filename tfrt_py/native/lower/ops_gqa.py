"""Lowering for com.microsoft GroupQueryAttention, the attention of onnxruntime-genai's
decoders (issue 37): with it their whole step lowers, and a box of past lengths
(``generic.py``) serves every step of a generation with one function.

The steps of the interpreter's kernel (``kernels/contrib/gqa.py``; its compiled small-call
pass ``gqa_jit.py`` has the same loops): per batch row, where its new tokens go (``at``:
0 for a first prompt, else ``seqlens_k + 1 - S``) and its length (``seqlens_k``), read at
run time; the presents (the past up to ``at``, the new keys -- rotated when
``do_rotary`` -- and values, zeros after); the rotated queries; per query row ``i`` and
head, the keys ``j <= min(at + i, seqlens_k)`` (the head's KV head ``n // (N / Nkv)``):
scores ``scale * q.k`` (``dot_rows_f4``), softmax and times V (``softmax_rows_f4``): sums
in vector lanes. A seqlens_k that does not fit the past, or a position past the rotary
cache, raises in the generated code (a fixed message), and the tier then runs the
interpreter, which raises the kernel's error.

Packed QKV (no ``key``/``value``: the model builder's form) reads the queries, keys and
values from their columns of the one input. Declined: position_ids / attention_bias /
head_sink inputs, softcap, a local window, smooth_softmax, another dtype than float32.
Same contract as ``ops.py``: ``fn(cx, node) -> lines``; pure; load time or the compile
worker.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir import Node, Value
from .context import CACHE_DECLINE
from .loops import Ref
from .ops_dec import ROWDOT_IMPORT
from .records import Registry
from .source import literal

__all__ = ["register_lowerings"]

_MS = "com.microsoft"
#: The import line of a module whose code calls ``softmax_rows_f4``.
SOFTMAX_IMPORT = "from tfrt_py.native.kernels.rowdot import softmax_rows_f4"
_RAISE = "raise ValueError('GroupQueryAttention input out of range')"


def _input(node: Node, i: int) -> Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _at(r: Ref, expr: str) -> str:
    return f"{r.buf}[{r.off} + {expr}]"


def _gqa(cx: Any, node: Node) -> list[str]:
    at_ = node.attrs
    heads, kvh = int(at_.get("num_heads", 0)), int(at_.get("kv_num_heads", 0))
    if heads <= 0 or kvh <= 0 or heads % kvh:
        cx.decline("GroupQueryAttention heads")
    if float(at_.get("softcap", 0.0)) > 0 or int(at_.get("local_window_size", -1)) > 0:
        cx.decline("GroupQueryAttention with softcap or a local window")
    packed = _input(node, 1) is None
    if int(at_.get("smooth_softmax", 0)) or (packed and _input(node, 2) is not None):
        cx.decline("GroupQueryAttention: smooth_softmax, or a value without a key")
    if any(_input(node, i) is not None for i in (9, 10, 11)):
        cx.decline("GroupQueryAttention with position_ids, attention_bias or head_sink")
    rotary = bool(int(at_.get("do_rotary", 0)))
    inter = bool(int(at_.get("rotary_interleaved", 0)))
    q = cx.ref(node.inputs[0])
    k, v = (q, q) if packed else (cx.ref(node.inputs[1]), cx.ref(node.inputs[2]))
    if any(str(r.dtype) != "float32" or len(r.shape) != 3 for r in (q, k, v)):
        cx.decline("GroupQueryAttention of another dtype or rank")
    b_, s_, row = q.shape
    h_ = row // (heads + 2 * kvh) if packed else row // heads
    width = heads * h_
    # each token's row in q, k and v: its length, and where the part read starts
    rq, rk = (row, row) if packed else (width, kvh * h_)
    cq, ck, cv = (0, width, width + kvh * h_) if packed else (0, 0, 0)
    fits = (
        row == (heads + 2 * kvh) * h_
        if packed
        else (row == width and k.shape == (b_, s_, kvh * h_) and v.shape == k.shape)
    )
    if not fits or h_ % 2 or h_ == 0:
        cx.decline(f"GroupQueryAttention of shapes {q.shape}, {k.shape}, {v.shape}")
    pk_v, pv_v = _input(node, 3), _input(node, 4)
    # in place (``cache.py``): the presents' buffers already start with the pasts, which
    # are not read here; only the new positions (and the zeros after a short row) are written
    in_place = pk_v is not None and id(pk_v) in cx.unread
    if in_place and (pv_v is None or id(pv_v) not in cx.unread):
        cx.decline(f"{CACHE_DECLINE} one of GroupQueryAttention's presents")
    past = None
    if pk_v is not None and pv_v is not None:
        past = (
            [cx.shapes[id(x)] for x in (pk_v, pv_v)]
            if in_place
            else [(r.shape, r.dtype) for r in (cx.ref(pk_v), cx.ref(pv_v))]
        )
    p_ = 0 if past is None else past[0][0][2]
    if past is not None and any(tuple(sh) != (b_, kvh, p_, h_) or str(dt) != "float32"
                                for sh, dt in past):  # fmt: skip
        cx.decline("GroupQueryAttention's past of another shape")
    lens_v = _input(node, 5)
    lens = cx.ref(lens_v)
    if lens.shape != (b_,) or str(lens.dtype) not in ("int32", "int64"):
        cx.decline("GroupQueryAttention's seqlens_k")
    half = h_ // 2
    tables = None
    if rotary:
        cos_v, sin_v = _input(node, 7), _input(node, 8)
        if cos_v is None or sin_v is None:
            cx.decline("GroupQueryAttention rotary without its caches")
        tables = (cx.ref(cos_v), cx.ref(sin_v))
        if any(len(r.shape) != 2 or r.shape[1] != half or str(r.dtype) != "float32"
               for r in tables):  # fmt: skip
            cx.decline("GroupQueryAttention's rotary caches")
    t_ = p_ + s_
    outs = [*node.outputs, None, None]
    y = cx.out(outs[0])
    pk = cx.out(outs[1]) if outs[1] is not None else cx.new_buffer((b_, kvh, t_, h_), q.dtype)
    pv = cx.out(outs[2]) if outs[2] is not None else cx.new_buffer((b_, kvh, t_, h_), q.dtype)
    if y.shape != (b_, s_, width) or pk.shape != (b_, kvh, t_, h_) or pv.shape != pk.shape:
        cx.decline("GroupQueryAttention's outputs")
    if bool(pk.mat) != in_place or bool(pv.mat) != in_place:
        cx.decline(f"{CACHE_DECLINE} GroupQueryAttention's presents")
    # each (batch, KV head) matrix of a present: its own stride (a buffer in place) or T x H
    MK, MV = pk.mat or literal(t_ * h_), pv.mat or literal(t_ * h_)
    qr = cx.new_buffer((s_, heads, h_), q.dtype)
    w = cx.new_buffer((t_,), q.dtype)
    pasts = [] if past is None or in_place else [cx.ref(pk_v), cx.ref(pv_v)]
    cx.extend(*([q] + ([] if packed else [k, v]) + [lens] + pasts))
    cx.imports.add(ROWDOT_IMPORT)
    cx.imports.add(SOFTMAX_IMPORT)
    g = cx.tag
    B, S, N, KV, H, HALF, T, P = (literal(x) for x in (b_, s_, heads, kvh, h_, half, t_, p_))
    RQ, RK, CQ, CK, CV = (literal(x) for x in (rq, rk, cq, ck, cv))
    scale = float(at_.get("scale", 0.0)) or 1.0 / math.sqrt(h_)

    def rotate(dst: str, src: str, src_ref: Ref, dst_ref: Ref, pos: str) -> list[str]:
        """Lines writing the rotated head at ``src`` (in ``src_ref``) to ``dst``."""
        if tables is None:
            to, fro = _at(dst_ref, f"{dst} + {g}d"), _at(src_ref, f"{src} + {g}d")
            return [f"for {g}d in range({H}):", f"    {to} = {fro}"]
        c = f"{pos} * {HALF} + {g}t"
        cos, sin = _at(tables[0], c), _at(tables[1], c)
        a, b = (f"2 * {g}t", f"2 * {g}t + 1") if inter else (f"{g}t", f"{HALF} + {g}t")
        return [f"for {g}t in range({HALF}):",
                f"    {g}x1 = {_at(src_ref, f'{src} + {a}')}",
                f"    {g}x2 = {_at(src_ref, f'{src} + {b}')}",
                f"    {_at(dst_ref, f'{dst} + {a}')} = {g}x1 * {cos} - {g}x2 * {sin}",
                f"    {_at(dst_ref, f'{dst} + {b}')} = {g}x2 * {cos} + {g}x1 * {sin}"]  # fmt: skip

    lines = [f"for {g}b in range({B}):",
             f"    {g}len = i8({_at(lens, f'{g}b')})",
             f"    {g}at = {g}len + 1 - {S}" if p_ else f"    {g}at = 0",
             f"    if {g}len < 0 or {g}len >= {T} or {g}at < 0 or {g}at > {P}:",
             f"        {_RAISE}"]  # fmt: skip
    if tables is not None:
        lines += [f"    if {g}at + {S} > {literal(tables[0].shape[0])}:", f"        {_RAISE}"]
    # the presents
    body = [f"for {g}g in range({KV}):",
            f"    for {g}j in range({T}):",
            f"        {g}ok = ({g}b * {KV} + {g}g) * {MK} + {g}j * {H}",
            f"        {g}ov = ({g}b * {KV} + {g}g) * {MV} + {g}j * {H}",
            f"        if {g}j < {g}at:"]  # fmt: skip
    if past is not None and not in_place:
        pk_r, pv_r = pasts
        src = f"(({g}b * {KV} + {g}g) * {P} + {g}j) * {H}"
        there = f"{g}src + {g}d"
        body += [f"            {g}src = {src}",
                 f"            for {g}d in range({H}):",
                 f"                {_at(pk, f'{g}ok + {g}d')} = {_at(pk_r, there)}",
                 f"                {_at(pv, f'{g}ov + {g}d')} = {_at(pv_r, there)}"]  # fmt: skip
    else:  # no past, or the buffer's first positions are the past
        body += ["            pass"]
    new = f"({g}b * {S} + {g}j - {g}at) * {RK} + {g}g * {H}"
    body += [f"        elif {g}j < {g}at + {S}:",
             f"            {g}src = {new}",
             *["            " + ln for ln in rotate(f"{g}ok", f"{g}src + {CK}", k, pk, f"{g}j")],
             f"            for {g}d in range({H}):",
             f"                {_at(pv, f'{g}ov + {g}d')} = {_at(v, f'{g}src + {CV} + {g}d')}",
             "        else:",
             f"            for {g}d in range({H}):",
             f"                {_at(pk, f'{g}ok + {g}d')} = f4(0.0)",
             f"                {_at(pv, f'{g}ov + {g}d')} = f4(0.0)"]  # fmt: skip
    # the rotated queries, then the attention of each query row and head
    body += [f"for {g}i in range({S}):",
             f"    for {g}n in range({N}):",
             f"        {g}qo = ({g}i * {N} + {g}n) * {H}",
             f"        {g}src = ({g}b * {S} + {g}i) * {RQ} + {CQ} + {g}n * {H}",
             *["        " + ln for ln in rotate(f"{g}qo", f"{g}src", q, qr, f"({g}at + {g}i)")],
             f"for {g}i in range({S}):",
             f"    {g}hi = min({g}at + {g}i, {g}len)",
             f"    for {g}n in range({N}):",
             f"        {g}kv = ({g}b * {KV} + {g}n // {literal(heads // kvh)}) * {MK}",
             f"        {g}vv = ({g}b * {KV} + {g}n // {literal(heads // kvh)}) * {MV}",
             f"        {g}qo = ({g}i * {N} + {g}n) * {H}",
             f"        dot_rows_f4({qr.buf}, {qr.off} + {g}qo, {pk.buf}, {pk.off} + {g}kv, "
             f"{w.buf}, {w.off}, {g}hi + 1, {H}, f4({literal(scale)}))",
             f"        {g}yo = (({g}b * {S} + {g}i) * {N} + {g}n) * {H}",
             f"        softmax_rows_f4({w.buf}, {w.off}, {g}hi + 1, {pv.buf}, {pv.off} + {g}vv, "
             f"{H}, {y.buf}, {y.off} + {g}yo)"]  # fmt: skip
    return lines + ["    " + ln for ln in body]


def register_lowerings(reg: Registry) -> None:
    """GroupQueryAttention (no row rule: rows mode declines it)."""
    reg.add(_MS, "GroupQueryAttention", _gqa)
