"""com.microsoft Attention against onnxruntime's CPU provider: every mask form it runs,
unidirectional, past/present, attention_bias, qkv_hidden_sizes, scale and the filter
value; the Megatron 4-D mask (which onnxruntime's CPU provider does not implement) against
a NumPy transcription of the operator's definition; load-time refusals."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import check_node, node_model
from tests.support.jit_paths import (  # noqa: F401 - both_paths, autouse: compiled and NumPy
    both_paths,
    spy_served,
)
from tfrt_py.errors import ExecutionError, UnsupportedOpError

_RNG = np.random.default_rng(99)
_B, _S, _HIN, _N, _D = 2, 5, 6, 2, 8


def _f(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


_X, _W, _BIAS = _f(_B, _S, _HIN), _f(_HIN, 3 * _D), _f(3 * _D)
_M2 = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], np.int32)  # row 1 fully masked
_M3 = _RNG.integers(0, 2, (_B, _S, _S)).astype(np.int32)
_M3[0, 1] = 0


def _check(inputs: list[Any], attrs: dict[str, Any] | None = None, **kw: Any) -> None:
    check_node("Attention", inputs, {"num_heads": _N, **(attrs or {})}, **kw)


def test_no_mask_bias_as_input_or_initializer() -> None:
    _check([_X, _W, _BIAS], consts=((), (1, 2)))
    _check([_X, _W])


@pytest.mark.parametrize(
    "mask",
    [
        np.array([3, 7], np.int32),  # right padding: end positions (7 > T: nothing masked)
        np.array([0, 5], np.int32),  # a fully masked row: uniform weights, not NaN
        np.array([4, 5, 1, 2], np.int32),  # left padding: ends, then starts
        np.array([2, 5, 3, 0], np.int32),  # start after end
        _M2,
        _M3,
    ],
    ids=["1d", "1d-zero", "2b", "2b-empty", "2d", "3d"],
)
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mask_forms(mask: np.ndarray, unidirectional: int) -> None:
    _check([_X, _W, _BIAS, mask], {"unidirectional": unidirectional})


def test_scale_and_filter_value() -> None:
    _check([_X, _W, _BIAS], {"scale": 0.3})
    _check([_X, _W, _BIAS, _M2], {"mask_filter_value": -1e9, "unidirectional": 1})


def test_qkv_hidden_sizes() -> None:
    _check([_X, _f(_HIN, 8 + 8 + 12), _f(28)], {"qkv_hidden_sizes": [8, 8, 12]})


_P = 3
_PAST = _f(2, _B, _N, _P, _D // _N)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize(
    "mask", [None, np.array([6, 8], np.int32), (_RNG.random((_B, _P + _S)) < 0.7).astype(np.int32)]
)
def test_past_and_present(unidirectional: int, mask: np.ndarray | None) -> None:
    attrs = {"unidirectional": unidirectional}
    _check([_X, _W, _BIAS, mask, _PAST], attrs, outputs=(True, True))


def test_present_without_past_and_one_step_decoding() -> None:
    _check([_X, _W, _BIAS], outputs=(True, True))
    _check([_f(_B, 1, _HIN), _W, _BIAS, None, _PAST], {"unidirectional": 1}, outputs=(True, True))


@pytest.mark.parametrize("shape", [(_B, _N, _S, _S), (1, 1, _S, _S), (_B, 1, _S, _S)])
def test_attention_bias(shape: tuple[int, ...]) -> None:
    _check([_X, _W, _BIAS, _M2, None, _f(*shape)], {"unidirectional": 1})


def test_float16() -> None:
    h = [a.astype(np.float16) for a in (_X, _W, _BIAS)]
    _check([*h, _M2], rtol=3e-3, atol=3e-3)


# -- beyond onnxruntime's CPU kernel: checked against the definition --------------------------


def _reference(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    heads: int,
    add: np.ndarray,
    past: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention by its definition, in float64: ``add`` is the (B, N|1, S, T) additive term."""
    bsz, s, _ = x.shape
    qkv = x.astype(np.float64) @ w + b
    d = qkv.shape[-1] // 3
    h = d // heads

    def split(m: np.ndarray) -> np.ndarray:
        return m.reshape(bsz, s, heads, h).transpose(0, 2, 1, 3)

    q, k, v = split(qkv[..., :d]), split(qkv[..., d : 2 * d]), split(qkv[..., 2 * d :])
    if past is not None:
        k = np.concatenate([past[0], k], axis=2)
        v = np.concatenate([past[1], v], axis=2)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(h) + add
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    y = (scores @ v).transpose(0, 2, 1, 3).reshape(bsz, s, d)
    return y, np.stack([k, v])


