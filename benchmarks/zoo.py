"""The classic-ML zoo: tfrt_py (auto) vs onnxruntime's InferenceSession.run, per model at
batch 1 and 1000, plus cold compile and warm (cached) load times.

    python benchmarks/zoo.py [--zoo benchmarks/zoo] [--seconds S] [--out DIR]

Run ``benchmarks/zoo_build.py`` first (``make bench-zoo`` does both). Each model is loaded
with ``executor="auto", native="eager"``, waited for until it runs on compiled code
(``wait_compiled``: the steady state, not a cold process's first seconds, which
``benchmarks/first_result.py`` measures) and called until auto's measured choice is made;
its outputs are checked against the onnxruntime outputs the builder saved; then both are
timed interleaved in this process (``tfrt_py.bench.measure``), ratio = tfrt_py / onnxruntime
(below 1: faster); onnxruntime's thread spinning is off unless ``--ort-spinning`` (its
spinning pool threads otherwise take the cores from the interleaved bursts).
"identity" is a one-Identity model with a dynamic batch: the cost of
the call path itself (feed check, dict in and out). Cold = a fresh cache dir in a new
process (numba import included), warm = the same again (numba's cache answers). Prints a
markdown table and writes ``zoo.md``, ``zoo.json`` and ``zoo.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import tfrt_py
m = tfrt_py.load(sys.argv[1], native="eager")
t1 = time.perf_counter()
c = m.native.compiled if m.native is not None and m.native.compiled else None
print(json.dumps({"load": t1 - t0, "compile": c.seconds if c else None,
                  "hit": c.cache_hit if c else None, "executor": m.executor}))
"""


def _load_times(path: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TFRT_PY_CACHE_DIR=os.path.join(cache, "c"))
        env.pop("TFRT_PY_NATIVE", None)
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", _CHILD, path], env=env, check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            runs.append(json.loads(out.strip().splitlines()[-1]))
    return {"cold_s": runs[0]["compile"], "warm_s": runs[1]["compile"],
            "cold_load_s": runs[0]["load"], "warm_load_s": runs[1]["load"],
            "warm_hit": runs[1]["hit"]}  # fmt: skip


def _identity() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])
    g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _check(got: dict, saved: np.lib.npyio.NpzFile, batch: int) -> str:
    """ "ok", or what differs from onnxruntime's saved outputs (the row is still timed, and
    the table says so: a mismatch is a finding, not a reason to stop the zoo)."""
    try:
        _assert_same(got, saved, batch)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        worst = [ln for ln in lines if ln.startswith("Max")]
        return "MISMATCH " + (lines[-1] if not worst else "; ".join(worst))
    return "ok"


