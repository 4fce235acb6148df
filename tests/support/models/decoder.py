"""A small KV-cache decoder written with onnx.helper, with the inputs and outputs Hugging
Face optimum's ``text-generation-with-past`` exports have (``input_ids``,
``attention_mask``, ``position_ids``, ``past_key_values.N.key/value`` -> ``logits``,
``present.N.key/value``, the cache ``[batch, kv_heads, past, head_dim]``): pre-LN blocks,
causal attention over the past plus a padding mask, grouped KV heads when ``kv_heads <
heads`` (Llama), learned positions (GPT-2). Random weights from a fixed seed; the logits
are scaled so that the top two tokens stay far apart (greedy tokens compare exactly
between runtimes).

``reference_greedy`` is the loop a user writes against onnxruntime, the tokens tfrt_py's
``generate`` must reproduce.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from .builders import FLOAT, INT64, Net, tensor_info

VOCAB = 61
MAX_POSITIONS = 64


def decoder(
    *,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int = 8,
    positions: bool = True,
    mask: bool = True,
    seed: int = 7,
    fused: bool = False,
) -> onnx.ModelProto:
    """The decoder (see the module docstring). ``positions=False`` computes positions in
    the graph (past length + index) and has no ``position_ids`` input; ``mask=False`` has
    no ``attention_mask`` (causal masking only); ``fused=True`` writes each attention as
    one com.microsoft MultiHeadAttention with the past, the padding mask and the
    projections' biases (the form onnxruntime's transformer optimizer fuses a decoder's
    attention to; needs ``kv_heads == heads`` and ``mask``)."""
    if fused and (kv_heads != heads or not mask):
        raise ValueError("fused attention: kv_heads == heads, with a mask")
    dim = heads * head_dim
    net = Net("tiny_decoder", seed=seed)
    made: dict[str, str] = {}

    def i64(name: str, v: Any) -> str:
        """An int64 constant, made once per name."""
        if name not in made:
            made[name] = net.const(name, np.array(v, np.int64))
        return made[name]

    past_len = net.op("Shape", "past_key_values.0.key", start=2, end=3)  # [1]
    seq_len = net.op("Shape", "input_ids", start=1, end=2)
    total = net.op("Add", past_len, seq_len)
    p0 = net.op("Squeeze", past_len, i64("axis0", [0]))
    t0 = net.op("Squeeze", total, i64("axis0", [0]))
    one = i64("one", 1)
    q_pos = net.op("Range", p0, t0, one)  # [S]: the queries' places in the cache
    k_pos = net.op("Range", i64("zero", 0), t0, one)  # [T]
    future = net.op("Greater", net.op("Unsqueeze", k_pos, i64("axis0", [0])),
                    net.op("Unsqueeze", q_pos, i64("axis1", [1])))  # fmt: skip
    neg = net.const("neg", np.float32(-1e9))
    zero_f = net.const("zero_f", np.float32(0.0))
    bias = net.op("Where", future, neg, zero_f)  # [S, T]
    if mask:
        m = net.op("Cast", "attention_mask", to=onnx.TensorProto.FLOAT)
        pad = net.op("Mul", net.op("Sub", net.const("one_f", np.float32(1.0)), m), neg)
        bias = net.op("Add", bias, net.op("Unsqueeze", pad, i64("axes12", [1, 2])))

    wte = net.weight("wte", (VOCAB, dim), scale=1.0)
    wpe = net.weight("wpe", (MAX_POSITIONS, dim), scale=0.5)
    pos = "position_ids" if positions else net.op("Unsqueeze", q_pos, i64("axis0", [0]))
    x = net.op("Add", net.op("Gather", wte, "input_ids"), net.op("Gather", wpe, pos))

    def norm(h: str, name: str) -> str:
        g = net.uniform(f"{name}_g", (dim,), 0.8, 1.2)
        return net.op("LayerNormalization", h, g, net.weight(f"{name}_b", (dim,), 0.1), axis=-1)

    def split(h: str, n: int, perm: list[int]) -> str:
        return net.op("Transpose", net.op("Reshape", h, i64(f"to{n}", [0, 0, n, head_dim])),
                      perm=perm)  # fmt: skip

    key_mask = net.op("Cast", "attention_mask", to=onnx.TensorProto.INT32) if fused else ""
    for layer in range(layers):
        h = norm(x, f"ln{layer}a")
        if fused:
            proj = [net.op("MatMul", h, net.weight(f"{p}{layer}", (dim, dim))) for p in "qkv"]
            ctx = net.op_multi("MultiHeadAttention", *proj, net.weight(f"qkv_b{layer}", (3 * dim,)),
                               key_mask, "", f"past_key_values.{layer}.key",
                               f"past_key_values.{layer}.value", domain="com.microsoft",
                               num_heads=heads, unidirectional=1,
                               outputs=[f"attn{layer}", f"present.{layer}.key",
                                        f"present.{layer}.value"])[0]  # fmt: skip
            x = net.op("Add", x, net.op("MatMul", ctx, net.weight(f"o{layer}", (dim, dim))))
            f = net.op("MatMul", norm(x, f"ln{layer}b"), net.weight(f"f{layer}", (dim, 2 * dim)))
            f = net.op("Mul", f, net.op("Sigmoid", f))
            x = net.op("Add", x, net.op("MatMul", f, net.weight(f"g{layer}", (2 * dim, dim))))
            continue
        q = split(net.op("MatMul", h, net.weight(f"q{layer}", (dim, dim))), heads, [0, 2, 1, 3])
        kv = []
        for part in ("key", "value"):
            w = net.weight(f"{part[0]}{layer}", (dim, kv_heads * head_dim))
            new = split(net.op("MatMul", h, w), kv_heads, [0, 2, 1, 3])
            past = f"past_key_values.{layer}.{part}"
            full = net.op("Concat", past, new, axis=2, outputs=[f"present.{layer}.{part}"])
            if kv_heads < heads:  # grouped heads: each KV head serves heads/kv_heads queries
                rep = i64("rep", [1, 1, heads // kv_heads, 1, 1])
                tiled = net.op("Tile", net.op("Unsqueeze", full, i64("axis2", [2])), rep)
                full = net.op("Reshape", tiled, i64("heads_back", [0, heads, -1, head_dim]))
            kv.append(full)
        scores = net.op("MatMul", q, net.op("Transpose", kv[0], perm=[0, 1, 3, 2]))
        scale = net.const(f"scale{layer}", np.float32(head_dim**-0.5))
        scores = net.op("Add", net.op("Mul", scores, scale), bias)
        ctx = net.op("MatMul", net.op("Softmax", scores, axis=-1), kv[1])
        ctx = net.op(
            "Reshape", net.op("Transpose", ctx, perm=[0, 2, 1, 3]), i64("merge", [0, 0, dim])
        )
        x = net.op("Add", x, net.op("MatMul", ctx, net.weight(f"o{layer}", (dim, dim))))
        f = net.op("MatMul", norm(x, f"ln{layer}b"), net.weight(f"f{layer}", (dim, 2 * dim)))
        f = net.op("Mul", f, net.op("Sigmoid", f))
        x = net.op("Add", x, net.op("MatMul", f, net.weight(f"g{layer}", (2 * dim, dim))))
    net.op("MatMul", norm(x, "lnf"), net.weight("lm_head", (dim, VOCAB), scale=2.0),
           outputs=["logits"])  # fmt: skip

    inputs = [tensor_info("input_ids", INT64, ["batch_size", "sequence_length"])]
    if mask:
        total_dims = ["batch_size", "past_sequence_length + sequence_length"]
        inputs.append(tensor_info("attention_mask", INT64, total_dims))
    if positions:
        inputs.append(tensor_info("position_ids", INT64, ["batch_size", "sequence_length"]))
    cache: list[int | str | None] = ["batch_size", kv_heads, "past_sequence_length", head_dim]
    grown: list[int | str | None] = [
        "batch_size",
        kv_heads,
        "past_sequence_length + sequence_length",
        head_dim,
    ]
    outputs = [tensor_info("logits", FLOAT, ["batch_size", "sequence_length", VOCAB])]
    for layer in range(layers):
        for part in ("key", "value"):
            inputs.append(tensor_info(f"past_key_values.{layer}.{part}", FLOAT, cache))
            outputs.append(tensor_info(f"present.{layer}.{part}", FLOAT, grown))
    if fused:
        return net.model(inputs, outputs, opset=17, extra_opsets={"com.microsoft": 1},
                         check=False)  # fmt: skip
    return net.model(inputs, outputs, opset=17)


def reference_greedy(session: Any, prompts: list[list[int]], new_tokens: int) -> np.ndarray:
    """Greedy generation with onnxruntime, written out as a user would (transformers'
    conventions: left padding, positions ``cumsum(mask) - 1``): [batch, width + new]."""
    names = {i.name for i in session.get_inputs()}
    cache = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
    width, batch = max(map(len, prompts)), len(prompts)
    ids = np.zeros((batch, width), np.int64)
    mask = np.zeros((batch, width), np.int64)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :], mask[r, width - len(p) :] = p, 1
    past = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32) for i in cache}
    positions = np.maximum(mask.cumsum(1) - 1, 0)
    out_ids, step = [ids], ids
    for _ in range(new_tokens):
        feeds = {"input_ids": step, **past}
        if "attention_mask" in names:
            feeds["attention_mask"] = mask
        if "position_ids" in names:
            feeds["position_ids"] = positions
        res = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        step = res["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        out_ids.append(step)
        past = {k: res[k.replace("past_key_values", "present")] for k in past}
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], 1)
        positions = positions[:, -1:] + 1
    return np.concatenate(out_ids, 1)


def genai_decoder(*, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                  seed: int = 11, packed: bool = False) -> onnx.ModelProto:  # fmt: skip
    """A decoder shaped as onnxruntime-genai's model builder writes one: ``input_ids``,
    ``attention_mask`` and ``past_key_values.N.key/value`` in, ``logits`` and
    ``present.N.key/value`` out; in the graph ``seqlens_k`` and ``total_sequence_length``
    from the mask, SimplifiedLayerNormalization and com.microsoft
    SkipSimplifiedLayerNormalization, and com.microsoft GroupQueryAttention with rotary
    (cos/sin caches as initializers). Random weights from a fixed seed. ``packed``: one
    MatMul makes queries, keys and values side by side and the attention reads them as
    one input (no key and value), as the model builder writes it."""
    dim = heads * head_dim
    net = Net("genai_decoder", seed=seed)
    ms = "com.microsoft"
    axes1 = net.const("axes1", np.array([1], np.int64))
    lens = net.op("Sub", net.op("ReduceSum", "attention_mask", axes1, keepdims=0),
                  net.const("one64", np.array(1, np.int64)))  # fmt: skip
    seqlens = net.op("Cast", lens, to=onnx.TensorProto.INT32)
    total = net.op("Cast", net.op("Squeeze", net.op("Shape", "attention_mask", start=1, end=2),
                                  net.const("axis0", np.array([0], np.int64))),
                   to=onnx.TensorProto.INT32)  # fmt: skip
    half = head_dim // 2
    angle = np.arange(MAX_POSITIONS)[:, None] / 10000 ** (np.arange(half)[None] / half)
    cos = net.const("cos_cache", np.cos(angle).astype(np.float32))
    sin = net.const("sin_cache", np.sin(angle).astype(np.float32))
    x = net.op("Gather", net.weight("embed", (VOCAB, dim), scale=1.0), "input_ids")
    skip = x  # the residual stream; the first layer's norm has no skip input
    for layer in range(layers):
        g = net.uniform(f"n{layer}a", (dim,), 0.8, 1.2)
        if layer == 0:
            h = net.op("SimplifiedLayerNormalization", x, g, axis=-1, epsilon=1e-6)
        else:
            h, _, _, skip = net.op_multi("SkipSimplifiedLayerNormalization", x, skip, g,
                                         outputs=4, domain=ms, epsilon=1e-6)  # fmt: skip
        if packed:
            width = (heads + 2 * kv_heads) * head_dim
            q, k, v = net.op("MatMul", h, net.weight(f"qkv{layer}", (dim, width))), "", ""
        else:
            q = net.op("MatMul", h, net.weight(f"q{layer}", (dim, dim)))
            k = net.op("MatMul", h, net.weight(f"k{layer}", (dim, kv_heads * head_dim)))
            v = net.op("MatMul", h, net.weight(f"v{layer}", (dim, kv_heads * head_dim)))
        past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        attn = net.op_multi("GroupQueryAttention", q, k, v, past_k, past_v, seqlens, total,
                            cos, sin, domain=ms, num_heads=heads, kv_num_heads=kv_heads,
                            do_rotary=1,
                            outputs=[f"attn{layer}", f"present.{layer}.key",
                                     f"present.{layer}.value"])[0]  # fmt: skip
        x = net.op("MatMul", attn, net.weight(f"o{layer}", (dim, dim)))
    g = net.uniform("nf", (dim,), 0.8, 1.2)
    h = net.op_multi("SkipSimplifiedLayerNormalization", x, skip, g, outputs=1, domain=ms,
                     epsilon=1e-6)[0]  # fmt: skip
    net.op("MatMul", h, net.weight("lm_head", (dim, VOCAB), scale=2.0), outputs=["logits"])
    inputs = [
        tensor_info("input_ids", INT64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", INT64, ["batch_size", "total_sequence_length"]),
    ]
    cache: list[int | str | None] = ["batch_size", kv_heads, "past_sequence_length", head_dim]
    outputs = [tensor_info("logits", FLOAT, ["batch_size", "sequence_length", VOCAB])]
    for layer in range(layers):
        for part in ("key", "value"):
            inputs.append(tensor_info(f"past_key_values.{layer}.{part}", FLOAT, cache))
            grown: list[int | str | None] = ["batch_size", kv_heads, "total_sequence_length",
                                             head_dim]  # fmt: skip
            outputs.append(tensor_info(f"present.{layer}.{part}", FLOAT, grown))
    return net.model(inputs, outputs, opset=17, extra_opsets={ms: 1}, check=False)
