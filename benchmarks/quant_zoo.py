"""The quantized zoo: onnxruntime.quantization's int8 / 4-bit models, tfrt_py against
onnxruntime on the same file and against tfrt_py on the fp32 source, interleaved in one
process per model.

    python benchmarks/quant_zoo.py [--models resnet18-qdq,...] [--batches 1,8]
        [--rounds N] [--seconds S] [--seq 64] [--past 64] [--quick] [--json PATH]
        [--model-timeout S] [--compile-timeout S] [--ort-spinning] [--rebuild]

The models (``quant_build.ZOO``: ResNet-18, MobileNetV2 and EfficientNet-B0 by
``quantize_static`` QDQ / QOperator per channel; BERT and DistilBERT 4 layers/256 by
``quantize_dynamic``, BERT also after onnxruntime's transformer optimizer; the Llama decoder
of ``generate.py`` by ``MatMulNBitsQuantizer`` 4 bits) are built from fixed seeds with
random weights (nothing downloaded) in child processes and cached under
``benchmarks/models/quant/`` (``quant_build.py``).

Each model is measured in a process of its own (past ``--model-timeout`` a watchdog reports
where it was stuck and the zoo goes on). For each batch, three runners: tfrt_py on the
quantized file, onnxruntime on it, and tfrt_py on its fp32 source. Each round calls each
once, the order rotating from round to round, for ``--rounds`` rounds or until
``--seconds`` (at least 3 rounds). Inputs: vision a batch of random images; text ``--seq``
tokens a sequence, the first row right-padded by a quarter; the decoder one decode step
(batch 1, one new token) over a past of ``--past`` tokens (the cache from a fp32 prefill,
the same feeds for every runner). Before timing,
each runner is called twice (so a new signature has started its compiles) and then tfrt_py's
``wait_compiled`` (also right after ``load``): background compiles never run during timing.
Reported: tfrt_py int8 median / mean / p99 µs, onnxruntime int8 median µs, their ratio, and
tfrt_py int8 / fp32; whether every output of tfrt_py's int8 run is within 2e-2 of
onnxruntime's, relative to the output's scale (max |diff| / max |reference|); the geomean
ratio per batch.

Threads: onnxruntime ``intra_op_num_threads = os.cpu_count()`` (its default), spinning off
between calls (``--ort-spinning`` to leave it on: spinning threads take the cores from the
interleaved tfrt_py calls); tfrt_py its own default. Run with ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE`` unset (``make bench-zoo-quant`` does).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import quant_build  # noqa: E402
from peers import cpu_model_and_flags  # noqa: E402

TOLERANCE = 2e-2
RUNNERS = ("tfrt_py int8", "onnxruntime int8", "tfrt_py fp32")
RESULT = "quant_zoo result: "


def host_isa() -> str:
    """The CPU's name and its int8-relevant ISA from /proc/cpuinfo."""
    model, flags = cpu_model_and_flags()
    if "avx512f" in flags:
        isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512 (no VNNI)"
    elif "avx2" in flags:
        isa = "AVX2 + AVX-VNNI" if "avx_vnni" in flags else "AVX2"
    else:
        isa = "no AVX2"
    return f"{model}, {isa}, {len(os.sched_getaffinity(0))} CPUs usable"


# -- feeds ---------------------------------------------------------------------------------------


def vision_feeds(sess: Any, batch: int) -> dict[str, Any]:
    import numpy as np

    inp = sess.get_inputs()[0]
    side = [d if isinstance(d, int) else 224 for d in inp.shape[2:]]
    rng = np.random.default_rng(1000 + batch)
    return {inp.name: rng.standard_normal((batch, 3, *side)).astype(np.float32)}


def text_feeds(sess: Any, batch: int, seq: int) -> dict[str, Any]:
    from transformer_zoo import feeds

    got = feeds(batch, seq, quant_build.text_size().vocab)
    return {i.name: got[i.name] for i in sess.get_inputs()}


