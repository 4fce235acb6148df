"""Kernels of the transformer, quant, signal, strings and vision families, checked against
onnxruntime (tiny one-node models) or NumPy."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tfrt_py.ir import Node, Value
from tfrt_py.kernels import KernelContext, default_registry

RNG = np.random.default_rng(0)


def kernel(
    op: str,
    n_in: int,
    n_out: int = 1,
    opset: int = 23,
    domain: str = "",
    consts: dict[int, np.ndarray] | None = None,
    absent: tuple[int, ...] = (),
    **attrs: Any,
) -> Any:
    """Build op's compute function for a node with inputs i0.. (``consts`` are
    initializers, ``absent`` omitted optional inputs)."""
    consts = consts or {}
    ins: list[Value | None] = [
        None if i in absent else Value(f"i{i}", const=consts.get(i)) for i in range(n_in)
    ]
    node = Node(
        op,
        ins,
        [Value(f"o{i}") for i in range(n_out)],
        attrs,
        name="n",
        domain=domain,
        opset=opset,
    )
    kd = default_registry().lookup(domain, op, opset)
    return kd.build(KernelContext(node))


def run_ort(
    op: str,
    inputs: list[np.ndarray | None],
    n_out: int,
    opset: int,
    out_types: list[int],
    **attrs: Any,
) -> list[np.ndarray]:
    """Run one node on onnxruntime (``None`` inputs are omitted optional inputs)."""
    names = ["" if x is None else f"i{i}" for i, x in enumerate(inputs)]
    node = helper.make_node(op, names, [f"o{i}" for i in range(n_out)], **attrs)
    g_in = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(x.dtype) if x.dtype != object else 8, x.shape
        )
        for n, x in zip(names, inputs)
        if x is not None
    ]
    g_out = [helper.make_tensor_value_info(f"o{i}", t, None) for i, t in enumerate(out_types)]
    graph = helper.make_graph([node], "g", g_in, g_out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    return list(sess.run(None, feeds))


def naive_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """4-D reference: (B, Hq, S, D), (B, Hkv, T, D); GQA by repeating KV heads."""
    g = q.shape[1] // k.shape[1]
    k = np.repeat(k, g, axis=1).astype(np.float64)
    v = np.repeat(v, g, axis=1).astype(np.float64)
    s = (scale or 1 / np.sqrt(q.shape[-1])) * q.astype(np.float64) @ k.swapaxes(-1, -2)
    sq, t = s.shape[-2:]
    if causal:
        s = s + np.where(np.arange(t)[None] <= np.arange(sq)[:, None] + (t - sq), 0, -np.inf)
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


# -- transformer --------------------------------------------------------------------------


def test_attention_3d_gqa_with_past_matches_naive() -> None:
    B, S, P, Hq, Hkv, D = 2, 3, 4, 6, 2, 8
    q = RNG.standard_normal((B, S, Hq * D), dtype=np.float32)
    k = RNG.standard_normal((B, S, Hkv * D), dtype=np.float32)
    v = RNG.standard_normal((B, S, Hkv * D), dtype=np.float32)
    pk = RNG.standard_normal((B, Hkv, P, D), dtype=np.float32)
    pv = RNG.standard_normal((B, Hkv, P, D), dtype=np.float32)
    fn = kernel("Attention", 6, 3, absent=(3,), q_num_heads=Hq, kv_num_heads=Hkv, is_causal=1)
    y, present_k, present_v = fn(q, k, v, None, pk, pv)
    k4 = np.concatenate([pk, k.reshape(B, S, Hkv, D).transpose(0, 2, 1, 3)], axis=2)
    v4 = np.concatenate([pv, v.reshape(B, S, Hkv, D).transpose(0, 2, 1, 3)], axis=2)
    q4 = q.reshape(B, S, Hq, D).transpose(0, 2, 1, 3)
    want = naive_attention(q4, k4, v4, causal=True).transpose(0, 2, 1, 3).reshape(B, S, -1)
    assert y.dtype == np.float32 and y.shape == (B, S, Hq * D)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(present_k, k4)
    np.testing.assert_array_equal(present_v, v4)


def test_attention_fully_masked_row_is_zero_without_warnings() -> None:
    q = RNG.standard_normal((1, 2, 3, 4), dtype=np.float32)
    k = RNG.standard_normal((1, 2, 5, 4), dtype=np.float32)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    fn = kernel("Attention", 4, 4, qk_matmul_output_mode=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, _, _, probs = fn(q, k, k, mask)
    assert np.all(y[:, :, 1] == 0) and np.all(probs[:, :, 1] == 0)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(probs.sum(-1)[:, :, [0, 2]], 1, rtol=1e-6)
    bias = np.where(mask, 0, -np.inf)
    want = naive_attention(q[:, :, [0, 2]], k, k, mask=bias[[0, 2]])
    np.testing.assert_allclose(y[:, :, [0, 2]], want, rtol=1e-5, atol=1e-6)


def test_attention_float16_keeps_dtype() -> None:
    q = RNG.standard_normal((1, 2, 3, 8)).astype(np.float16)
    fn = kernel("Attention", 3, 1, is_causal=1)
    y = fn(q, q, q)
    assert y.dtype == np.float16
    want = naive_attention(q, q, q, causal=True)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_matches_ort(interleaved: int) -> None:
    x = RNG.standard_normal((2, 3, 4, 8), dtype=np.float32)
    cos = RNG.standard_normal((10, 3), dtype=np.float32)
    sin = RNG.standard_normal((10, 3), dtype=np.float32)
    pos = np.array([[0, 1, 2, 3], [5, 6, 7, 9]], dtype=np.int64)
    fn = kernel("RotaryEmbedding", 4, interleaved=interleaved, rotary_embedding_dim=6)
    (want,) = run_ort(
        "RotaryEmbedding",
        [x, cos, sin, pos],
        1,
        23,
        [TensorProto.FLOAT],
        interleaved=interleaved,
        rotary_embedding_dim=6,
    )
    np.testing.assert_allclose(fn(x, cos, sin, pos), want, rtol=1e-5, atol=1e-6)


def test_linear_attention_decode_matches_prefill() -> None:
    """Running T steps one at a time with the carried state equals one T-step call."""
    B, T, H, dk, dv = 1, 5, 2, 4, 3
    q = RNG.standard_normal((B, T, H * dk), dtype=np.float32)
    k = RNG.standard_normal((B, T, H * dk), dtype=np.float32)
    v = RNG.standard_normal((B, T, H * dv), dtype=np.float32)
    decay = -np.abs(RNG.standard_normal((B, T, H), dtype=np.float32))
    beta = RNG.random((B, T, H), dtype=np.float32)
    fn = kernel("LinearAttention", 6, 2, opset=27, q_num_heads=H, kv_num_heads=H)
    y_all, s_all = fn(q, k, v, None, decay, beta)
    state = np.zeros((B, H, dk, dv), dtype=np.float32)
    for t in range(T):
        sl = slice(t, t + 1)
        y_t, state = fn(q[:, sl], k[:, sl], v[:, sl], state, decay[:, sl], beta[:, sl])
        np.testing.assert_allclose(y_t[:, 0], y_all[:, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, s_all, rtol=1e-5, atol=1e-5)


# -- quant --------------------------------------------------------------------------------


def test_quantize_dequantize_per_axis_constants_match_ort() -> None:
    x = (RNG.standard_normal((2, 3, 4)) * 50).astype(np.float32)
    x[0, 0, :3] = [0.5, 1.5, 2.5]  # ties round to even
    scale = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    zp = np.array([0, -3, 5], dtype=np.int8)
    q_fn = kernel("QuantizeLinear", 3, opset=21, consts={1: scale, 2: zp}, axis=1)
    dq_fn = kernel("DequantizeLinear", 3, opset=21, consts={1: scale, 2: zp}, axis=1)
    q = q_fn(x, scale, zp)
    (want_q,) = run_ort("QuantizeLinear", [x, scale, zp], 1, 21, [TensorProto.INT8], axis=1)
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q, want_q)
    (want_dq,) = run_ort("DequantizeLinear", [q, scale, zp], 1, 21, [TensorProto.FLOAT], axis=1)
    np.testing.assert_allclose(dq_fn(q, scale, zp), want_dq, rtol=1e-6)
    # a second shape through the same (memoised) constant layout
    np.testing.assert_array_equal(q_fn(x[:1], scale, zp), want_q[:1])


def test_blocked_quantization_matches_ort() -> None:
    x = RNG.standard_normal((3, 5), dtype=np.float32) * 10
    scale = np.abs(RNG.standard_normal((3, 3), dtype=np.float32)) + 0.1
    zp = RNG.integers(0, 20, (3, 3)).astype(np.uint8)
    fn = kernel("QuantizeLinear", 3, opset=21, axis=1, block_size=2)
    (want,) = run_ort(
        "QuantizeLinear", [x, scale, zp], 1, 21, [TensorProto.UINT8], axis=1, block_size=2
    )
    np.testing.assert_array_equal(fn(x, scale, zp), want)
    dq = kernel("DequantizeLinear", 3, opset=21, axis=1, block_size=2)
    (want_dq,) = run_ort(
        "DequantizeLinear", [want, scale, zp], 1, 21, [TensorProto.FLOAT], axis=1, block_size=2
    )
    np.testing.assert_allclose(dq(want, scale, zp), want_dq, rtol=1e-6)


def test_quantize_float8_saturates_and_int4() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, 1000.0, -1000.0, 3.3], dtype=np.float32)
    one = np.array(1.0, dtype=np.float32)
    f8 = kernel("QuantizeLinear", 2, opset=21, output_dtype=TensorProto.FLOAT8E4M3FN)(x, one)
    assert f8.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(f8.astype(np.float32)[:3], [1.0, 448.0, -448.0])
    i4 = kernel("QuantizeLinear", 2, opset=21, output_dtype=TensorProto.INT4)(x, one)
    assert i4.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(i4.astype(np.int8), [1, 7, -8, 3])


@pytest.mark.parametrize("kind", ["normal", "zeros"])
def test_dynamic_quantize_linear_matches_ort(kind: str) -> None:
    """An empty range (all zeros) has scale 1, as onnxruntime's, not 1/255."""
    x = RNG.standard_normal((4, 5), dtype=np.float32) * (kind == "normal")
    y, s, z = kernel("DynamicQuantizeLinear", 1, 3, opset=11)(x)
    wy, ws, wz = run_ort(
        "DynamicQuantizeLinear", [x], 3, 11, [TensorProto.UINT8, TensorProto.FLOAT, 2]
    )
    assert y.dtype == np.uint8 and s.dtype == np.float32 and z.dtype == np.uint8
    assert np.abs(y.astype(int) - wy).max() <= 1
    np.testing.assert_allclose(s, ws, rtol=1e-6)
    assert z == wz


