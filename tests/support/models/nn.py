"""Neural-network test models written with onnx.helper: MLP, CNN, GRU, LSTM, transformer
block, embedding recommender, and a dynamic-batch model."""

from __future__ import annotations

import numpy as np

from .builders import FLOAT, INT32, INT64, ModelCase, Net, float_feed, tensor_info


def mlp() -> ModelCase:
    """x[4,32] -> Gemm(alpha, beta, B as [in,out]) -> Relu -> Gemm(transB) -> Relu -> Gemm
    -> Softmax."""
    net = Net("mlp", seed=101)
    w1 = net.weight("fc1_w", (32, 64), scale=32**-0.5)
    b1 = net.weight("fc1_b", (64,), scale=0.1)
    h = net.op("Gemm", "x", w1, b1, alpha=1.0, beta=0.5)
    h = net.op("Relu", h)
    h = net.dense(h, 64, 48)
    logits = net.dense(h, 48, 10, act=None)
    net.op("Softmax", logits, outputs=["probs"], axis=-1)
    model = net.model([tensor_info("x", FLOAT, [4, 32])], [tensor_info("probs", FLOAT, [4, 10])])
    rng = np.random.default_rng(1)
    return ModelCase("mlp", model, ({"x": float_feed(rng, (4, 32))},))


def cnn() -> ModelCase:
    """Conv + BatchNormalization + Relu + MaxPool + AveragePool + GlobalAveragePool +
    Flatten + Gemm, on x[2,3,16,16]."""
    net = Net("small_cnn", seed=102)
    c1 = net.op(
        "Conv", "image", net.weight("conv1_w", (8, 3, 3, 3)), kernel_shape=[3, 3], pads=[1, 1, 1, 1]
    )
    scale = net.uniform("bn1_scale", (8,), 0.5, 1.5)
    bias = net.weight("bn1_bias", (8,), scale=0.1)
    mean = net.weight("bn1_mean", (8,), scale=0.1)
    var = net.uniform("bn1_var", (8,), 0.5, 2.0)
    h = net.op("BatchNormalization", c1, scale, bias, mean, var, epsilon=1e-5)
    h = net.op("Relu", h)
    h = net.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])  # -> [2,8,8,8]
    h = net.op(
        "Conv",
        h,
        net.weight("conv2_w", (16, 8, 3, 3)),
        net.weight("conv2_b", (16,), scale=0.1),
        kernel_shape=[3, 3],
        strides=[1, 1],
        dilations=[1, 1],
    )  # -> [2,16,6,6]
    h = net.op("Relu", h)
    h = net.op("AveragePool", h, kernel_shape=[2, 2], strides=[2, 2])  # -> [2,16,3,3]
    h = net.op(
        "Conv",
        h,
        net.weight("conv3_w", (24, 4, 1, 1)),
        group=4,
        kernel_shape=[1, 1],
    )  # grouped 1x1 -> [2,24,3,3]
    h = net.op("GlobalAveragePool", h)  # -> [2,24,1,1]
    h = net.op("Flatten", h, axis=1)
    net.dense(h, 24, 10, act=None, out="logits")
    model = net.model(
        [tensor_info("image", FLOAT, [2, 3, 16, 16])], [tensor_info("logits", FLOAT, [2, 10])]
    )
    rng = np.random.default_rng(2)
    return ModelCase("cnn", model, ({"image": float_feed(rng, (2, 3, 16, 16))},))


def gru() -> ModelCase:
    """A forward GRU (linear_before_reset=1, as PyTorch exports) with an initial state fed
    at run time and per-batch sequence_lens, followed by a classifier on the last state."""
    seq, batch, n_in, hidden = 5, 3, 4, 6
    net = Net("gru", seed=103)
    w = net.weight("gru_W", (1, 3 * hidden, n_in))
    r = net.weight("gru_R", (1, 3 * hidden, hidden))
    b = net.weight("gru_B", (1, 6 * hidden), scale=0.1)
    net.op_multi(
        "GRU",
        "X",
        w,
        r,
        b,
        "sequence_lens",
        "initial_h",
        outputs=["Y", "Y_h"],
        hidden_size=hidden,
        linear_before_reset=1,
        direction="forward",
    )
    last = net.op("Squeeze", "Y_h", net.const("squeeze_axes", [0], np.int64))
    net.dense(last, hidden, 3, act=None, out="scores")
    model = net.model(
        [
            tensor_info("X", FLOAT, [seq, batch, n_in]),
            tensor_info("sequence_lens", INT32, [batch]),
            tensor_info("initial_h", FLOAT, [1, batch, hidden]),
        ],
        [
            tensor_info("Y", FLOAT, [seq, 1, batch, hidden]),
            tensor_info("Y_h", FLOAT, [1, batch, hidden]),
            tensor_info("scores", FLOAT, [batch, 3]),
        ],
    )
    rng = np.random.default_rng(3)
    feeds = tuple(
        {
            "X": float_feed(rng, (seq, batch, n_in)),
            "sequence_lens": np.array(lens, dtype=np.int32),
            "initial_h": float_feed(rng, (1, batch, hidden), 0.5),
        }
        for lens in ([5, 5, 5], [5, 2, 4])
    )
    return ModelCase("gru", model, feeds)


