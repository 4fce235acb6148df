"""Lowerings of what ``onnxruntime.quantization.quantize_dynamic`` writes (issue 36), after
``compiler/fuse_dynamic_quant``: DynamicQuantizeLinear, com.microsoft MatMulIntegerToFloat
and a per-tensor DequantizeLinear (the quantized embeddings' rows), and in a graph
onnxruntime's transformer optimizer fused first, QAttention and QEmbedLayerNormalization.
With them an int8 BERT's whole graph lowers, as its float32 source does, instead of paying
the interpreter per node.

DynamicQuantizeLinear is one ``dql_u8`` call and MatMulIntegerToFloat one ``qmm_u8`` call
(``native/kernels/qdynamic.py``): the interpreter's arithmetic and its kernel
(``qgemm_packed``'s scaled form over the weight packed here as ``IntegerWeights`` packs it),
so the outputs are the interpreter's bits. The product runs on the calling thread.
QAttention is that product into its Q/K/V rows, then the float Attention's heads
(``ops_tx.attention_core``); QEmbedLayerNormalization the float lowering
(``ops_tx.embed_norm``) over its tables dequantized here, as the interpreter dequantizes
them at load.
Declined: no integer kernel here (or the compiled kernels held back in a cold process), a
weight, its scale or zero point or the bias given at run time, a zero point per row, int8
activations. Same contract as ``ops.py``: ``fn(cx, node) -> lines``; pure; load time or
the compile worker.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from ...ir import Node, Value
from ...kernels.contrib.quantized import dequantize
from ...kernels.lib import qgemm_packed
from ...kernels.lib.qgemm_packed import layout_code
from ...kernels.lib.qgemm_rows import IntegerWeights
from .loops import loop_nest
from .ops_tx import attention_core, embed_norm
from .records import Registry
from .source import literal

__all__ = ["QDYNAMIC_IMPORT", "register_lowerings"]

_MS = "com.microsoft"
#: The import line of a module whose code calls ``dql_u8`` or ``qmm_u8``.
QDYNAMIC_IMPORT = "from tfrt_py.native.kernels.qdynamic import dql_u8, qmm_u8"
_U8, _F32 = np.dtype(np.uint8), np.dtype(np.float32)


def _kernel(cx: Any) -> Any:
    """This process's integer kernel build (declined without one)."""
    built = qgemm_packed.available()
    if built is None or qgemm_packed.kernel_scaled() is None:
        cx.decline("no integer kernel here (portable path, or the compiled kernels held back)")
    return built


def _dynamic_quantize_linear(cx: Any, node: Node) -> list[str]:
    _kernel(cx)  # the module imports the kernels' module
    x = cx.ref(node.inputs[0])
    if x.dtype != _F32:
        cx.decline(f"DynamicQuantizeLinear of {x.dtype}")
    y, s, z = (cx.out(v) for v in node.outputs[:3])
    if (y.dtype, s.dtype, z.dtype) != (_U8, _F32, _U8) or s.size != 1 or z.size != 1:
        cx.decline("DynamicQuantizeLinear outputs of another type")
    cx.imports.add(QDYNAMIC_IMPORT)
    return [f"dql_u8({x.buf}, {x.off}, {literal(x.size)}, {y.buf}, {y.off}, {s.buf}, {s.off}, "
            f"{z.buf}, {z.off})"]  # fmt: skip


def _scalar(cx: Any, v: Any, dtype: np.dtype, what: str) -> Any:
    r = cx.ref(v)
    if r.dtype != dtype or r.size != 1:
        cx.decline(f"{what} is not one {dtype} value")
    return r


#: A packed weight, its scale (one or one per column) and its bias (or None).
_Weights = tuple[IntegerWeights, np.ndarray, np.ndarray | None]


def _matmul_integer_to_float(cx: Any, node: Node) -> list[str]:
    built = _kernel(cx)
    a_v, b_v, as_v, bs_v, az_v, bz_v, bias_v = [*node.inputs, None, None, None][:7]
    w, bs, bias = _weights(cx, built, b_v, bs_v, bz_v, bias_v)
    a, y = cx.ref(a_v), cx.out(node.outputs[0])
    return _product(cx, built, (a, as_v, az_v), (w, bs, bias), y)


