"""``entry.Trial``: the measured choice between native code and the interpreter, over a
bucket whose calls come in many shapes (a box of dims). The candidates here are plain
callables whose cost is read from a clock the test advances (``entry.time``), so the
decision is the logic's, not the host's timing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfrt_py.native.runtime import entry


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(entry, "time", c)
    return c


def _cand(clock: _Clock, per_token_s: float, log: list[str], name: str) -> Any:
    def run(feeds: Any, x: np.ndarray) -> dict[str, Any]:
        clock.now += per_token_s * x.size
        log.append(name)
        return {"y": x.astype(np.float32) * 2}

    return run


def _trial(native: Any, sync: Any, decided: list[Any], size: Any = None) -> entry.Trial:
    """A trial between ``native`` and ``sync`` (also the reference) whose decisions land in
    ``decided``; a disagreement fails the test."""
    return entry.Trial([("native", native), ("sync", sync)], sync,
                       lambda best, fig: decided.append((best, fig)),
                       lambda why: pytest.fail(why), size)  # fmt: skip


def test_a_box_trial_compares_the_candidates_on_the_same_calls(clock: _Clock) -> None:
    """Native costs half the interpreter's time on every call, but the calls alternate
    between 64 and 2,048 tokens: timed on calls of their own (even calls native, odd ones
    the interpreter), the interpreter looked 16x faster and served the box for good."""
    log: list[str] = []
    native = _cand(clock, 1e-6, log, "native")
    sync = _cand(clock, 2e-6, log, "sync")
    decided: list[tuple[str, dict[str, float]]] = []
    trial = _trial(native, sync, decided)
    shapes = [(1, 64), (8, 256)] * 4
    for shape in shapes:
        x = np.ones(shape, np.int64)
        out = trial({"x": x}, x)
        np.testing.assert_array_equal(out["y"], x * 2)
        if decided:
            break
    assert decided and decided[0][0] == "native", decided
    assert trial.done and trial.best is native
    # every trial call ran both candidates, the order rotating
    assert log[:4] == ["native", "sync", "sync", "native"], log
    assert trial.calls == entry.WARMUP + entry.SAMPLES


def test_a_trial_whose_native_answer_disagrees_serves_the_interpreter(clock: _Clock) -> None:
    log: list[str] = []
    sync = _cand(clock, 2e-6, log, "sync")

    def wrong(feeds: Any, x: np.ndarray) -> dict[str, Any]:
        return {"y": x.astype(np.float32) * 3}

    reasons: list[str] = []
    trial = entry.Trial([("native", wrong), ("sync", sync)], sync,
                        lambda best, fig: pytest.fail("decided"), reasons.append)  # fmt: skip
    x = np.ones((1, 8), np.int64)
    np.testing.assert_array_equal(trial({"x": x}, x)["y"], x * 2)
    assert trial.done and trial.best is sync
    assert reasons and "native" in reasons[0] and "'y'" in reasons[0]


def test_a_rows_trial_reports_its_figures_per_row(clock: _Clock) -> None:
    log: list[str] = []
    native = _cand(clock, 3e-6, log, "native")
    sync = _cand(clock, 1e-6, log, "sync")
    decided: list[tuple[str, dict[str, float]]] = []
    trial = _trial(native, sync, decided, size=lambda xs: int(xs[0].shape[0]))
    for n in (4, 8, 16, 32):
        x = np.ones((n, 10), np.int64)
        trial({"x": x}, x)
    best, fig = decided[0]
    assert best == "sync"
    assert fig["native"] == pytest.approx(30.0) and fig["sync"] == pytest.approx(10.0)
