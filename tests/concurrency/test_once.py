"""``concurrency.once.Once``: one decision per process, however many threads ask first."""

from __future__ import annotations

import threading
import time

from tfrt_py.concurrency.once import Once


def test_many_threads_asking_at_once_decide_once_and_share_the_result() -> None:
    calls: list[int] = []

    def decide() -> object:
        calls.append(1)
        time.sleep(0.05)  # the others arrive while the first decides
        return object()

    once: Once[object] = Once(decide)
    assert once.peek() is None
    start = threading.Barrier(8)
    got: list[object] = []

    def ask() -> None:
        start.wait()
        got.append(once.get())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(got) == 8 and all(g is got[0] for g in got)
    assert once.peek() is got[0] and once.get() is got[0]