def _weights(cx: Any, built: Any, b_v: Any, bs_v: Any, bz_v: Any, bias_v: Any) -> _Weights:
    """The constant weight packed as the interpreter packs it, its scale (one or one per
    column, float32) and the bias (N float32 or None); declined for anything else."""
    b = cx.const(b_v) if b_v is not None else None
    bs = cx.const(bs_v) if bs_v is not None else None
    bz = cx.const(bz_v) if bz_v is not None else None
    bias = cx.const(bias_v) if bias_v is not None else None
    if b is None or bs is None or (bz_v is not None and bz is None):
        cx.decline("a weight, its scale or its zero point given at run time")
    if bias_v is not None and bias is None:
        cx.decline("a bias given at run time")
    w = IntegerWeights.make(np.asarray(b), bz)
    if w is None or w.built is not built:
        cx.decline("a weight the integer kernel does not take")
    assert w is not None  # (decline raised)
    n = w.n
    bs = np.asarray(bs, _F32).reshape(-1)
    if bs.size not in (1, n) or not np.all(np.isfinite(bs)):
        cx.decline("b_scale not one finite value or one per column")
    if bias is not None and np.asarray(bias).shape != (n,):
        cx.decline("a bias of another shape")
    return w, bs, None if bias is None else np.asarray(bias, _F32)


