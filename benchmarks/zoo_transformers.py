"""The transformer zoo: tfrt_py against onnxruntime on transformers-library models.

    python benchmarks/zoo_transformers.py [--models bert,gpt2,...] [--shapes 1x16,8x64]
        [--seconds S] [--out DIR] [--rebuild] [--no-profile]
    python benchmarks/zoo_transformers.py --write-test-files tests/data/transformers

Builds every variant of ``transformer_zoo.VARIANTS`` (BERT, DistilBERT, GPT-2, T5 encoder at
hidden 128, 2 layers, 4 heads, vocab 1000; TorchScript and dynamo exports, and
onnxruntime-optimized ones with com.microsoft ops) from fixed seeds, caching the files in
``benchmarks/models/transformers`` (gitignored; ``--rebuild`` re-exports). An export that
fails is reported with its reason. For every model, onnxruntime's outputs at each shape are
saved beside it (``<model>.ref.npz``), and tfrt_py (executors auto, sync and async, each
loaded once and called at every shape in turn, so later calls change batch and sequence)
must agree with them before anything is timed (a native tier's compiled answer too: each
signature is awaited). Then, per model and batch x sequence, after ``model.warmup`` of
that signature (the native tier compiles it and measures it; compile time is not timed),
the median per-call µs of tfrt_py auto and onnxruntime (``tfrt_py.bench.measure``: short
interleaved bursts, the ratio is the median of per-round ratios), printed as a table and
written to ``--out`` (markdown, JSON, PNG). Last, a per-op profile of the model with the
worst ratio (``model.profile``), for the engineers working on fusions and native lowering.

``--write-test-files DIR`` makes the small ("test") size of every variant instead, with
``<model>.npz`` (feeds and onnxruntime outputs at two shapes) and ``manifest.json`` (what
was made, what failed and why, the versions used): the files
``tests/models/test_transformer_zoo.py`` checks, so ``make test`` needs no torch.

Threads: one per runtime by default (``--threads``): NumPy's BLAS and onnxruntime's intra-op
pool get the same count, and onnxruntime does not spin between calls. On a small shared
machine, multi-threaded BLAS and a spinning onnxruntime pool oversubscribe the cores and
the figures swing by 10-100x; with one thread each they are stable to a few percent. The
models are exported in a child process, so torch (and its OpenMP pool) is never loaded in
the timing process.

Needs torch, transformers and onnxscript (``make bench-zoo-transformers`` installs them).
The machine's other load still makes the figures noisy; ratios are the figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _threads_arg(argv: list[str]) -> str:
    """``--threads N`` read before NumPy is imported (BLAS sizes its pool at import)."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


THREADS = _threads_arg(sys.argv[1:])
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = THREADS

# The thread variables must be set before NumPy's BLAS loads: these imports come after.
import numpy as np  # noqa: E402
import transformer_zoo as zoo  # noqa: E402
from peers import ort_session  # noqa: E402

import tfrt_py  # noqa: E402
from tfrt_py.bench import measure  # noqa: E402

SHAPES = ((1, 16), (1, 64), (8, 16), (8, 64))
TEST_SHAPES = ((2, 16), (1, 7))
EXECUTORS = ("auto", "sync", "async")
RTOL, ATOL = 1e-4, 1e-4
MODELS_DIR = os.path.join(HERE, "models", "transformers")


def reference(path: str, shapes: tuple[tuple[int, int], ...], vocab: int) -> dict[str, Any]:
    """Feeds and onnxruntime's output per shape, keyed ``<b>x<s>/<name>``."""
    sess = ort_session(path)
    ref: dict[str, Any] = {}
    for b, s in shapes:
        f = zoo.feeds(b, s, vocab)
        (out,) = sess.run(["last_hidden_state"], f)
        for k, v in {**f, "last_hidden_state": out}.items():
            ref[f"{b}x{s}/{k}"] = v
    return ref


def check(path: str, ref: dict[str, Any], shapes: tuple[tuple[int, int], ...]) -> float:
    """Every executor, loaded once, called at every shape in turn (then the first again),
    agrees with the reference; returns the largest error relative to the output's max."""
    worst = 0.0
    order = [*shapes, shapes[0]]
    for ex in EXECUTORS:
        model = tfrt_py.load(path, executor=ex)
        for b, s in order:
            key = f"{b}x{s}/"
            feeds = {n: ref[key + n] for n in ("input_ids", "attention_mask")}
            if model.native is not None:  # the native tier's answer too, once compiled
                model.warmup([feeds])
            got = model.run(feeds)
            want = ref[key + "last_hidden_state"]
            y = got["last_hidden_state"]
            np.testing.assert_allclose(
                y, want, rtol=RTOL, atol=ATOL, err_msg=f"{path} {ex} {b}x{s}"
            )
            worst = max(worst, float(np.abs(y - want).max() / max(np.abs(want).max(), 1e-30)))
    return worst


