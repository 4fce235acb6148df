"""One com.microsoft MatMulNBits node at a time, tfrt_py against onnxruntime at
``accuracy_level`` 0 (float32 products) and 4 (A quantized to int8 per block: the CPU
default of onnxruntime-genai's model builder), interleaved in one process.

    python benchmarks/nbits_nodes.py [--seconds 3] [--levels 0,4] [--zp packed|none]

Cases: a decoder's products at decode (1 row) and prompt sizes (16 and 64 rows), K x N from
256 x 256 to 2048 x 8192, 4 bits, block 32; the weight, scales and zero points constant
(random codes from a fixed seed; zero points packed, as ``MatMulNBitsQuantizer`` writes
them, or absent with ``--zp none``). Per case and level, rounds of one call each of
tfrt_py's and onnxruntime's sessions (both at their default threads: tfrt_py's, and
onnxruntime's ``intra_op_num_threads`` = the CPUs, spinning off), order rotating; medians
and p99 in µs, and the ratio. Every output is checked against onnxruntime's at the same
level (max |diff| / max |onnxruntime|). The two runtimes' copies of the weight alternate
through the caches. BLAS variables (``OPENBLAS_CORETYPE``,
``OPENBLAS_L2_SIZE``) should be unset for figures a user meets.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CASES = [(256, 256, 1), (256, 1024, 1), (2048, 2048, 1), (2048, 8192, 1), (2048, 2048, 16),
         (256, 1024, 64), (2048, 2048, 64)]  # fmt: skip


def _cpu() -> str:
    from tfrt_py.kernels.lib.features import cpu_flags

    flags = " ".join(k for k, on in cpu_flags().items() if on)
    name = "?"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return f"{name}, {flags}, {os.cpu_count()} CPUs"


def _model(k: int, n: int, rows: int, level: int, zp: str, rng: Any) -> tuple[Any, dict[str, Any]]:
    from tests.support.contrib import nbits_inputs, node_model, runtime_feeds

    inputs = nbits_inputs(rng, (rows,), k, n, 4, 32, zp, bias=False)
    attrs = {"K": k, "N": n, "bits": 4, "block_size": 32, "accuracy_level": level}
    return node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3)), runtime_feeds(
        inputs, (1, 2, 3)
    )


def _interleaved(tm: Any, sess: Any, feeds: dict[str, Any],
                 seconds: float) -> tuple[list[list[float]], int]:  # fmt: skip
    """Rounds of one call each (order rotating) for ``seconds``, at least 6: (tfrt_py's
    and onnxruntime's times, rounds)."""
    runs = [lambda: tm.run(feeds), lambda: sess.run(None, feeds)]
    times: list[list[float]] = [[], []]
    end, i = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or i < 6:
        for j in (i % 2, 1 - i % 2):
            t0 = time.perf_counter()
            runs[j]()
            times[j].append(time.perf_counter() - t0)
        i += 1
    return times, i


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per case and level")
    ap.add_argument("--levels", default="0,4")
    ap.add_argument("--zp", default="packed", choices=["packed", "none"])
    a = ap.parse_args()
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.kernels.lib import qnbits_ir

    levels = [int(x) for x in a.levels.split(",")]
    rng = np.random.default_rng(0)
    rows_out = []
    for k, n, rows in CASES:
        for level in levels:
            model, feeds = _model(k, n, rows, level, a.zp, rng)
            tm = tfrt_py.load(model)
            so = ort.SessionOptions()
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.intra_op_num_threads = os.cpu_count() or 1
            sess = ort.InferenceSession(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])  # fmt: skip
            got, want = tm.run(feeds)["y0"], sess.run(None, feeds)[0]
            err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            times, i = _interleaved(tm, sess, feeds, a.seconds)
            med = [float(np.median(t)) * 1e6 for t in times]
            p99 = [float(np.percentile(t, 99)) * 1e6 for t in times]
            rows_out.append((k, n, rows, level, med, p99, i, err))
            print(f"  {k} x {n}, {rows} row(s), level {level}: tfrt_py {med[0]:,.1f} µs, "
                  f"onnxruntime {med[1]:,.1f} µs, ratio {med[0] / med[1]:.2f}, err {err:.1g}",
                  flush=True)  # fmt: skip
    print(f"\n# MatMulNBits nodes ({time.strftime('%Y-%m-%d')})\n")
    print(f"CPU: {_cpu()}. tfrt_py {tfrt_py.__version__} (level 4: "
          f"{qnbits_ir.describe() or 'its kernel not built'}), onnxruntime {ort.__version__}. "
          f"4 bits, block 32, zero points {a.zp}; {a.seconds:g} s of interleaved rounds per "
          "row. Match: max |diff| / max |onnxruntime| at the same level.\n")  # fmt: skip
    print(
        "| K x N | rows | level | rounds | tfrt_py median / p99 µs | onnxruntime median / "
        "p99 µs | tfrt/ort | match |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for k, n, rows, level, med, p99, i, err in rows_out:
        print(f"| {k} x {n} | {rows} | {level} | {i} | {med[0]:,.1f} / {p99[0]:,.1f} | "
              f"{med[1]:,.1f} / {p99[1]:,.1f} | **{med[0] / med[1]:.2f}x** | "
              f"{'yes' if err < 1e-4 else 'NO'} ({err:.1g}) |")  # fmt: skip
    for level in levels:
        r = [m[0] / m[1] for _, _, _, lv, m, _, _, _ in rows_out if lv == level]
        print(
            f"| **geomean, level {level}** | | | | | | "
            f"**{float(np.exp(np.mean(np.log(r)))):.2f}x** | |"
        )


if __name__ == "__main__":
    main()
