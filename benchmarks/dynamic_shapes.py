"""Dynamic shapes: tfrt_py against onnxruntime when every call brings a new shape (issue 32).

    python benchmarks/dynamic_shapes.py [--parts text,batch,generate,compile,serve]
        [--seconds S] [--text-models bert,...] [--vision-models resnet18,...]
        [--threads 1] [--out DIR]

Every measurement runs in a fresh child process that loads the model (tfrt_py ``auto``,
an empty native cache dir, as a new user's first process) and an onnxruntime session on the
same file, then calls both on the same feeds, alternating which goes first, from the first
call after load until ``--seconds`` have passed. Latencies are reported as mean, p50 and p99
of each runtime, for the first ``FIRST_S`` (10) seconds after load apart from the rest,
and for the whole run; the ratios are tfrt_py / onnxruntime. Parts:

* ``text``: the transformer zoo (``transformer_zoo.py``: BERT, DistilBERT, T5 encoder,
  TorchScript, dynamo and onnxruntime-optimized exports; hidden 128, 2 layers) with the
  sequence length uniform in 8..128 at batch 1, and at batch uniform in 1..8;
* ``batch``: the vision zoo's CNNs and ViTs (``vision_zoo.py``) with the batch uniform in
  1..32, beside the same model at a fixed batch of 1 in the same process: the issue's
  target is the random-batch ratio within 1.1x of the fixed one;
* ``generate``: optimum's ``text-generation-with-past`` exports of GPT-2 (4 layers, 256
  wide) and Llama (4 layers, 256 wide, grouped KV heads) from fixed seeds, a greedy
  generation of ``NEW_TOKENS`` tokens from a random 16-token prompt feeding ``present.*``
  back as ``past_key_values.*``: tokens/s of each runtime, rounds alternating, and the
  tokens compared;
* ``compile``: calls of a shape already compiled on the native tier while a new shape
  compiles, p50/p99 before and during, with the compile server (the default) and with
  ``$TFRT_PY_COMPILE_SERVER=0`` (the compile on a thread of the serving process);
* ``serve``: ``tfrt-py serve`` (dynamic batching on) on 127.0.0.1 under variable-length
  BERT traffic from a real client (Triton's ``tritonclient.http.aio``, binary tensors, 8
  requests in flight, in this process): requests/s, mean, p50 and p99, first 10 s apart,
  every answer checked against onnxruntime's. No onnxruntime server stands beside it
  here: the text rows above give the model's own ratio.

Threads: one per runtime by default (``--threads``), as the transformer zoo: NumPy's BLAS,
tfrt_py's budget and onnxruntime's intra-op pool, no spinning. Benchmark with
``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` unset (``make bench-dynamic`` does). The host's
CPU and its widest SIMD path are printed with the figures. Needs what ``make bench-zoo``
installs (torch, transformers, optimum-onnx for the decoders).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from peers import cpu_model_and_flags, ort_session

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DECODERS_DIR = os.path.join(HERE, "models", "decoders")
TEXT_MODELS = ("bert", "bert-dynamo", "bert-ort", "distilbert", "t5-encoder")
VISION_MODELS = ("resnet18", "mobilenet_v2", "efficientnet_b0", "vit_tiny", "convnext_atto")
DECODERS = ("gpt2", "llama")
FIRST_S = 10.0
SEQ = (8, 128)
NEW_TOKENS = 48
PROMPT = (4, 64)  # each round's prompt length, drawn uniformly: every round new signatures


# -- the host ---------------------------------------------------------------------------------


def host_line() -> str:
    """The CPU, its widest SIMD path, and the cores this process may use."""
    model, flags = cpu_model_and_flags()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    if "avx512_vnni" in flags:
        isa += "+VNNI"
    return f"{model}, {isa}, {len(os.sched_getaffinity(0))} CPUs"


# -- statistics ---------------------------------------------------------------------------


def stats(xs: list[float]) -> dict[str, float]:
    import numpy as np

    if not xs:
        return {"n": 0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan")}
    a = np.asarray(xs)
    return {"n": len(xs), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99))}  # fmt: skip


def windows(samples: list[tuple[float, float, float]]) -> dict[str, Any]:
    """(seconds since load, tfrt µs, ort µs) -> per window: each runtime's stats and the
    ratios of their means and p99s."""
    out: dict[str, Any] = {}
    parts = {
        "first 10 s": [s for s in samples if s[0] < FIRST_S],
        "after 10 s": [s for s in samples if s[0] >= FIRST_S],
        "all": samples,
    }
    for name, ss in parts.items():
        t = stats([s[1] for s in ss])
        o = stats([s[2] for s in ss])
        out[name] = {"tfrt": t, "ort": o,
                     "mean_ratio": t["mean"] / o["mean"] if o["n"] else float("nan"),
                     "p99_ratio": t["p99"] / o["p99"] if o["n"] else float("nan")}  # fmt: skip
    return out


# -- runtimes -------------------------------------------------------------------------------


def _close(a: Any, b: Any, scale_tol: float = 2e-3) -> bool:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    scale = max(float(np.abs(b).max()) if b.size else 0.0, 1.0)
    return bool(np.all(np.abs(a - b) <= scale_tol * scale))


def interleaved(run_t: Any, run_o: Any, draw: Any, seconds: float, t_load: float,
                check: int = 5) -> tuple[list[tuple[float, float, float]], int]:  # fmt: skip
    """Call both runtimes on each drawn feed, alternating which goes first, until
    ``seconds`` after ``t_load``; the samples and how many answers disagreed (the first
    ``check`` calls are compared)."""
    samples = []
    bad = 0
    i = 0
    while time.perf_counter() - t_load < seconds:
        feeds = draw(i)
        at = time.perf_counter() - t_load
        order = (0, 1) if i % 2 == 0 else (1, 0)
        res: list[Any] = [None, None]
        us = [0.0, 0.0]
        for k in order:
            t0 = time.perf_counter()
            res[k] = (run_t if k == 0 else run_o)(feeds)
            us[k] = (time.perf_counter() - t0) * 1e6
        if i < check and not _close(res[0], res[1]):
            bad += 1
        samples.append((at, us[0], us[1]))
        i += 1
    return samples, bad


# -- children -------------------------------------------------------------------------------


def child_text(path: str, pattern: str, seconds: float, threads: int) -> dict[str, Any]:
    import numpy as np

    import tfrt_py

    rng = np.random.default_rng(1)
    sess = ort_session(path, threads)
    t_load = time.perf_counter()
    model = tfrt_py.load(path, threads=threads or None)
    load_s = time.perf_counter() - t_load
    names = [i.name for i in sess.get_inputs()]
    vocab = 1000

    def draw(i: int) -> dict[str, Any]:
        b = 1 if pattern == "b1" else int(rng.integers(1, 9))
        s = int(rng.integers(SEQ[0], SEQ[1] + 1))
        f = {"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64),
             "attention_mask": np.ones((b, s), np.int64)}  # fmt: skip
        f["attention_mask"][0, s - s // 4 :] = 0
        return {k: v for k, v in f.items() if k in names}

    def run_t(f: dict[str, Any]) -> Any:
        return model.run(f)["last_hidden_state"]

    def run_o(f: dict[str, Any]) -> Any:
        return sess.run(["last_hidden_state"], f)[0]

    samples, bad = interleaved(run_t, run_o, draw, seconds, t_load)
    return {"load_s": load_s, "executor": model.executor, "bad": bad,
            "windows": windows(samples), "describe": _dynamic_lines(model)}  # fmt: skip


def _dynamic_lines(model: Any) -> list[str]:
    return [ln for ln in model.describe().splitlines()
            if "memory:" in ln or "signatures served" in ln or "native:" in ln
            or "generic plan" in ln]  # fmt: skip


def child_batch(path: str, seconds: float, threads: int) -> dict[str, Any]:
    import numpy as np

    import tfrt_py

    rng = np.random.default_rng(2)
    sess = ort_session(path, threads)
    inp = sess.get_inputs()[0]
    side = int(inp.shape[2]) if isinstance(inp.shape[2], int) else 224
    out_name = sess.get_outputs()[0].name
    t_load = time.perf_counter()
    model = tfrt_py.load(path, threads=threads or None)
    load_s = time.perf_counter() - t_load
    fixed = {inp.name: rng.standard_normal((1, 3, side, side)).astype(np.float32)}
    pool = rng.standard_normal((32, 3, side, side)).astype(np.float32)

    def draw_random(i: int) -> dict[str, Any]:
        return {inp.name: pool[: int(rng.integers(1, 33))]}

    def run_t(f: dict[str, Any]) -> Any:
        return model.run(f)[out_name]

    def run_o(f: dict[str, Any]) -> Any:
        return sess.run([out_name], f)[0]

    rand, bad = interleaved(run_t, run_o, draw_random, seconds, t_load)
    t1 = time.perf_counter()
    fix, bad2 = interleaved(run_t, run_o, lambda i: fixed, seconds / 3, t1)
    w = windows(rand)
    wf = windows(fix)["all"]
    return {"load_s": load_s, "executor": model.executor, "bad": bad + bad2, "windows": w,
            "fixed": wf, "ratio_of_ratios": w["all"]["mean_ratio"] / wf["mean_ratio"]}  # fmt: skip


def _decoder_feeds(names: list[str], kv: list[Any], ids: Any, past: dict[str, Any],
                   p: int) -> dict[str, Any]:  # fmt: skip
    import numpy as np

    b, s = ids.shape
    f = {"input_ids": ids, **past}
    if "attention_mask" in names:
        f["attention_mask"] = np.ones((b, p + s), np.int64)
    if "position_ids" in names:
        f["position_ids"] = np.arange(p, p + s, dtype=np.int64)[None].repeat(b, 0)
    return f


def generate(run: Any, names: list[str], kv: list[Any], prompt: Any, n: int) -> list[int]:
    """Greedy generation of ``n`` tokens, the cache fed back (optimum's names)."""
    import numpy as np

    b = prompt.shape[0]
    past = {i.name: np.zeros((b, i.shape[1], 0, i.shape[3]), np.float32) for i in kv}
    ids, p, toks = prompt, 0, []
    for _ in range(n):
        out = run(_decoder_feeds(names, kv, ids, past, p))
        nxt = out["logits"][:, -1].argmax(-1)
        toks.append(int(nxt[0]))
        p += ids.shape[1]
        ids = nxt[:, None].astype(np.int64)
        past = {i.name: out[i.name.replace("past_key_values", "present")] for i in kv}
    return toks


def child_generate(path: str, seconds: float, threads: int) -> dict[str, Any]:
    import numpy as np

    import tfrt_py

    rng = np.random.default_rng(3)
    sess = ort_session(path, threads)
    names = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    kv = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    t_load = time.perf_counter()
    model = tfrt_py.load(path, threads=threads or None)
    load_s = time.perf_counter() - t_load

    def run_o(f: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(outs, sess.run(None, f)))

    rounds: list[tuple[float, float, float]] = []
    same = 0
    i = 0
    while time.perf_counter() - t_load < seconds:
        length = int(rng.integers(PROMPT[0], PROMPT[1] + 1))
        prompt = rng.integers(1, 1000, (1, length)).astype(np.int64)
        at = time.perf_counter() - t_load
        got: list[Any] = [None, None]
        tps = [0.0, 0.0]
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            got[k] = generate(model.run if k == 0 else run_o, names, kv, prompt, NEW_TOKENS)
            tps[k] = NEW_TOKENS / (time.perf_counter() - t0)
        same += got[0] == got[1]
        rounds.append((at, tps[0], tps[1]))
        i += 1
    first = [r for r in rounds if r[0] < FIRST_S]
    rest = [r for r in rounds if r[0] >= FIRST_S]

    def tok(rs: list[tuple[float, float, float]]) -> dict[str, float]:
        if not rs:
            return {"n": 0}
        t = float(np.median([r[1] for r in rs]))
        o = float(np.median([r[2] for r in rs]))
        return {"n": len(rs), "tfrt_tps": t, "ort_tps": o, "ratio": t / o}

    return {"load_s": load_s, "executor": model.executor, "rounds": len(rounds),
            "token_exact": same, "first 10 s": tok(first), "after 10 s": tok(rest),
            "all": tok(rounds), "describe": _dynamic_lines(model)}  # fmt: skip


def child_compile(path: str, seconds: float, threads: int) -> dict[str, Any]:
    """Calls of a compiled shape before and while another shape compiles."""
    import numpy as np

    import tfrt_py

    def feeds(s: int) -> dict[str, Any]:
        return {"input_ids": np.ones((1, s), np.int64), "attention_mask": np.ones((1, s), np.int64)}

    known, new = feeds(16), feeds(24)
    model = tfrt_py.load(path, threads=threads or None, warmup=[known])
    tier = model.native
    if tier is None:
        return {"error": f"not on the native tier ({model.executor})"}

    def sample(until: Any) -> list[float]:
        xs = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end and until():
            t0 = time.perf_counter()
            model.run(known)
            xs.append((time.perf_counter() - t0) * 1e6)
        return xs

    before = sample(lambda: True)
    job = tier.compile_signature(((1, 24), (1, 24)))
    t0 = time.perf_counter()
    during = sample(lambda: job is not None and job.state == "compiling")
    compile_s = time.perf_counter() - t0
    tier.wait(600)
    model.run(new)
    b, d = stats(before), stats(during)
    return {"before": b, "during": d, "compile_s": compile_s,
            "p99_ratio": d["p99"] / b["p99"], "p50_ratio": d["p50"] / b["p50"],
            "job": None if job is None else job.state}  # fmt: skip


CHILDREN = {"text": child_text, "batch": child_batch, "generate": child_generate,
            "compile": child_compile}  # fmt: skip


def run_child(kind: str, args: list[str], env: dict[str, str] | None = None,
              timeout: float = 3600) -> dict[str, Any]:  # fmt: skip
    """One measurement in a fresh process with an empty native cache dir."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, e.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as cache:
        e["TFRT_PY_CACHE_DIR"] = os.path.join(cache, "native")
        r = subprocess.run([sys.executable, __file__, "--child", kind, *args],
                           capture_output=True, text=True, env=e, timeout=timeout)  # fmt: skip
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# -- models ---------------------------------------------------------------------------------


def text_paths(names: list[str]) -> dict[str, str]:
    import transformer_zoo as zoo

    out = {}
    for n in names:
        try:
            out[n] = zoo.make(zoo.variant(n), zoo.SIZES["bench"],
                              os.path.join(HERE, "models", "transformers"))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - reported, the rest still measured
            print(f"  {n}: cannot be made: {e}", flush=True)
    return out


_DECODER_SCRIPT = r"""
import sys, torch, transformers as tr
from optimum.exporters.onnx import main_export
arch, out, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
if arch == "gpt2":
    cfg = tr.GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=1024,
                        bos_token_id=0, eos_token_id=0)
    m = tr.GPT2LMHeadModel(cfg)
