"""The memory planner on real models: arena size against its lower bound.

    python benchmarks/planner_table.py [--models alexnet,resnet50,...] [--batch 1]

For the classic CNNs inside the onnx package (``onnx/backend/test/data/light``) and a
pre-LN transformer block (the test suite's ``transformer_erf``, from ``tests/support``, at
several sequence batches), prints: the arena the planner chose, the lower bound (the largest
sum of live buffer bytes at any step: no arena can be smaller), their ratio, the bytes
without any reuse (every planned value its own buffer), and how many kernels ran in place.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.support

import tfrt_py
from tests.support.classic_cnns import CLASSIC_CNNS as CNNS
from tests.support.classic_cnns import LIGHT_DIR as LIGHT
from tests.support.models import build


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _row(name: str, model: tfrt_py.Model, shapes: dict[str, tuple[int, ...]], load_s: float) -> str:
    t0 = time.perf_counter()
    plan = model.memory_plan(shapes)
    plan_s = time.perf_counter() - t0
    naive = sum(b.nbytes for b in plan.buffers)  # each buffer its own memory
    return (
        f"| {name} | {_kb(plan.arena_bytes)} | {_kb(plan.lower_bound_bytes)} | "
        f"{plan.ratio:.3f} | {_kb(naive)} | {len(plan.buffers)} | {plan.n_inplace} | "
        f"{plan.n_unplanned} | {load_s:.1f} | {plan_s:.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join((*CNNS, "transformer")))
    a = ap.parse_args()
    print(
        "| model | arena KiB | lower bound KiB | ratio | no reuse KiB | buffers | in place "
        "| unplanned | load s | plan s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        if name == "transformer":
            case = build("transformer_erf")
            t0 = time.perf_counter()
            model = tfrt_py.load(case.model, executor="sync")
            load_s = time.perf_counter() - t0
            for batch in (1, 8, 64):
                print(_row(f"transformer block b{batch}", model, {"x": (batch, 8, 16)}, load_s))
            continue
        t0 = time.perf_counter()
        model = tfrt_py.load(os.path.join(LIGHT, f"light_{name}.onnx"), executor="sync")
        load_s = time.perf_counter() - t0
        spec = model.inputs[0]
        shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape or ())
        print(_row(name, model, {spec.name: shape}, load_s), flush=True)
        del model
        gc.collect()


if __name__ == "__main__":
    main()
