"""Bench results as a markdown table, JSON, and an optional PNG chart (matplotlib)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from .timing import BenchResult

__all__ = ["markdown_table", "plot", "to_json"]

COLUMNS = ("runtime", "median µs", "p90 µs", "p99 µs", "ratio to baseline")


def markdown_table(results: Mapping[str, BenchResult], baseline: str) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(results.values(), key=lambda r: r.median_us):
        mark = " (baseline)" if r.name == baseline else ""
        lines.append(
            f"| {r.name}{mark} | {r.median_us:.1f} | {r.pct(0.9):.1f} | {r.pct(0.99):.1f} "
            f"| {r.ratio:.2f} |"
        )
    return "\n".join(lines)


def to_json(results: Mapping[str, BenchResult], baseline: str, **meta: object) -> str:
    return json.dumps(
        {"baseline": baseline, **meta, "results": [r.as_dict() for r in results.values()]},
        indent=1,
    )


def plot(results: Mapping[str, BenchResult], path: str, title: str) -> None:
    """Bar chart of median µs with p90 whiskers. Needs matplotlib (``pip install .[bench]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = sorted(results.values(), key=lambda r: r.median_us)
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rs)))
    meds = [r.median_us for r in rs]
    err = [max(0.0, r.pct(0.9) - r.median_us) for r in rs]
    ax.barh([r.name for r in rs], meds, xerr=[[0] * len(rs), err], color="#4c72b0")
    ax.set_xlabel("µs per call (median, whisker to p90)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
