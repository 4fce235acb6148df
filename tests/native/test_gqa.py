"""com.microsoft GroupQueryAttention on the native tier (``native/lower/ops_gqa.py``):
decode steps and prompts over a past, rotary in halves and in pairs, rows shorter than the
batch's (seqlens_k), grouped heads, against onnxruntime (the compiled function called
directly, and the model); a seqlens_k that does not fit
raises the interpreter's error; onnxruntime-genai's decoder (its ``total_sequence_length``
tied to past + sequence) generating onnxruntime's tokens on boxes of past lengths."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.kernels.test_contrib_gqa import _feeds, _model
from tests.support.models.decoder import genai_decoder, reference_greedy
from tfrt_py.errors import ExecutionError


@pytest.mark.parametrize(
    ("kv", "b", "s", "p", "lens", "attrs"),
    [
        # (a first prompt's empty past is a zero-size feed: the interpreter serves it)
        (2, 2, 1, 9, None, {"do_rotary": 1}),  # a decode step
        # (seqlens_k is a feed here: the shape probes' ones fit at most 2 new tokens, and
        # the boxes end there; a decoder computes it from its mask: see the last test)
        (1, 1, 2, 4, None, {"do_rotary": 1, "rotary_interleaved": 1}),
        (4, 2, 1, 6, [6, 3], {}),  # the second row shorter
        (2, 1, 2, 5, None, {"scale": 0.3}),  # (onnxruntime: batch 1 for S > 1 over a past)
    ],
)
@pytest.mark.parametrize("packed", [False, True])  # True: one qkv input (the model builder's)
@pytest.mark.compiles
def test_the_native_lowering_matches_onnxruntime(kv: int, b: int, s: int, p: int, lens: Any,
                                                 attrs: Any, packed: bool) -> None:  # fmt: skip
    attrs = dict(attrs)
    rotary = attrs.pop("do_rotary", 0)
    model = _model(kv, rotary, packed=packed, **attrs)
    feeds = _feeds(np.random.default_rng(7 + s * 10 + p), kv, b, s, p, lens, rotary, packed)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    m = tfrt_py.load(model, executor="native", native="eager")
    m.warmup([feeds])
    got = dict(zip(("o", "pko", "pvo"), _native_outputs(m, feeds)))
    for name, w in zip(("o", "pko", "pvo"), want):
        np.testing.assert_allclose(got[name], w, rtol=2e-5, atol=2e-5, err_msg=name)
        np.testing.assert_allclose(m.run(feeds)[name], w, rtol=2e-5, atol=2e-5, err_msg=name)


def _native_outputs(m: tfrt_py.Model, feeds: dict[str, Any]) -> list[np.ndarray]:
    """The compiled function's own outputs for ``feeds`` (not the interpreter's, which
    the tier may also run): the one ready job's, called directly."""
    jobs = [j for j in m.native.sigs.values() if j.state == "ready"]
    assert len(jobs) == 1, m.native.sigs
    low, fn = jobs[0].lowered, jobs[0].compiled.fn
    outs = fn(*[np.array(feeds[n], order="C") for n in low.input_names], *low.params)
    named = dict(zip(low.output_names, outs if isinstance(outs, tuple) else (outs,)))
    return [named[n] for n in ("o", "pko", "pvo")]


def test_a_seqlens_k_past_the_cache_raises_the_kernels_error() -> None:
    model = _model(2, 0)
    feeds = _feeds(np.random.default_rng(3), 2, 1, 1, 6, [9], 0)  # 9 >= past 6 + 1
    m = tfrt_py.load(model, executor="native", native="eager")
    good = dict(feeds, seqlens_k=np.array([6], np.int32))
    m.warmup([good])
    with pytest.raises(ValueError, match="out of range"):
        _native_outputs(m, feeds)  # the compiled code refuses it ...
    with pytest.raises(ExecutionError, match="seqlens_k"):  # ... and the kernel says why
        m.run(feeds)
    feeds["seqlens_k"] = np.array([6], np.int32)  # the model stays usable
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(m.run(feeds)["o"], want[0], rtol=2e-5, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True])
def test_a_genai_decoder_generates_onnxruntimes_tokens_on_boxes(packed: bool) -> None:
    """The mask's ``total_sequence_length`` is read as past + sequence, so the decode steps
    share a box of past lengths (declared as a free symbol, every box declined and each
    length compiled alone: 250 s to settle instead of 50). ``packed``: the attention reads
    one QKV input, as the model builder writes it."""
    onx = genai_decoder(packed=packed).SerializeToString()
    model = tfrt_py.load(onx, executor="native", native="eager")
    assert model.native.dims.names == ("batch_size", "sequence_length", "past_sequence_length")
    prompt = [3, 14, 15, 9, 26, 5]
    session = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(model.generate(prompt, max_new_tokens=16),
                                  reference_greedy(session, [prompt], 16)[0])  # fmt: skip
    ready = {k for k, j in model.native.sigs.items() if j.state == "ready"}
    assert any(k[0] == "box" and k[1][2][0] == 16 for k in ready), ready