elif arch == "gpt2-100m":  # GPT-2 small's shape (12 layers, 768 wide), a 32k vocabulary
    cfg = tr.GPT2Config(vocab_size=32000, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                        bos_token_id=0, eos_token_id=0)
    m = tr.GPT2LMHeadModel(cfg)
elif arch == "llama-1k":  # a small LM's width (1024, MLP 4096), 4 layers, 8k vocabulary
    cfg = tr.LlamaConfig(vocab_size=8000, hidden_size=1024, intermediate_size=4096,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                         max_position_embeddings=1024)
    m = tr.LlamaForCausalLM(cfg)
else:  # llama, and llama-genai: the same model through onnxruntime-genai's model builder
    cfg = tr.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024)
    m = tr.LlamaForCausalLM(cfg)
m.eval().save_pretrained(tmp)
if arch.startswith("llama-genai"):  # GroupQueryAttention (packed QKV, rotary), simplified norms
    import os, shutil, subprocess
    precision = "int4" if arch.endswith("-int4") else "fp32"  # int4: MatMulNBits at level 4
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", tmp,
                    "-o", out, "-p", precision, "-e", "cpu", "-c", os.path.join(tmp, "cache")])
    # (it fails after writing the model, saving a tokenizer the random model has not got)
    shutil.copy(os.path.join(tmp, "config.json"), out)
