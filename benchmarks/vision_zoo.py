"""The vision zoo: torchvision and timm models exported by torch.onnx, tfrt_py against
onnxruntime, batch 1 and batch 8, medians over interleaved runs in one process.

    python benchmarks/vision_zoo.py [--models resnet18,...] [--set zoo|wide|all]
                                    [--batches 1,8] [--exporter torchscript|dynamo|both]
                                    [--seconds S] [--busy] [--threads N] [--png PATH]
                                    [--json PATH]

Every model is built with random weights from a fixed seed (``weights=None`` /
``pretrained=False``: nothing is downloaded), put in eval mode and exported to ONNX with
torch.onnx: the TorchScript exporter (``dynamo=False``, opset 17, a dynamic batch axis)
and, with ``--exporter dynamo|both``, the dynamo exporter (opset 18; failures are
reported and skipped). Files are cached under ``benchmarks/models/`` (gitignored), named
by model, exporter and the torch/torchvision/timm versions, so a rerun skips the export.
Exports run in a child process: torch (its OpenMP pool, its allocator) never shares the
measuring process with the runtimes it would disturb.

Before timing, tfrt_py's outputs are checked against onnxruntime's on one random input
(relative to the output's scale: random-weight networks reach logits of ~1e3). Timing is
``tfrt_py.bench.measure``: bursts of each runtime interleaved in shuffled order, each paired
with the adjacent onnxruntime burst; the table shows the median ms of each and the median
paired ratio, and a geomean of the ratios per batch size. ``--busy`` runs a busy-loop
neighbour (``python -c "while True: pass"``) pinned to one core for the whole run, killed
at the end, and labels the table. ``--threads N`` gives both runtimes N threads (BLAS
through threadpoolctl around the measurement, onnxruntime's intra-op pool); by default each
library picks its own (OpenBLAS and onnxruntime: one per core). onnxruntime's pool threads
do not spin between runs unless ``--ort-spinning`` (spinning threads keep the cores from the
interleaved tfrt_py bursts, which no single-runtime process sees). Torch, torchvision, timm
and onnxscript come from ``make bench-zoo``; the measuring process needs only tfrt_py and
onnxruntime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(HERE, "models")

#: name -> (library, constructor name, input side). Input is (batch, 3, side, side).
ZOO: dict[str, tuple[str, str, int]] = {
    "resnet18": ("torchvision", "resnet18", 224),
    "mobilenet_v2": ("torchvision", "mobilenet_v2", 224),
    "mobilenet_v3_small": ("torchvision", "mobilenet_v3_small", 224),
    "efficientnet_b0": ("torchvision", "efficientnet_b0", 224),
    "squeezenet1_1": ("torchvision", "squeezenet1_1", 224),
    "shufflenet_v2": ("torchvision", "shufflenet_v2_x1_0", 224),
    "regnet_y_400mf": ("torchvision", "regnet_y_400mf", 224),
    "vit_tiny": ("timm", "vit_tiny_patch16_224", 224),
    "deit_tiny": ("timm", "deit_tiny_patch16_224", 224),
    "convnext_atto": ("timm", "convnext_atto", 224),
    "mobilevit_xxs": ("timm", "mobilevit_xxs", 256),
}
#: Models outside the zoo the kernels were tuned on (``--set wide``): other families a
#: user brings -- grouped convs (RegNetX), pre-activation BatchNorm (DenseNet), Inception
#: branches and their pools (GoogLeNet), LeViT's BatchNorm1d and HardSwish, RepVGG's
#: identity branches, bottlenecks, NAS nets -- measured as the zoo is (issue 35: a target
#: met only on the zoo is not met).
WIDE: dict[str, tuple[str, str, int]] = {
    "resnet50": ("torchvision", "resnet50", 224),
    "densenet121": ("torchvision", "densenet121", 224),
    "mobilenet_v3_large": ("torchvision", "mobilenet_v3_large", 224),
    "mnasnet1_0": ("torchvision", "mnasnet1_0", 224),
    "googlenet": ("torchvision", "googlenet", 224),
    "regnet_x_400mf": ("torchvision", "regnet_x_400mf", 224),
    "efficientnet_lite0": ("timm", "efficientnet_lite0", 224),
    "ghostnet_100": ("timm", "ghostnet_100", 224),
    "lcnet_100": ("timm", "lcnet_100", 224),
    "resnet26d": ("timm", "resnet26d", 224),
    "edgenext_xx_small": ("timm", "edgenext_xx_small", 256),
    "levit_128s": ("timm", "levit_128s", 224),
    "repvgg_a0": ("timm", "repvgg_a0", 224),
    "efficientvit_b0": ("timm", "efficientvit_b0", 224),
}
#: Every model this file can export: the zoo's and the wide set's.
ALL = {**ZOO, **WIDE}
EXPORTERS = ("torchscript", "dynamo")
SEED = 0


# -- export (child process: imports torch) ---------------------------------------------------


def _build_torch_model(name: str) -> Any:
    import torch

    lib, ctor, _ = ALL[name]
    torch.manual_seed(SEED)
    if lib == "torchvision":
        import torchvision

        model = getattr(torchvision.models, ctor)(weights=None)
    else:
        import timm

        model = timm.create_model(ctor, pretrained=False)
    return model.eval()


def _export_one(name: str, exporter: str, path: str) -> None:
    """Export ``name`` with ``exporter`` to ``path`` (atomically). Runs in the child."""
    import torch

    torch.set_num_threads(1)
    model = _build_torch_model(name)
    side = ALL[name][2]
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(SEED))
    tmp = path + ".tmp"
    with torch.no_grad():
        if exporter == "torchscript":
            torch.onnx.export(
                model, (x,), tmp, dynamo=False, opset_version=17,
                input_names=["input"], output_names=["output"],
                dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
            )  # fmt: skip
        else:
            # an example batch of 2: torch.export specializes dims whose example size is 1
            batch = torch.export.Dim("batch", min=1, max=1024)
            x2 = torch.cat([x, x])
            prog = torch.onnx.export(
                model, (x2,), dynamo=True, opset_version=18,
                input_names=["input"], output_names=["output"],
                dynamic_shapes=({0: batch},), external_data=False,
            )  # fmt: skip
            if prog is None:
                raise RuntimeError(f"torch.onnx.export gave no program for {name}")
            prog.save(tmp, external_data=False)
    os.replace(tmp, path)


def _versions_tag() -> str:
    """A short tag of the exporting libraries' versions (asked of the child's packages)."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import importlib.metadata as m;"
         "print('-'.join(m.version(p).split('+')[0] for p in ('torch','torchvision','timm')))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def model_path(name: str, exporter: str, tag: str) -> str:
    return os.path.join(MODELS_DIR, f"{name}.{exporter}.{tag}.onnx")


