"""Triton's generate extension (``/v2/models/NAME/generate`` and ``generate_stream`` as
server-sent events) over a served KV-cache decoder (issue 37, item 4), on a real uvicorn
server with a real client (httpx); the tokens are ``Model.generate``'s, which
tests/test_generation.py checks against onnxruntime."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import tfrt_py
from tests.support.models.decoder import VOCAB, decoder
from tfrt_py.serving import ServerThread, create_app

PROMPT = [3, 14, 15, 9, 26, 5]


class _Counted:
    """The decoder's real ``run_async``, each step counted and slowed by ``delay`` s (so a
    hang-up lands mid-generation)."""

    def __init__(self, model: tfrt_py.Model) -> None:
        self.steps = 0
        self.delay = 0.0
        self._real = model.run_async

    async def __call__(self, *a: Any, **kw: Any) -> Any:
        self.steps += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return await self._real(*a, **kw)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """decoder.onnx with a word-level tokenizer.json beside it (token i is "w{i}")."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (the [text] extra)")
    d = tmp_path_factory.mktemp("decoder")
    (d / "decoder.onnx").write_bytes(decoder(kv_heads=2).SerializeToString())
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[tuple[str, tfrt_py.Model, _Counted]]:
    model = tfrt_py.load(str(model_dir / "decoder.onnx"))
    counted = _Counted(model)
    model.run_async = counted  # type: ignore[method-assign]
    bare = tfrt_py.load(decoder(kv_heads=2))  # the same weights, no tokenizer beside it
    from tests.support.models import build

    app = create_app({"lm": model, "bare": bare, "mlp": build("mlp").model})
    with ServerThread(app) as url:
        yield url, model, counted


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            out.append(json.loads(line[len("data: ") :]))
    return out