def _run(inputs: list[Any], attrs: dict[str, Any], n_out: int = 1) -> list[list[np.ndarray]]:
    model = node_model("Attention", inputs, {"num_heads": _N, **attrs}, outputs=(True,) * n_out)
    feeds = {f"i{i}": a for i, a in enumerate(inputs) if a is not None}
    outs = []
    for ex in ("sync", "async"):
        m = tfrt_py.load(model, executor=ex)
        for _ in range(2):
            got = m.run(feeds)
            outs.append([got[f"y{k}"] for k in range(n_out)])
    return outs


def test_megatron_4d_mask() -> None:
    """(B, 1, M, M) masks: rows P..P+S-1 and columns 0..T-1 of the square, 0 masked."""
    m = _P + _S + 1
    mask4 = np.tril(np.ones((_B, 1, m, m), np.int32))
    mask4[1, 0, :, 1] = 0
    for past in (None, _PAST):
        p = 0 if past is None else _P
        rows = mask4[:, :, p : p + _S, : p + _S]
        want, present = _reference(_X, _W, _BIAS, _N, np.where(rows > 0, 0.0, -10000.0), past)
        for y, *rest in _run([_X, _W, _BIAS, mask4, past], {}, 1 if past is None else 2):
            np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
            if rest:
                np.testing.assert_allclose(rest[0], present, rtol=1e-6, atol=1e-6)


def test_past_with_attention_bias() -> None:
    """onnxruntime's CPU kernel refuses this pair; the definition composes them."""
    bias = _f(1, _N, _S, _P + _S)
    want, _ = _reference(_X, _W, _BIAS, _N, bias, _PAST)
    for y, _present in _run([_X, _W, _BIAS, None, _PAST, bias], {}, 2):
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"do_rotary": 1}, "do_rotary"),
        ({"past_present_share_buffer": 1}, "past_present_share_buffer"),
        ({"qkv_hidden_sizes": [8, 4, 12]}, "qkv_hidden_sizes"),
        ({"qkv_hidden_sizes": [8, 8, 7]}, "multiples"),
        ({"num_heads": 0}, "num_heads"),
    ],
)
def test_refused_at_load(attrs: dict[str, Any], match: str) -> None:
    model = node_model("Attention", [_X, _W, _BIAS], {"num_heads": _N, **attrs})
    with pytest.raises(UnsupportedOpError, match=match):
        tfrt_py.load(model)


@pytest.mark.parametrize(
    "mask",
    [
        np.zeros(3 * _B + 2, np.int32),  # the (3B + 2) form: CUDA kernels only
        np.ones((_B, _S + 1), np.int32),
        np.ones((_B, _S, _S, 1, 1), np.int32),
    ],
)
def test_bad_masks_fail_the_call(mask: np.ndarray) -> None:
    model = node_model("Attention", [_X, _W, _BIAS, mask], {"num_heads": _N})
    m = tfrt_py.load(model)
    for _ in range(2):  # and the model stays usable
        with pytest.raises(ExecutionError, match="mask_index"):
            m.run({"i0": _X, "i1": _W, "i2": _BIAS, "i3": mask})