def ensure_exported(names: list[str], exporters: list[str]) -> dict[tuple[str, str], str]:
    """Export what is not cached yet (one child process per file, so one failure costs only
    that file). Returns {(name, exporter): path or an error message}."""
    os.makedirs(MODELS_DIR, exist_ok=True)
    tag = _versions_tag()
    got: dict[tuple[str, str], str] = {}
    for name in names:
        for ex in exporters:
            path = model_path(name, ex, tag)
            fail = path + ".failed"
            if os.path.exists(path):
                got[(name, ex)] = path
                continue
            if os.path.exists(fail):
                with open(fail) as f:
                    lines = f.read().strip().splitlines() or ["failed"]
                got[(name, ex)] = "error: " + next(
                    (ln for ln in reversed(lines) if "Error" in ln), lines[-1]
                )
                continue
            print(f"exporting {name} ({ex}) ...", flush=True)
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, __file__, "--export-child", name, ex, path],
                capture_output=True, text=True,
            )  # fmt: skip
            if r.returncode == 0 and os.path.exists(path):
                got[(name, ex)] = path
                print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
            else:
                lines = r.stderr.strip().splitlines() or ["failed"]
                msg = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1])
                with open(fail, "w") as f:
                    f.write(r.stderr[-4000:] or "failed")
                got[(name, ex)] = "error: " + msg
                print(f"  failed: {msg}", flush=True)
    return got


# -- measuring (this process: tfrt_py and onnxruntime only) ----------------------------------