def decoder_feeds(fp32_path: str, past: int) -> dict[str, Any]:
    """One decode step's feeds at batch 1: the cache of a ``past``-token prompt (a fp32
    onnxruntime prefill), one new token."""
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(fp32_path, providers=["CPUExecutionProvider"])
    ins = {i.name: i for i in sess.get_inputs()}
    rng = np.random.default_rng(7)
    pre: dict[str, Any] = {"input_ids": rng.integers(0, 1000, (1, past)).astype(np.int64)}
    for name, i in ins.items():
        if name.startswith("past_key_values"):
            pre[name] = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
    if "attention_mask" in ins:
        pre["attention_mask"] = np.ones((1, past), np.int64)
    if "position_ids" in ins:
        pre["position_ids"] = np.arange(past, dtype=np.int64)[None]
    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, pre)))
    step: dict[str, Any] = {
        "input_ids": np.array([[int(outs["logits"][0, -1].argmax())]], np.int64)
    }
    for name in ins:
        if name.startswith("past_key_values"):
            step[name] = outs[name.replace("past_key_values", "present")]
    if "attention_mask" in ins:
        step["attention_mask"] = np.ones((1, past + 1), np.int64)
    if "position_ids" in ins:
        step["position_ids"] = np.array([[past]], np.int64)
    return step


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    recipe: str
    batch: str
    rounds: int = 0
    tfrt_int8: dict[str, float] = field(default_factory=dict)  # median, mean, p99 (µs)
    ort_int8_us: float = float("nan")
    tfrt_fp32_us: float = float("nan")
    ratio: float = float("nan")  # tfrt_py int8 / onnxruntime int8 (medians)
    int8_vs_fp32: float = float("nan")  # tfrt_py int8 / tfrt_py fp32 (medians)
    max_rel_err: float = float("nan")
    compiled: bool = True
    error: str = ""