else:
    main_export(tmp, output=out, task="text-generation-with-past", do_validation=False)
"""


def decoder_paths(names: list[str]) -> dict[str, str]:
    """optimum exports from configs and a fixed seed (a child process imports torch);
    ``llama-genai``: the Llama config through onnxruntime-genai's model builder
    (``llama-genai-int4``: its int4 CPU precision, MatMulNBits at ``accuracy_level=4``)."""
    out = {}
    for n in names:
        d = os.path.join(DECODERS_DIR, n)
        path = os.path.join(d, "model.onnx")
        if not os.path.exists(path):
            how = "onnxruntime-genai" if "-genai" in n else "optimum"
            print(f"exporting decoder {n} with {how} ...", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                r = subprocess.run([sys.executable, "-c", _DECODER_SCRIPT, n, d, tmp],
                                   capture_output=True, text=True)  # fmt: skip
            if r.returncode != 0 or not os.path.exists(path):
                print(f"  {n}: export failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
        out[n] = path
    return out


# -- reports --------------------------------------------------------------------------------


def _fmt_window(w: dict[str, Any]) -> str:
    t, o = w["tfrt"], w["ort"]
    return (f"{t['mean'] / 1e3:.2f} / {t['p50'] / 1e3:.2f} / {t['p99'] / 1e3:.2f} | "
            f"{o['mean'] / 1e3:.2f} / {o['p50'] / 1e3:.2f} / {o['p99'] / 1e3:.2f} | "
            f"**{w['mean_ratio']:.2f}x** / {w['p99_ratio']:.2f}x")  # fmt: skip


def text_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| model | traffic | window | calls | tfrt_py mean / p50 / p99 ms | "
             "onnxruntime mean / p50 / p99 ms | ratio mean / p99 |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, r in results.items():
        model, pattern = key.split("|")
        if "error" in r:
            lines.append(f"| {model} | {pattern} | error: {r['error']} | | | | |")
            continue
        for wname in ("first 10 s", "after 10 s", "all"):
            w = r["windows"][wname]
            lines.append(f"| {model} | {pattern} | {wname} | {w['tfrt']['n']} | "
                         f"{_fmt_window(w)} |")  # fmt: skip
    return lines


def batch_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| model | tfrt_py mean ms (batch 1..32) | onnxruntime mean ms | ratio mean | "
             "ratio p99 | fixed batch 1 ratio | random / fixed | first 10 s ratio | "
             "after 10 s ratio |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, r in results.items():
        if "error" in r:
            lines.append(f"| {model} | error: {r['error']} | | | | | | | |")
            continue
        w = r["windows"]["all"]
        later = r["windows"].get("after 10 s", {}).get("mean_ratio")
        lines.append(
            f"| {model} | {w['tfrt']['mean'] / 1e3:.1f} | {w['ort']['mean'] / 1e3:.1f} | "
            f"{w['mean_ratio']:.2f}x | {w['p99_ratio']:.2f}x | {r['fixed']['mean_ratio']:.2f}x "
            f"| **{r['ratio_of_ratios']:.2f}** | {r['windows']['first 10 s']['mean_ratio']:.2f}x "
            f"| {'-' if later is None else f'{later:.2f}x'} |"
        )
    return lines


def generate_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| decoder | window | rounds | tfrt_py tokens/s | onnxruntime tokens/s | ratio | "
             "token-exact rounds |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, r in results.items():
        if "error" in r:
            lines.append(f"| {model} | error: {r['error']} | | | | | |")
            continue
        for wname in ("first 10 s", "after 10 s", "all"):
            w = r[wname]
            if not w.get("n"):
                continue
            lines.append(f"| {model} | {wname} | {w['n']} | {w['tfrt_tps']:.0f} | "
                         f"{w['ort_tps']:.0f} | **{w['ratio']:.2f}x** | "
                         f"{r['token_exact']}/{r['rounds']} |")  # fmt: skip
    return lines


def compile_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| compile | calls before | p50 / p99 µs before | calls during | "
             "p50 / p99 µs during | p99 during / before | compile s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for how, r in results.items():
        if "error" in r:
            lines.append(f"| {how} | error: {r['error']} | | | | | |")
            continue
        b, d = r["before"], r["during"]
        lines.append(f"| {how} | {b['n']} | {b['p50']:.0f} / {b['p99']:.0f} | {d['n']} | "
                     f"{d['p50']:.0f} / {d['p99']:.0f} | **{r['p99_ratio']:.2f}x** | "
                     f"{r['compile_s']:.1f} |")  # fmt: skip
    return lines


# -- serving --------------------------------------------------------------------------------


def serve_part(path: str, seconds: float, concurrency: int = 8) -> dict[str, Any]:
    """``tfrt-py serve`` under variable-length traffic from tritonclient's asyncio client
    (binary tensors), ``concurrency`` requests in flight; every answer is checked against
    onnxruntime's for the same feeds (a sample of them)."""
    import asyncio

    import numpy as np
    import serve_load
    import tritonclient.http as triton
    import tritonclient.http.aio as triton_aio

    sess = ort_session(path, 1)
    name = os.path.splitext(os.path.basename(path))[0]
    rng = np.random.default_rng(4)
    bodies = []
    for _ in range(64):
        s = int(rng.integers(SEQ[0], SEQ[1] + 1))
        f = {"input_ids": rng.integers(0, 1000, (1, s)).astype(np.int64),
             "attention_mask": np.ones((1, s), np.int64)}  # fmt: skip
        ins = []
        for n, x in f.items():
            t = triton.InferInput(n, list(x.shape), "INT64")
            t.set_data_from_numpy(x, binary_data=True)
            ins.append(t)
        bodies.append((ins, sess.run(["last_hidden_state"], f)[0]))
    outputs = [triton.InferRequestedOutput("last_hidden_state", binary_data=True)]

    async def drive(port: int) -> tuple[list[tuple[float, float]], int, float]:
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=concurrency)
        lat: list[tuple[float, float]] = []
        bad = 0
        t_ready = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal bad
            i = w
            while time.perf_counter() - t_ready < seconds:
                ins, want = bodies[i % len(bodies)]
                i += concurrency
                t0 = time.perf_counter()
                r = await client.infer(name, ins, outputs=outputs)
                lat.append((t0 - t_ready, (time.perf_counter() - t0) * 1e6))
                if not _close(r.as_numpy("last_hidden_state"), want):
                    bad += 1

        try:
            await asyncio.gather(*(worker(w) for w in range(concurrency)))
        finally:
            await client.close()
        return lat, bad, time.perf_counter() - t_ready

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TFRT_PY_CACHE_DIR"] = os.path.join(tmp, "native")  # the server's: cold
        proc, port = serve_load.start_server([path], "on", os.path.join(tmp, "log"), [],
                                             "default")  # fmt: skip
        try:
            asyncio.run(serve_load.wait_ready(port, proc))
            lat, bad, total = asyncio.run(drive(port))
        finally:
            proc.terminate()
            proc.wait(30)
    first = stats([x for t, x in lat if t < FIRST_S])
    rest = stats([x for t, x in lat if t >= FIRST_S])
    return {"requests": len(lat), "rps": len(lat) / total, "bad": bad, "first 10 s": first,
            "after 10 s": rest, "all": stats([x for _, x in lat])}  # fmt: skip


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        fn = CHILDREN[kind]
        if kind == "text":
            res = fn(rest[0], rest[1], float(rest[2]), int(rest[3]))
        else:
            res = fn(rest[0], float(rest[1]), int(rest[2]))
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="text,batch,generate,compile,serve")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--text-models", default=",".join(TEXT_MODELS))
    ap.add_argument("--patterns", default="b1,b1-8")
    ap.add_argument("--vision-models", default=",".join(VISION_MODELS))
    ap.add_argument("--decoders", default=",".join(DECODERS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "dynamic_shapes"))
    a = ap.parse_args()
    parts = a.parts.split(",")
    th = str(a.threads)
    report = [f"# Dynamic shapes ({time.strftime('%Y-%m-%d')})", "",
              f"Host: {host_line()}; {a.threads} thread(s) per runtime; "
              f"{a.seconds:.0f} s per row, from the first call after load.", ""]  # fmt: skip
    everything: dict[str, Any] = {"host": host_line(), "threads": a.threads}
    if "text" in parts:
        res = {}
        for name, path in text_paths(a.text_models.split(",")).items():
            for pattern in a.patterns.split(","):
                print(f"text: {name} {pattern} ...", flush=True)
                res[f"{name}|{pattern}"] = run_child("text", [path, pattern, str(a.seconds), th])
        everything["text"] = res
        report += ["## Variable-length text (sequence 8..128; b1: batch 1, b1-8: batch 1..8)",
                   "", *text_table(res), ""]  # fmt: skip
    if "batch" in parts:
        sys.path.insert(0, HERE)
        import vision_zoo

        got = vision_zoo.ensure_exported(a.vision_models.split(","), ["torchscript"])
        res = {}
        for (name, _), path in got.items():
            if path.startswith("error"):
                res[name] = {"error": path}
                continue
            print(f"batch: {name} ...", flush=True)
            res[name] = run_child("batch", [path, str(a.seconds), th])
        everything["batch"] = res
        report += ["## Random batch 1..32 (vision zoo, TorchScript exports)", "",
                   *batch_table(res), ""]  # fmt: skip
    if "generate" in parts:
        res = {}
        for name, path in decoder_paths(a.decoders.split(",")).items():
            print(f"generate: {name} ...", flush=True)
            res[name] = run_child("generate", [path, str(a.seconds), th])
        everything["generate"] = res
        lo, hi = PROMPT
        report += [f"## Greedy generation (prompts of {lo}..{hi} tokens, {NEW_TOKENS} new tokens)",
                   "", *generate_table(res), ""]  # fmt: skip
    if "compile" in parts:
        res = {}
        paths = text_paths(["bert"])
        if "bert" in paths:
            for how, flag in (("compile server", "1"), ("in process (before)", "0")):
                print(f"compile: {how} ...", flush=True)
                env = dict(os.environ)
                env["TFRT_PY_COMPILE_SERVER"] = flag
                res[how] = run_child("compile", [paths["bert"], str(min(a.seconds, 10)), th],
                                     env=env)  # fmt: skip
        everything["compile"] = res
        report += ["## Calls of a compiled shape (BERT 1x16) while 1x24 compiles", "",
                   *compile_table(res), ""]  # fmt: skip
    if "serve" in parts:
        paths = text_paths(["bert"])
        if "bert" in paths:
            print("serve: bert ...", flush=True)
            r = serve_part(paths["bert"], a.seconds)
            everything["serve"] = r
            if "error" in r:
                report += ["## tfrt-py serve", "", f"error: {r['error']}", ""]
            else:
                report += ["## tfrt-py serve, variable-length BERT (batching on, 8 clients)", "",
                           "| window | requests | mean ms | p50 ms | p99 ms |",
                           "|---|---|---|---|---|"]  # fmt: skip
                for wname in ("first 10 s", "after 10 s", "all"):
                    w = r[wname]
                    report.append(f"| {wname} | {w['n']} | {w['mean'] / 1e3:.2f} | "
                                  f"{w['p50'] / 1e3:.2f} | {w['p99'] / 1e3:.2f} |")  # fmt: skip
                report += [
                    "",
                    f"{r['rps']:.0f} requests/s over {r['requests']} requests "
                    f"({r['bad']} answers differing from onnxruntime's)",
                    "",
                ]
    text = "\n".join(report)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "dynamic_shapes.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "dynamic_shapes.json"), "w") as f:
        json.dump(everything, f, indent=1)


if __name__ == "__main__":
    main()
