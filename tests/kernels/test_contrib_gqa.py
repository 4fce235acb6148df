"""GroupQueryAttention (com.microsoft) against onnxruntime's CPU provider: the first
prompt and decode steps over a past, grouped heads, rotary (halves and pairs), softcap,
a local window, rows whose valid length is shorter (seqlens_k); what it refuses."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.errors import UnsupportedOpError

F = TensorProto.FLOAT
H, D = 4, 16  # onnxruntime rotates heads of a multiple of 16


def _model(kv: int, rotary: int = 0, packed: bool = False, width: Any = None,
           **attrs: Any) -> bytes:  # fmt: skip
    """One GroupQueryAttention; ``packed``: queries, keys and values in one input ``qkv``
    (no key and value inputs), as onnxruntime-genai's model builder writes it, its last
    dim declared ``width`` (default (H + 2 kv) D)."""
    names = ["q", "k", "v", "pk", "pv", "seqlens_k", "total"]
    ins = [
        helper.make_tensor_value_info("q", F, ["b", "s", H * D]),
        helper.make_tensor_value_info("k", F, ["b", "s", kv * D]),
        helper.make_tensor_value_info("v", F, ["b", "s", kv * D]),
    ]
    if packed:
        names[:3] = ["qkv", "", ""]
        w = (H + 2 * kv) * D if width is None else width
        ins = [helper.make_tensor_value_info("qkv", F, ["b", "s", w])]
    ins += [
        helper.make_tensor_value_info("pk", F, ["b", kv, "p", D]),
        helper.make_tensor_value_info("pv", F, ["b", kv, "p", D]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if rotary:
        names += ["cos", "sin"]
        ins += [helper.make_tensor_value_info(n, F, [64, D // 2]) for n in ("cos", "sin")]
    node = helper.make_node("GroupQueryAttention", names, ["o", "pko", "pvo"],
                            domain="com.microsoft", num_heads=H, kv_num_heads=kv,
                            do_rotary=rotary, **attrs)  # fmt: skip
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("o", "pko", "pvo")]
    graph = helper.make_graph([node], "gqa", ins, outs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _feeds(rng: np.random.Generator, kv: int, b: int, s: int, p: int,
           lens: list[int] | None = None, rotary: int = 0,
           packed: bool = False) -> dict[str, Any]:  # fmt: skip
    f: dict[str, Any] = {
        "q": rng.standard_normal((b, s, H * D)).astype(np.float32),
        "k": rng.standard_normal((b, s, kv * D)).astype(np.float32),
        "v": rng.standard_normal((b, s, kv * D)).astype(np.float32),
        "pk": rng.standard_normal((b, kv, p, D)).astype(np.float32),
        "pv": rng.standard_normal((b, kv, p, D)).astype(np.float32),
        "seqlens_k": np.array(lens if lens is not None else [p + s - 1] * b, np.int32),
        "total": np.array(p + s, np.int32),
    }
    if rotary:
        angle = np.arange(64)[:, None] / 10000 ** (np.arange(D // 2)[None] / (D // 2))
        f["cos"], f["sin"] = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    if packed:
        f["qkv"] = np.concatenate([f.pop("q"), f.pop("k"), f.pop("v")], axis=-1)
    return f


CASES = [
    # (kv heads, batch, new, past, lens, attrs)
    (4, 1, 5, 0, None, {}),
    (2, 2, 5, 0, None, {}),
    (1, 2, 1, 7, None, {}),
    (2, 2, 1, 9, None, {"do_rotary": 1}),
    (2, 1, 6, 0, None, {"do_rotary": 1, "rotary_interleaved": 1}),
    (2, 1, 3, 4, None, {"do_rotary": 1}),
    (2, 2, 1, 6, [6, 3], {}),
    (2, 1, 1, 12, None, {"softcap": 2.0}),
    (2, 1, 6, 0, None, {"local_window_size": 3}),
    (2, 2, 5, 0, [4, 2], {}),
    (2, 1, 1, 8, None, {"scale": 0.3}),
]


@pytest.mark.parametrize(("kv", "b", "s", "p", "lens", "attrs"), CASES)
def test_matches_onnxruntime(kv: int, b: int, s: int, p: int, lens: Any, attrs: Any) -> None:
    attrs = dict(attrs)
    rotary = attrs.pop("do_rotary", 0)
    model = _model(kv, rotary, **attrs)
    feeds = _feeds(np.random.default_rng(kv * 100 + s * 10 + p), kv, b, s, p, lens, rotary)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = tfrt_py.load(model).run(feeds)
    for name, w in zip(("o", "pko", "pvo"), want):
        np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize(("kv", "b", "s", "p", "lens", "attrs"),
                         [c for c in CASES if "softcap" not in cast(dict, c[5])])  # fmt: skip
def test_the_compiled_small_call_path_and_the_numpy_path_both_match(
    kv: int, b: int, s: int, p: int, lens: Any, attrs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small float32 calls (a decode step) take ``gqa_jit``'s one compiled pass: it runs
    (counted) and matches onnxruntime; with it off (``MAX_WORK`` 0) the NumPy path does."""
    from tfrt_py.kernels.contrib import gqa_jit

    if gqa_jit.kernel() is None:
        pytest.skip("numba is off here ($TFRT_PY_JIT=0 or not installed): no compiled pass")
    attrs = dict(attrs)
    rotary = attrs.pop("do_rotary", 0)
    model = _model(kv, rotary, **attrs)
    feeds = _feeds(np.random.default_rng(kv * 100 + s * 10 + p), kv, b, s, p, lens, rotary)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    ran: list[int] = []
    real = gqa_jit.kernel

    def counted() -> Any:
        ran.append(1)
        return real()

    monkeypatch.setattr(gqa_jit, "kernel", counted)
    m = tfrt_py.load(model, executor="sync")
    for work in (gqa_jit.MAX_WORK, 0):
        monkeypatch.setattr(gqa_jit, "MAX_WORK", work)
        ran.clear()
        got = m.run(feeds)
        assert bool(ran) == bool(work), (work, ran)
        for name, w in zip(("o", "pko", "pvo"), want):
            np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=2e-5, err_msg=name)