@dataclass
class Row:
    name: str
    exporter: str
    batch: int
    tfrt_ms: float
    ort_ms: float
    ratio: float
    max_err: float


@contextlib.contextmanager
def busy_neighbour(enabled: bool) -> Iterator[None]:
    """A ``while True: pass`` process pinned to the last core, killed on exit."""
    if not enabled:
        yield
        return
    cpu = max(os.sched_getaffinity(0))

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
    try:
        time.sleep(0.2)
        yield
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """BLAS limited to ``n`` threads for the block (0: unchanged). A benchmark setting
    only: tfrt_py's own thread ownership is ``load``'s business."""
    if not n:
        yield
        return
    import numpy  # noqa: F401 - threadpoolctl limits only the BLAS libraries already loaded
    import threadpoolctl

    with threadpoolctl.threadpool_limits(limits=n, user_api="blas"):
        yield


def _feeds(side: int, batch: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(SEED + batch)
    return {"input": rng.standard_normal((batch, 3, side, side)).astype(np.float32)}


def bench_one(
    path: str,
    name: str,
    exporter: str,
    batch: int,
    seconds: float,
    threads: int = 0,
    spinning: bool = False,
) -> Row:
    import numpy as np
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.bench import measure

    feeds = _feeds(ALL[name][2], batch)
    model = tfrt_py.load(path, threads=threads or None)  # --threads: tfrt_py's budget too
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if not spinning:
        # onnxruntime's pool threads spin after each run by default; in one process,
        # interleaved, they take the cores from the next burst (tfrt_py's intra-op threads).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    in_name = sess.get_inputs()[0].name
    feeds = {in_name: feeds["input"]}
    got = next(iter(model.run(feeds).values()))
    want = sess.run(None, feeds)[0]
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(got - want).max()) / scale
    if not err <= 1e-3:
        raise AssertionError(f"{name} ({exporter}, batch {batch}): max |tfrt - ort| / max|ort|"
                             f" = {err:.2e}")  # fmt: skip
    # Steady state: a cold process's first model would be timed on the cold start's NumPy
    # stand-ins (its first ~2-4 s), and under auto a native compile would run beside the
    # timing; warm both first (``warmup`` waits for the switch and the signature's compile).
    model.warmup([feeds])
    runners = {"tfrt_py": lambda: model.run(feeds), "onnxruntime": lambda: sess.run(None, feeds)}
    res = measure(runners, "onnxruntime", seconds, burst_s=0.05)
    t, o = res["tfrt_py"], res["onnxruntime"]
    return Row(name, exporter, batch, t.median_us / 1e3, o.median_us / 1e3, t.ratio, err)


def kernel_path() -> str:
    """tfrt_py's kernel path in this process (``TFRT_PY_ISA``; the packed gemm's tile and
    numba's vector width follow it), and why."""
    with contextlib.suppress(Exception):
        from tfrt_py.kernels.lib import gemm_packed

        p, why = gemm_packed.path()
        return f"{p} ({why})"
    return "?"