def _product(cx: Any, built: Any, act: tuple[Any, Any, Any], weights: _Weights,
             y: Any) -> list[str]:  # fmt: skip
    """``y`` = the rows of ``act`` (A's ref, its scale's and zero point's values) times the
    packed weight, scaled, plus the bias: one ``qmm_u8`` call."""
    a, as_v, az_v = act
    w, bs, bias = weights
    k, n = w.k, w.n
    if a.dtype != _U8 or a.shape[-1:] != (k,) or y.dtype != _F32 or y.size != a.size // k * n:
        cx.decline(f"A of {a.dtype} {a.shape} (uint8 rows of {k} codes only)")
    a_scale = _scalar(cx, as_v, _F32, "a_scale")
    a_zp = _scalar(cx, az_v, _U8, "a_zero_point") if az_v is not None else a
    m = a.size // k
    shape = w.tile  # the process's tile, or pairs256's (7-bit weights on an avx2 path)
    kg = -(-k // shape.g)
    kp = kg * shape.g
    vw = shape.nr // 2
    ldy = -(-n // vw) * vw
    consts = (w.packed.reshape(-1).view(np.int32), w.colsum32, w.wz_i32,
              w.padded(np.broadcast_to(bs, (n,))),
              w.padded(np.zeros(n, _F32) if bias is None else bias))  # fmt: skip
    names = [cx.const_slice(arr) for arr in consts]
    esize = np.dtype(qgemm_packed.a_dtype(shape)).itemsize
    staged = 0 if shape.g == 4 and kp == k else m * kp * esize
    sizes = ((staged, _U8), (m, np.dtype(np.int32)), (m * ldy if ldy != n else 1, _F32))
    scratch = [cx.view(cx.new_buffer((max(1, size),), dt)) for size, dt in sizes]
    cx.imports.add(QDYNAMIC_IMPORT)
    args = [a.buf, a.off, literal(m), literal(k), *names, a_scale.buf, a_scale.off, a_zp.buf,
            a_zp.off, str(az_v is not None), y.buf, y.off, literal(n), *scratch, literal(ldy),
            literal(kp), literal(kg), literal(w.packed.shape[0]), literal(layout_code(shape)),
            str(shape.g == 4), str(w.asymmetric)]  # fmt: skip
    return [f"qmm_u8({', '.join(args)})"]


def _qattention(cx: Any, node: Node) -> list[str]:
    """QAttention as the interpreter runs it where its operands are constants: the
    projection on the integer kernel (``_product``, the bias added as it stores), then
    Attention's heads (``ops_tx.attention_core``) over it."""
    built = _kernel(cx)
    ins = [*node.inputs, *[None] * 9][:9]
    at = node.attrs
    if ins[8] is not None or any(v is not None for v in node.outputs[1:]):
        cx.decline("QAttention with past or present")
    if int(at.get("unidirectional", 0)) or at.get("qkv_hidden_sizes") is not None:
        cx.decline("QAttention unidirectional or with qkv_hidden_sizes")
    if int(at.get("do_rotary", 0)) or int(at.get("past_present_share_buffer", 0)):
        cx.decline("QAttention decoder options")
    if ins[2] is None:
        cx.decline("QAttention without its bias")
    w, bs, bias = _weights(cx, built, ins[1], ins[4], ins[7], ins[2])
    x, y = cx.ref(ins[0]), cx.out(node.outputs[0])
    heads, d = int(at.get("num_heads", 0)), w.n // 3
    if len(x.shape) != 3 or w.n % 3 or heads <= 0 or d % heads or y.shape != (*x.shape[:2], d):
        cx.decline(f"QAttention of shapes {x.shape} x {(w.k, w.n)} with {heads} heads")
    b_, s_, _ = x.shape
    qkv = cx.new_buffer((b_ * s_, w.n), _F32)
    lines = _product(cx, built, (x, ins[3], ins[6]), (w, bs, bias), qkv)
    scale = float(at.get("scale", 0.0)) or 1.0 / math.sqrt(d // heads)
    return lines + attention_core(cx, node, qkv, y, ins[5], (heads, d, scale))


#: QEmbedLayerNormalization's quantized inputs: (codes, scale, zero point) of the word,
#: position and segment tables, gamma and beta (the interpreter's ``_TABLES``)
_TABLES = ((2, 8, 13), (3, 9, 14), (4, 10, 15), (5, 11, 16), (6, 12, 17))


def _qembed_norm(cx: Any, node: Node) -> list[str]:
    """QEmbedLayerNormalization with constant tables: EmbedLayerNormalization's lowering
    (``ops_tx.embed_norm``) over them dequantized here as the interpreter dequantizes them
    at load (so they are float32 constants of the code, as there)."""
    ins = [*node.inputs, *[None] * 18][:18]
    tables: list[Value | None] = []
    for q, s, z in _TABLES:
        if ins[q] is None:
            tables.append(None)
            continue
        vals = [cx.const(ins[i]) if ins[i] is not None else None for i in (q, s, z)]
        if vals[0] is None or vals[1] is None or (ins[z] is not None and vals[2] is None):
            cx.decline("QEmbedLayerNormalization tables given at run time")
        try:
            table = dequantize(vals[0], vals[1], vals[2], "QEmbedLayerNormalization table")
        except (TypeError, ValueError) as e:
            cx.decline(str(e))
        tables.append(Value(f"{ins[q].name}_dequantized", const=table))  # type: ignore[union-attr]
    inner = SimpleNamespace(inputs=[ins[0], ins[1], *tables, ins[7]], outputs=node.outputs,
                            attrs=node.attrs)  # fmt: skip
    return embed_norm(cx, inner)


def _dequantize_linear(cx: Any, node: Node) -> list[str]:
    """``y = (float32(x) - float32(zp)) * scale`` for one constant scale (and zero point):
    the interpreter's steps."""
    x_v, s_v, z_v = [*node.inputs, None, None][:3]
    s = cx.const(s_v) if s_v is not None else None
    z = cx.const(z_v) if z_v is not None else None
    if s is None or np.asarray(s).size != 1 or (z_v is not None and (z is None or z.size != 1)):
        cx.decline("DequantizeLinear without one constant scale and zero point")
    if int(node.attrs.get("block_size", 0)) or int(node.attrs.get("output_dtype", 0)):
        cx.decline("DequantizeLinear with block_size or output_dtype")
    scale = np.asarray(s).reshape(-1)[0]
    x, y = cx.ref(x_v), cx.out(node.outputs[0])
    if str(x.dtype) not in ("uint8", "int8", "int32") or y.dtype != _F32 or scale.dtype != _F32:
        cx.decline(f"DequantizeLinear of {x.dtype} by {scale.dtype}")
    if not (np.isfinite(scale) and scale > 0):
        cx.decline("a scale that is not positive and finite")
    if z is not None and z.dtype != x.dtype:
        cx.decline("a zero point of another dtype")
    zp = literal(float(np.float32(0 if z is None else z.reshape(-1)[0])))
    line = (f"{y.buf}[{y.off} + i0] = (f4({x.buf}[{x.off} + i0]) - f4({zp})) * "
            f"f4({literal(float(scale))})")  # fmt: skip
    return loop_nest([x.size], lambda iv: [line])


def register_lowerings(reg: Registry) -> None:
    """DynamicQuantizeLinear, MatMulIntegerToFloat, QAttention, QEmbedLayerNormalization
    and DequantizeLinear (no row rules: rows mode declines them)."""
    reg.add("", "DynamicQuantizeLinear", _dynamic_quantize_linear)
    reg.add(_MS, "MatMulIntegerToFloat", _matmul_integer_to_float)
    reg.add(_MS, "QAttention", _qattention)
    reg.add(_MS, "QEmbedLayerNormalization", _qembed_norm)
    reg.add("", "DequantizeLinear", _dequantize_linear)
