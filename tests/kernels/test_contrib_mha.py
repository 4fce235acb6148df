"""com.microsoft MultiHeadAttention against onnxruntime's CPU provider: self and cross
attention with their biases, every key padding mask form it runs, unidirectional, a past
and the present outputs (a decode step among them), attention_bias, K and V split into
heads, scale and the filter value, float16; the packed QKV and KV forms (which its CPU
kernel does not run) against onnxruntime on the same values unpacked; load-time refusals
and calls that fail with the model left usable."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import check_node, node_model, ort_outputs, tfrt_outputs
from tests.support.jit_paths import (  # noqa: F401 - both_paths, autouse: compiled and NumPy
    both_paths,
)
from tfrt_py.errors import ExecutionError, UnsupportedOpError

_RNG = np.random.default_rng(37)
_B, _S, _L, _N, _H, _HV = 2, 5, 7, 2, 4, 3
_D, _DV = _N * _H, _N * _HV


def _f(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


_Q, _K, _V = _f(_B, _S, _D), _f(_B, _L, _D), _f(_B, _L, _DV)
_BIAS = _f(2 * _D + _DV)
_KS, _VS = _f(_B, _S, _D), _f(_B, _S, _DV)  # self attention: L = S


def _check(inputs: list[Any], attrs: dict[str, Any] | None = None, **kw: Any) -> None:
    check_node("MultiHeadAttention", inputs, {"num_heads": _N, **(attrs or {})}, **kw)


def test_cross_attention_with_and_without_bias() -> None:
    _check([_Q, _K, _V, _BIAS], consts=((), (3,)))
    _check([_Q, _K, _V])


@pytest.mark.parametrize(
    "mask",
    [
        np.array([3, 9], np.int32),  # key lengths (9 > T: nothing masked)
        np.array([0, 2], np.int32),  # a fully masked row: uniform weights, not NaN
        (_RNG.random((_B, _S)) < 0.6).astype(np.int32),
        (_RNG.random((_B, _S, _S)) < 0.6).astype(np.int32),
    ],
    ids=["1d", "1d-zero", "2d", "3d"],
)
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mask_forms(mask: np.ndarray, unidirectional: int) -> None:
    _check([_Q, _KS, _VS, _BIAS, mask], {"unidirectional": unidirectional})


def test_scale_and_filter_value() -> None:
    _check([_Q, _K, _V, _BIAS], {"scale": 0.3})
    mask = np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], np.int32)
    _check([_Q, _KS, _VS, _BIAS, mask], {"mask_filter_value": -1e9, "unidirectional": 1})


_P = 3
# with a past, onnxruntime takes V's head size equal to K's
_PK, _PV, _VD, _BIASD = _f(_B, _N, _P, _H), _f(_B, _N, _P, _H), _f(_B, _S, _D), _f(3 * _D)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize(
    "mask",
    [None, np.array([6, 8], np.int32), (_RNG.random((_B, _P + _S)) < 0.7).astype(np.int32)],
    ids=["none", "1d", "2d"],
)
def test_past_and_present(unidirectional: int, mask: np.ndarray | None) -> None:
    inputs = [_Q, _KS, _VD, _BIASD, mask, None, _PK, _PV]
    _check(inputs, {"unidirectional": unidirectional}, outputs=(True, True, True))


def test_present_without_past_and_one_step_decoding() -> None:
    _check([_Q, _KS, _VS, _BIAS], outputs=(True, True, True))
    step = [_f(_B, 1, _D), _f(_B, 1, _D), _f(_B, 1, _D), _BIASD, None, None, _PK, _PV]
    _check(step, {"unidirectional": 1}, outputs=(True, True, True))


@pytest.mark.parametrize("shape", [(_B, _N, _S, _S), (1, _N, _S, _S), (_B, 1, _S, _S)])
def test_attention_bias(shape: tuple[int, ...]) -> None:
    mask = np.array([4, 5], np.int32)
    _check([_Q, _KS, _VS, _BIAS, mask, _f(*shape)], {"unidirectional": 1})


def test_key_and_value_split_into_heads() -> None:
    """Cross attention over a cache of K and V already split into heads (B, N, L, H)."""
    k4, v4 = _f(_B, _N, _L, _H), _f(_B, _N, _L, _H)
    _check([_Q, k4, v4], outputs=(True, True, True))
    _check([_Q, k4, v4, None, np.array([2, 7], np.int32)])


def test_float16() -> None:
    h = [a.astype(np.float16) for a in (_Q, _K, _V, _BIAS)]
    _check(h, rtol=3e-3, atol=3e-3)


def _unpacked_want(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None,
                   attrs: dict[str, Any]) -> np.ndarray:  # fmt: skip
    model = node_model("MultiHeadAttention", [q, k, v, bias], {"num_heads": _N, **attrs})
    feeds = {f"i{i}": a for i, a in enumerate((q, k, v, bias)) if a is not None}
    return ort_outputs(model, feeds)[0]


def _bsd(x: np.ndarray) -> np.ndarray:
    """(B, L, N, H) as (B, L, N * H)."""
    return np.ascontiguousarray(x.reshape(x.shape[0], x.shape[1], -1))


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_packed_qkv_and_kv(executor: str) -> None:
    """onnxruntime's CPU kernel refuses the packed forms: they must equal its output on
    the same Q, K and V given unpacked."""
    qkv = _f(_B, _S, _N, 3, _H)
    q, k, v = (_bsd(qkv[:, :, :, j]) for j in range(3))
    bias = _f(3 * _D)
    for b, attrs in ((None, {}), (bias, {"unidirectional": 1})):
        want = _unpacked_want(q, k, v, b, attrs)
        model = node_model("MultiHeadAttention", [qkv, None, None, b], {"num_heads": _N, **attrs})
        feeds = {"i0": qkv} if b is None else {"i0": qkv, "i3": b}
        got = tfrt_outputs(model, feeds, executor)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kv = _f(_B, _L, _N, 2, _H)
    want = _unpacked_want(_Q, _bsd(kv[:, :, :, 0]), _bsd(kv[:, :, :, 1]), None, {})
    model = node_model("MultiHeadAttention", [_Q, kv], {"num_heads": _N})
    got = tfrt_outputs(model, {"i0": _Q, "i1": kv}, executor)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("inputs", "attrs", "outputs", "match"),
    [
        ([_Q, _K, _V], {"num_heads": 0}, (True,), "num_heads"),
        (
            [_Q, _KS, _VD, None, None, None, _PK, _PV, np.array([3], np.int32)],
            {},
            (True,),
            "past_sequence_length",
        ),
        (
            [_Q, _K, _V, None, None, None, None, None, None, np.zeros((_B, 1, 8), np.int32)],
            {},
            (True,),
            "cache_indirection",
        ),
        ([_Q, _K, _V], {}, (True, False, False, True), "qk"),
    ],
    ids=["num_heads", "past_sequence_length", "cache_indirection", "qk"],
)
def test_refused_at_load(inputs: list[Any], attrs: dict[str, Any],
                         outputs: tuple[bool, ...], match: str) -> None:  # fmt: skip
    model = node_model("MultiHeadAttention", inputs, {"num_heads": _N, **attrs}, outputs=outputs)
    with pytest.raises(UnsupportedOpError, match=match):
        tfrt_py.load(model)


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        ({"i4": np.zeros(3 * _B + 2, np.int32)}, "key_padding_mask"),  # CUDA kernels' form
        ({"i4": np.ones(_B + 1, np.int32)}, "key_padding_mask"),
        ({"i1": _f(_B, _L, _D + 1)}, "key"),
        ({"i3": _f(2 * _D + _DV + 1)}, "bias"),
        ({"i5": _f(_B, _N, _S, _L + 2)}, "attention_bias"),
    ],
    ids=["mask-3b2", "mask-length", "key-width", "bias-size", "attention-bias"],
)
def test_bad_inputs_fail_the_call_and_the_model_stays_usable(
    feeds: dict[str, np.ndarray], match: str
) -> None:
    good = {"i0": _Q, "i1": _K, "i2": _V, "i3": _BIAS, "i4": np.array([3, 7], np.int32),
            "i5": _f(_B, _N, _S, _L)}  # fmt: skip
    model = node_model("MultiHeadAttention", [good[f"i{k}"] for k in range(6)],
                       {"num_heads": _N})  # fmt: skip
    for k, vi in enumerate(model.graph.input):  # every dim symbolic: the kernel checks them
        for d, dim in enumerate(vi.type.tensor_type.shape.dim):
            dim.dim_param = f"d{k}_{d}"
    want = ort_outputs(model, good)[0]
    shape_free = tfrt_py.load(model, executor="sync")
    for _ in range(2):
        with pytest.raises(ExecutionError, match=match):
            shape_free.run({**good, **feeds})
        np.testing.assert_allclose(shape_free.run(good)["y0"], want, rtol=1e-5, atol=1e-5)