def stats(xs: list[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(xs) * 1e6
    return {"median": float(np.median(a)), "mean": float(a.mean()),
            "p99": float(np.percentile(a, 99))}  # fmt: skip


def max_rel_err(got: dict[str, Any], want: dict[str, Any]) -> float:
    """The worst output's max |got - want| / max |want|."""
    import numpy as np

    worst = 0.0
    for name, w in want.items():
        w = np.asarray(w, np.float64)
        g = np.asarray(got[name], np.float64)
        if g.shape != w.shape:
            return float("inf")
        scale = float(np.abs(w).max()) if w.size else 0.0
        worst = max(worst, float(np.abs(g - w).max()) / (scale or 1.0) if w.size else 0.0)
    return worst


def interleaved(runners: dict[str, Callable[[], Any]], rounds: int, seconds: float
                ) -> dict[str, list[float]]:  # fmt: skip
    """Per-call seconds of each runner: one call each a round, the order rotating."""
    names = list(runners)
    times: dict[str, list[float]] = {k: [] for k in names}
    t_end = time.perf_counter() + seconds
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - t)
        if r + 1 >= 3 and time.perf_counter() > t_end:
            break
    return times


def bench_model(name: str, info: dict[str, Any], a: argparse.Namespace) -> list[Row]:
    import onnxruntime as ort

    import tfrt_py

    kind, recipe = info["kind"], info["recipe"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    if not a.ort_spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(info["int8"], so, providers=["CPUExecutionProvider"])
    try:
        q = tfrt_py.load(info["int8"])
    except Exception as e:  # noqa: BLE001 - reported, the zoo goes on
        return [Row(name, recipe, "-", error=f"tfrt_py.load(int8): {type(e).__name__}: {e}")]
    try:
        f = tfrt_py.load(info["fp32"])
    except Exception as e:  # noqa: BLE001
        print(f"  {name}: tfrt_py.load(fp32): {type(e).__name__}: {e}", flush=True)
        f = None
    compiled = q.wait_compiled(a.compile_timeout) and (
        f is None or f.wait_compiled(a.compile_timeout)
    )
    if kind == "decoder":
        cases = [(f"1 (step @{a.past})", decoder_feeds(info["fp32"], a.past))]
    elif kind == "text":
        cases = [(f"{b} x {a.seq}", text_feeds(sess, b, a.seq)) for b in a.batch_list]
    else:
        cases = [(str(b), vision_feeds(sess, b)) for b in a.batch_list]
    rows = []
    for label, feeds in cases:
        row = Row(name, recipe, label, compiled=compiled)
        try:
            measure_case(row, q, f, sess, feeds, a)
        except Exception as e:  # noqa: BLE001
            row.error = f"{type(e).__name__}: {e}"
            print(f"  {name} {label}: {row.error}", flush=True)
        rows.append(row)
        if not row.error:
            print(f"  {name:20s} {label:14s} tfrt_py int8 {row.tfrt_int8['median']:9.0f} µs, "
                  f"onnxruntime int8 {row.ort_int8_us:9.0f} µs, ratio {row.ratio:.2f}, "
                  f"vs fp32 {row.int8_vs_fp32:.2f}, err {row.max_rel_err:.1e}",
                  flush=True)  # fmt: skip
    return rows


def measure_case(row: Row, q: Any, f: Any, sess: Any, feeds: dict[str, Any],
                 a: argparse.Namespace) -> None:  # fmt: skip
    """Check tfrt_py int8 against onnxruntime int8 on ``feeds``, then time the runners."""
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    row.max_rel_err = max_rel_err(q.run(feeds), want)
    runners: dict[str, Callable[[], Any]] = {
        RUNNERS[0]: lambda: q.run(feeds),
        RUNNERS[1]: lambda: sess.run(None, feeds),
    }
    if f is not None:
        runners[RUNNERS[2]] = lambda: f.run(feeds)
    for run in runners.values():  # a new signature starts its compiles here
        run()
        run()
    for m in (q, f):  # the feeds' signature compiled and the tier's choice made (the
        if m is not None:  # native tier compiles a signature once hot, else mid-timing)
            m.warmup([feeds])
    row.compiled &= q.wait_compiled(a.compile_timeout) and (
        f is None or f.wait_compiled(a.compile_timeout)
    )
    times = interleaved(runners, a.rounds, a.seconds)
    row.rounds = len(times[RUNNERS[0]])
    row.tfrt_int8 = stats(times[RUNNERS[0]])
    row.ort_int8_us = stats(times[RUNNERS[1]])["median"]
    row.ratio = row.tfrt_int8["median"] / row.ort_int8_us
    if RUNNERS[2] in times:
        row.tfrt_fp32_us = stats(times[RUNNERS[2]])["median"]
        row.int8_vs_fp32 = row.tfrt_int8["median"] / row.tfrt_fp32_us


# -- a process per model ---------------------------------------------------------------------


def child(name: str, a: argparse.Namespace) -> None:
    """Measure ``name`` (built already) and print its rows as the last line. A watchdog
    dumps every thread's stack and exits if it takes over ``--model-timeout``."""
    faulthandler.dump_traceback_later(a.model_timeout, exit=True)
    info = quant_build.ensure_built([name])[name]
    rows = bench_model(name, info, a)
    faulthandler.cancel_dump_traceback_later()
    print(RESULT + json.dumps([r.__dict__ for r in rows]), flush=True)


def _stuck_at(stderr: str) -> str:
    """From faulthandler's dump: the innermost frame of the main thread (the one that
    started at ``<module>``)."""
    for block in stderr.split("\n\n"):
        frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        if frames and "<module>" in frames[-1]:
            return frames[0]
    return "?"


def run_child(name: str, a: argparse.Namespace) -> list[Row]:
    """``name`` measured in a process of its own (one model's crash or hang costs only its
    rows); its progress lines relayed as they come."""
    args = [sys.executable, __file__, "--child", name, "--batches", a.batches,
            "--rounds", str(a.rounds), "--seconds", str(a.seconds), "--seq", str(a.seq),
            "--past", str(a.past), "--compile-timeout", str(a.compile_timeout),
            "--model-timeout", str(a.model_timeout)]  # fmt: skip
    if a.ort_spinning:
        args.append("--ort-spinning")
    result = None
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(RESULT):
                result = json.loads(line[len(RESULT) :])
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        err.seek(0)
        stderr = err.read()
    if result is not None:
        return [Row(**r) for r in result]
    recipe = quant_build.ZOO[name].recipe
    if "Timeout (" in stderr:
        msg = f"no result in {a.model_timeout:g} s; main thread at {_stuck_at(stderr)}"
    else:
        msg = f"exit {rc}: {quant_build.error_line(stderr)}"
    print(f"  {name}: {msg}", flush=True)
    return [Row(name, recipe, "-", error=msg)]


# -- the report ----------------------------------------------------------------------------------


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(rows: list[Row]) -> list[str]:
    lines = ["| model | recipe | batch | rounds | tfrt_py int8 median / mean / p99 µs | "
             "onnxruntime int8 median µs | tfrt/ort | tfrt_py fp32 median µs | "
             "tfrt int8/fp32 | outputs match (max rel err) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        if r.error and not r.tfrt_int8:
            lines.append(f"| {r.model} | {quant_build.RECIPES[r.recipe]} | {r.batch} | "
                         f"error: {r.error[:200]} | | | | | | |")  # fmt: skip
            continue
        t = r.tfrt_int8
        ok = "yes" if r.max_rel_err <= TOLERANCE else "**NO**"
        note = "" if r.compiled else " (compiles not finished)"
        lines.append(
            f"| {r.model} | {quant_build.RECIPES[r.recipe]} | {r.batch} | {r.rounds} | "
            f"{t['median']:.0f} / {t['mean']:.0f} / {t['p99']:.0f} | {r.ort_int8_us:.0f} | "
            f"**{r.ratio:.2f}x** | {r.tfrt_fp32_us:.0f} | {r.int8_vs_fp32:.2f}x | "
            f"{ok} ({r.max_rel_err:.1e}){note} |"
        )
    ok_rows = [r for r in rows if r.tfrt_int8]
    for b in dict.fromkeys(r.batch.split(" ")[0] for r in ok_rows):
        sel = [r for r in ok_rows if r.batch.split(" ")[0] == b]
        lines.append(f"| **geomean** | {len(sel)} models | {b} | | | | "
                     f"**{geomean([r.ratio for r in sel]):.2f}x** | | "
                     f"{geomean([r.int8_vs_fp32 for r in sel]):.2f}x | "
                     f"{sum(r.max_rel_err <= TOLERANCE for r in sel)}/{len(sel)} match |"
                     )  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(quant_build.ZOO))
    ap.add_argument("--batches", default="1,8", help="vision images / text sequences a call")
    ap.add_argument("--rounds", type=int, default=40, help="rounds at most, per model and batch")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="time budget per model and batch (at least 3 rounds)")  # fmt: skip
    ap.add_argument("--seq", type=int, default=64, help="text: tokens a sequence")
    ap.add_argument("--past", type=int, default=64, help="decoder: past tokens of the step")
    ap.add_argument("--compile-timeout", type=float, default=600.0,
                    help="seconds to wait for tfrt_py's background compiles")  # fmt: skip
    ap.add_argument("--ort-spinning", action="store_true",
                    help="leave onnxruntime's thread spinning on (its default)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="a smoke test: 5 rounds, 5 s")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the quantized models")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument(
        "--model-timeout",
        type=float,
        default=1800.0,
        help="seconds a model's process may take (then its stacks are reported)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.seconds = min(a.rounds, 5), min(a.seconds, 5.0)
    a.batch_list = [int(b) for b in a.batches.split(",") if b]
    if a.child:
        child(a.child, a)
        return
    names = [m for m in a.models.split(",") if m]
    unknown = set(names) - set(quant_build.ZOO)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; the zoo has {', '.join(quant_build.ZOO)}")
    built = quant_build.ensure_built(names, a.rebuild)

    import onnxruntime as ort

    import tfrt_py

    rows: list[Row] = []
    for name in names:
        info = built[name]
        if "error" in info:
            rows.append(Row(name, quant_build.ZOO[name].recipe, "-",
                            error=f"build: {info['error']}"))  # fmt: skip
            continue
        print(f"{name}: {', '.join(f'{k} {v}' for k, v in info['ops'].items())}", flush=True)
        rows.extend(run_child(name, a))
    threads = os.cpu_count() or 1
    lines = [
        f"# Quantized zoo ({time.strftime('%Y-%m-%d')})", "",
        f"CPU: {host_isa()}. tfrt_py {getattr(tfrt_py, '__version__', '?')} (its default "
        f"threads); onnxruntime {ort.__version__}, intra_op_num_threads = os.cpu_count() = "
        f"{threads}, spinning {'on' if a.ort_spinning else 'off'}. Both tfrt_py models warmed "
        f"on the feeds first (`Model.warmup`). Runs: up to {a.rounds} "
        f"rounds or {a.seconds:g} s per model and batch, each round tfrt_py int8, onnxruntime "
        f"int8, tfrt_py fp32 once (order rotating){' (--quick)' if a.quick else ''}; text "
        f"batches of {a.seq} tokens, the decoder one step over {a.past} past tokens. Match: "
        f"every output within {TOLERANCE:g} of its scale (max |diff| / max |onnxruntime|).",
        "", *table(rows),
    ]  # fmt: skip
    print("\n" + "\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": lines[2], "rows": [r.__dict__ for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
