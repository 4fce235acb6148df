"""Interleaved, paired burst timing.

``measure`` times each runner in bursts of ``burst`` calls, cycling through the runners in
a shuffled order per round, and pairs each burst with the baseline burst of the same round.
Per runner it reports the median, p90 and p99 of per-call µs (over bursts) and the median
of the per-round ratio to the baseline. Runs on the caller's thread.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import field

from ..records import record

__all__ = ["BenchResult", "measure"]


@record
class BenchResult:
    """Per-call latency of one runner: µs statistics over bursts, and the paired ratio."""

    name: str
    burst_us: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        xs = sorted(self.burst_us)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]

    @property
    def median_us(self) -> float:
        return statistics.median(self.burst_us) if self.burst_us else float("nan")

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else float("nan")

    def as_dict(self) -> dict[str, float | str | int]:
        return {
            "name": self.name,
            "median_us": self.median_us,
            "p90_us": self.pct(0.9),
            "p99_us": self.pct(0.99),
            "ratio": self.ratio,
            "bursts": len(self.burst_us),
        }


def _calibrate(fn: Callable[[], object], target_s: float) -> int:
    """Calls per burst so that one burst takes about ``target_s``."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= target_s / 4 or n >= 1 << 16:
            return max(1, int(n * target_s / max(dt, 1e-9)))
        n *= 4


def measure(
    runners: Mapping[str, Callable[[], object]],
    baseline: str,
    seconds: float = 2.0,
    burst_s: float = 0.005,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
) -> dict[str, BenchResult]:
    """Time every runner for about ``seconds`` in total; ratios are against ``baseline``."""
    if baseline not in runners:
        raise ValueError(f"baseline {baseline!r} is not one of {list(runners)}")
    for fn in runners.values():  # warm-up: caches, lazy compilation, allocator pools
        for _ in range(3):
            fn()
    sizes = {name: _calibrate(fn, burst_s) for name, fn in runners.items()}
    results = {name: BenchResult(name) for name in runners}
    order = list(runners)
    rng = random.Random(seed)
    t_end = time.perf_counter() + seconds
    t_start = time.perf_counter()
    while True:
        rng.shuffle(order)
        round_us: dict[str, float] = {}
        for name in order:
            fn, n = runners[name], sizes[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            round_us[name] = (time.perf_counter() - t0) / n * 1e6
        base = round_us[baseline]
        for name, us in round_us.items():
            results[name].burst_us.append(us)
            results[name].ratios.append(us / base)
        now = time.perf_counter()
        if progress is not None:
            progress(min(1.0, (now - t_start) / seconds))
        if now >= t_end and len(results[baseline].burst_us) >= 5:
            return results
