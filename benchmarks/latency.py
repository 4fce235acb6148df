"""Latency of the anchor models M1-M4 on every runtime, side by side in one process.

    python benchmarks/latency.py [--seconds S] [--models M1,M2,...] [--out DIR]

For each model: tfrt_py (each executor it accepts), hand-written NumPy (fresh and
preallocated), onnxruntime (run and io binding). Outputs are checked against each other
before timing; bursts are interleaved and paired with an adjacent NumPy-prealloc burst;
the table reports median/p90/p99 µs and the median paired ratio. Writes JSON, markdown
and (when matplotlib is installed) a PNG per model into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import contextlib

from anchors import ANCHORS

from tfrt_py.bench import measure
from tfrt_py.bench.report import markdown_table, plot
from tfrt_py.bench.runners import check_agreement, make_runners

BASELINE = "numpy prealloc"


def bench_model(key: str, seconds: float, executors: tuple[str, ...]) -> tuple[str, list]:
    anchor = ANCHORS[key]()
    data = anchor.model.SerializeToString()
    runners, outputs = make_runners(data, anchor.feeds, executors, ("onnxruntime",))
    runners = {"numpy fresh": anchor.numpy_fresh, BASELINE: anchor.numpy_prealloc, **runners}
    outputs = {BASELINE: anchor.numpy_prealloc, "numpy fresh": anchor.numpy_fresh, **outputs}
    check_agreement(outputs)
    results = measure(runners, BASELINE, seconds)
    return anchor.name, [results, markdown_table(results, BASELINE)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--models", default=",".join(ANCHORS))
    ap.add_argument("--executors", default="auto")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    summary = {}
    for key in a.models.split(","):
        name, (results, table) = bench_model(key, a.seconds, tuple(a.executors.split(",")))
        print(f"\n## {name}\n\n{table}", flush=True)
        summary[key] = {"name": name, "results": [r.as_dict() for r in results.values()]}
        with contextlib.suppress(ImportError):
            plot(results, os.path.join(a.out, f"{key}.png"), name)
    with open(os.path.join(a.out, "latency.json"), "w") as f:
        json.dump({"baseline": BASELINE, "models": summary}, f, indent=1)


if __name__ == "__main__":
    main()