def _parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(b), int(s)) for b, s in (p.split("x") for p in text.split(",")))


def _make_all(
    names: list[str], size: zoo.Size, directory: str, rebuild: bool
) -> tuple[dict[str, str], dict[str, str]]:
    made: dict[str, str] = {}
    failed: dict[str, str] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            made[name] = zoo.make(zoo.variant(name), size, directory, rebuild)
            print(f"  {name}: {made[name]} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except zoo.ExportFailed as e:
            failed[name] = str(e)
            print(f"  {name}: export FAILED: {e}", flush=True)
    return made, failed


def _make_in_child(names: list[str], directory: str, rebuild: bool) -> dict[str, str]:
    """Export the missing models (all with ``rebuild``) in a child process, so torch is never
    imported here; returns the failures it recorded (name -> why)."""
    missing = [n for n in names if rebuild or not os.path.exists(_path(directory, n))]
    failed_path = os.path.join(directory, "failed.json")
    if missing:
        cmd = [sys.executable, os.path.abspath(__file__), "--make-only", "--dir", directory,
               "--models", ",".join(missing)] + (["--rebuild"] if rebuild else [])  # fmt: skip
        subprocess.run(cmd, check=True)
    failed: dict[str, str] = {}
    if os.path.exists(failed_path):
        with open(failed_path, encoding="utf-8") as fh:
            failed = {k: v for k, v in json.load(fh).items() if k in names}
    return {n: why for n, why in failed.items() if not os.path.exists(_path(directory, n))}


def _path(directory: str, name: str) -> str:
    return os.path.join(directory, f"{name}.onnx")


def make_only(names: list[str], directory: str, rebuild: bool) -> None:
    """The child of ``_make_in_child``: export, record failures in ``failed.json``."""
    _, failed = _make_all(names, zoo.SIZES["bench"], directory, rebuild)
    failed_path = os.path.join(directory, "failed.json")
    known: dict[str, str] = {}
    if os.path.exists(failed_path):
        with open(failed_path, encoding="utf-8") as fh:
            known = json.load(fh)
    known = {k: v for k, v in known.items() if k not in names} | failed
    with open(failed_path, "w", encoding="utf-8") as fh:
        json.dump(known, fh, indent=1)


def write_test_files(directory: str, names: list[str]) -> None:
    """The small models, their reference outputs and a manifest, for the tests."""
    import onnx
    import onnxruntime
    import torch
    import transformers

    size = zoo.SIZES["test"]
    print(f"writing test files to {directory}")
    made, failed = _make_all(names, size, directory, rebuild=True)
    models: dict[str, Any] = {}
    for name, path in made.items():
        ref = reference(path, TEST_SHAPES, size.vocab)
        np.savez_compressed(os.path.join(directory, f"{name}.npz"), **ref)
        err = check(path, ref, TEST_SHAPES)
        proto = onnx.load(path)
        ops = sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in proto.graph.node})
        v = zoo.variant(name)
        models[name] = {
            "arch": v.arch,
            "exporter": v.exporter,
            "optimize": v.optimize,
            "opset": {i.domain or "ai.onnx": i.version for i in proto.opset_import},
            "contrib_ops": [o for o in ops if not o.startswith("ai.onnx:")],
            "max_rel_err": err,
        }
        print(f"  {name}: agrees (max rel err {err:.1e})")
    manifest = {
        "size": size.__dict__,
        "shapes": [list(s) for s in TEST_SHAPES],
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
            "onnx": onnx.__version__,
        },
        "models": models,
        "failed": failed,
    }
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def bench(a: argparse.Namespace, names: list[str]) -> None:
    size = zoo.SIZES["bench"]
    shapes = _parse_shapes(a.shapes)
    threads = int(THREADS)
    print(f"models (hidden {size.hidden}, {size.layers} layers, {size.heads} heads) in {a.dir}; "
          f"{threads} thread(s) per runtime")  # fmt: skip
    failed = _make_in_child(names, a.dir, a.rebuild)
    made = {n: _path(a.dir, n) for n in names if os.path.exists(_path(a.dir, n))}
    rows: list[dict[str, Any]] = []
    agree: dict[str, float] = {}
    for name, path in made.items():
        ref = reference(path, shapes, size.vocab)
        np.savez_compressed(os.path.join(a.dir, f"{name}.ref.npz"), **ref)
        agree[name] = check(path, ref, shapes)
        print(f"  {name}: auto, sync, async agree with onnxruntime (max rel err "
              f"{agree[name]:.1e})", flush=True)  # fmt: skip
        model = tfrt_py.load(path, threads=threads)  # the same thread count as onnxruntime
        if model.native is not None:
            model.native.wait()
        sess = ort_session(path, threads)
        for b, s in shapes:
            f = zoo.feeds(b, s, size.vocab)
            if model.native is not None:  # auto compiles a signature once it is hot: warm it
                model.warmup([f])
            runners = {
                "tfrt_py auto": lambda f=f, m=model: m.run(f),
                "onnxruntime": lambda f=f, o=sess: o.run(None, f),
            }
            res = measure(runners, "onnxruntime", a.seconds)
            rows.append({
                "model": name, "batch": b, "seq": s, "executor": model.executor,
                "tfrt_us": res["tfrt_py auto"].median_us,
                "ort_us": res["onnxruntime"].median_us,
                "ratio": res["tfrt_py auto"].ratio,
            })  # fmt: skip
            r = rows[-1]
            print(f"  {name} {b}x{s}: tfrt_py {r['tfrt_us']:.0f} µs, onnxruntime "
                  f"{r['ort_us']:.0f} µs, ratio {r['ratio']:.2f}", flush=True)  # fmt: skip
    table = f"{threads} thread(s) per runtime; medians of interleaved bursts\n\n"
    table += markdown(rows, failed, agree)
    print("\n" + table)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "zoo_transformers.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    with open(os.path.join(a.out, "zoo_transformers.json"), "w", encoding="utf-8") as fh:
        meta = {"threads": threads, "size": size.__dict__}
        json.dump({**meta, "rows": rows, "failed": failed, "max_rel_err": agree}, fh, indent=1)
    try:
        plot(rows, os.path.join(a.out, "zoo_transformers.png"))
    except ImportError:
        print("(matplotlib is not installed: no PNG)")
    if rows and not a.no_profile:
        worst = max(rows, key=lambda r: r["ratio"])
        print(f"\nper-op profile of the worst ratio: {worst['model']} at "
              f"{worst['batch']}x{worst['seq']} ({worst['ratio']:.2f} x onnxruntime)")  # fmt: skip
        model = tfrt_py.load(made[worst["model"]])
        report = model.profile(zoo.feeds(worst["batch"], worst["seq"], size.vocab), repeat=30)
        text = report.table(top=25)
        print(text)
        with open(os.path.join(a.out, "zoo_transformers_profile.txt"), "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


def markdown(rows: list[dict[str, Any]], failed: dict[str, str], agree: dict[str, float]) -> str:
    lines = [
        "| model | batch x seq | tfrt_py auto µs | onnxruntime µs | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} x {r['seq']} | {r['tfrt_us']:,.0f} "
            f"| {r['ort_us']:,.0f} | {r['ratio']:.2f} |"
        )
    if agree:
        lines.append("")
        lines.append("Agreement with onnxruntime (auto, sync, async; every shape, in turn): "
                     + ", ".join(f"{k} {v:.0e}" for k, v in agree.items()))  # fmt: skip
    for name, why in failed.items():
        lines.append(f"\nNot made: {name}: {why}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Grouped bars: tfrt_py auto / onnxruntime per model, one bar per shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    shapes = list(dict.fromkeys((r["batch"], r["seq"]) for r in rows))
    width = 0.8 / max(len(shapes), 1)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(models), 4.2))
    for k, (b, s) in enumerate(shapes):
        xs, ys = [], []
        for i, m in enumerate(models):
            for r in rows:
                if r["model"] == m and (r["batch"], r["seq"]) == (b, s):
                    xs.append(i + (k - (len(shapes) - 1) / 2) * width)
                    ys.append(r["ratio"])
        ax.bar(xs, ys, width, label=f"{b} x {s}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, rotation=35, ha="right")
    ax.set_ylabel("tfrt_py auto / onnxruntime (median paired ratio)")
    ax.set_title("transformer zoo: per-call latency ratio (lower is better)")
    ax.legend(title="batch x seq", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(v.name for v in zoo.VARIANTS))
    p.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES))
    p.add_argument("--seconds", type=float, default=1.5, help="timing per model and shape")
    p.add_argument("--out", default=os.path.join(HERE, "results", "zoo_transformers"))
    p.add_argument("--dir", default=MODELS_DIR, help="where the exported models are cached")
    p.add_argument("--rebuild", action="store_true", help="re-export cached models")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--threads", default="1", help="BLAS and onnxruntime intra-op threads")
    p.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write-test-files", metavar="DIR", help="make the tests' small models")
    a = p.parse_args()
    names = [n for n in a.models.split(",") if n]
    for n in names:
        zoo.variant(n)  # unknown names fail before any export
    if a.write_test_files:
        write_test_files(a.write_test_files, names)
    elif a.make_only:
        make_only(names, a.dir, a.rebuild)
    else:
        bench(a, names)


if __name__ == "__main__":
    main()
