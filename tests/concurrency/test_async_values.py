"""The concurrency layer: AsyncValue semantics, awaiting on asyncio/uvloop/trio, the loop
bridge, HostContext (pool, background loop, cancellation). No timing assertions."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import threading
from typing import Any

import anyio
import pytest

from tests.support.paths import ROOT as REPO_ROOT
from tfrt_py.concurrency import (
    AsyncValue,
    CancelToken,
    HostContext,
    current_bridge,
    make_available,
    run_when_ready,
)

ROOT = str(REPO_ROOT)


@pytest.fixture
def host() -> Any:
    with HostContext(num_workers=2, name="test-host") as h:
        yield h


def _in_thread(fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=fn, args=args)
    t.start()
    return t


# -- states ----------------------------------------------------------------------------------


def test_states_value_error_and_repr() -> None:
    av: AsyncValue[int] = AsyncValue()
    assert (av.state, av.is_available(), av.error) == ("pending", False, None)
    assert repr(av) == "<AsyncValue pending>"
    with pytest.raises(RuntimeError, match="not available"):
        _ = av.value
    av.set(3)
    assert (av.state, av.is_available(), av.is_concrete(), av.value) == ("available", True, True, 3)
    assert repr(av) == "<AsyncValue available: 3>"
    bad: AsyncValue[int] = AsyncValue()
    bad.set_error(ValueError("boom"))
    assert bad.is_available() and bad.is_error() and not bad.is_concrete()
    assert isinstance(bad.error, ValueError) and "error: ValueError('boom')" in repr(bad)
    with pytest.raises(ValueError, match="boom"):
        _ = bad.value
    assert len(repr(make_available("x" * 500))) < 100


@pytest.mark.parametrize("first", ["set", "set_error"])
@pytest.mark.parametrize("second", ["set", "set_error"])
def test_setting_twice_raises(first: str, second: str) -> None:
    av: AsyncValue[int] = AsyncValue()
    getattr(av, first)(ValueError("a") if first == "set_error" else 1)
    with pytest.raises(RuntimeError, match="already set"):
        getattr(av, second)(ValueError("b") if second == "set_error" else 2)
    with pytest.raises(TypeError):
        AsyncValue().set_error("not an exception")  # type: ignore[arg-type]


def _race_to_set(av: AsyncValue[int], i: int, wins: list[int], losses: list[int]) -> None:
    try:
        av.set(i)
        wins.append(i)
    except RuntimeError:
        losses.append(i)


def test_racing_setters_exactly_one_wins() -> None:
    for _ in range(50):
        av: AsyncValue[int] = AsyncValue()
        wins: list[int] = []
        losses: list[int] = []
        threads = [_in_thread(_race_to_set, av, i, wins, losses) for i in range(4)]
        for t in threads:
            t.join()
        assert len(wins) == 1 and len(losses) == 3 and av.value == wins[0]


# -- and_then --------------------------------------------------------------------------------


def test_and_then_runs_on_the_fulfilling_thread_or_at_once() -> None:
    av: AsyncValue[int] = AsyncValue()
    ran_on: list[tuple[str, int]] = []
    av.and_then(lambda: ran_on.append(("first", threading.get_ident())))
    av.and_then(lambda: ran_on.append(("second", threading.get_ident())))
    setter_id: list[int] = []

    def set_it() -> None:
        setter_id.append(threading.get_ident())
        av.set(1)

    _in_thread(set_it).join()
    assert ran_on == [("first", setter_id[0]), ("second", setter_id[0])]
    av.and_then(lambda: ran_on.append(("late", threading.get_ident())))
    assert ran_on[-1] == ("late", threading.get_ident())  # at once, on this thread


def test_and_then_never_loses_a_callback_racing_set() -> None:
    for _ in range(200):
        av: AsyncValue[int] = AsyncValue()
        calls: list[int] = []
        t = _in_thread(av.set, 1)
        for i in range(20):
            av.and_then(functools.partial(calls.append, i))
        t.join()
        assert sorted(calls) == list(range(20))


def test_a_failing_callback_is_logged_and_the_others_run(caplog: Any) -> None:
    av: AsyncValue[int] = AsyncValue()
    calls: list[str] = []
    av.and_then(lambda: 1 / 0)
    av.and_then(lambda: calls.append("ok"))
    with caplog.at_level(logging.ERROR, logger="tfrt_py.concurrency"):
        av.set(1)
    assert calls == ["ok"] and "ZeroDivisionError" in caplog.text


def test_wait_blocks_until_set_and_times_out() -> None:
    av: AsyncValue[str] = AsyncValue()
    t = _in_thread(av.set, "done")
    assert av.wait() == "done"
    t.join()
    with pytest.raises(TimeoutError):
        AsyncValue().wait(timeout=0.01)
    with pytest.raises(KeyError):
        _error(KeyError("k")).wait()


# -- helpers ---------------------------------------------------------------------------------


def test_run_when_ready_counts_once_across_threads() -> None:
    calls: list[int] = []
    run_when_ready([], lambda: calls.append(0))
    run_when_ready([make_available(1), _error(ValueError())], lambda: calls.append(1))
    assert calls == [0, 1]
    for _ in range(20):
        values: list[AsyncValue[int]] = [AsyncValue() for _ in range(16)]
        values.append(make_available(0))
        seen: list[int] = []
        run_when_ready(values, functools.partial(seen.append, 1))
        threads = [_in_thread(v.set, i) for i, v in enumerate(values[:-1])]
        for t in threads:
            t.join()
        assert seen == [1]


# -- awaiting on asyncio, uvloop, trio -------------------------------------------------------


@pytest.mark.anyio
async def test_await_available_pending_and_error(anyio_backend: Any) -> None:
    assert await make_available(5) == 5
    with pytest.raises(ValueError, match="bad"):
        await _error(ValueError("bad"))
    from_thread: AsyncValue[str] = AsyncValue()
    t = _in_thread(from_thread.set, "thread")
    assert await from_thread == "thread"
    t.join()
    on_loop: AsyncValue[str] = AsyncValue()
    async with anyio.create_task_group() as tg:

        async def set_soon() -> None:
            await anyio.sleep(0)
            on_loop.set("loop")

        tg.start_soon(set_soon)
        assert await on_loop == "loop"
    error_later: AsyncValue[int] = AsyncValue()
    t = _in_thread(error_later.set_error, KeyError("late"))
    with pytest.raises(KeyError):
        await error_later
    t.join()


@pytest.mark.anyio
async def test_many_waiters_one_value(anyio_backend: Any) -> None:
    av: AsyncValue[int] = AsyncValue()
    got: list[int] = []
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            got.append(await av)

        for _ in range(50):
            tg.start_soon(waiter)
        await anyio.sleep(0)
        _in_thread(av.set, 9).join()
    assert got == [9] * 50


@pytest.mark.anyio
async def test_cancelling_the_waiter_leaves_the_value_alone(anyio_backend: Any) -> None:
    av: AsyncValue[int] = AsyncValue()
    with anyio.move_on_after(0.01) as scope:
        await av
    assert scope.cancelled_caught and not av.is_available()
    av.set(1)  # the cancelled waiter's wake-up is a no-op
    assert await av == 1


# -- the loop bridge -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_bridge_spawns_from_a_worker_thread(anyio_backend: Any, host: HostContext) -> None:
    bridge = current_bridge()
    assert bridge is not None and bridge.in_loop_thread()
    result: AsyncValue[Any] = AsyncValue()

    async def kernel(x: int) -> int:
        await anyio.sleep(0)
        return x + 1

    def on_done(value: Any, error: BaseException | None) -> None:
        assert bridge.in_loop_thread()  # completions run on the loop's thread
        result.set((value, error))

    host.enqueue(bridge.spawn, kernel, [41], on_done)
    assert await result == (42, None)
    failed: AsyncValue[Any] = AsyncValue()

    async def broken() -> None:
        raise OSError("io")

    bridge.spawn(broken, [], lambda v, e: failed.set(e))
    assert isinstance(await failed, OSError)


def test_no_bridge_without_a_running_loop() -> None:
    assert current_bridge() is None


# -- HostContext -----------------------------------------------------------------------------


def test_pool_runs_work_on_workers(host: HostContext) -> None:
    assert host.num_workers == 2 and not host.is_worker_thread()
    seen: list[AsyncValue[bool]] = [AsyncValue() for _ in range(8)]
    for av in seen:
        host.enqueue(lambda av=av: av.set(host.is_worker_thread()))
    assert [av.wait(timeout=10) for av in seen] == [True] * 8
    assert HostContext().num_workers >= 1
    with pytest.raises(ValueError):
        HostContext(num_workers=0)


def test_background_loop_runs_async_work_and_cancels(host: HostContext) -> None:
    bridge = host.background_bridge()
    assert bridge is host.background_bridge() and not bridge.in_loop_thread()
    out: AsyncValue[Any] = AsyncValue()

    async def double(x: int) -> int:
        await anyio.sleep(0)
        return 2 * x

    bridge.spawn(double, [21], lambda v, e: out.set(v))
    assert out.wait(timeout=10) == 42
    started: AsyncValue[None] = AsyncValue()
    finished: AsyncValue[str] = AsyncValue()
    never: AsyncValue[None] = AsyncValue()

    async def forever() -> None:
        started.set(None)
        try:
            await never
        finally:
            finished.set("cancelled")

    handle = bridge.spawn(forever, [], lambda v, e: finished.set("completed?"))
    started.wait(timeout=10)
    handle.cancel()
    handle.cancel()  # idempotent
    assert finished.wait(timeout=10) == "cancelled"


def test_cancel_tokens_and_close() -> None:
    h = HostContext(num_workers=1, name="closing")
    token = h.cancel_token()
    calls: list[str] = []
    token.add_callback(lambda: calls.append("a"))
    h.enqueue(lambda: None)
    h.background_bridge()
    h.close()
    h.close()  # idempotent
    assert token.cancelled and token.reason == "host closed" and calls == ["a"]
    token.add_callback(lambda: calls.append("late"))  # already cancelled: runs at once
    assert calls == ["a", "late"] and h.closed
    assert h.cancel_token().cancelled
    with pytest.raises(RuntimeError, match="closed"):
        h.background_bridge()
    with pytest.raises(RuntimeError, match="closed"):
        h.enqueue(lambda: None)
    alone = CancelToken()
    alone.cancel("why")
    alone.cancel("again")
    assert alone.reason == "why"


def test_concurrency_imports_nothing_of_tfrt_py_nor_numpy() -> None:
    code = (
        "import importlib.util, sys\n"
        f"path = {os.path.join(ROOT, 'tfrt_py', 'concurrency')!r}\n"
        "spec = importlib.util.spec_from_file_location('conc', path + '/__init__.py',\n"
        "    submodule_search_locations=[path])\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['conc'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'tfrt_py')]\n"
        "assert not bad, bad\n"
        "assert mod.AsyncValue and mod.HostContext\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def _error(e: BaseException) -> AsyncValue[object]:
    av: AsyncValue[object] = AsyncValue()
    av.set_error(e)
    return av
