"""Generation: tfrt_py's ``Model.generate`` against onnxruntime driving the same export from
a NumPy loop, plain and with IO binding (issue 37).

    python benchmarks/generate.py [--decoders gpt2,llama,llama-genai,...] [--rounds 5]
        [--new-tokens 64] [--prompts 16,128] [--pasts 16,128,512] [--threads 1]
        [--out DIR]

Models: optimum's ``text-generation-with-past`` exports from configs and a fixed seed
(``dynamic_shapes.decoder_paths``; nothing downloaded): GPT-2 4 layers/256, Llama 4
layers/256 with grouped KV heads, and a GPT-2-small-shaped model of ~135M parameters;
and the same Llama through onnxruntime-genai's model builder (``llama-genai``:
GroupQueryAttention with packed QKV and rotary, its weights as external data;
``llama-genai-int4``: the builder's int4 CPU model, MatMulNBits at ``accuracy_level=4``).
Each model is measured in a fresh child process (tfrt_py ``auto`` with an empty native
cache dir, as a new user's first process, and an onnxruntime session on the same file):

* **tokens**: greedy generation of 12 tokens, batch 1 and batch 4 (prompts of 5..16
  tokens, left-padded), compared token for token with the onnxruntime loop;
* **generate**: tokens/s of a greedy generation of ``--new-tokens`` from a random prompt
  of each ``--prompts`` length, the three runtimes and the prompt lengths alternating,
  ``--rounds`` rounds; the first round (the first generations after load, which a cold
  process serves on the interpreter while numba compiles) is reported apart from the
  median of the rest, which run once tfrt_py has settled (``settle``: generations until
  one starts no compile and none is in flight; the boxes of dims a generation crosses
  compile as they become hot, after ``wait_compiled()`` has returned, and a median over
  rounds that met those compiles measured the warm-up); the seconds that took are
  reported too;
* **step**: one decode step (one new token) at each ``--pasts`` past length, the same
  feeds repeated in blocks of ``BLOCK`` steps (the first two of a block dropped), the
  runtimes alternating block by block: median ms, and the growth from the shortest past
  to the longest (the issue's target is <= 1.2x from 16 to 512). Blocks, because a step
  that follows the other runtime's step finds its weights and cache evicted (per-step
  alternation measured 2-3x this host's steps, for both runtimes), which no generation
  loop meets. tfrt_py's step runs as ``generate`` runs it (the cache in one buffer,
  written in place, once it passes ``IN_PLACE_BYTES`` on an executor that writes a
  ``Concat`` there); onnxruntime's as a user's loop does.

* **serve**: ``tfrt-py serve`` in its own process streaming ``generate_stream`` to 1, 4
  and 16 concurrent clients (``--streams``; httpx, server-sent events): a warm-up until
  one stream's tokens/s settles (its trace printed apart), then ``--serve-rounds`` rounds
  of every level interleaved: tokens/s of all streams together (median over rounds) and
  the time to the first token, beside the prompt's own time.

Threads: one per runtime by default (``--threads``). Benchmark with ``OPENBLAS_CORETYPE``
and ``OPENBLAS_L2_SIZE`` unset (``make bench-generate`` does). Needs what ``make
bench-zoo`` installs (torch, transformers, optimum-onnx).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from dynamic_shapes import decoder_paths, host_line  # noqa: E402
from peers import ort_session  # noqa: E402

DECODERS = ("gpt2", "llama", "llama-genai", "llama-genai-int4", "gpt2-100m")


# -- the onnxruntime loops a user writes --------------------------------------------------------


class OrtLoop:
    """Greedy generation with onnxruntime from NumPy, transformers' conventions (left
    padding, positions ``cumsum(mask) - 1``); ``binding=True`` keeps the cache in
    OrtValues between steps (IO binding: no copy of the cache through NumPy)."""

    def __init__(self, sess: Any, binding: bool) -> None:
        self.sess = sess
        self.binding = binding
        self.names = {i.name for i in sess.get_inputs()}
        self.cache = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
        self.outs = [o.name for o in sess.get_outputs()]

    def feeds(self, ids: Any, mask: Any, pos: Any, past: dict[str, Any]) -> dict[str, Any]:
        f = {"input_ids": ids, **past}
        if "attention_mask" in self.names:
            f["attention_mask"] = mask
        if "position_ids" in self.names:
            f["position_ids"] = pos
        return f

    def empty(self, batch: int) -> dict[str, Any]:
        import numpy as np

        return {
            i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32) for i in self.cache
        }

    def generate(self, prompts: list[list[int]], n: int) -> Any:
        import numpy as np

        width, batch = max(map(len, prompts)), len(prompts)
        ids = np.zeros((batch, width), np.int64)
        mask = np.zeros((batch, width), np.int64)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :], mask[r, width - len(p) :] = p, 1
        pos = np.maximum(mask.cumsum(1) - 1, 0)
        past: dict[str, Any] = self.empty(batch)
        made = [ids]
        step = ids
        for _ in range(n):
            logits, past = self.step(self.feeds(step, mask, pos, past))
            step = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            made.append(step)
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], 1)
            pos = pos[:, -1:] + 1
        return np.concatenate(made, 1)

    def step(self, feeds: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if not self.binding:
            res = dict(zip(self.outs, self.sess.run(None, feeds)))
            return res["logits"], {k: res[k.replace("past_key_values", "present")]
                                   for k in feeds if k.startswith("past_key_values")}  # fmt: skip
        io = self.sess.io_binding()
        for k, v in feeds.items():
            if type(v).__name__ == "OrtValue":
                io.bind_ortvalue_input(k, v)
            else:
                io.bind_cpu_input(k, v)
        for o in self.outs:
            io.bind_output(o)
        self.sess.run_with_iobinding(io)
        vals = dict(zip(self.outs, io.get_outputs()))
        past = {k: vals[k.replace("past_key_values", "present")]
                for k in feeds if k.startswith("past_key_values")}  # fmt: skip
        return vals["logits"].numpy(), past


# -- the child: one model -------------------------------------------------------------------------


#: steps per block and blocks per runtime in the step measurement; calls that make a
#: signature hot (``native.runtime.tier.HOT_CALLS``)
BLOCK, BLOCKS, HOT = 10, 16, 20


def settle(model: Any, work: Callable[[], Any], limit_s: float = 300.0) -> float:
    """Run ``work`` until a pass of it starts no compile and none is in flight (the boxes
    of dims a generation crosses compile as they become hot, after ``wait_compiled()``
    has returned); the seconds it took (at most ``limit_s``)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        tier = model.native
        before = None if tier is None else len(tier.sigs)
        work()
        model.wait_compiled()
        tier = model.native
        if (
            tier is not None
            and len(tier.sigs) == before
            and all(j.state != "compiling" for j in tier.sigs.values())
        ):
            break
        if tier is None and model.executor != "native":
            break  # (served by the interpreter: nothing compiles)
    return time.perf_counter() - t0