def environment() -> str:
    """One line on what the figures depend on: versions, BLAS kernels and threads, load."""
    import numpy as np
    import onnxruntime as ort

    from tfrt_py.kernels.lib.jit import jit_enabled

    blas = "?"
    with contextlib.suppress(Exception):
        import threadpoolctl

        info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if info:
            i = info[0]
            blas = f"{i.get('internal_api')} {i.get('architecture')} x{i.get('num_threads')}"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (
        f"tfrt_py kernel path {kernel_path()}, numpy {np.__version__} ({blas}), onnxruntime "
        f"{ort.__version__}, numba kernels {'on' if jit_enabled() else 'off'}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )


def pick_models(ap: argparse.ArgumentParser, models: str, zoo: Any) -> list[str]:
    """The comma-separated ``models`` (``ap.error`` for one not in ``zoo``)."""
    names = [m for m in models.split(",") if m]
    unknown = set(names) - set(zoo)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; the zoo has {', '.join(zoo)}")
    return names


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(rows: list[Row], label: str) -> str:
    lines = [
        f"### {label}",
        "",
        "| model | exporter | batch | tfrt_py auto ms | onnxruntime ms | ratio | max rel err |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.exporter} | {r.batch} | {r.tfrt_ms:.2f} | {r.ort_ms:.2f} "
            f"| {r.ratio:.2f} | {r.max_err:.1e} |"
        )
    for b in sorted({r.batch for r in rows}):
        for ex in sorted({r.exporter for r in rows}):
            sel = [r.ratio for r in rows if r.batch == b and r.exporter == ex]
            if sel:
                lines.append(
                    f"| **geomean** | {ex} | {b} | | | **{geomean(sel):.2f}** "
                    f"(max {max(sel):.2f}) | |"
                )
    return "\n".join(lines)


def plot_rows(rows: list[Row], path: str, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r.batch for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 0.6 + 0.4 * len(rows)))
    axes = axes if len(batches) > 1 else [axes]
    for ax, b in zip(axes, batches):
        sel = [r for r in rows if r.batch == b]
        labels = [f"{r.name} ({r.exporter[:2]})" for r in sel]
        ax.barh(labels, [r.ratio for r in sel], color="#4c72b0")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("tfrt_py / onnxruntime (median paired ratio)")
        ax.set_title(f"batch {b}")
        ax.invert_yaxis()
    fig.suptitle(label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="", help="comma-separated (default: the --set's)")
    ap.add_argument(
        "--set",
        default="zoo",
        choices=("zoo", "wide", "all"),
        help="zoo: the models tuned on; wide: other families (WIDE); all: both",
    )
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--exporter", default="torchscript", choices=(*EXPORTERS, "both"))
    ap.add_argument("--seconds", type=float, default=3.0, help="timing per model and batch")
    ap.add_argument("--busy", action="store_true", help="a busy-loop neighbour on one core")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for both runtimes (onnxruntime intra-op, BLAS via threadpoolctl for "
        "the measurement only); 0: each library's default",
    )
    ap.add_argument("--ort-spinning", action="store_true",
                    help="leave onnxruntime's thread spinning on (its default)")  # fmt: skip
    ap.add_argument("--png", default="", help="write a plot of the ratios here")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--export-only", action="store_true", help="export (cache) and stop")
    ap.add_argument("--export-child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export_child:
        _export_one(*a.export_child)
        return
    chosen = {"zoo": ZOO, "wide": WIDE, "all": ALL}[a.set]
    names = pick_models(ap, a.models or ",".join(chosen), ALL)
    exporters = list(EXPORTERS) if a.exporter == "both" else [a.exporter]
    paths = ensure_exported(names, exporters)
    failed = {k: v for k, v in paths.items() if v.startswith("error:")}
    if a.export_only:
        for (name, ex), msg in sorted(failed.items()):
            print(f"export failed: {name} ({ex}): {msg}")
        return
    batches = [int(b) for b in a.batches.split(",")]
    label = f"vision zoo ({a.set} set), " + (
        "with a busy-loop neighbour on one core" if a.busy else "quiet"
    )
    rows: list[Row] = []
    if a.threads:
        label += f", {a.threads} thread(s) each"
    label += ", onnxruntime spinning " + ("on" if a.ort_spinning else "off")
    label += f", tfrt_py path {kernel_path()}"
    with busy_neighbour(a.busy), blas_threads(a.threads):
        for name in names:
            for ex in exporters:
                path = paths[(name, ex)]
                if (name, ex) in failed:
                    continue
                for b in batches:
                    try:
                        row = bench_one(path, name, ex, b, a.seconds, a.threads, a.ort_spinning)
                    except Exception as e:  # noqa: BLE001 - report and go on with the zoo
                        print(f"{name} ({ex}, batch {b}): {type(e).__name__}: {e}", flush=True)
                        continue
                    rows.append(row)
                    print(
                        f"{name:20s} {ex:11s} b{b}: tfrt_py {row.tfrt_ms:7.2f} ms, "
                        f"onnxruntime {row.ort_ms:7.2f} ms, ratio {row.ratio:.2f}",
                        flush=True,
                    )
    print("\n" + table(rows, label) + "\n\n" + environment())
    for (name, ex), msg in sorted(failed.items()):
        print(f"\nexport failed: {name} ({ex}): {msg}")
    if a.png:
        plot_rows(rows, a.png, label)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
