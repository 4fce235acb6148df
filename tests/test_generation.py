"""``Model.generate``/``stream``/``generate_async`` on a KV-cache decoder with optimum's
names (tests/support/models/decoder.py), against the greedy loop a user writes for
onnxruntime; sampling's rules; every bad input refused before a step runs."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio
import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.models.decoder import MAX_POSITIONS, VOCAB, decoder, reference_greedy
from tfrt_py.errors import DeadlineExceeded, InputError
from tfrt_py.generation import read_decoder
from tfrt_py.generation.prompts import Settings
from tfrt_py.generation.sampling import pick

PROMPTS = [[3, 14, 15, 9, 26, 5], [53, 5, 8], [1, 2, 3, 4, 5, 6, 7, 8], [42]]


@pytest.fixture(scope="module", params=["mha", "gqa"])
def onnx_decoder(request: pytest.FixtureRequest) -> Any:
    return decoder(kv_heads=4 if request.param == "mha" else 2).SerializeToString()


@pytest.fixture(scope="module")
def session(onnx_decoder: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_decoder, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=["sync", "async"])
def model(request: pytest.FixtureRequest, onnx_decoder: bytes) -> tfrt_py.Model:
    return tfrt_py.load(onnx_decoder, executor=request.param)


@pytest.mark.compiles
def test_reads_optimums_names_and_the_cache_layout(model: tfrt_py.Model) -> None:
    dec = read_decoder(model)
    assert dec.attention_mask == "attention_mask" and dec.position_ids == "position_ids"
    assert [(c.past, c.present, c.axis) for c in dec.cache[:2]] == [
        ("past_key_values.0.key", "present.0.key", 2),
        ("past_key_values.0.value", "present.0.value", 2),
    ]
    assert len(dec.cache) == 4 and dec.vocab == VOCAB
    assert dec.max_positions == MAX_POSITIONS  # the rows of the table position_ids indexes


def test_greedy_tokens_match_onnxruntime_for_one_prompt(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    want = reference_greedy(session, PROMPTS[:1], 12)[0]
    got = model.generate(PROMPTS[0], max_new_tokens=12)
    assert got.dtype == np.int64 and got.shape == (len(PROMPTS[0]) + 12,)
    np.testing.assert_array_equal(got, want)


def test_a_batch_of_different_lengths_matches_onnxruntime_and_each_row_alone(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    want = reference_greedy(session, PROMPTS, 10)
    got = model.generate(PROMPTS, max_new_tokens=10)
    np.testing.assert_array_equal(got, want)
    for row, prompt in zip(got, PROMPTS):  # left padding changes nothing a row sees
        np.testing.assert_array_equal(row[-10:], model.generate(prompt, max_new_tokens=10)[-10:])


@pytest.mark.parametrize("from_length", [0, 8])
def test_the_cache_grows_in_one_buffer_and_gives_the_copying_loops_tokens(
    model: tfrt_py.Model, monkeypatch: pytest.MonkeyPatch, from_length: int
) -> None:
    """present = Concat(past, new): once the cache passes IN_PLACE_BYTES (here: from the
    first step, or from 8 positions on) each cache lives in one buffer, every step's
    present output is a view of it (no step copies the cache), on an executor that writes
    the Concat there (sync); the others get no buffers; the tokens are those of the loop
    that feeds the fresh present arrays back."""
    from tfrt_py.generation import steps

    dec = read_decoder(model)
    assert dec.in_place
    monkeypatch.setattr(steps, "IN_PLACE_BYTES", from_length * dec.bytes_per_token(2))
    seen: list[Any] = []
    real = model.run

    def spy(feeds: Any, outputs: Any = None, **kw: Any) -> Any:
        seen.append(outputs)
        return real(feeds, outputs, **kw)

    monkeypatch.setattr(model, "run", spy)
    got = model.generate(PROMPTS[:2], max_new_tokens=6)
    name = dec.cache[0].present
    in_place = [o for o in seen if o is not None]
    if model.runtime.writes_concat_in_place:
        assert len(seen) == 6 and len(in_place) == (6 if from_length == 0 else 3)  # 8, 9, 10
        assert len({id(o[name].base) for o in in_place}) == 1
        assert in_place[-1][name].shape[2] == 6 + 5
    else:  # async: it makes each present apart and would copy the whole cache in
        assert seen == [None] * 6
    monkeypatch.undo()
    monkeypatch.setattr(model, "_decoder", dataclasses.replace(dec, in_place=False))
    np.testing.assert_array_equal(model.generate(PROMPTS[:2], max_new_tokens=6), got)


def test_a_padded_array_with_its_mask_is_the_same_as_the_ragged_list(model: tfrt_py.Model) -> None:
    ids = np.array([[0, 0, 53, 5, 8], [1, 2, 3, 4, 5]])
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    got = model.generate(ids, max_new_tokens=6, attention_mask=mask)
    want = model.generate([[53, 5, 8], [1, 2, 3, 4, 5]], max_new_tokens=6)
    np.testing.assert_array_equal(got[:, -6:], want[:, -6:])


def test_stream_yields_generates_tokens_one_at_a_time(model: tfrt_py.Model) -> None:
    full = model.generate(PROMPTS[0], max_new_tokens=8)
    toks = list(model.stream(PROMPTS[0], max_new_tokens=8))
    assert all(type(t) is int for t in toks)
    assert toks == full[len(PROMPTS[0]) :].tolist()
    rows = list(model.stream(np.array(PROMPTS[:1] * 2), max_new_tokens=3))
    assert [r.shape for r in rows] == [(2,)] * 3


def test_generation_stops_at_the_end_token_and_pads_finished_rows(model: tfrt_py.Model) -> None:
    free = model.generate(PROMPTS[:2], max_new_tokens=8)
    eos = int(free[0, -8 + 2])  # row 0's third new token
    got = model.generate(PROMPTS[:2], max_new_tokens=8, eos_token_id=eos, pad_token_id=60)
    row0 = got[0, -got.shape[1] + free.shape[1] - 8 :]
    first_eos = list(free[0, -8:]).index(eos)
    assert row0[first_eos] == eos and (row0[first_eos + 1 :] == 60).all()
    if eos not in free[1, -8:]:
        assert got.shape == free.shape  # row 1 never ended: all 8 steps ran
    alone = list(model.stream(PROMPTS[0], max_new_tokens=8, eos_token_id=eos))
    assert alone == free[0, -8:][: first_eos + 1].tolist()  # the end token is the last
    unused = next(t for t in range(VOCAB) if t not in free[:, -8:])
    for ids in ([unused, eos], [eos, unused]):  # any of several end tokens ends a row
        both = model.generate(PROMPTS[:2], max_new_tokens=8, eos_token_id=ids, pad_token_id=60)
        np.testing.assert_array_equal(both, got)


@pytest.mark.anyio
async def test_generate_async_streams_the_same_tokens(
    model: tfrt_py.Model, anyio_backend: Any
) -> None:
    want = list(model.stream(PROMPTS[2], max_new_tokens=6))
    got = [t async for t in model.generate_async(PROMPTS[2], max_new_tokens=6, timeout=60)]
    assert got == want


@pytest.mark.anyio
async def test_cancelling_the_consumer_starts_no_further_step(
    model: tfrt_py.Model, anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = []
    real = model.run_async
    scope = anyio.CancelScope()

    async def counted(*a: Any, **kw: Any) -> Any:
        steps.append(1)
        if len(steps) == 5:
            scope.cancel()  # lands in the awaits of this step's run_async: the step in flight
        return await real(*a, **kw)

    monkeypatch.setattr(model, "run_async", counted)
    got: list[int] = []
    with scope:
        async for tok in model.generate_async(PROMPTS[0], max_new_tokens=MAX_POSITIONS - 6):
            got.append(tok)
    await anyio.sleep(0.2)
    # the step in flight may finish (a run_async that never suspends); none starts after it
    assert scope.cancelled_caught and len(steps) == 5 and len(got) in (4, 5)
    monkeypatch.undo()
    assert model.generate(PROMPTS[0], max_new_tokens=5)[-5:].tolist()[: len(got)] == got


@pytest.mark.anyio
async def test_a_generation_past_its_timeout_raises_deadline_exceeded(
    model: tfrt_py.Model, anyio_backend: Any
) -> None:
    with pytest.raises(DeadlineExceeded) as e:
        async for _ in model.generate_async(PROMPTS[0], max_new_tokens=50, timeout=0.05):
            await anyio.sleep(0.01)
    assert e.value.timeout == 0.05
    with pytest.raises(DeadlineExceeded):
        model.generate(PROMPTS[0], max_new_tokens=MAX_POSITIONS - 6, timeout=1e-6)
    assert len(model.generate(PROMPTS[0], max_new_tokens=2)) == 8  # still usable


def test_sampling_is_repeatable_from_a_seed_and_differs_across_seeds(model: tfrt_py.Model) -> None:
    kw: dict[str, Any] = {"max_new_tokens": 16, "do_sample": True, "temperature": 1.5}
    a = model.generate(PROMPTS[0], seed=5, **kw)
    assert (a == model.generate(PROMPTS[0], seed=np.random.default_rng(5), **kw)).all()
    assert any((a != model.generate(PROMPTS[0], seed=s, **kw)).any() for s in range(6, 10))
    greedy = model.generate(PROMPTS[0], max_new_tokens=16)
    np.testing.assert_array_equal(model.generate(PROMPTS[0], seed=1, top_k=1, **kw), greedy)
    np.testing.assert_array_equal(model.generate(PROMPTS[0], seed=1, top_p=1e-9, **kw), greedy)


def _sample_many(logits: np.ndarray, n: int, **kw: Any) -> np.ndarray:
    s = Settings(1, frozenset(), 0, True, kw.get("temperature", 1.0), kw.get("top_k", 0),
                 kw.get("top_p", 1.0))  # fmt: skip
    return pick(np.repeat(logits[None], n, 0), s, np.random.default_rng(0))


def test_top_k_and_top_p_keep_the_tokens_transformers_keeps_with_its_probabilities() -> None:
    logits = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], np.float32))
    top3 = _sample_many(logits, 20_000, top_k=3)
    assert set(top3.tolist()) == {1, 3, 4}
    freq = np.bincount(top3, minlength=5)[[1, 3, 4]] / len(top3)
    np.testing.assert_allclose(freq, np.array([0.4, 0.3, 0.15]) / 0.85, atol=0.015)
    # the smallest set reaching 0.65: 0.4 + 0.3 (transformers keeps it, drops the rest)
    assert set(_sample_many(logits, 5_000, top_p=0.65).tolist()) == {1, 3}
    hot = np.bincount(_sample_many(logits, 20_000, temperature=0.5), minlength=5) / 20_000
    want = np.array([0.05, 0.4, 0.1, 0.3, 0.15]) ** 2
    np.testing.assert_allclose(hot, want / want.sum(), atol=0.015)


def test_a_model_that_is_not_a_decoder_is_refused_and_still_runs() -> None:
    from tests.support.models import build

    case = build("mlp")
    m = tfrt_py.load(case.model)
    with pytest.raises(InputError, match="not a KV-cache decoder"):
        m.generate([1, 2], max_new_tokens=2)
    assert m.run(case.feeds[0])["probs"].shape == (4, 10)


@pytest.mark.parametrize(
    ("args", "kw", "match"),
    [
        ([1, 2], {"max_new_tokens": 0}, "max_new_tokens must be in"),
        ([1, 2], {"max_new_tokens": -3}, "max_new_tokens must be in"),
        ([1, 2], {"max_new_tokens": 1 << 20}, "max_new_tokens must be in"),
        ([1, 2], {"max_new_tokens": 2.5}, "max_new_tokens must be an integer"),
        ([1, VOCAB], {}, "outside the vocabulary"),
        ([1, -1], {}, "outside the vocabulary"),
        ([], {}, "the prompt is empty"),
        ([[1, 2], []], {}, "the prompt is empty"),
        (["a", "b"], {}, "token ids must be integers"),
        ([1.5, 2.0], {}, "token ids must be integers"),
        ([[[1]]], {}, "flat list of token ids"),
        (list(range(40)), {"max_new_tokens": 30}, "exceed the model's 64 positions"),
        ([1, 2], {"eos_token_id": VOCAB + 3}, "outside the vocabulary"),
        ([1, 2], {"eos_token_id": "x"}, "eos_token_id must be"),
        ([1, 2], {"temperature": 0.0, "do_sample": True}, "temperature must be"),
        ([1, 2], {"top_p": 1.5}, "top_p in"),
        ([1, 2], {"top_k": -1}, "top_k must be"),
        ([[1, 2]], {"attention_mask": [[1, 2]]}, "attention_mask must be 0/1"),
        ([[1, 2]], {"attention_mask": [[0, 0]]}, "masks every token"),
    ],
)
def test_bad_input_is_an_input_error_before_any_step(
    model: tfrt_py.Model, args: Any, kw: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_step(*a: Any, **k: Any) -> Any:
        raise AssertionError("a step ran")

    monkeypatch.setattr(model, "run", no_step)
    kw = {"max_new_tokens": 4, **kw}
    with pytest.raises(InputError, match=match):
        model.generate(args, **kw)
    with pytest.raises(InputError, match=match):
        model.stream(args, **kw)
    with pytest.raises(InputError, match=match):
        model.generate_async(args, **kw)


def test_an_unknown_keyword_is_a_type_error(model: tfrt_py.Model) -> None:
    with pytest.raises(TypeError, match="max_tokens"):
        model.generate([1, 2], max_tokens=3)  # type: ignore[call-arg]


def test_a_cache_past_the_memory_bound_is_refused(
    model: tfrt_py.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfrt_py.generation import prompts

    monkeypatch.setattr(prompts, "MAX_CACHE_BYTES", 1 << 16)
    with pytest.raises(InputError, match="the cache would grow"):
        model.generate([[1, 2]] * 64, max_new_tokens=8)


def test_ragged_rows_without_a_mask_input_are_refused_equal_rows_run() -> None:
    m = tfrt_py.load(decoder(mask=False))
    with pytest.raises(InputError, match="need an attention_mask input"):
        m.generate([[1, 2, 3], [4]], max_new_tokens=2)
    assert m.generate([[1, 2, 3], [4, 5, 6]], max_new_tokens=2).shape == (2, 5)


def test_the_position_limit_comes_from_config_json_beside_the_file(tmp_path: Any) -> None:
    """Without position_ids the table cannot be found; transformers' config.json says it."""
    path = tmp_path / "model.onnx"
    path.write_bytes(decoder(positions=False).SerializeToString())
    assert read_decoder(tfrt_py.load(str(path))).max_positions is None
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": 20}))
    m = tfrt_py.load(str(path))
    with pytest.raises(InputError, match="exceed the model's 20 positions"):
        m.generate(list(range(10)), max_new_tokens=11)
    assert m.generate(list(range(10)), max_new_tokens=10).shape == (20,)


