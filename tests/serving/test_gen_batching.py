"""Continuous batching's batch-wide cache (``serving/gen_batching.py`` over
``serving/gen_cache.py``), in one process on a real asyncio loop with a real decoder:
prompts that arrive together run as one call, rows join with prompts shorter and longer
than the batch, leave from the middle, and the batch moves left once every row carries
padding; every stream's tokens are the ones ``Model.generate`` gives it alone. Over HTTP:
tests/serving/test_generate.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.models.decoder import MAX_POSITIONS, decoder
from tfrt_py.generation.mixin import GenerateOptions, start
from tfrt_py.serving import gen_cache
from tfrt_py.serving.gen_batching import GenerationBatcher

#: (prompt, new tokens, ticks to wait before it starts): a long prompt arrives once the
#: batch is narrower than it (the others move right), short streams end while longer ones
#: go on (the last row moves into their place)
PLAN = [
    ([3, 14, 15], 20, 0),
    ([9, 26], 4, 0),
    ([5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6, 26, 43, 3, 1, 2, 7, 5, 11], 9, 2),
    ([1], 7, 3),
    ([44, 12, 6, 30], 14, 5),
]


@pytest.fixture(scope="module")
def model() -> tfrt_py.Model:
    return tfrt_py.load(decoder(kv_heads=2), executor="sync")


def _serve_all(batcher: GenerationBatcher, m: tfrt_py.Model) -> list[list[int]]:
    """Every stream of PLAN through ``batcher``, each started after its ticks."""

    async def one(prompt: list[int], n: int, after: int) -> list[int]:
        while batcher.ticks < after:
            await asyncio.sleep(0)
        steps, _, deadline = start(m, prompt, n, {}, in_place=False)
        return [t async for t in batcher.stream(steps, deadline, flat=True)]

    async def every() -> list[list[int]]:
        return list(await asyncio.gather(*(one(p, n, a) for p, n, a in PLAN)))

    return asyncio.run(every())


@pytest.mark.parametrize("in_place", [True, False], ids=["written-in-place", "copied-in"])
def test_rows_that_join_leave_and_move_get_the_tokens_they_get_alone(
    model: tfrt_py.Model, in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gen_cache, "SLACK", 3)  # the batch moves left within this plan
    monkeypatch.setattr(gen_cache, "FIRST_LENGTH", 4)  # and its buffers grow
    want = [model.generate(p, max_new_tokens=n)[len(p) :].tolist() for p, n, _ in PLAN]
    batcher = GenerationBatcher(model)
    assert batcher.dec.in_place  # the decoder's presents are Concat(past, new)
    if not in_place:  # as for a model whose presents are not a Concat of its pasts
        batcher.dec = dataclasses.replace(batcher.dec, in_place=False)
        batcher._cache = gen_cache.BatchCache(batcher.dec)
    moves: list[int] = []
    sizes: list[int] = []
    real_move, real_fit = gen_cache.BatchCache._move, gen_cache.BatchCache._fit

    def move(self: gen_cache.BatchCache, by: int) -> None:
        moves.append(by)
        real_move(self, by)

    def fit(self: gen_cache.BatchCache, rows: int, length: int) -> None:
        real_fit(self, rows, length)
        sizes.append(self._mask.shape[1] - 1)

    monkeypatch.setattr(gen_cache.BatchCache, "_move", move)
    monkeypatch.setattr(gen_cache.BatchCache, "_fit", fit)
    prompts: list[tuple[int, ...]] = []  # (rows, width) of each prompt call
    real_run = model.run_async

    async def run_async(feeds: Any, **kw: Any) -> Any:
        if feeds["input_ids"].shape[1] > 1:
            prompts.append(feeds["input_ids"].shape)
        return await real_run(feeds, **kw)

    monkeypatch.setattr(model, "run_async", run_async)
    got = _serve_all(batcher, model)
    assert got == want
    assert (2, 3) in prompts  # the two prompts that came together ran as one call
    assert batcher.rows > batcher.ticks  # steps carried several rows
    assert any(by > 0 for by in moves) and any(by < 0 for by in moves)
    assert len(set(sizes)) >= 3  # the buffers grew twice or more
    assert not batcher._cache.rows and batcher._cache.length == 0 and not batcher._cache._bufs


def test_sampled_greedy_and_ended_rows_of_one_batch_get_their_own_tokens(
    model: tfrt_py.Model,
) -> None:
    """A tick picks every greedy row's token in one call and lets a sampling row draw its
    own: rows that sample (each from its own seed), rows that stop at an end token and
    plain greedy rows share ticks and each gets what ``generate`` gives it alone."""
    free = model.generate([3, 14, 15], max_new_tokens=12)[3:].tolist()
    plan: list[tuple[list[int], int, GenerateOptions]] = [
        ([3, 14, 15], 12, {"eos_token_id": free[4]}),
        ([9, 26], 10, {"do_sample": True, "seed": 7, "temperature": 0.9, "top_k": 20}),
        ([5, 35, 8, 9], 11, {}),
        ([1, 2], 9, {"do_sample": True, "seed": 11, "top_p": 0.8}),
    ]
    want = [model.generate(p, max_new_tokens=n, **kw)[len(p) :].tolist() for p, n, kw in plan]
    assert len(want[0]) == free.index(free[4]) + 1  # it ended at its end token
    batcher = GenerationBatcher(model)

    async def one(prompt: list[int], n: int, kw: GenerateOptions) -> list[int]:
        steps, _, deadline = start(model, prompt, n, GenerateOptions(**kw), in_place=False)
        return [t async for t in batcher.stream(steps, deadline, flat=True)]

    async def every() -> list[list[int]]:
        return list(await asyncio.gather(*(one(p, n, kw) for p, n, kw in plan)))

    assert asyncio.run(every()) == want
    assert batcher.rows > batcher.ticks  # the rows shared their steps


def test_a_first_token_reaches_its_reader_before_the_next_tick_starts(
    model: tfrt_py.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a call of prompts the scheduler lets the readers take their first tokens (a
    server writes them) before it prepares and starts the tick of the seated rows."""
    order: list[str] = []
    real_run = model.run_async

    async def run_async(feeds: Any, **kw: Any) -> Any:
        order.append("prompt" if feeds["input_ids"].shape[1] > 1 else "tick")
        return await real_run(feeds, **kw)

    monkeypatch.setattr(model, "run_async", run_async)
    batcher = GenerationBatcher(model)

    async def one() -> list[int]:
        steps, _, deadline = start(model, [3, 14, 15], 3, {}, in_place=False)
        got = []
        async for t in batcher.stream(steps, deadline, flat=True):
            order.append("token")
            got.append(t)
        return got

    assert asyncio.run(one()) == model.generate([3, 14, 15], max_new_tokens=3)[3:].tolist()
    assert order[:3] == ["prompt", "token", "tick"], order