def _assert_same(got: dict, saved: np.lib.npyio.NpzFile, batch: int) -> None:
    for name, val in got.items():
        want = saved[f"{name}_{batch}"]
        if isinstance(val, list):
            val = np.array([list(r.values()) for r in val])
        val = np.asarray(val)
        if want.dtype.kind == "f":  # issue 39: probabilities within 1e-5 relative
            np.testing.assert_allclose(val, want, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(val.astype(want.dtype), want, err_msg=name)


def _feeds(saved: np.lib.npyio.NpzFile, batch: int) -> dict[str, np.ndarray]:
    """The saved feeds at ``batch``: ``X``, or every named input (strings as object
    arrays, as a user passes them)."""
    named = {k[3 : -len(f"_{batch}")]: saved[k] for k in saved.files
             if k.startswith("in:") and k.endswith(f"_{batch}")}  # fmt: skip
    if not named:
        return {"X": saved[f"X_{batch}"]}
    return {k: v.astype(object) if v.dtype.kind == "U" else v for k, v in named.items()}


def bench(name: str, source: object, feeds_by_batch: dict, seconds: float,
          saved: object = None, spinning: bool = False) -> list[dict]:  # fmt: skip
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.bench import measure

    model = tfrt_py.load(source, native="eager")
    data = source if isinstance(source, bytes) else open(source, "rb").read()  # noqa: SIM115
    so = ort.SessionOptions()
    if not spinning:
        # onnxruntime's pool threads spin after each run by default; in one process,
        # interleaved, they take the cores from the next burst (the other runtime's).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    rows = []
    model.run(next(iter(feeds_by_batch.values())))
    model.wait_compiled(120)  # the steady state: a cold process's first seconds are not it
    for batch, feeds in feeds_by_batch.items():
        for _ in range(30):  # auto's trial for this batch class
            got = model.run(feeds)
        check = "ok" if saved is None else _check(got, saved, batch)
        if check != "ok":
            print(f"{name} batch {batch}: {check}")
        res = measure({"tfrt_py auto": lambda f=feeds: model.run(f),
                       "onnxruntime run": lambda f=feeds: sess.run(None, f)},
                      "onnxruntime run", seconds)  # fmt: skip
        t, o = res["tfrt_py auto"], res["onnxruntime run"]
        rows.append({"model": name, "batch": batch, "tfrt_us": t.median_us,
                     "ort_us": o.median_us, "ratio": t.ratio,
                     "executor": model.executor, "check": check})  # fmt: skip
    print(model.describe().split("\n  memory")[0].splitlines()[0])
    for line in model.describe().splitlines():
        if "measured" in line or line.strip().startswith("native:"):
            print("   ", line.strip())
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoo", default=os.path.join(HERE, "zoo"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-load-times", action="store_true")
    ap.add_argument("--ort-spinning", action="store_true",
                    help="leave onnxruntime's thread spinning on (its default)")  # fmt: skip
    args = ap.parse_args()
    os.environ.pop("TFRT_PY_NATIVE", None)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = bench("identity", _identity(), {b: {"X": rng.standard_normal((b, 4)).astype(np.float32)}
                                           for b in (1, 1000)}, args.seconds,
                 spinning=args.ort_spinning)  # fmt: skip
    loads = {}
    for f in sorted(os.listdir(args.zoo)):
        if not f.endswith(".onnx"):
            continue
        name, path = f[:-5], os.path.join(args.zoo, f)
        saved = np.load(os.path.join(args.zoo, name + ".npz"))
        feeds = {b: _feeds(saved, b) for b in (1, 1000)}
        rows += bench(name, path, feeds, args.seconds, saved, args.ort_spinning)
        if not args.no_load_times:
            loads[name] = _load_times(path)
    lines = ["| model | batch | executor | tfrt_py auto µs | onnxruntime run µs | ratio | "
             "matches onnxruntime |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['model']} | {r['batch']} | {r['executor']} | {r['tfrt_us']:.1f} | "
              f"{r['ort_us']:.1f} | {r['ratio']:.2f} | {r['check']} |" for r in rows]  # fmt: skip
    if loads:
        lines += ["", "| model | cold compile s | warm load s (cache hit) | cold load s | "
                  "warm load s |", "|---|---|---|---|---|"]  # fmt: skip
        for name, lt in loads.items():
            fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            lines.append(f"| {name} | {fmt(lt['cold_s'])} | {fmt(lt['warm_s'])} "
                         f"({lt['warm_hit']}) | {fmt(lt['cold_load_s'])} | "
                         f"{fmt(lt['warm_load_s'])} |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "zoo.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(args.out, "zoo.json"), "w") as fh:
        json.dump({"rows": rows, "loads": loads}, fh, indent=1)
    _plot(rows, os.path.join(args.out, "zoo.png"))


def _plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len(names)))
    for k, batch in enumerate((1, 1000)):
        vals = [next((r["ratio"] for r in rows if r["model"] == n and r["batch"] == batch),
                     np.nan) for n in names]  # fmt: skip
        ax.barh(np.arange(len(names)) + 0.4 * k, vals, height=0.4, label=f"batch {batch}")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(np.arange(len(names)) + 0.2, names)
    ax.set_xlabel("tfrt_py auto / onnxruntime run (median paired ratio; < 1 is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