def test_generated_feeds_of_a_decoder_are_a_first_step(model: tfrt_py.Model) -> None:
    """tfrt-py bench/run and the server's warm-up call a model on generated feeds; a
    decoder's dims are tied (the mask spans past + new), so it gets a generation's first
    step (before: the mask and the past were one position each, and optimum's GPT-2
    failed its warm-up: the server never became ready)."""
    from tfrt_py.bench.runners import random_feeds

    feeds = random_feeds(model, batch=2)
    assert feeds["input_ids"].shape == (2, 4) and feeds["attention_mask"].shape == (2, 4)
    assert feeds["past_key_values.0.key"].shape[2] == 0
    np.testing.assert_array_equal(feeds["position_ids"], [[0, 1, 2, 3]] * 2)
    assert model.run(feeds)["present.0.key"].shape[2] == 4


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_a_decoder_with_fused_multihead_attention_generates_onnxruntimes_tokens(
    executor: str,
) -> None:
    """Attention fused to com.microsoft MultiHeadAttention with the past, the padding
    mask and the projections' biases (as onnxruntime's transformer optimizer writes a
    decoder): token-exact with onnxruntime's loop for one prompt and for left-padded rows
    of different lengths."""
    onx = decoder(fused=True).SerializeToString()
    sess = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    model = tfrt_py.load(onx, executor=executor)
    assert [c.present for c in read_decoder(model).cache[:2]] == ["present.0.key",
                                                                  "present.0.value"]  # fmt: skip
    np.testing.assert_array_equal(model.generate(PROMPTS[0], max_new_tokens=10),
                                  reference_greedy(sess, PROMPTS[:1], 10)[0])  # fmt: skip
    np.testing.assert_array_equal(model.generate(PROMPTS, max_new_tokens=8),
                                  reference_greedy(sess, PROMPTS, 8))  # fmt: skip