def test_one_model_called_with_changing_masks() -> None:
    """The additive masks are memoized per kernel by the mask's bytes: a model called with
    one mask, another, the first again, and one that masks nothing, gives onnxruntime's
    output each time; a mask masking nothing equals no mask."""
    from tests.support.contrib import ort_outputs, runtime_feeds, tfrt_outputs

    masks = [np.array([3, 5], np.int32), np.array([5, 2], np.int32), np.array([3, 5], np.int32),
             np.array([5, 9], np.int32)]  # fmt: skip
    model = node_model("Attention", [_X, _W, _BIAS, masks[0]], {"num_heads": _N})
    m = tfrt_py.load(model, executor="sync")
    for mask in masks:
        feeds = runtime_feeds([_X, _W, _BIAS, mask], ())
        want = ort_outputs(model, feeds)
        got = tfrt_outputs(m, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    unmasked = node_model("Attention", [_X, _W, _BIAS], {"num_heads": _N})
    plain = tfrt_outputs(tfrt_py.load(unmasked), runtime_feeds([_X, _W, _BIAS], ()))
    np.testing.assert_array_equal(got[0], plain[0])


def test_the_mask_memo_keeps_small_masks_only() -> None:
    """A request can vary the mask at will: only additive masks of at most
    ``_MASK_MEMO_BYTES`` are kept (a (8,) mask over 2,101 keys makes a 67 KB one)."""
    from tfrt_py.ir import Node, TensorType, Value
    from tfrt_py.kernels import KernelContext, KernelRegistry
    from tfrt_py.kernels.contrib import attention as att

    reg = KernelRegistry()
    att.register_kernels(reg)
    b, p, heads, d = 8, 2100, 2, 8
    x, w = _f(b, 1, _HIN), _f(_HIN, 3 * d)
    past = _f(2, b, heads, p, d // heads)
    ins = [x, w, None, np.zeros(b, np.int32), past]
    vals = [None if a is None else Value(f"i{i}", TensorType(a.dtype, a.shape))
            for i, a in enumerate(ins)]  # fmt: skip
    node = Node("Attention", vals, [Value("y"), Value("present")], {"num_heads": heads},
                name="n", domain="com.microsoft", opset=1)  # fmt: skip
    fn: Any = reg.lookup("com.microsoft", "Attention", 1).build(KernelContext(node))  # .mask_memo
    for end in (5, 900, 2000):
        fn(x, w, None, np.full(b, end, np.int32), past)
    assert len(fn.mask_memo) == 0
    small = _f(b, 1, _HIN)
    fn(small, w, None, np.full(b, 1, np.int32), past[:, :, :, :3])  # 4 keys: kept
    assert len(fn.mask_memo) == 1
    assert b * (p + 1) * 4 > att._MASK_MEMO_BYTES


def test_constant_weights_project_on_the_packed_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constant float32 weights and bias (every exporter's form) are packed at load and
    the Q/K/V projection runs on the one-thread packed product with the bias added as it
    stores (NumPy's gemm packs the weights again on every call: an onnxruntime-optimized
    BERT's variable-length traffic went from 1.09x to 0.95x onnxruntime's time); the same
    answers as onnxruntime, and the packed product really ran where the compiled kernels
    are on. 96 columns: a multiple of every packed panel width."""
    from tfrt_py.kernels.lib.linear_par import Serial, serial_for

    ran = spy_served(monkeypatch, Serial, "packed_product")
    x, w, b = _f(2, 7, 16), _f(16, 96), _f(96)
    _check([x, w, b, np.array([5, 7], np.int32)], consts=((1, 2),), rtol=1e-4, atol=1e-4)
    _check([x, w, None], consts=((1,),), rtol=1e-4, atol=1e-4)  # no bias
    # where the packed product exists here (both_paths' compiled leg, the packed gemm on)
    assert any(ran) == (serial_for([], None, w) is not None), ran


def test_a_long_input_projects_split_by_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows enough for the row split (the packed product's one thread would serve them
    alone): the projection goes through the packed product's row split
    (``linear_par.Serial.split_rows``) or, without the packed kernel, ``gemm.matmul_into``,
    which split it over the thread budget (before, one NumPy product on one thread: an
    onnxruntime-optimized BERT at 128 tokens spent most of its Attention there);
    onnxruntime's answers."""
    from tfrt_py.kernels.contrib import attention as attention_mod
    from tfrt_py.kernels.lib import linear_par

    seen: list[tuple[int, ...]] = []
    real = attention_mod.matmul_into
    real_rows = linear_par.Serial.split_rows

    def spy(a: np.ndarray, b: np.ndarray, *rest: Any, **kw: Any) -> Any:
        seen.append(a.shape)
        return real(a, b, *rest, **kw)

    def spy_rows(self: linear_par.Serial, a: np.ndarray, out: np.ndarray) -> bool:
        done = real_rows(self, a, out)
        if done:
            seen.append(a.shape)
        return done

    monkeypatch.setattr(attention_mod, "matmul_into", spy)
    monkeypatch.setattr(linear_par.Serial, "split_rows", spy_rows)
    x, w, b = _f(1, 130, 64), _f(64, 192), _f(192)
    # (scores of ~N(0, 64) inputs: a thread split of the projection rounds otherwise, and
    # a sharp softmax carries that to ~2e-4 of an output under a busy neighbour)
    _check([x, w, b], consts=((1, 2),), rtol=2e-3, atol=1e-3)
    assert (130, 64) in seen
