"""The detection zoo: torchvision detectors exported by torch.onnx with their whole
post-processing (score thresholds, per-class TopK, NonZero, batched NonMaxSuppression,
RoiAlign and its ScatterElements), tfrt_py against onnxruntime in one process, interleaved.

    python benchmarks/detection.py [--models ssdlite320,...] [--seconds S] [--busy]
                                   [--threads N] [--executor auto|sync|async]
                                   [--sizes 320x320,480x640,...] [--json PATH]

Each detector is built with random weights from a fixed seed (``weights=None``,
``weights_backbone=None``: nothing is downloaded), in eval mode, and exported with the
TorchScript exporter (opset 17) on one 3x320x320 image, height and width dynamic (a
detector's input is a list of images: the graph takes one CHW image of any size and resizes
it itself: SSDLite to 320x320, the others keeping the aspect ratio), every score threshold at
0.001 (SSD's default). Random weights make every class score near 1/classes (SSDLite) or
near the classifier's prior: the thresholds then keep nearly every candidate, and SSDLite's
batched NMS sees 27,000 boxes -- the post-processing's worst case, which trained weights
rarely reach. Files are cached under ``benchmarks/models/`` by the torch/torchvision versions;
exports run in a child process (torch never shares the measuring process).

The inputs are uniform [0, 1) images from a fixed seed, one per ``--sizes`` entry; with
several, each call of either runtime takes the next size (a new shape every call). Outputs
are checked against onnxruntime first on each (``_check``: the same detections, boxes to
1e-3 of the image size), which also times tfrt_py's first call per size (its plans:
"slowest first call"). Timing is
``tfrt_py.bench.measure``, as ``vision_zoo.py`` (whose helpers this uses): bursts of each
runtime interleaved, the median paired ratio; onnxruntime's threads do not spin between
runs. Torch and torchvision come from ``make bench-zoo``.
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
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.vision_zoo import (  # noqa: E402 - after the path above
    MODELS_DIR,
    blas_threads,
    busy_neighbour,
    environment,
    geomean,
    kernel_path,
    pick_models,
)

SIDE = 320
SEED = 0
OUTPUTS = ("dets0", "dets1", "dets2")  # boxes, labels, scores in a detector's own order
#: name -> (torchvision.models.detection constructor, its keyword arguments)
#: The score thresholds are torchvision's SSD default (0.001) for all: with their own
#: (0.05) random weights leave the others nothing to suppress.
DETECTORS: dict[str, tuple[str, dict[str, float]]] = {
    "ssdlite320": ("ssdlite320_mobilenet_v3_large", {}),
    "fasterrcnn_mobile320": ("fasterrcnn_mobilenet_v3_large_320_fpn", {"box_score_thresh": 1e-3}),
    "retinanet_r50_320": (
        "retinanet_resnet50_fpn_v2",
        {"min_size": SIDE, "max_size": SIDE, "score_thresh": 1e-3},
    ),
    "fcos_r50_320": (
        "fcos_resnet50_fpn",
        {"min_size": SIDE, "max_size": SIDE, "score_thresh": 1e-3},
    ),
}


def _export_one(name: str, path: str) -> None:
    """Export ``name`` to ``path`` (atomically). Runs in the child: imports torch."""
    import torch
    import torchvision

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    ctor, kw = DETECTORS[name]
    model = getattr(torchvision.models.detection, ctor)(
        weights=None, weights_backbone=None, **kw
    ).eval()
    x = torch.rand(3, SIDE, SIDE, generator=torch.Generator().manual_seed(SEED))
    tmp = path + ".tmp"
    with torch.no_grad():
        torch.onnx.export(model, ([x],), tmp, dynamo=False, opset_version=17,
                          input_names=["images"], output_names=list(OUTPUTS),
                          dynamic_axes={"images": {1: "height", 2: "width"}})  # fmt: skip
    os.replace(tmp, path)


def ensure_exported(names: list[str]) -> dict[str, str]:
    """{name: path or "error: ..."}, exporting what is not cached (a child per file)."""
    os.makedirs(MODELS_DIR, exist_ok=True)
    tag = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print('-'.join("
         "m.version(p).split('+')[0] for p in ('torch', 'torchvision')))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    got: dict[str, str] = {}
    for name in names:
        path = os.path.join(MODELS_DIR, f"{name}.dynhw.{tag}.onnx")
        if not os.path.exists(path):
            print(f"exporting {name} ...", flush=True)
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, __file__, "--export-child", name, path],
                               capture_output=True, text=True)  # fmt: skip
            if r.returncode or not os.path.exists(path):
                lines = r.stderr.strip().splitlines() or ["failed"]
                got[name] = "error: " + lines[-1]
                continue
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
        got[name] = path
    return got


def _detections(outs: list) -> tuple[Any, Any, Any]:
    """(boxes (N, 4), scores (N,), labels (N,)) by shape and dtype: torchvision writes them
    in a different order per detector."""
    boxes = next(o for o in outs if o.ndim == 2)
    labels = next(o for o in outs if o.ndim == 1 and o.dtype.kind in "iu")
    scores = next(o for o in outs if o.ndim == 1 and o.dtype.kind == "f")
    return boxes, scores, labels


def _check(got: list, want: list) -> str:
    """ "" when tfrt_py's detections are onnxruntime's, else what differs. Random weights put
    many scores within float32 rounding of each other, so two runtimes may order them (and
    cut the last ones) differently: the sorted scores must agree to 1e-4, and 98% of the
    detections must have one of the same label whose box is within 1e-3 of the image size."""
    import numpy as np

    (gb, gs, gl), (wb, ws, wl) = _detections(got), _detections(want)
    if gb.shape != wb.shape:
        return f"{len(gb)} detections against {len(wb)}"
    if not len(gb):
        return ""
    if float(np.abs(np.sort(gs) - np.sort(ws)).max()) > 1e-4:
        return "scores differ"
    near = np.abs(gb[:, None, :].astype(np.float64) - wb[None, :, :]).max(axis=2) <= 1e-3 * SIDE
    matched = (near & (gl[:, None] == wl[None, :])).any(axis=1).mean()
    return "" if matched >= 0.98 else f"{100 * (1 - matched):.1f}% of the detections differ"


def _cycle(run: Any, feeds: list[dict]) -> Any:
    """A runner that calls ``run`` on the next of ``feeds`` each time (a new shape a call)."""
    state = [0]

    def step() -> Any:
        state[0] = (state[0] + 1) % len(feeds)
        return run(feeds[state[0]])

    return step


def bench_one(
    path: str, seconds: float, threads: int, executor: str, sizes: list[tuple[int, int]]
) -> dict:
    import numpy as np
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.bench import measure

    rng = np.random.default_rng(SEED)
    all_feeds = [{"images": rng.random((3, h, w), dtype=np.float32)} for h, w in sizes]
    t0 = time.perf_counter()
    model = tfrt_py.load(path, executor=executor, threads=threads or None)
    load_s = time.perf_counter() - t0
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    first_ms = []
    for feeds in all_feeds:
        want = sess.run(None, feeds)
        t1 = time.perf_counter()
        got = list(model.run(feeds).values())
        first_ms.append(1e3 * (time.perf_counter() - t1))
        bad = _check(got, want)
        if bad:
            raise AssertionError(bad)
    model.warmup(all_feeds)
    runners = {"tfrt_py": _cycle(model.run, all_feeds),
               "onnxruntime": _cycle(lambda f: sess.run(None, f), all_feeds)}  # fmt: skip
    res = measure(runners, "onnxruntime", seconds, burst_s=0.2)
    t, o = res["tfrt_py"], res["onnxruntime"]
    kind = model.describe().split("executor: ", 1)[-1].split(" ", 1)[0]
    return {"tfrt_ms": t.median_us / 1e3, "ort_ms": o.median_us / 1e3, "ratio": t.ratio,
            "detections": int(want[0].shape[0]), "executor": kind, "load_s": load_s,
            "first_ms": max(first_ms)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DETECTORS))
    ap.add_argument("--seconds", type=float, default=4.0, help="timing per model")
    ap.add_argument("--busy", action="store_true", help="a busy-loop neighbour on one core")
    ap.add_argument("--threads", type=int, default=0, help="threads for both runtimes (0: each "
                    "library's default)")  # fmt: skip
    ap.add_argument("--executor", default="auto", choices=("auto", "sync", "async"))
    ap.add_argument("--sizes", default=f"{SIDE}x{SIDE}", help="image sizes HxW, comma "
                    "separated; several: each call takes the next")  # fmt: skip
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--export-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.export_child:
        _export_one(*a.export_child)
        return
    names = pick_models(ap, a.models, DETECTORS)
    sizes = [(int(h), int(w)) for h, w in (v.split("x") for v in a.sizes.split(","))]
    paths = ensure_exported(names)
    rows: dict[str, dict] = {}
    with busy_neighbour(a.busy), blas_threads(a.threads):
        for name in names:
            if paths[name].startswith("error:"):
                print(f"{name}: export failed: {paths[name]}", flush=True)
                continue
            try:
                rows[name] = r = bench_one(paths[name], a.seconds, a.threads, a.executor, sizes)
            except Exception as e:  # noqa: BLE001 - report and go on with the zoo
                print(f"{name}: {type(e).__name__}: {e}", flush=True)
                continue
            print(f"{name:22s} tfrt_py ({r['executor']}) {r['tfrt_ms']:8.2f} ms, onnxruntime "
                  f"{r['ort_ms']:8.2f} ms, ratio {r['ratio']:.2f}", flush=True)  # fmt: skip
    where = "with a busy-loop neighbour on one core" if a.busy else "quiet"
    label = (f"detection zoo, {where}, executor {a.executor}, images {a.sizes}, "
             f"tfrt_py path {kernel_path()}")  # fmt: skip
    print(f"\n### {label}\n\n| model | detections | tfrt_py ms (executor) | onnxruntime ms "
          "| ratio | slowest first call ms |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for name, r in rows.items():
        print(f"| {name} | {r['detections']} | {r['tfrt_ms']:.2f} ({r['executor']}) "
              f"| {r['ort_ms']:.2f} | {r['ratio']:.2f} | {r['first_ms']:.0f} |")  # fmt: skip
    if rows:
        ratios = [r["ratio"] for r in rows.values()]
        print(f"| **geomean** | | | | **{geomean(ratios):.2f}** (max {max(ratios):.2f}) | |")
    print("\n" + environment())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
