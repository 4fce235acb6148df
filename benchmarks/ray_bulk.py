"""Bulk scoring through Ray Data: rows/s of tfrt_py.ray.Predictor against the same actor
class wrapping onnxruntime.

    python benchmarks/ray_bulk.py [--rows 400000] [--actors 2] [--batch-sizes 256,1024,4096]
                                  [--repeat 3] [--models gbt,mlp] [--json out.json]

Starts a local Ray cluster (``num_cpus=--actors``) and, for each model (gradient-boosted
trees from scikit-learn via skl2onnx, ZipMap on; a 16-64-64-4 MLP from onnx.helper;
tests/support/scale_models.py), runtime and batch size, runs ``--rows`` rows through
``ds.map_batches(Actor, batch_format="numpy", batch_size=B,
compute=ActorPoolStrategy(size=--actors), num_cpus=1)``. Runtimes:

* ``tfrt_py``: ``tfrt_py.ray.Predictor`` (one BLAS thread per actor, from its num_cpus;
  ZipMap outputs become columns per class without building dicts);
* ``onnxruntime``: ``OrtPredictor`` below, the same class around an InferenceSession
  (``intra_op_num_threads=1``): outputs added as columns, ZipMap's dicts expanded;
* ``onnxruntime (no ZipMap)``: the same on the model with its ZipMap cut off as tfrt_py
  does (``tfrt_py.ray.unzip_zipmaps``), for the trees: onnxruntime without the dicts.

rows/s is measured in steady state, from the first batch out to the last (actor start-up
and model load excluded): (rows after the first batch) / (time between first and last);
each figure is the median of ``--repeat`` runs, the runtimes taking turns (interleaved).
"in-process" is the same actor classes called on batches of B rows in this process with
one thread (no Ray): the per-call cost Ray's transport adds to. Figures are relative and
noisy on a shared machine: compare columns of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import tests.support.scale_models as sm  # run from the repository root (PYTHONPATH=.)


class OrtPredictor:
    """The baseline actor: onnxruntime in Predictor's shape (columns in, columns added)."""

    def __init__(self, model: str, threads: int = 1, unzip: bool = False) -> None:
        import onnx
        import onnxruntime as ort

        from tfrt_py.ray import unzip_zipmaps

        proto = onnx.load(model)
        self.labels = unzip_zipmaps(proto) if unzip else {}
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(proto.SerializeToString(), so)
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.outputs = [o.name for o in self.sess.get_outputs()]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self.sess.run(None, {n: batch[n] for n in self.inputs})
        result = dict(batch)
        for name, value in zip(self.outputs, outs):
            if name in self.labels:
                for j, label in enumerate(self.labels[name]):
                    result[f"{name}_{label}"] = value[:, j]
            elif isinstance(value, list):  # ZipMap: one dict per row
                for key in value[0]:
                    result[f"{name}_{key}"] = np.array([d[key] for d in value])
            else:
                result[name] = value
        return result


def dataset(column: str, x: np.ndarray, blocks: int) -> Any:
    """``x`` as a tensor column in ``blocks`` blocks, made without a task (the actors hold
    every CPU)."""
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    table = pa.table({column: ArrowTensorArray.from_numpy(x)})
    step = -(-len(x) // blocks)
    return ray.data.from_arrow([table.slice(i, step) for i in range(0, len(x), step)])


def rows_per_s(ds: Any, actor: Any, kwargs: dict[str, Any], batch: int, actors: int) -> float:
    import ray.data

    out = ds.map_batches(
        actor,
        fn_constructor_kwargs=kwargs,
        batch_format="numpy",
        batch_size=batch,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
    )
    first = last = 0.0
    rows = 0
    for b in out.iter_batches(batch_size=None, batch_format="numpy"):
        n = len(next(iter(b.values())))
        now = time.perf_counter()
        if not first:
            first = now
        else:
            rows += n
        last = now
    return rows / (last - first) if last > first else float("nan")


def in_process_rows_per_s(actor: Any, kwargs: dict[str, Any], column: str, x: np.ndarray) -> float:
    """Rows/s of ``actor(**kwargs)`` called on ``x`` (one batch) for about half a second;
    ``x`` read-only, as Ray Data hands batches to actors (views of its object store)."""
    fn = actor(**kwargs)
    x = x.copy()
    x.flags.writeable = False
    batch = {column: x}
    fn(batch)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        fn(batch)
        n += 1
    return n * len(x) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--batch-sizes", default="256,1024,4096")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    ap.add_argument("--models", default="gbt,mlp", help="which of gbt, mlp to run")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    import ray

    from tfrt_py.concurrency.threads import set_process_threads
    from tfrt_py.ray import Predictor

    set_process_threads(1)  # the in-process figures: one thread, like each actor

    sizes = [int(s) for s in args.batch_sizes.split(",")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - {"gbt", "mlp"}:
        ap.error(f"--models takes gbt and/or mlp, got {args.models!r}")
    ray.init(num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        makers = {
            "gbt": lambda: (sm.gbt_model(Path(d) / "gbt.onnx"), "features", sm.gbt_data(args.rows)),
            "mlp": lambda: (sm.mlp_model(Path(d) / "mlp.onnx"), "x", sm.mlp_data(args.rows)),
        }
        cases = {name: makers[name]() for name in models}
        for name, (path, column, x) in cases.items():
            ds = dataset(column, x, blocks=max(8, args.rows // 8192)).materialize()
            runtimes: dict[str, tuple[Any, dict[str, Any]]] = {
                "tfrt_py": (Predictor, {"model": str(path)}),
                "onnxruntime": (OrtPredictor, {"model": str(path)}),
            }
            if name == "gbt":
                runtimes["onnxruntime (no ZipMap)"] = (
                    OrtPredictor, {"model": str(path), "unzip": True},
                )  # fmt: skip
            for batch in sizes:
                row: dict[str, Any] = {"model": name, "batch_size": batch}
                runs: dict[str, list[float]] = {rt: [] for rt in runtimes}
                for _ in range(args.repeat):
                    for rt, (actor, kwargs) in runtimes.items():
                        runs[rt].append(rows_per_s(ds, actor, kwargs, batch, args.actors))
                for rt, (actor, kwargs) in runtimes.items():
                    row[rt] = statistics.median(runs[rt])
                    row["in-process " + rt] = in_process_rows_per_s(
                        actor, kwargs, column, x[:batch]
                    )
                results.append(row)
                for where, pre in (("ray", ""), ("in-process", "in-process ")):
                    cells = "  ".join(f"{rt} {row[pre + rt]:>11,.0f}" for rt in runtimes)
                    ratio = row[pre + "tfrt_py"] / row[pre + "onnxruntime"]
                    print(f"{name:4} batch {batch:5} {where:10}: rows/s  {cells}  "
                          f"(tfrt_py/ort {ratio:.2f}x)")  # fmt: skip
                sys.stdout.flush()
    ray.shutdown()
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"rows": args.rows, "actors": args.actors, "repeat": args.repeat,
                       "results": results}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