def lstm() -> ModelCase:
    """A bidirectional LSTM with initial hidden and cell states and sequence_lens; the two
    final states are concatenated per batch row and fed to a Gemm head."""
    seq, batch, n_in, hidden = 6, 3, 5, 8
    net = Net("bilstm", seed=104)
    w = net.weight("lstm_W", (2, 4 * hidden, n_in))
    r = net.weight("lstm_R", (2, 4 * hidden, hidden))
    b = net.weight("lstm_B", (2, 8 * hidden), scale=0.1)
    net.op_multi(
        "LSTM",
        "X",
        w,
        r,
        b,
        "sequence_lens",
        "initial_h",
        "initial_c",
        outputs=["Y", "Y_h", "Y_c"],
        hidden_size=hidden,
        direction="bidirectional",
    )
    h = net.op("Transpose", "Y_h", perm=[1, 0, 2])  # [batch, 2, hidden]
    h = net.op("Reshape", h, net.const("head_shape", [0, -1], np.int64))  # [batch, 2*hidden]
    net.dense(h, 2 * hidden, 4, act="Tanh", out="head")
    model = net.model(
        [
            tensor_info("X", FLOAT, [seq, batch, n_in]),
            tensor_info("sequence_lens", INT32, [batch]),
            tensor_info("initial_h", FLOAT, [2, batch, hidden]),
            tensor_info("initial_c", FLOAT, [2, batch, hidden]),
        ],
        [
            tensor_info("Y", FLOAT, [seq, 2, batch, hidden]),
            tensor_info("Y_h", FLOAT, [2, batch, hidden]),
            tensor_info("Y_c", FLOAT, [2, batch, hidden]),
            tensor_info("head", FLOAT, [batch, 4]),
        ],
    )
    rng = np.random.default_rng(4)
    feeds = tuple(
        {
            "X": float_feed(rng, (seq, batch, n_in)),
            "sequence_lens": np.array(lens, dtype=np.int32),
            "initial_h": float_feed(rng, (2, batch, hidden), 0.5),
            "initial_c": float_feed(rng, (2, batch, hidden), 0.5),
        }
        for lens in ([6, 6, 6], [6, 4, 1])
    )
    return ModelCase("lstm_bidirectional", model, feeds)


def _transformer(opset: int) -> ModelCase:
    """One pre-LN transformer block with causal multi-head attention; GELU is the opset-20
    ``Gelu`` op when ``opset >= 20``, else spelled out with Erf."""
    seq, dim, heads = 8, 16, 4
    head_dim = dim // heads
    net = Net(f"transformer_block_opset{opset}", seed=105)

    def layer_norm(x: str, prefix: str) -> str:
        gamma = net.uniform(f"{prefix}_gamma", (dim,), 0.8, 1.2)
        beta = net.weight(f"{prefix}_beta", (dim,), scale=0.1)
        return net.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-5)

    def linear(x: str, prefix: str, n_in: int, n_out: int) -> str:
        y = net.op("MatMul", x, net.weight(f"{prefix}_w", (n_in, n_out), scale=n_in**-0.5))
        return net.op("Add", y, net.weight(f"{prefix}_b", (n_out,), scale=0.05))

    heads_shape = net.const("heads_shape", [0, 0, heads, head_dim], np.int64)

    def to_heads(x: str, perm: list[int]) -> str:
        """[B, S, D] -> [B, S, H, Dh] -> transposed by ``perm``."""
        return net.op("Transpose", net.op("Reshape", x, heads_shape), perm=perm)

    ln1 = layer_norm("x", "ln1")
    q = to_heads(linear(ln1, "q", dim, dim), [0, 2, 1, 3])  # [B, H, S, Dh]
    k = to_heads(linear(ln1, "k", dim, dim), [0, 2, 3, 1])  # [B, H, Dh, S]
    v = to_heads(linear(ln1, "v", dim, dim), [0, 2, 1, 3])  # [B, H, S, Dh]
    scores = net.op("MatMul", q, k)  # [B, H, S, S]
    scores = net.op("Mul", scores, net.const("attn_scale", np.float32(head_dim**-0.5)))
    causal = np.triu(np.full((seq, seq), -1e4, dtype=np.float32), k=1)
    scores = net.op("Add", scores, net.const("causal_mask", causal))
    attn = net.op("Softmax", scores, axis=-1)
    ctx = net.op("MatMul", attn, v)  # [B, H, S, Dh]
    ctx = net.op("Transpose", ctx, perm=[0, 2, 1, 3])
    ctx = net.op("Reshape", ctx, net.const("merge_shape", [0, 0, dim], np.int64))
    h1 = net.op("Add", "x", linear(ctx, "proj", dim, dim))

    ff = linear(layer_norm(h1, "ln2"), "ff1", dim, 4 * dim)
    if opset >= 20:
        ff = net.op("Gelu", ff, approximate="none")
    else:
        scaled = net.op("Div", ff, net.const("sqrt2", np.float32(np.sqrt(2.0))))
        erf1 = net.op("Add", net.op("Erf", scaled), net.const("one", np.float32(1.0)))
        ff = net.op("Mul", net.op("Mul", ff, erf1), net.const("half", np.float32(0.5)))
    ff = linear(ff, "ff2", 4 * dim, dim)
    net.op("Add", h1, ff, outputs=["y"])
    model = net.model(
        [tensor_info("x", FLOAT, ["batch", seq, dim])],
        [tensor_info("y", FLOAT, ["batch", seq, dim])],
        opset=opset,
    )
    rng = np.random.default_rng(5)
    feeds = ({"x": float_feed(rng, (2, seq, dim))}, {"x": float_feed(rng, (1, seq, dim))})
    name = "transformer_gelu20" if opset >= 20 else "transformer_erf"
    return ModelCase(name, model, feeds)