def test_dynamic_quantize_is_one_compiled_call_with_the_numpy_paths_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lib.quant.dynamic_quantize`` (DynamicQuantizeLinear, DynamicQuantizeMatMul): one
    compiled call finds the range on the float bits, the scale, the zero point and the
    codes; every answer equals the NumPy path's (``$TFRT_PY_JIT=0``) bit for bit: values of
    one sign, zeros of both signs, constants, denormals, the float32 limits, a strided
    view, half steps (rounding half to even); NaN and infinity leave it for NumPy's (which
    warns of nothing)."""
    pytest.importorskip("numba", reason="the compiled path is numba's")
    from tests.support.jit_paths import spying_jitted
    from tfrt_py.kernels.lib import quant

    rng = np.random.default_rng(11)
    finite = [
        rng.standard_normal(1000).astype(np.float32) * 3 + 0.5,
        np.abs(rng.standard_normal(100)).astype(np.float32),
        -np.abs(rng.standard_normal(100)).astype(np.float32),
        np.zeros(7, np.float32),
        np.array([-0.0, -0.0], np.float32),
        np.full(5, -3.0, np.float32),
        np.full(5, 2.5, np.float32),
        np.array([-0.0, 1e-40, -1e-40], np.float32),
        np.array([3.4e38, -3.4e38, 1.0], np.float32),
        rng.standard_normal((3, 5, 7)).astype(np.float32)[:, ::2],
        (rng.integers(-255, 256, 999) / 2).astype(np.float32),
    ]
    others = [np.array([1.0, np.nan], np.float32), np.array([1.0, -np.inf], np.float32)]
    if quant._DYNAMIC.get() is None:
        pytest.skip("numba is off in this process")
    got = []
    with spying_jitted(quant._DYNAMIC) as calls:
        got = [quant.dynamic_quantize(x) for x in finite + others]
    assert len(calls) == len(finite) + len(others)  # the NaN/inf cases return False
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    for x, (y, s, z) in zip(finite + others, got, strict=True):
        wy, ws, wz = quant.dynamic_quantize(x)
        assert y.shape == x.shape and y.dtype == np.uint8
        np.testing.assert_array_equal(y, wy)
        assert (s == ws or (np.isnan(s) and np.isnan(ws))) and z == wz


# -- signal -------------------------------------------------------------------------------


def test_dft_rfft_irfft_roundtrip_opset20() -> None:
    x = RNG.standard_normal((2, 8, 3, 1), dtype=np.float32)
    axis = np.array(1, dtype=np.int64)
    spec = kernel("DFT", 3, opset=20, absent=(1,), onesided=1)(x, None, axis)
    assert spec.shape == (2, 5, 3, 2) and spec.dtype == np.float32
    want = np.fft.rfft(x[..., 0], axis=1)
    np.testing.assert_allclose(spec[..., 0] + 1j * spec[..., 1], want, rtol=1e-4, atol=1e-5)
    back = kernel("DFT", 3, opset=20, absent=(1,), onesided=1, inverse=1)(spec, None, axis)
    np.testing.assert_allclose(back, x, rtol=1e-4, atol=1e-5)


def test_dft_opset17_axis_attribute_and_stft() -> None:
    x = RNG.standard_normal((1, 6, 4, 2), dtype=np.float32)
    out = kernel("DFT", 1, opset=17, axis=2)(x)
    want = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=2)
    np.testing.assert_allclose(out[..., 0] + 1j * out[..., 1], want, rtol=1e-4, atol=1e-5)
    sig = RNG.standard_normal((1, 32, 1), dtype=np.float32)
    win = np.hanning(8).astype(np.float32)
    st = kernel("STFT", 3, opset=17)(sig, np.array(4, dtype=np.int64), win)
    frames = np.stack([sig[0, i : i + 8, 0] * win for i in range(0, 25, 4)])
    np.testing.assert_allclose(st[0, ..., 0] + 1j * st[0, ..., 1], np.fft.rfft(frames), atol=1e-5)


def test_windows_match_ort() -> None:
    size = np.array(7, dtype=np.int64)
    for op in ("HannWindow", "HammingWindow", "BlackmanWindow"):
        for periodic in (0, 1):
            fn = kernel(op, 1, opset=17, consts={0: size}, periodic=periodic)
            (want,) = run_ort(op, [size], 1, 17, [TensorProto.FLOAT], periodic=periodic)
            got = fn(size)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            got[0] = 99  # each call returns its own array
            assert fn(size)[0] != 99


# -- strings ------------------------------------------------------------------------------


def test_string_ops() -> None:
    x = np.array(["a,b,,c", "", "hello"], dtype=object)
    y, z = kernel("StringSplit", 1, 2, opset=20, delimiter=",")(x)
    assert y.shape == (3, 4) and y.dtype == object
    assert y[0].tolist() == ["a", "b", "", "c"] and y[1].tolist() == [""] * 4
    assert z.tolist() == [4, 1, 1] and z.dtype == np.int64
    y2, z2 = kernel("StringSplit", 1, 2, opset=20, maxsplit=1)(np.array([" a  b c "], object))
    assert y2.tolist() == [["a", "b c "]] and z2.tolist() == [2]
    norm = kernel("StringNormalizer", 1, opset=10, case_change_action="UPPER", stopwords=["the"])
    assert norm(np.array([["The", "cat", "the"]], object)).tolist() == [["CAT"]]
    assert norm(np.array(["the"], object)).tolist() == [""]
    cat = kernel("StringConcat", 2, opset=20)
    assert cat(np.array(["a", "b"], object), np.array(["!"], object)).tolist() == ["a!", "b!"]
    rx = kernel("RegexFullMatch", 1, opset=20, pattern=r"[a-z]+\d")
    assert rx(np.array([["ab1", "ab12"]], object)).tolist() == [[True, False]]


def test_tfidf_vectorizer_matches_ort() -> None:
    attrs: dict[str, Any] = dict(
        mode="TFIDF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=1,
        ngram_counts=[0, 4],
        ngram_indexes=[0, 1, 2, 3, 4, 5],
        pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8],
        weights=[1.0, 0.5, 2.0, 1.0, 3.0, 1.0],
    )
    x = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], dtype=np.int32)
    fn = kernel("TfIdfVectorizer", 1, opset=9, **attrs)
    (want,) = run_ort("TfIdfVectorizer", [x], 1, 9, [TensorProto.FLOAT], **attrs)
    np.testing.assert_allclose(fn(x), want)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize(("min_n", "max_n", "skip"), [(1, 1, 0), (1, 1, 3), (1, 2, 2), (2, 2, 0)])
def test_tfidf_vectorizer_strings_match_ort(mode: str, min_n: int, max_n: int, skip: int) -> None:
    """Unigrams (counted in one pass over the tokens), bigrams with skips, padding tokens
    in the pool, strings of every kind."""
    attrs: dict[str, Any] = dict(
        mode=mode, min_gram_length=min_n, max_gram_length=max_n, max_skip_count=skip,
        ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5],
        pool_strings=["a", "#", "", "é", "a", "#", "é", "a"],
        weights=[1.0, 0.5, 2.0, 1.0, 3.0, 1.5],
    )  # fmt: skip
    x = np.array([["a", "a", "é", "#", "", "z"], ["é", "a", "#", "#", "a", "é"]], dtype=object)
    fn = kernel("TfIdfVectorizer", 1, opset=9, **attrs)
    (want,) = run_ort("TfIdfVectorizer", [x], 1, 9, [TensorProto.FLOAT], **attrs)
    np.testing.assert_allclose(fn(x), want)
    np.testing.assert_allclose(fn(x[0]), want[0])


# -- vision -------------------------------------------------------------------------------


@pytest.mark.compiles
def test_non_max_suppression_matches_ort() -> None:
    boxes = RNG.random((2, 30, 4), dtype=np.float32)
    scores = RNG.random((2, 3, 30), dtype=np.float32)
    args: list[np.ndarray | None] = [
        boxes,
        scores,
        np.array([5], np.int64),
        np.array([0.3], np.float32),
        np.array([0.2], np.float32),
    ]
    (want,) = run_ort("NonMaxSuppression", args, 1, 11, [TensorProto.INT64])
    got = kernel("NonMaxSuppression", 5, opset=11)(*args)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_matches_ort(mode: str, padding: str) -> None:
    x = RNG.standard_normal((1, 2, 4, 5), dtype=np.float32)
    grid = RNG.uniform(-1.3, 1.3, (1, 3, 6, 2)).astype(np.float32)
    fn = kernel("GridSample", 2, opset=20, mode=mode, padding_mode=padding)
    (want,) = run_ort(
        "GridSample", [x, grid], 1, 20, [TensorProto.FLOAT], mode=mode, padding_mode=padding
    )
    np.testing.assert_allclose(fn(x, grid), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_matches_ort(mode: str) -> None:
    x = RNG.standard_normal((2, 3, 8, 9), dtype=np.float32)
    rois = np.array([[0, 0, 5, 5], [1.5, 2.2, 7.9, 6.1], [3, 1, 3.5, 7]], dtype=np.float32)
    idx = np.array([0, 1, 1], dtype=np.int64)
    attrs: dict[str, Any] = dict(
        mode=mode, output_height=3, output_width=2, sampling_ratio=0, spatial_scale=0.9
    )
    (want,) = run_ort("RoiAlign", [x, rois, idx], 1, 16, [TensorProto.FLOAT], **attrs)
    got = kernel("RoiAlign", 3, opset=16, **attrs)(x, rois, idx)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