PACKED = [c for c in CASES if c[0] in (1, 2) and "softcap" not in cast(dict, c[5])][:6]


@pytest.mark.parametrize(("kv", "b", "s", "p", "lens", "attrs"), PACKED)
@pytest.mark.parametrize("small", [True, False])
def test_packed_qkv_matches_onnxruntime(
    kv: int, b: int, s: int, p: int, lens: Any, attrs: Any, small: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The model builder's packed form (one ``qkv`` input, no key and value): the same
    outputs as onnxruntime's, on the compiled small-call pass and on the NumPy path."""
    from tfrt_py.kernels.contrib import gqa_jit

    if not small:
        monkeypatch.setattr(gqa_jit, "MAX_WORK", 0)
    attrs = dict(attrs)
    rotary = attrs.pop("do_rotary", 0)
    model = _model(kv, rotary, packed=True, **attrs)
    feeds = _feeds(np.random.default_rng(kv * 100 + s * 10 + p), kv, b, s, p, lens, rotary,
                   packed=True)  # fmt: skip
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = tfrt_py.load(model, executor="sync").run(feeds)
    for name, w in zip(("o", "pko", "pvo"), want):
        np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=2e-5, err_msg=name)
    bad = dict(feeds, qkv=feeds["qkv"][..., :-1])  # not (heads + 2 KV heads) x head size
    free = _model(kv, rotary, packed=True, width="w", **attrs)
    with pytest.raises(tfrt_py.errors.ExecutionError, match="packed QKV"):
        tfrt_py.load(free, executor="sync").run(bad)


def test_refused_options_name_themselves() -> None:
    with pytest.raises(UnsupportedOpError, match="smooth_softmax"):
        tfrt_py.load(_model(2, smooth_softmax=1))


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("offset", [False, True])
@pytest.mark.parametrize("rot_dim", [0, 8])
def test_ms_rotary_embedding_matches_onnxruntime(interleaved: int, offset: bool,
                                                 rot_dim: int) -> None:  # fmt: skip
    """com.microsoft RotaryEmbedding (genai's exports): positions per row or one offset,
    halves or pairs, all or the first ``rotary_embedding_dim`` features."""
    b, s = 2, 5
    pos_shape = [1] if offset else [b, s]
    ins = [helper.make_tensor_value_info("x", F, [b, s, H * D]),
           helper.make_tensor_value_info("pos", TensorProto.INT64, pos_shape),
           helper.make_tensor_value_info("cos", F, [64, (rot_dim or D) // 2]),
           helper.make_tensor_value_info("sin", F, [64, (rot_dim or D) // 2])]  # fmt: skip
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"],
                            domain="com.microsoft", interleaved=interleaved, num_heads=H,
                            rotary_embedding_dim=rot_dim)  # fmt: skip
    graph = helper.make_graph([node], "rope", ins, [helper.make_tensor_value_info("y", F, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    rng = np.random.default_rng(3)
    half = (rot_dim or D) // 2
    angle = np.arange(64)[:, None] / 10000 ** (np.arange(half)[None] / half)
    feeds = {
        "x": rng.standard_normal((b, s, H * D)).astype(np.float32),
        "pos": np.array([7]) if offset else rng.integers(0, 60, (b, s)),
        "cos": np.cos(angle).astype(np.float32),
        "sin": np.sin(angle).astype(np.float32),
    }
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(tfrt_py.load(model).run(feeds)["y"], want, rtol=1e-5, atol=1e-5)