@pytest.mark.compiles
def test_a_genai_style_decoder_gets_one_plan_for_every_step() -> None:
    """genai's ``total_sequence_length`` (the mask) is read as past + sequence: the shape
    model's probes then feed shapes the decoder runs at, and the sync interpreter plans once
    for every step (declared free, the probes failed and every step planned and compiled
    code of its own: 5.9 ms a token, 0.8 with the one plan); a mask that breaks the
    relation is refused as before."""
    from tests.support.models.decoder import genai_decoder

    model = tfrt_py.load(genai_decoder().SerializeToString(), executor="sync")
    report = model.describe()
    assert ("one plan for every signature of the dims (batch_size, sequence_length, "
            "past_sequence_length)") in report, report  # fmt: skip
    model.generate(PROMPTS[0], max_new_tokens=4)
    feeds = {"input_ids": np.array([[5]]), "attention_mask": np.ones((1, 9), np.int64)}
    for name in (i.name for i in model.inputs if i.name.startswith("past_key_values")):
        feeds[name] = np.zeros((1, 2, 4, 16), np.float32)  # past 4 + 1 new != 9
    with pytest.raises(tfrt_py.errors.ExecutionError, match="seqlens_k"):
        model.run(feeds)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.compiles
def test_a_genai_style_decoder_generates_onnxruntimes_tokens(packed: bool) -> None:
    """onnxruntime-genai's shape of decoder (GroupQueryAttention with rotary, seqlens_k
    from the mask, the simplified norms; ``packed``: one QKV input, as its model builder
    writes the attention): token-exact with onnxruntime at batch 1 and for rows of one
    length; rows of different lengths are padded on the right, as its attention takes
    them, and each gets the tokens it gets alone."""
    from tests.support.models.decoder import genai_decoder

    onx = genai_decoder(packed=packed).SerializeToString()
    sess = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    model = tfrt_py.load(onx)
    dec = read_decoder(model)
    assert not dec.pads_left and dec.in_place  # its attention grows each past: one buffer
    np.testing.assert_array_equal(model.generate(PROMPTS[0], max_new_tokens=10),
                                  reference_greedy(sess, PROMPTS[:1], 10)[0])  # fmt: skip
    even = [[3, 14, 15], [9, 26, 5]]
    np.testing.assert_array_equal(model.generate(even, max_new_tokens=8),
                                  reference_greedy(sess, even, 8))  # fmt: skip
    ragged = model.generate(PROMPTS, max_new_tokens=6)
    for row, prompt in zip(ragged, PROMPTS):
        np.testing.assert_array_equal(row[-6:], model.generate(prompt, max_new_tokens=6)[-6:])
    with pytest.raises(InputError, match="padded on the right"):
        model.generate(np.array([[0, 5, 6]]), max_new_tokens=2, attention_mask=[[0, 1, 1]])