def child(path: str, rounds: int, new: int, prompts: list[int], pasts: list[int],
          threads: int) -> dict[str, Any]:  # fmt: skip
    import numpy as np

    import tfrt_py
    from tfrt_py.generation.steps import IN_PLACE_BYTES

    t0 = time.perf_counter()
    model = tfrt_py.load(path, threads=threads)
    load_s = time.perf_counter() - t0
    sess = ort_session(path, threads)
    plain, bound = OrtLoop(sess, False), OrtLoop(sess, True)
    vocab = model.decoder().vocab or 1000
    rng = np.random.default_rng(0)
    res: dict[str, Any] = {"load_s": load_s, "executor": model.executor, "tokens": {}}

    one = [rng.integers(0, vocab, 16).tolist()]
    four = [rng.integers(0, vocab, int(k)).tolist() for k in (5, 16, 9, 12)]
    for label, ps in (("batch 1", one), ("batch 4", four)):
        got = np.asarray(model.generate(ps, max_new_tokens=12))
        if model.decoder().pads_left or len(ps) == 1:
            res["tokens"][label] = bool((got == plain.generate(ps, 12)).all())
        else:  # GroupQueryAttention pads on the right: each row as the row alone
            res["tokens"][label] = all(bool((row[-12:] == plain.generate([p], 12)[0, -12:]).all())
                                       for row, p in zip(got, ps))  # fmt: skip

    runners = {
        "tfrt_py": lambda p: model.generate(p, max_new_tokens=new),
        "ort": lambda p: plain.generate(p, new),
        "ort+iobinding": lambda p: bound.generate(p, new),
    }
    times: dict[int, dict[str, list[float]]] = {p: {k: [] for k in runners} for p in prompts}
    for r in range(rounds):  # the prompt lengths interleaved: both meet the first seconds
        for plen in prompts:
            prompt = [rng.integers(0, vocab, plen).tolist()]
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            for k in order:
                t = time.perf_counter()
                runners[k](prompt)
                times[plen][k].append(time.perf_counter() - t)
        if r == 0:  # the first round meets the cold start; the rest, the compiled code
            res["settled_s"] = settle(model, lambda: [runners["tfrt_py"]([
                rng.integers(0, vocab, n).tolist()]) for n in prompts])  # fmt: skip
    res["generate"] = {
        plen: {k: {"first_tok_s": new / v[0], "tok_s": new / statistics.median(v[1:] or v)}
               for k, v in by.items()}
        for plen, by in times.items()
    }  # fmt: skip

    res["step"] = {}
    dec = model.decoder()
    for p in pasts:
        prompt = rng.integers(0, vocab, p)[None]
        pre = {"input_ids": prompt}
        for c in dec.cache:
            pre[c.past] = c.empty(1)
        if dec.attention_mask:
            pre[dec.attention_mask] = np.ones((1, p), np.int64)
        if dec.position_ids:
            pre[dec.position_ids] = np.arange(p, dtype=np.int64)[None]
        out = model.run(pre)
        feeds: dict[str, Any] = {"input_ids": np.array([[1]], np.int64)}
        ort_feeds: dict[str, Any] = {"input_ids": feeds["input_ids"]}
        grown = (dec.in_place and model.runtime.writes_concat_in_place
                 and p * dec.bytes_per_token(1) >= IN_PLACE_BYTES)  # fmt: skip
        bufs: dict[str, Any] | None = {} if grown else None
        for c in dec.cache:  # as generate() steps: the cache in one buffer past the size
            ort_feeds[c.past] = out[c.present]
            if bufs is None:
                feeds[c.past] = out[c.present]
                continue
            buf = c.buffer(1, p + 1)
            buf[c.upto(p)] = out[c.present]
            feeds[c.past], bufs[c.present] = buf[c.upto(p)], buf[c.upto(p + 1)]
        if dec.attention_mask:
            feeds[dec.attention_mask] = np.ones((1, p + 1), np.int64)
        if dec.position_ids:
            feeds[dec.position_ids] = np.array([[p]], np.int64)
        ort_feeds.update({k: v for k, v in feeds.items() if not k.startswith("past")})
        settle(model, lambda f=feeds, b=bufs: [model.run(f, b) for _ in range(HOT)])
        t_ms: list[float] = []
        o_ms: list[float] = []
        for i in range(BLOCKS):  # blocks of steps, the runtimes alternating block by block
            for k in (0, 1) if i % 2 == 0 else (1, 0):
                for j in range(BLOCK):
                    t = time.perf_counter()
                    if k == 0:
                        model.run(feeds, bufs)
                    else:
                        sess.run(None, ort_feeds)
                    if j >= 2:  # a block's first steps meet the other runtime's caches
                        (t_ms if k == 0 else o_ms).append((time.perf_counter() - t) * 1e3)
        res["step"][p] = {"tfrt_py": statistics.median(t_ms), "ort": statistics.median(o_ms)}
    return res