def test_padding_is_zeros_and_the_mask_covers_it(model: tfrt_py.Model) -> None:
    """A row shorter than the batch sits right-aligned behind zeros its mask hides; the
    row that was longest keeps its cache as its own generation made it."""
    dec = model.decoder()
    cache = gen_cache.BatchCache(dec)
    rows = []
    for prompt in ([3, 14, 15, 9, 26], [7, 2]):
        steps, _, _ = start(model, prompt, 4, {}, in_place=False)
        out = model.run(steps.feeds)
        steps.advance(out)
        rows.append((steps, out))
        cache.join(steps, steps.feeds)
    feeds, outputs = cache.feeds([s for s, _ in rows])
    assert outputs is not None and cache.length == 5 and dec.attention_mask is not None
    np.testing.assert_array_equal(feeds[dec.attention_mask], [[1] * 6, [0, 0, 0, 1, 1, 1]])
    c = dec.cache[0]
    past = feeds[c.past]
    np.testing.assert_array_equal(past[0], rows[0][1][c.present][0])
    assert not past[1, :, :3].any()
    np.testing.assert_array_equal(past[1, :, 3:], rows[1][1][c.present][0])
    out = model.run(feeds, outputs=outputs)
    for r, (steps, _) in enumerate(rows):  # each row's logits are its own step's
        alone = model.run(steps.feeds)
        np.testing.assert_allclose(out[dec.logits][r], alone[dec.logits][0], rtol=1e-4, atol=1e-5)


def test_a_failed_tick_ends_its_rows_and_the_next_streams_start_clean(
    model: tfrt_py.Model,
) -> None:
    """A tick whose call fails ends every row in it with the error; the batch is dropped
    (a late call may still write its buffers) and later streams are served right."""
    batcher = GenerationBatcher(model)
    real = model.run_async
    calls = 0

    async def fail_the_first_tick(feeds: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if kw.get("outputs") is not None and calls < 4:
            raise tfrt_py.errors.InputError("this tick fails")
        return await real(feeds, **kw)

    async def one(prompt: list[int]) -> Any:
        steps, _, deadline = start(model, prompt, 5, {}, in_place=False)
        try:
            return [t async for t in batcher.stream(steps, deadline, flat=True)]
        except tfrt_py.errors.InputError as e:
            return str(e)

    async def run() -> tuple[list[Any], list[Any]]:
        first = list(await asyncio.gather(one([3, 14]), one([9])))
        return first, list(await asyncio.gather(one([3, 14]), one([9])))

    model.run_async = fail_the_first_tick  # type: ignore[method-assign]
    try:
        first, then = asyncio.run(run())
    finally:
        del model.run_async
    assert first == ["this tick fails", "this tick fails"]
    assert then == [model.generate(p, max_new_tokens=5)[len(p) :].tolist() for p in ([3, 14], [9])]


def test_the_buffers_grow_no_further_than_the_positions_need_and_go_when_idle(
    model: tfrt_py.Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gen_cache, "SLACK", 3)
    dec = model.decoder()
    assert dec.max_positions == MAX_POSITIONS
    cache = gen_cache.BatchCache(dec)
    steps, _, _ = start(model, list(range(1, 41)), 4, {}, in_place=False)
    steps.advance(model.run(steps.feeds))
    cache.join(steps, steps.feeds)
    steps.keep_outside()
    for _ in range(2):  # the second step needs 42 positions: doubled, the buffers would hold 82
        feeds, outputs = cache.feeds([steps])
        out = model.run(feeds, outputs=outputs)
        cache.advanced(out)
        steps.advance({dec.logits: out[dec.logits]})
    assert 42 <= cache._mask.shape[1] - 1 <= MAX_POSITIONS + 3 + 1
    cache.leave(steps)
    assert cache.length == 0 and not cache._bufs
