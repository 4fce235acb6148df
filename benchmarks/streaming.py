"""Streamed bulk inference: overlap of weight transfer (disk reads) with compute.

    python benchmarks/streaming.py [--layers 20] [--hidden 2048] [--rows 16] [--window 2]
                                   [--windows 3] [--budget-stages 4] [--repeats 3]

Builds an MLP of ``--layers`` x (MatMul hidden x hidden + bias Add + Relu), float32, saved
with its weights as ONNX external data in a temporary directory under /tmp (deleted at the
end), and loads it with a ``memory_budget`` of two stages of ``--budget-stages`` layers.
Each timed run happens in a fresh subprocess (so ``ru_maxrss`` is that run's own peak) and
starts by dropping the weight file from the page cache (``posix_fadvise(DONTNEED)``), so
every read comes from the disk. A run is ``--windows`` windows of ``--window`` batches of
``--rows`` rows through ``model.run_batches``, once with overlap (the next stage is read
while this one computes) and once without (read, then compute), interleaved, ``--repeats``
times each; medians are printed. The bound checked: wall with overlap <= 1.15 x max(compute,
transfer) + the first stage's transfer, using the compute and transfer of the run *without*
overlap (uncontended; the overlapped run's own figures are printed too).

Peak RSS: the child's ``ru_maxrss``, and its growth over the RSS measured right before
``load`` (after imports and a BLAS warm-up), against the budget plus the activations.
A reference run loads the same model without a budget (memory-mapped weights).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np


def build(directory: str, layers: int, hidden: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    scale = 1.0 / np.sqrt(hidden)
    for i in range(layers):
        w = (rng.standard_normal((hidden, hidden), dtype=np.float32) * scale).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.full(hidden, 0.01, np.float32), f"b{i}")]  # fmt: skip
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    g = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", hidden])], inits,
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(directory, "mlp.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="mlp.weights", size_threshold=0)  # fmt: skip
    weights = os.path.join(directory, "mlp.weights")
    fd = os.open(weights, os.O_RDONLY)
    os.fsync(fd)  # dirty pages cannot be dropped from the cache
    os.close(fd)


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def current_rss_kb() -> int:
    """This process's resident set now (kB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def child(args: argparse.Namespace) -> None:
    """One timed run in this (fresh) process; prints one JSON line."""
    import tfrt_py
    from tfrt_py.streaming import last_stats

    rng = np.random.default_rng(1)
    batches = [{"x": rng.standard_normal((args.rows, args.hidden), dtype=np.float32)}
               for _ in range(args.window * args.windows)]  # fmt: skip
    warm = rng.standard_normal((args.rows, args.hidden), dtype=np.float32)
    _ = warm @ warm.T  # BLAS buffers and threads belong to the baseline
    from tfrt_py.concurrency import default_host

    default_host().enqueue(lambda: None)  # so do the host's worker threads
    drop_cache(args.weights)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    budget = None if args.mode == "mmap" else args.budget
    t0 = time.perf_counter()
    model = tfrt_py.load(args.model, memory_budget=budget)
    load_s = time.perf_counter() - t0
    start_kb = current_rss_kb()
    t0 = time.perf_counter()
    outs = list(model.run_batches(batches, window=args.window, overlap=args.mode == "overlap"))
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    st = last_stats(model)
    out: dict[str, Any] = {
        "mode": args.mode, "wall": wall, "load": load_s, "base_kb": base_kb, "peak_kb": peak_kb,
        "start_kb": start_kb,
        "checksum": float(sum(float(o[next(iter(o))].sum(dtype=np.float64)) for o in outs)),
    }  # fmt: skip
    if st is not None:
        out.update(compute=st.compute_s, transfer=st.transfer_s, first=st.first_transfer_s,
                   wait=st.wait_s, bytes=st.bytes_read, arena=model.runtime.arena.nbytes,
                   stages=len(model.runtime.stages))  # fmt: skip
    print(json.dumps(out))


def run_child(args: argparse.Namespace, mode: str, parse: bool = True) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", args.model,
           "--weights", args.weights, "--budget", str(args.budget)]  # fmt: skip
    for k in ("layers", "hidden", "rows", "window", "windows"):
        cmd += [f"--{k}", str(getattr(args, k))]
    n = str(args.blas_threads)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"child {mode} failed:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1])) if parse else {}


def med(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--rows", type=int, default=16, help="rows per batch")
    p.add_argument("--window", type=int, default=2, help="batches per window (per stage load)")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--budget-stages", type=int, default=4, help="layers per stage")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--blas-threads", type=int, default=1,
                   help="BLAS threads in the runs (1: one core computes, one reads)")  # fmt: skip
    p.add_argument("--child", choices=["overlap", "serial", "mmap", "build"])
    p.add_argument("--model")
    p.add_argument("--weights")
    p.add_argument("--budget", type=int, default=0)
    args = p.parse_args()
    if args.child == "build":
        build(os.path.dirname(args.model), args.layers, args.hidden)
        return
    if args.child:
        args.mode = args.child
        child(args)
        return
    layer = args.hidden * args.hidden * 4 + args.hidden * 4
    args.budget = 2 * args.budget_stages * layer + (1 << 20)
    tmp = tempfile.mkdtemp(prefix="tfrt_py_streaming_", dir="/tmp")
    try:
        # Built in a child: the children inherit this process's peak RSS through fork/exec
        # (Linux keeps ru_maxrss across exec), so this process must stay small.
        args.model = os.path.join(tmp, "mlp.onnx")
        args.weights = os.path.join(tmp, "mlp.weights")
        run_child(args, "build", parse=False)
        report(args, layer)
    finally:
        shutil.rmtree(tmp)