# -- tfrt-py serve: streams over HTTP -------------------------------------------------------------


#: The serve part's warm-up: at least this long, at most ``SERVE_WARMUP_MAX_S``, until the
#: last ``SETTLED_RUNS`` one-stream runs agree within ``SETTLED_SPREAD``.
SERVE_WARMUP_MIN_S, SERVE_WARMUP_MAX_S = 20.0, 240.0
SETTLED_RUNS, SETTLED_SPREAD = 3, 0.15
#: How long the server may take to answer /readyz (``--warmup generate`` compiles first).
READY_TIMEOUT_S = 900.0


def serve_part(path: str, levels: list[int], new: int, rounds: int) -> dict[str, Any]:
    """``tfrt-py serve --warmup generate`` (a real process; the seconds until it is ready
    are reported) streaming ``generate_stream`` to ``levels`` concurrent clients (httpx,
    server-sent events). First a warm-up, reported apart (a box of dims a generation
    crosses that the server's warm-up did not compile compiles once hot, the interpreter
    serving meanwhile): runs of one and of the most streams alternating until the
    one-stream runs settle (``SETTLED_*``). Then ``rounds`` rounds,
    each a run of every level (each of ``k`` clients two streams one after another):
    aggregate tokens/s per level (median over rounds), the time to the first token
    against the prompt's own time (a one-token generation of a 16-token prompt in this
    process, after its own warm-up: ``warmup_generation``, as the server's), and the CPU
    time a token cost the server process and the clients (this process; they share the
    host's cores)."""
    import asyncio

    import httpx
    import numpy as np
    import serve_load

    import tfrt_py

    name = os.path.splitext(os.path.basename(path))[0]
    rng = np.random.default_rng(5)
    per = 2  # streams each client runs one after another in a level's run
    prompts = [rng.integers(0, 1000, 16).tolist() for _ in range(64)]
    local = tfrt_py.load(path)
    local.warmup_generation()  # as the server's --warmup generate: the steps compiled first
    for p in prompts[:20]:
        local.generate(p, max_new_tokens=2)
    prefill = []
    for p in prompts[:16]:
        t = time.perf_counter()
        local.generate(p, max_new_tokens=1)
        prefill.append(time.perf_counter() - t)
    expected = [local.generate(p, max_new_tokens=new)[16:].tolist() for p in prompts]
    mismatched = 0

    async def one(client: Any, k: int) -> tuple[float, int]:
        nonlocal mismatched
        body = {"input_ids": prompts[k], "parameters": {"max_tokens": new}}
        t0 = time.perf_counter()
        first, toks = 0.0, []
        url = f"/v2/models/{name}/generate_stream"
        async with client.stream("POST", url, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    toks.append(json.loads(line[6:])["output_ids"][0])
                    if len(toks) == 1:
                        first = time.perf_counter() - t0
        mismatched += toks != expected[k]
        return first, len(toks)

    server_pid = 0  # set once the server runs

    async def run_level(client: Any, k: int) -> tuple[float, list[float], float, float]:
        """k clients, each ``per`` streams one after another: tokens/s of all, firsts, and
        the CPU ms a token cost the server process and this (client) process."""
        got: list[tuple[float, int]] = []

        async def stream_after_stream(w: int) -> None:
            for r in range(per):
                got.append(await one(client, (w * per + r) % len(prompts)))

        t0, s0, c0 = time.perf_counter(), cpu_seconds(server_pid), time.process_time()
        await asyncio.gather(*(stream_after_stream(w) for w in range(k)))
        n = sum(n for _, n in got)
        server_ms = (cpu_seconds(server_pid) - s0) * 1e3 / max(1, n)
        client_ms = (time.process_time() - c0) * 1e3 / max(1, n)
        return n / (time.perf_counter() - t0), [f for f, _ in got], server_ms, client_ms

    async def session(port: int) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=max(levels))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                     timeout=600) as client:  # fmt: skip
            trace: list[tuple[float, int, float]] = []  # (s since ready, streams, tok/s)
            t0 = time.perf_counter()
            ones: list[float] = []
            while True:
                for k in (1, max(levels)):
                    tok_s, *_ = await run_level(client, k)
                    trace.append((time.perf_counter() - t0, k, tok_s))
                    if k == 1:
                        ones.append(tok_s)
                spent = time.perf_counter() - t0
                last = ones[-SETTLED_RUNS:]
                settled = len(last) == SETTLED_RUNS and max(last) <= min(last) * (
                    1 + SETTLED_SPREAD)  # fmt: skip
                if spent >= SERVE_WARMUP_MAX_S or (settled and spent >= SERVE_WARMUP_MIN_S):
                    break
            rates: dict[int, list[float]] = {k: [] for k in levels}
            firsts: dict[int, list[float]] = {k: [] for k in levels}
            cpu: dict[int, list[tuple[float, float]]] = {k: [] for k in levels}
            for _ in range(rounds):
                for k in levels:
                    tok_s, fs, server_ms, client_ms = await run_level(client, k)
                    rates[k].append(tok_s)
                    firsts[k] += fs
                    cpu[k].append((server_ms, client_ms))
        res = [{"streams": k, "tok_s": statistics.median(rates[k]),
                "tok_s_range": [min(rates[k]), max(rates[k])],
                "first_p50_ms": statistics.median(firsts[k]) * 1e3,
                "first_p99_ms": float(np.percentile(firsts[k], 99)) * 1e3,
                "server_cpu_ms_per_token": statistics.median(c[0] for c in cpu[k]),
                "client_cpu_ms_per_token": statistics.median(c[1] for c in cpu[k])}
               for k in levels]  # fmt: skip
        return {"levels": res, "warmup": trace, "settled_after_s": trace[-1][0]}

    async def ready(port: int, proc: Any) -> float:
        """Seconds until /readyz answers 200 (the warm-up compiles first: minutes with a
        cold compile cache)."""
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while proc.poll() is None and time.perf_counter() - t0 < READY_TIMEOUT_S:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/readyz")).status_code == 200:
                        return time.perf_counter() - t0
                await asyncio.sleep(0.2)
        raise SystemExit(f"tfrt-py serve {name}: not ready")

    with tempfile.TemporaryDirectory() as tmp:
        t_start = time.perf_counter()
        proc, port = serve_load.start_server([path], "off", os.path.join(tmp, "log"),
                                             ["--no-grpc", "--warmup", "generate"],
                                             "default")  # fmt: skip
        server_pid = proc.pid
        try:
            listening = time.perf_counter() - t_start
            ready_s = listening + asyncio.run(ready(port, proc))
            got = asyncio.run(session(port))
        finally:
            proc.terminate()
            proc.wait(30)
    return {"prefill_ms": statistics.median(prefill) * 1e3, **got, "rounds": rounds,
            "ready_s": ready_s, "mismatched": mismatched}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux ``/proc``; 0.0 where it
    cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def serve_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| model | streams | tokens/s, all streams: median (range) over rounds | vs 1 stream "
             "| first token p50 / p99 ms "
             "| the prompt's own time ms | CPU ms a token: server / clients "
             "| streams unlike generate() |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:120]} |")
            continue
        one = r["levels"][0]["tok_s"]
        for lv in r["levels"]:
            lo, hi = lv["tok_s_range"]
            lines.append(f"| {name} | {lv['streams']} | {lv['tok_s']:.0f} ({lo:.0f}-{hi:.0f}) | "
                         f"{lv['tok_s'] / one:.2f}x | {lv['first_p50_ms']:.1f} / "
                         f"{lv['first_p99_ms']:.1f} | {r['prefill_ms']:.1f} | "
                         f"{lv['server_cpu_ms_per_token']:.3f} / "
                         f"{lv['client_cpu_ms_per_token']:.3f} | {r['mismatched']} |")  # fmt: skip
    for name, r in results.items():
        if "warmup" in r:
            shown = ", ".join(f"{t:.0f} s: {k} x {v:.0f}" for t, k, v in r["warmup"])
            lines.append("")
            lines.append(f"{name}: ready {r['ready_s']:.0f} s after start (``--warmup "
                         f"generate``); then the warm-up runs (streams x tok/s; settled "
                         f"after {r['settled_after_s']:.0f} s): {shown}")  # fmt: skip
    return lines


