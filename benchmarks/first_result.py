"""Time to the first result in a new process: tfrt_py against onnxruntime (issue 33).

Each sample is one whole process -- start the interpreter, import NumPy and the runtime,
load a model, run it once, exit -- timed from spawn to exit, with tfrt_py's and
onnxruntime's processes interleaved. Three tfrt_py rows:

- ``import cache warm``: the model was loaded once before (by any process), so its graph is
  read from tfrt_py's import cache and ``onnx`` is not imported (what every process after
  the first meets: a CLI, a restarted server, a Ray actor, a serverless start);
- ``import cache cold``: a model this installation has never loaded (each process gets a
  copy whose bytes differ), so the load imports ``onnx`` and writes the entry;
- ``import cache off``: ``TFRT_PY_GRAPH_CACHE=0``.

    python benchmarks/first_result.py [--model PATH] [--rounds 30]

Both runtimes' compiled code is already on disk (numba's cache for tfrt_py's kernels is
warmed by a first untimed process). The import cache lives in a temporary
``TFRT_PY_CACHE_DIR`` of this run. Measure with ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE``
unset and nothing else running; the figures are medians, means and p90 of wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(os.path.dirname(HERE), "tfrt_py", "examples", "mlp_small.onnx")

TFRT = """
import sys
import numpy as np
import tfrt_py
m = tfrt_py.load(sys.argv[1])
m.run({s.name: np.ones([d if isinstance(d, int) else 1 for d in s.shape], np.float32)
       for s in m.inputs})
"""
ORT = """
import sys
import numpy as np
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
s.run(None, {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in s.get_inputs()})
"""


def _spawn(script: str, model: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", script, model], env=env, check=True)
    return time.perf_counter() - t0


def _fresh_copy(model: onnx.ModelProto, d: str, i: int) -> str:
    """A copy of ``model`` whose bytes no earlier process loaded (another doc string)."""
    model.doc_string = f"first_result copy {i}"
    path = os.path.join(d, f"copy{i}.onnx")
    onnx.save(model, path)
    return path


def _row(name: str, xs: list[float], ref: list[float]) -> str:
    ratio = statistics.median(a / b for a, b in zip(xs, ref, strict=True))
    xs_sorted = sorted(xs)
    p90 = xs_sorted[min(len(xs) - 1, int(0.9 * len(xs)))]
    return (
        f"{name:<28} median {statistics.median(xs) * 1e3:7.1f} ms  mean "
        f"{statistics.fmean(xs) * 1e3:7.1f}  p90 {p90 * 1e3:7.1f}  "
        f"x onnxruntime (median of pair ratios) {ratio:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    proto = onnx.load(args.model)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TFRT_PY_CACHE_DIR=os.path.join(d, "cache"))
        env.pop("TFRT_PY_GRAPH_CACHE", None)
        off = dict(env, TFRT_PY_GRAPH_CACHE="0")
        for _ in range(2):  # numba's kernel cache and the import cache warm; OS caches hot
            _spawn(TFRT, args.model, env)
            _spawn(ORT, args.model, env)
        rows: dict[str, list[float]] = {"warm": [], "cold": [], "off": [], "ort": []}
        for i in range(args.rounds):
            copy = _fresh_copy(proto, d, i)
            rows["ort"].append(_spawn(ORT, args.model, env))
            rows["warm"].append(_spawn(TFRT, args.model, env))
            rows["cold"].append(_spawn(TFRT, copy, env))
            rows["off"].append(_spawn(TFRT, args.model, off))
    ort = rows["ort"]
    print(f"model {args.model}; {args.rounds} rounds, interleaved; whole processes, wall time")
    print(_row("onnxruntime", ort, ort))
    print(_row("tfrt_py, import cache warm", rows["warm"], ort))
    print(_row("tfrt_py, import cache cold", rows["cold"], ort))
    print(_row("tfrt_py, import cache off", rows["off"], ort))


if __name__ == "__main__":
    main()