def transformer_erf() -> ModelCase:
    return _transformer(17)


def transformer_gelu20() -> ModelCase:
    return _transformer(20)


def recommender() -> ModelCase:
    """Embedding + MLP click model: user and item-history ids (int64) gathered from
    embedding tables, history mean-pooled, concatenated with dense features, MLP, Sigmoid."""
    n_users, n_items, emb = 100, 50, 8
    net = Net("recommender", seed=106)
    users = net.op("Gather", net.weight("user_table", (n_users, emb), 0.3), "user_id", axis=0)
    hist = net.op("Gather", net.weight("item_table", (n_items, emb), 0.3), "item_history", axis=0)
    hist = net.op("ReduceMean", hist, axes=[1], keepdims=0)  # [N, emb]
    feats = net.op("Concat", users, hist, "dense", axis=1)  # [N, 2*emb + 4]
    h = net.dense(feats, 2 * emb + 4, 32)
    h = net.dense(h, 32, 1, act=None)
    net.op("Sigmoid", h, outputs=["click_prob"])
    model = net.model(
        [
            tensor_info("user_id", INT64, ["N"]),
            tensor_info("item_history", INT64, ["N", 5]),
            tensor_info("dense", FLOAT, ["N", 4]),
        ],
        [tensor_info("click_prob", FLOAT, ["N", 1])],
    )
    rng = np.random.default_rng(6)
    feeds = tuple(
        {
            "user_id": rng.integers(0, n_users, size=(n,), dtype=np.int64),
            "item_history": rng.integers(0, n_items, size=(n, 5), dtype=np.int64),
            "dense": float_feed(rng, (n, 4)),
        }
        for n in (6, 1)
    )
    return ModelCase("recommender", model, feeds)


DYNAMIC_BATCH_SIZES = (1, 3, 17)


def dynamic_batch() -> ModelCase:
    """x["N",10] -> MatMul + Add + Relu -> Reshape to [N,4,5] with a shape computed from
    Shape(x) -> ReduceMax -> Softmax. Run at batch sizes 1, 3 and 17 on one loaded model."""
    net = Net("dynamic_batch", seed=107)
    h = net.op("MatMul", "x", net.weight("w", (10, 20)))
    h = net.op("Add", h, net.weight("b", (20,), scale=0.1))
    hidden = net.op("Relu", h, outputs=["hidden"])
    n = net.op("Shape", "x", start=0, end=1)  # [N]
    shape = net.op("Concat", n, net.const("tail_shape", [4, 5], np.int64), axis=0)
    grouped = net.op("Reshape", hidden, shape)
    pooled = net.op("ReduceMax", grouped, axes=[2], keepdims=0)
    net.op("Softmax", pooled, outputs=["probs"], axis=1)
    model = net.model(
        [tensor_info("x", FLOAT, ["N", 10])],
        [tensor_info("probs", FLOAT, ["N", 4]), tensor_info("hidden", FLOAT, ["N", 20])],
    )
    rng = np.random.default_rng(7)
    feeds = tuple({"x": float_feed(rng, (n, 10))} for n in DYNAMIC_BATCH_SIZES)
    return ModelCase("dynamic_batch", model, feeds)
