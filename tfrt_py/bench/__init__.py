"""The benchmark method shared by ``tfrt-py bench`` and ``benchmarks/``.

Short bursts, runtimes interleaved, every burst paired with an adjacent burst of the
baseline; the figure that survives a noisy machine is the median ratio per pair.
"""

from __future__ import annotations

from .timing import BenchResult as BenchResult
from .timing import measure as measure

__all__ = ["BenchResult", "measure"]