def test_generate_answers_the_prompt_and_the_tokens(served: Any) -> None:
    url, model, _ = served
    want = model.generate(PROMPT, max_new_tokens=8).tolist()
    req: dict[str, Any] = {"id": "q1", "input_ids": PROMPT, "parameters": {"max_tokens": 8}}
    r = httpx.post(url + "/v2/models/lm/generate", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == "q1" and body["model_name"] == "lm" and body["output_ids"] == want
    req = {"input_ids": PROMPT, "max_tokens": 8, "exclude_input_in_output": True}
    r = httpx.post(url + "/v2/models/lm/versions/1/generate", json=req)
    assert r.json()["output_ids"] == want[len(PROMPT) :]


def test_a_batch_answers_one_list_per_row(served: Any) -> None:
    url, model, _ = served
    prompts = [[53, 5, 8], PROMPT]
    want = model.generate(prompts, max_new_tokens=4)[:, -4:].tolist()
    r = httpx.post(url + "/v2/models/lm/generate",
                   json={"input_ids": prompts, "parameters": {"max_tokens": 4}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert [row[-4:] for row in r.json()["output_ids"]] == want
    assert [row[:-4] for row in r.json()["output_ids"]] == prompts


def test_generate_stream_sends_one_event_per_token(served: Any) -> None:
    url, model, _ = served
    want = list(model.stream(PROMPT, max_new_tokens=6))
    rid = 'q"7\\é</x>'  # the head of each event is JSON-escaped once and reused
    req = {"id": rid, "input_ids": PROMPT, "parameters": {"max_tokens": 6}}
    with httpx.stream("POST", url + "/v2/models/lm/generate_stream", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    head = {"id": rid, "model_name": "lm", "model_version": events[0]["model_version"]}
    assert events == [{**head, "output_ids": [t]} for t in want]


def test_sampling_parameters_sample_and_a_seed_repeats(served: Any) -> None:
    url, model, _ = served
    req = {"input_ids": PROMPT, "parameters": {"max_tokens": 12, "temperature": 1.5, "seed": 3}}
    a = httpx.post(url + "/v2/models/lm/generate", json=req).json()["output_ids"]
    assert a == httpx.post(url + "/v2/models/lm/generate", json=req).json()["output_ids"]
    want = model.generate(PROMPT, max_new_tokens=12, do_sample=True, temperature=1.5, seed=3)
    assert a == want.tolist()


def test_text_in_and_out_with_the_tokenizer_beside_the_model(served: Any) -> None:
    url, model, _ = served
    ids = model.generate(PROMPT, max_new_tokens=5).tolist()
    text = " ".join(f"w{i}" for i in PROMPT)
    r = httpx.post(url + "/v2/models/lm/generate",
                   json={"text_input": text, "parameters": {"max_tokens": 5}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == ids
    assert r.json()["text_output"] == " ".join(f"w{i}" for i in ids)
    with httpx.stream("POST", url + "/v2/models/lm/generate_stream",
                      json={"text_input": text, "parameters": {"max_tokens": 5}}) as s:  # fmt: skip
        pieces = [e["text_output"] for e in _events(s)]
    assert "".join(pieces).split() == [f"w{i}" for i in ids[len(PROMPT) :]]


@pytest.mark.parametrize(
    ("path", "body", "status", "match"),
    [
        ("lm", {"parameters": {"max_tokens": 3}}, 400, "needs input_ids or text_input"),
        ("lm", {"input_ids": PROMPT, "max_tokens": 0}, 400, "max_new_tokens must be in"),
        ("lm", {"input_ids": [1, VOCAB]}, 400, "outside the vocabulary"),
        ("lm", {"input_ids": PROMPT, "beam_width": 4}, 400, "unknown parameters"),
        ("lm", {"input_ids": PROMPT, "text_input": "w1"}, 400, "not both"),
        ("lm", {"input_ids": "abc"}, 400, "input_ids"),
        ("lm", [1, 2, 3], 400, "must be a JSON object"),
        ("lm", {"input_ids": PROMPT, "timeout": -5}, 400, "positive integer"),
        ("bare", {"text_input": "w1 w2"}, 400, "no tokenizer.json"),
        ("mlp", {"input_ids": PROMPT}, 400, "not a KV-cache decoder"),
        ("nope", {"input_ids": PROMPT}, 404, "unknown model"),
    ],
)
def test_bad_requests_are_4xx_and_the_model_stays_usable(
    served: Any, path: str, body: Any, status: int, match: str
) -> None:
    url, _, _ = served
    for route in ("generate", "generate_stream"):
        r = httpx.post(f"{url}/v2/models/{path}/{route}", json=body)
        assert r.status_code == status, r.text
        assert match in r.json()["error"]
    ok = httpx.post(url + "/v2/models/lm/generate", json={"input_ids": PROMPT, "max_tokens": 2})
    assert ok.status_code == 200


def test_a_generation_past_the_deadline_is_504_or_an_error_event(served: Any) -> None:
    url, _, counted = served
    counted.delay = 0.02  # 50 steps would take a second
    try:
        # 0.3 s: time for a first token on a loaded host, not for 50 steps of 20 ms
        req = {"input_ids": PROMPT, "max_tokens": 50, "timeout": 300_000}
        r = httpx.post(url + "/v2/models/lm/generate", json=req)
        assert r.status_code == 504 and "deadline" in r.json()["error"]
        with httpx.stream("POST", url + "/v2/models/lm/generate_stream", json=req) as s:
            events = _events(s)
        assert 0 < len(events) < 50 and "deadline" in events[-1]["error"]
    finally:
        counted.delay = 0.0


def test_a_client_that_hangs_up_stops_its_generation(served: Any) -> None:
    url, _, counted = served
    counted.delay = 0.02  # 58 steps would take over a second
    try:
        before = counted.steps
        with httpx.stream("POST", url + "/v2/models/lm/generate_stream",
                          json={"input_ids": PROMPT, "max_tokens": 58}) as s:  # fmt: skip
            first = next(s.iter_lines())
            assert first.startswith("data: ")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the server notices the hang-up
            seen = counted.steps
            time.sleep(0.3)
            if counted.steps == seen:
                break
        assert counted.steps == seen and seen - before < 40  # of 58
    finally:
        counted.delay = 0.0
    ok = httpx.post(url + "/v2/models/lm/generate", json={"input_ids": PROMPT, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == len(PROMPT) + 2
    np.testing.assert_array_equal(ok.json()["output_ids"][: len(PROMPT)], PROMPT)


def test_concurrent_streams_share_batched_steps_and_get_their_own_tokens(served: Any) -> None:
    """Continuous batching: six streams of different prompt lengths in flight at once run
    their decode steps together (rows per step > 1), and each gets the tokens it would get
    alone (the cache rows left-padded and masked)."""
    from tfrt_py.serving import generate as gen

    url, model, counted = served
    prompts = [PROMPT[:k] for k in (1, 2, 3, 4, 5, 6)]
    want = [model.generate(p, max_new_tokens=12)[len(p) :].tolist() for p in prompts]
    counted.delay = 0.005  # the streams overlap

    async def one(client: httpx.AsyncClient, p: list[int]) -> list[int]:
        body = {"input_ids": p, "parameters": {"max_tokens": 12}}
        toks = []
        async with client.stream("POST", "/v2/models/lm/generate_stream", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    toks.append(json.loads(line[6:])["output_ids"][0])
        return toks

    async def all_at_once() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return list(await asyncio.gather(*(one(client, p) for p in prompts)))

    try:
        got = asyncio.run(all_at_once())
    finally:
        counted.delay = 0.0
    assert got == want
    batcher = next(iter(gen._batchers.values()))
    assert batcher.rows > batcher.ticks  # some steps carried several streams


def test_generations_past_the_models_limit_are_503_and_slots_come_back(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each generation holds a cache: a served model runs at most MAX_GENERATIONS at once
    (here 1), the next gets 503 with Retry-After, and a slot comes back when its stream
    ends or its client hangs up."""
    from tfrt_py.serving import generate as gen

    url, _, counted = served
    monkeypatch.setattr(gen, "MAX_GENERATIONS", 1)
    counted.delay = 0.02
    body = {"input_ids": PROMPT, "max_tokens": 40}
    try:
        with httpx.stream("POST", url + "/v2/models/lm/generate_stream", json=body) as s:
            lines = s.iter_lines()  # kept: a dropped iterator closes the response
            assert next(lines).startswith("data: ")
            r = httpx.post(url + "/v2/models/lm/generate", json=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "generations already" in r.json()["error"]
        deadline = time.monotonic() + 10  # the hang-up gives the slot back
        while time.monotonic() < deadline:
            r = httpx.post(url + "/v2/models/lm/generate", json={**body, "max_tokens": 2})
            if r.status_code != 503:
                break
            time.sleep(0.1)
        assert r.status_code == 200
    finally:
        counted.delay = 0.0


def test_warmup_generate_prepares_the_decoders_steps_before_ready() -> None:
    """``--warmup generate``: a decoder's prompt and one-token steps (batched too, as the
    generate routes batch them) are prepared before /readyz; a model that is not a
    decoder is skipped, or, when the warm-up names it, is not ready and says why."""
    from tests.support.models import build
    from tfrt_py.cli import _parse_signature
    from tfrt_py.serving.served import GenerationWarmup

    assert _parse_signature("generate", {"lm"}) == (None, GenerationWarmup())
    assert _parse_signature("lm:generate", {"lm"}) == ("lm", GenerationWarmup(named=True))
    lm, mlp = tfrt_py.load(decoder(kv_heads=2)), tfrt_py.load(build("mlp").model)
    every = GenerationWarmup(prompts=(4,), pasts=(6,), batched=2)
    with ServerThread(create_app({"lm": lm, "mlp": mlp}, warmup=[(None, every)])) as url:
        assert httpx.get(url + "/readyz").json()["status"] == "ready"
        # a prompt and a step after 6 positions, at batch 1 and 2
        assert "warmup: 4 signature(s)" in lm.describe()
        assert "warmup:" not in mlp.describe()
        r = httpx.post(url + "/v2/models/lm/generate",
                       json={"input_ids": PROMPT, "parameters": {"max_tokens": 4}})  # fmt: skip
        assert r.json()["output_ids"] == lm.generate(PROMPT, max_new_tokens=4).tolist()
    named = GenerationWarmup(named=True)
    with ServerThread(create_app({"mlp": build("mlp").model}, warmup=[("mlp", named)])) as url:
        r = httpx.get(url + "/readyz")
        assert r.status_code == 503 and "not a KV-cache decoder" in r.json()["error"], r.text
