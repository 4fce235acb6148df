"""Streamed runs against hostile or changing inputs (issue 12, items 2b, 6, 7): a transfer
that fails for any reason reaches the waiting call as an ExecutionError naming the stage
and the tensor (never a hang) and the model stays usable; a too-small ``memory_budget``
says the real minimum; an unfinished or slow ``run_batches`` iterator never blocks other
threads' calls. Hangs are detected with a join timeout; the asserts are on behaviour."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from sec_models import STREAM_BUDGET, expected, external_model, save, write_weights

import tfrt_py
from tfrt_py.errors import ExecutionError, ModelLoadError

#: Long enough for any healthy call on a loaded 2-core machine; a hang runs past it.
JOIN_S = 60.0


def _streamed(tmp_path: Any) -> tuple[tfrt_py.Model, str]:
    model_dir = str(tmp_path)
    write_weights(model_dir)
    model = tfrt_py.load(save(external_model("w.bin"), model_dir), memory_budget=STREAM_BUDGET)
    assert model.executor == "stream"
    return model, os.path.join(model_dir, "w.bin")


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` on a daemon thread; the dict gets "result" or "error"."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t, box


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(64).astype(np.float32)


# -- item 2b: any transfer failure reaches the call ------------------------------------------


def test_weight_file_swapped_for_a_fifo_fails_the_run_not_hangs(tmp_path: Any) -> None:
    """A FIFO in place of the weight file used to block the transfer worker in open()
    forever, and run() with it. Now the transfer refuses it and the call fails, naming
    the stage and the tensor; with the file back, the model works."""
    model, wfile = _streamed(tmp_path)
    os.replace(wfile, wfile + ".orig")
    os.mkfifo(wfile)
    t, box = _in_thread(lambda: model.run({"x": _x()}))
    t.join(JOIN_S)
    hung = t.is_alive()
    if hung:  # unblock the old behaviour's reader so the thread can end
        fd = os.open(wfile, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(JOIN_S)
    assert not hung, "run() hung on a transfer that could not complete"
    err = box.get("error")
    assert isinstance(err, ExecutionError), box
    assert "stage 0 transfer of tensor 'w'" in str(err) and "not a regular file" in str(err)
    os.remove(wfile)
    os.replace(wfile + ".orig", wfile)
    x = _x(1)
    np.testing.assert_allclose(model.run({"x": x})["y"], expected(x), rtol=1e-6)


@pytest.mark.parametrize("how", ["truncated", "deleted", "shorter"])
def test_weight_file_broken_after_load_fails_the_run_then_recovers(tmp_path: Any, how: str) -> None:
    model, wfile = _streamed(tmp_path)
    with open(wfile, "rb") as f:
        data = f.read()
    if how == "truncated":
        os.truncate(wfile, 10)
    elif how == "deleted":
        os.remove(wfile)
    else:
        with open(wfile + ".new", "wb") as f:
            f.write(data[:100])
        os.replace(wfile + ".new", wfile)
    t, box = _in_thread(lambda: model.run({"x": _x()}))
    t.join(JOIN_S)
    assert not t.is_alive(), "run() hung on a failed transfer"
    assert isinstance(box.get("error"), ExecutionError), box
    assert "transfer of tensor 'w'" in str(box["error"])
    with open(wfile, "wb") as f:
        f.write(data)
    x = _x(2)
    np.testing.assert_allclose(model.run({"x": x})["y"], expected(x), rtol=1e-6)


# -- item 6: the budget's real minimum --------------------------------------------------------


@pytest.mark.parametrize("budget", [16, 64, 259])
def test_too_small_budget_says_the_real_minimum(tmp_path: Any, budget: int) -> None:
    model_dir = str(tmp_path)
    write_weights(model_dir)
    path = save(external_model("w.bin"), model_dir)
    # Each node reads one 256-byte weight; the embedded bias (4 bytes) stays resident.
    with pytest.raises(ModelLoadError, match=r"needs memory_budget >= 260 bytes") as info:
        tfrt_py.load(path, memory_budget=budget)
    assert "> 0" not in str(info.value)
    assert tfrt_py.load(path, memory_budget=260).executor == "stream"  # the minimum works


# -- item 7: unfinished or slow iterators block nobody ----------------------------------------


def _check(results: list[dict[str, np.ndarray]], xs: list[np.ndarray]) -> None:
    assert len(results) == len(xs)
    for r, x in zip(results, xs):
        np.testing.assert_allclose(r["y"], expected(x), rtol=1e-6)


def test_unfinished_iterator_does_not_block_another_threads_run(tmp_path: Any) -> None:
    model, _ = _streamed(tmp_path)
    xs = [_x(i) for i in range(4)]
    it = model.run_batches([{"x": x} for x in xs], window=2)
    first = next(it)  # the window's weights are loaded; the iterator is left unfinished
    x = _x(9)
    t, box = _in_thread(lambda: model.run({"x": x}))
    t.join(JOIN_S)
    assert not t.is_alive(), "run() on another thread waited for an unfinished iterator"
    assert "error" not in box, box
    np.testing.assert_allclose(box["result"]["y"], expected(x), rtol=1e-6)
    _check([first, *it], xs)  # the iterator carries on, reloading what it lost


def _run_meanwhile(
    model: tfrt_py.Model,
    x: np.ndarray,
    go_on: threading.Event,
    consumer: threading.Thread,
    out: dict[str, Any],
    xs: list[np.ndarray],
    parked: str,
) -> None:
    """While ``consumer``'s iterator is parked (until ``go_on``), ``model.run`` on ``x``
    from another thread returns without waiting for it; then both results are right."""
    other, box = _in_thread(lambda: model.run({"x": x}))
    other.join(JOIN_S)
    still_waiting = other.is_alive()
    go_on.set()
    consumer.join(JOIN_S)
    other.join(JOIN_S)
    assert not still_waiting, f"run() waited for {parked}"
    assert "error" not in box and "error" not in out, (box, out)
    np.testing.assert_allclose(box["result"]["y"], expected(x), rtol=1e-6)
    _check(out["result"], xs)


def test_slow_feed_source_does_not_block_another_threads_run(tmp_path: Any) -> None:
    model, _ = _streamed(tmp_path)
    xs = [_x(i) for i in range(3)]
    pulled_first, go_on = threading.Event(), threading.Event()

    def slow_feeds() -> Iterator[dict[str, np.ndarray]]:
        yield {"x": xs[0]}
        pulled_first.set()
        go_on.wait(JOIN_S)  # the source stalls while the pipeline asks for the next window
        for x in xs[1:]:
            yield {"x": x}

    consumer, out = _in_thread(lambda: list(model.run_batches(slow_feeds(), window=1)))
    assert pulled_first.wait(JOIN_S)
    _run_meanwhile(model, _x(7), go_on, consumer, out, xs, "a stalled feed source of another run")


def test_unfinished_async_iterator_does_not_block_a_sync_run(tmp_path: Any) -> None:
    import asyncio

    model, _ = _streamed(tmp_path)
    xs = [_x(i) for i in range(3)]
    parked, go_on = threading.Event(), threading.Event()

    async def consume() -> list[dict[str, np.ndarray]]:
        agen = model.run_batches_async([{"x": x} for x in xs], window=1)
        got = [await agen.__anext__()]
        parked.set()
        await asyncio.get_running_loop().run_in_executor(None, go_on.wait, JOIN_S)
        got += [r async for r in agen]
        return got

    consumer, out = _in_thread(lambda: asyncio.run(consume()))
    assert parked.wait(JOIN_S)
    _run_meanwhile(model, _x(5), go_on, consumer, out, xs, "an unfinished async iterator")


def test_interleaved_iterators_each_keep_their_own_state(tmp_path: Any) -> None:
    model, _ = _streamed(tmp_path)
    xa, xb = [_x(i) for i in range(4)], [_x(10 + i) for i in range(4)]
    a = model.run_batches([{"x": x} for x in xa], window=2)
    b = model.run_batches([{"x": x} for x in xb], window=3)
    got_a, got_b = [], []
    for ra, rb in zip(a, b):  # each next() preempts the other, parked, iterator
        got_a.append(ra)
        got_b.append(rb)
    _check(got_a, xa)
    _check(got_b, xb)