def report(args: argparse.Namespace, layer: int) -> None:
    total = os.path.getsize(args.weights)
    runs: dict[str, list[dict[str, Any]]] = {"overlap": [], "serial": []}
    for _ in range(args.repeats):
        for mode in ("overlap", "serial"):
            runs[mode].append(run_child(args, mode))
    ref = run_child(args, "mmap")
    ov, se = runs["overlap"], runs["serial"]
    rows = args.rows * args.window
    mb = 1e6
    print(f"model: {args.layers} x MatMul {args.hidden}x{args.hidden} (+bias, Relu), float32, "
          f"weights {total / mb:.1f} MB on disk ({layer / mb:.1f} MB per layer)")  # fmt: skip
    print(f"memory_budget {args.budget / mb:.1f} MB -> {ov[0]['stages']} stages, weight arena "
          f"{ov[0]['arena'] / mb:.1f} MB; {args.windows} windows x {args.window} batches x "
          f"{args.rows} rows ({rows} rows per stage load); BLAS threads {args.blas_threads}; page "
          f"cache dropped before each run (and each read's pages after it); medians of "
          f"{args.repeats} runs")  # fmt: skip
    print(f"  {'':16} {'wall':>9} {'compute':>9} {'transfer':>9} {'1st stage':>9} "
          f"{'wait':>9} {'read MB':>8}")  # fmt: skip
    for name, rs in (("with overlap", ov), ("without overlap", se)):
        print(f"  {name:16} {med(rs, 'wall') * 1e3:7.0f}ms {med(rs, 'compute') * 1e3:7.0f}ms "
              f"{med(rs, 'transfer') * 1e3:7.0f}ms {med(rs, 'first') * 1e3:7.0f}ms "
              f"{med(rs, 'wait') * 1e3:7.0f}ms {med(rs, 'bytes') / mb:8.0f}")  # fmt: skip
    w_ov, w_se = med(ov, "wall"), med(se, "wall")
    for label, rs in (("its own", ov), ("the run without overlap's", se)):
        c, t, first = med(rs, "compute"), med(rs, "transfer"), med(rs, "first")
        bound = 1.15 * max(c, t) + first
        ok = "OK" if w_ov <= bound else "NOT MET"
        print(f"bound ({label} figures): wall with overlap {w_ov * 1e3:.0f} ms <= 1.15 x "
              f"max(compute {c * 1e3:.0f}, transfer {t * 1e3:.0f}) + first stage "
              f"{first * 1e3:.0f} = {bound * 1e3:.0f} ms: {ok}")  # fmt: skip
    c, t = med(se, "compute"), med(se, "transfer")
    print(f"without overlap: wall {w_se * 1e3:.0f} ms vs compute + transfer {(c + t) * 1e3:.0f} "
          f"ms ({w_se / (c + t):.2f}x); overlap saves {(1 - w_ov / w_se) * 100:.0f}% of the wall "
          f"time")  # fmt: skip
    # Activations: every batch's output (kept by the caller) + per batch of a window its
    # input, the stage's live values (3 per batch) and the value crossing the stage boundary.
    n_batches = args.window * args.windows
    act = (n_batches + 5 * args.window) * args.rows * args.hidden * 4
    limit = args.budget + act
    for name, rs in (("with overlap", ov), ("without overlap", se)):
        peak, base = med(rs, "peak_kb") * 1024, med(rs, "base_kb") * 1024
        start = med(rs, "start_kb") * 1024
        grew = peak - start
        verdict = "within" if grew <= limit else "OVER"
        print(f"peak RSS {name}: {peak / mb:.0f} MB = {start / mb:.0f} MB at the run's start "
              f"(before load {base / mb:.0f} MB: interpreter, NumPy, onnx, BLAS; load adds "
              f"kernels, no weights) + {grew / mb:.1f} MB during the run, {verdict} budget "
              f"{args.budget / mb:.1f} MB + activations ~{act / mb:.1f} MB")  # fmt: skip
    print(f"reference, no budget (memory-mapped, cold): wall {ref['wall'] * 1e3:.0f} ms, peak RSS "
          f"{ref['peak_kb'] * 1024 / mb:.0f} MB "
          f"({(ref['peak_kb'] - ref['start_kb']) * 1024 / mb:.0f} MB during the run: the mapped "
          "weights)")  # fmt: skip
    sums = {round(r["checksum"], 3) for r in ov + se + [ref]}
    print(f"outputs agree across runs: {'yes' if len(sums) == 1 else 'NO: ' + str(sums)}")


if __name__ == "__main__":
    main()