# -- the parent ------------------------------------------------------------------------------------


def run_child(path: str, a: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        env["TFRT_PY_CACHE_DIR"] = cache
        args = [sys.executable, __file__, "--child", path, str(a.rounds), str(a.new_tokens),
                a.prompts, a.pasts, str(a.threads)]  # fmt: skip
        r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def table(results: dict[str, dict[str, Any]], a: argparse.Namespace) -> list[str]:
    lines = ["| model | tokens (b1, b4) | settled after s | prompt | tfrt_py tok/s (first) | "
             "ort tok/s | ort+iobinding tok/s | vs ort | vs iobinding |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    steps = ["| model | " + " | ".join(f"step @{p} tfrt / ort ms" for p in a.pasts.split(","))
             + " | growth tfrt | growth ort | step ratio (geomean) |",
             "|---|" + "---:|" * (len(a.pasts.split(",")) + 3)]  # fmt: skip
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:120]} |")
            continue
        exact = ", ".join("exact" if v else "DIFFER" for v in r["tokens"].values())
        for plen, g in r["generate"].items():
            t, o, b = g["tfrt_py"], g["ort"], g["ort+iobinding"]
            vs_o, vs_b = t["tok_s"] / o["tok_s"], t["tok_s"] / b["tok_s"]
            lines.append(f"| {name} | {exact} | {r.get('settled_s', 0):.1f} | {plen} | "
                         f"{t['tok_s']:.0f} "
                         f"({t['first_tok_s']:.0f}) | {o['tok_s']:.0f} | {b['tok_s']:.0f} | "
                         f"{vs_o:.2f}x | {vs_b:.2f}x |")  # fmt: skip
        st = r["step"]
        ps = list(st)
        ratios = [st[p]["tfrt_py"] / st[p]["ort"] for p in ps]
        geo = statistics.geometric_mean(ratios)
        cells = " | ".join(f"{st[p]['tfrt_py']:.2f} / {st[p]['ort']:.2f}" for p in ps)
        growth_t = st[ps[-1]]["tfrt_py"] / st[ps[0]]["tfrt_py"]
        growth_o = st[ps[-1]]["ort"] / st[ps[0]]["ort"]
        steps.append(f"| {name} | {cells} | {growth_t:.2f}x | {growth_o:.2f}x | {geo:.2f}x |")
    return [*lines, "", *steps]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        path, rounds, new, prompts, pasts, threads = sys.argv[2:8]
        res = child(path, int(rounds), int(new), [int(x) for x in prompts.split(",")],
                    [int(x) for x in pasts.split(",")], int(threads))  # fmt: skip
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decoders", default=",".join(DECODERS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", default="16,128")
    ap.add_argument("--pasts", default="16,128,512")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--streams", default="1,4,16", help="concurrent streams ('' to skip)")
    ap.add_argument("--serve-decoders", default="gpt2,llama")
    ap.add_argument(
        "--serve-rounds",
        type=int,
        default=6,
        help="rounds of every streams level, after the server's warm-up",
    )
    ap.add_argument("--out", default=os.path.join(HERE, "results", "generate"))
    a = ap.parse_args()
    results = {}
    paths = decoder_paths(a.decoders.split(","))
    for name, path in paths.items():
        print(f"generate: {name} ...", flush=True)
        results[name] = run_child(path, a)
    lines = [f"# Generation ({time.strftime('%Y-%m-%d')})", "",
             f"Host: {host_line()}; {a.threads} thread(s) per runtime; {a.rounds} rounds; "
             f"{a.new_tokens} new tokens; greedy.", "", *table(results, a)]  # fmt: skip
    served: dict[str, Any] = {}
    if a.streams:
        levels = [int(x) for x in a.streams.split(",")]
        for name in a.serve_decoders.split(","):
            if name in paths:
                print(f"serve: {name} ...", flush=True)
                try:
                    served[name] = serve_part(paths[name], levels, a.new_tokens, a.serve_rounds)
                except Exception as e:  # noqa: BLE001 - reported, the rest still measured
                    served[name] = {"error": f"{type(e).__name__}: {e}"}
        lines += ["", f"## tfrt-py serve, generate_stream ({a.new_tokens} tokens a stream, "
                  "16-token prompts, httpx)", "", *serve_table(served)]  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "generate.json"), "w") as f:
        json.dump({"host": host_line(), "results": results, "serve": served}, f, indent=1)
    with open(os.path.join(a.out, "generate.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
