"""Latency of the anchor models M1-M4 and some real models, all runtimes in one process.

    python benchmarks/latency.py [--seconds S] [--models M1,M2,...] [--out DIR]

For each anchor model: tfrt_py (each executor it accepts), hand-written NumPy (fresh and
preallocated), onnxruntime (run and io binding) and, where installed, the peers of
``peers.py`` (TFLite via ai-edge-litert, torch.jit, jax.jit; ``--peers``). For the real
models (a CNN, a transformer block, a recommender, a gradient-boosted tree ensemble; built
from fixed seeds by ``tests/support/models``, importable with the repository root on the
path: ``PYTHONPATH=. python benchmarks/latency.py``) there is no hand-written baseline:
ratios are to onnxruntime run.
Outputs are checked against each other before timing; bursts are interleaved and paired
with an adjacent baseline burst; the table reports median/p90/p99 µs and the median
paired ratio. Writes JSON, markdown and (when matplotlib is installed) a PNG per model
into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import peers
from anchor_models import ANCHORS

from tfrt_py.bench import measure
from tfrt_py.bench.report import markdown_table, plot
from tfrt_py.bench.runners import check_agreement, make_runners

BASELINE = "numpy prealloc"
REAL_BASELINE = "onnxruntime run"
REAL_MODELS = ("cnn", "transformer_erf", "recommender", "sklearn_gb_classifier")
NO_REAL = "tests/support/models needs the repository root on the path (PYTHONPATH=.)"


def real_models() -> Callable[[str], Any] | None:
    """The test suite's model builder (``tests.support.models.build``: real models from
    fixed seeds), or None when the repository root is not on the path (a script only has
    its own folder there; ``PYTHONPATH=.`` adds the root)."""
    try:
        from tests.support.models import build
    except ModuleNotFoundError:
        return None
    return build


def bench_real(key: str, seconds: float, executors: tuple[str, ...]) -> tuple[str, list]:
    build = real_models()
    assert build is not None, "checked in main()"
    case = build(key)
    runners, outputs = make_runners(case.model.SerializeToString(), case.feeds[0], executors)
    check_agreement(outputs, rtol=case.rtol, atol=case.atol)
    results = measure(runners, REAL_BASELINE, seconds)
    return case.name, [results, markdown_table(results, REAL_BASELINE)]


def add_native(data: bytes, feeds: dict, timed: dict, outputs: dict) -> None:
    """tfrt_py[native] for a model the native tier lowers, compiled before timing
    (native="eager"), so the column measures the native function, not the tier-up."""
    import tfrt_py
    from tfrt_py.native import Declined, NativeUnavailable

    try:
        model = tfrt_py.load(data, executor="native", native="eager")
    except (Declined, NativeUnavailable) as e:
        print(f"(no tfrt_py[native] column: {e})")
        return

    def run() -> dict:
        return model.run(feeds)

    timed["tfrt_py[native]"] = run
    outputs["tfrt_py[native]"] = lambda: [np.asarray(v) for v in run().values()]


def bench_model(
    key: str,
    seconds: float,
    executors: tuple[str, ...],
    peer_names: tuple[str, ...] = (),
    peer_threads: int = 1,
) -> tuple[str, list]:
    anchor = ANCHORS[key]()
    data = anchor.model.SerializeToString()
    runners, outputs = make_runners(data, anchor.feeds, executors, ("onnxruntime",))
    peer_timed, peer_outputs = peers.peer_runners(anchor, peer_names, peer_threads)
    runners = {"numpy fresh": anchor.numpy_fresh, BASELINE: anchor.numpy_prealloc, **runners}
    runners.update(peer_timed)
    add_native(data, anchor.feeds, runners, outputs)
    outputs = {BASELINE: anchor.numpy_prealloc, "numpy fresh": anchor.numpy_fresh, **outputs}
    outputs.update(peer_outputs)
    # atol scaled to the outputs (M1's are ~1e-13: a fixed 1e-5 would accept zeros)
    scale = max(float(np.abs(o).max()) for o in anchor.numpy_prealloc())
    check_agreement(outputs, atol=min(1e-5, 1e-4 * scale))
    results = measure(runners, BASELINE, seconds)
    return anchor.name, [results, markdown_table(results, BASELINE)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--models", default=",".join(ANCHORS))
    ap.add_argument("--real", default=",".join(REAL_MODELS), help="'' for none")
    ap.add_argument("--executors", default="sync,async,auto")
    ap.add_argument("--peers", default=",".join(peers.PEERS), help="'' for none")
    ap.add_argument("--peer-threads", type=int, default=1, help="threads per peer runtime")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    summary = {}
    executors = tuple(a.executors.split(","))
    peer_names = tuple(p for p in a.peers.split(",") if p)
    if a.models:
        print(peers.describe(peer_names, a.peer_threads), flush=True)
    anchor_bench = functools.partial(
        bench_model, peer_names=peer_names, peer_threads=a.peer_threads
    )
    jobs: list[tuple[str, Callable[..., tuple[str, list]]]]
    jobs = [(k, anchor_bench) for k in a.models.split(",") if k]
    no_real = bool(a.real) and real_models() is None
    if no_real:
        print(f"(no real models: {NO_REAL})", flush=True)
    else:
        jobs += [(k, bench_real) for k in a.real.split(",") if k]
    for key, bench in jobs:
        name, (results, table) = bench(key, a.seconds, executors)
        print(f"\n## {name}\n\n{table}", flush=True)
        summary[key] = {"name": name, "results": [r.as_dict() for r in results.values()]}
        with contextlib.suppress(ImportError):
            plot(results, os.path.join(a.out, f"{key}.png"), name)
    with open(os.path.join(a.out, "latency.json"), "w") as f:
        json.dump({"baseline": BASELINE, "models": summary}, f, indent=1)
    missing = peers.missing()
    if missing:
        print(f"\nnot installed, so no columns for: {', '.join(missing)}")
    if no_real:
        print(f"\nno tables for the real models ({a.real}): {NO_REAL}")


if __name__ == "__main__":
    main()
