"""Per-path kernel microbenchmark (issue 35 item 5): GFLOP/s of tfrt_py's products and convs
on every kernel path this host runs, against the path's measured peak and against
onnxruntime on the same shapes.

    python benchmarks/kernels.py [--paths avx512,avx2] [--seconds 1.5] [--json out.json]

Each path runs in its own child process (``TFRT_PY_ISA=<path>``: the packed gemm's tile and
numba's vector width are chosen once per process), one thread for both runtimes. In a
child:

* **peak**: one core's fused multiply-add throughput at the path's vector width, measured
  by an LLVM IR loop of independent FMA chains in registers (``cores x frequency x FMA
  width`` as this VM's clock actually runs it; the nominal clock of a VM is not what it
  runs at);
* **gemm**: the packed-weight product (``lib/gemm_packed``) called directly on the zoo's
  large shapes (ViT-Tiny's and BERT's linear layers), and the same product as a one-node
  ONNX MatMul with a constant weight through ``tfrt_py.load`` and onnxruntime;
* **conv**: one-node ONNX Convs (with bias) at ResNet-18's, MobileNetV2's and SqueezeNet's
  shapes through ``tfrt_py.load`` (the kernel each plan picks: ``conv_cols``' 14 x 32 or
  6 x 16 tile, a pointwise conv's BLAS, the depthwise kernels) and onnxruntime.

Timings are medians of bursts interleaved with onnxruntime's in one process
(``tfrt_py.bench.measure``), onnxruntime's threads not spinning. Every row prints the
path; a path the host lacks is not run and is named. BLAS variables
(``OPENBLAS_CORETYPE``, ``OPENBLAS_L2_SIZE``) should be unset for figures a user meets.
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
ROOT = os.path.dirname(HERE)

#: (label, M, K, N): x (M x K) @ W (K x N), W constant (packed at load).
GEMMS = [
    ("ViT-Tiny qkv 197x192 @ 192x576", 197, 192, 576),
    ("ViT-Tiny mlp 197x192 @ 192x768", 197, 192, 768),
    ("ViT-Tiny mlp 197x768 @ 768x192", 197, 768, 192),
    ("BERT 128x256 @ 256x1024", 128, 256, 1024),
    ("square 512x512 @ 512x512", 512, 512, 512),
]
#: (label, C_in, H, C_out, kernel, stride, pad, group)
CONVS = [
    ("ResNet-18 stem 3x224 7x7/2 ->64", 3, 224, 64, 7, 2, 3, 1),
    ("ResNet-18 64x56 3x3 ->64", 64, 56, 64, 3, 1, 1, 1),
    ("ResNet-18 128x28 3x3 ->128", 128, 28, 128, 3, 1, 1, 1),
    ("ResNet-18 256x14 3x3 ->256", 256, 14, 256, 3, 1, 1, 1),
    ("ResNet-18 512x7 3x3 ->512", 512, 7, 512, 3, 1, 1, 1),
    ("ResNet-18 64x56 3x3/2 ->128", 64, 56, 128, 3, 2, 1, 1),
    ("SqueezeNet 16x55 3x3 ->64", 16, 55, 64, 3, 1, 1, 1),
    ("SqueezeNet 512x13 1x1 ->1000", 512, 13, 1000, 1, 1, 0, 1),
    ("MobileNetV2 320x7 1x1 ->1280", 320, 7, 1280, 1, 1, 0, 1),
    ("MobileNetV2 32x112 1x1 ->16", 32, 112, 16, 1, 1, 0, 1),
    ("MobileNetV2 96x112 dw 3x3/2", 96, 112, 96, 3, 2, 1, 96),
    ("MobileNetV2 576x14 dw 3x3", 576, 14, 576, 3, 1, 1, 576),
]
#: independent FMA chains in the peak loop: enough to cover a 4-cycle latency on 2 pipes,
#: few enough that they and the loop's two constants fit sixteen ymm registers (16 chains
#: spilled on an AVX2 CPU without AVX-512: Zen 3 measured 54.8 GFLOP/s a core, half its
#: peak, and the packed gemm read 171% of it)
PEAK_CHAINS = 10
PEAK_ITERS = 1 << 22


# -- child: one path ---------------------------------------------------------------------


def _peak_ir(vw: int) -> str:
    """``peak(n)``: n iterations of PEAK_CHAINS independent vw-wide FMAs; returns a lane."""
    import llvmlite.ir as ir

    f32, i64 = ir.FloatType(), ir.IntType(64)
    v = ir.VectorType(f32, vw)
    mod = ir.Module(name="tfrt_py_peak")
    fma = ir.Function(mod, ir.FunctionType(v, [v, v, v]), name=f"llvm.fma.v{vw}f32")
    fn = ir.Function(mod, ir.FunctionType(f32, [i64]), name="tfrt_py_peak")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    head, body, done = (fn.append_basic_block() for _ in range(3))
    pre = b.block
    one = ir.Constant(v, [1.0000001] * vw)
    tiny = ir.Constant(v, [1e-9] * vw)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), pre)
    acc = []
    for c in range(PEAK_CHAINS):
        a = b.phi(v)
        a.add_incoming(ir.Constant(v, [float(c)] * vw), pre)
        acc.append(a)
    b.cbranch(b.icmp_signed("<", i, fn.args[0]), body, done)
    b.position_at_end(body)
    new = [b.call(fma, [a, one, tiny]) for a in acc]
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), body)
    for a, n in zip(acc, new, strict=True):
        a.add_incoming(n, body)
    b.branch(head)
    b.position_at_end(done)
    s = acc[0]
    for a in acc[1:]:
        s = b.fadd(s, a)
    b.ret(b.extract_element(s, ir.Constant(ir.IntType(32), 0)))
    text = str(mod)
    if vw * 32 > 256:  # zmm registers: as gemm_packed asks for them (LLVM splits otherwise)
        from tfrt_py.kernels.lib.gemm_packed import _WIDE_ATTRS

        head, rest = text.split('define float @"tfrt_py_peak"(', 1)
        args, body = rest.split(")", 1)
        text = f'{head}define float @"tfrt_py_peak"({args}) #0{body}' + _WIDE_ATTRS
    return text


def peak_gflops(vw: int) -> float:
    """One core's measured FMA throughput at vector width ``vw`` (best of 5), GFLOP/s."""
    import ctypes

    from tfrt_py.concurrency.llvm_jit import compile_ir

    engine = compile_ir(_peak_ir(vw), host_cpu=True, opt=2)
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(
        engine.get_function_address("tfrt_py_peak")
    )
    fn(1000)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        fn(PEAK_ITERS)
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * vw * PEAK_CHAINS * PEAK_ITERS / dt / 1e9)
    return best


def _one_node(op: Any, inputs: list[Any], inits: list[Any], opset: int = 17) -> bytes:
    from onnx import TensorProto, helper

    g = helper.make_graph([op], "k", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=inits)  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _pair(model: bytes, feeds: dict, seconds: float) -> tuple[float, float, float]:
    """(tfrt_py µs, onnxruntime µs, max relative difference), one thread each, interleaved."""
    import numpy as np
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.bench import measure

    m = tfrt_py.load(model, threads=1, executor="sync")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    m.warmup([feeds])
    got, want = m.run(feeds)["y"], s.run(None, feeds)[0]
    err = float(np.abs(got - want).max() / (np.abs(want).max() or 1.0))
    res = measure({"tfrt_py": lambda: m.run(feeds), "onnxruntime": lambda: s.run(None, feeds)},
                  "onnxruntime", seconds, burst_s=0.02)  # fmt: skip
    return res["tfrt_py"].median_us, res["onnxruntime"].median_us, err


def gemm_rows(seconds: float) -> list[dict]:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tfrt_py.kernels.lib import gemm_packed

    rows = []
    rng = np.random.default_rng(0)
    kern, tile = gemm_packed.kernel(), gemm_packed.tile()
    for label, m, k, n in GEMMS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        flops = 2.0 * m * k * n
        direct = float("nan")
        if kern is not None and tile is not None and n % tile.nr == 0:
            wp = gemm_packed.pack(w)
            y = np.empty((m, n), np.float32)
            bias = np.zeros(n, np.float32)

            args = (x, 0, k, wp, 0, y, 0, n, m, k, n, bias, 0, 0, tile.nr)

            def call(args: tuple = args) -> None:
                kern(*args)

            call()
            np.testing.assert_allclose(y, x @ w, rtol=1e-3, atol=1e-3)
            ts = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(20):
                    call()
                ts.append((time.perf_counter() - t0) / 20)
            direct = flops / sorted(ts)[3] / 1e9
        op = helper.make_node("MatMul", ["x", "w"], ["y"])
        model = _one_node(op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [numpy_helper.from_array(w, "w")])  # fmt: skip
        t_us, o_us, err = _pair(model, {"x": x}, seconds)
        rows.append({"kind": "gemm", "shape": label, "flops": flops, "kernel_gflops": direct,
                     "tfrt_gflops": flops / t_us / 1e3, "ort_gflops": flops / o_us / 1e3,
                     "tfrt_us": t_us, "ort_us": o_us, "err": err})  # fmt: skip
    return rows


def conv_rows(seconds: float) -> list[dict]:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rows = []
    rng = np.random.default_rng(1)
    for label, ci, h, co, kk, s, p, g in CONVS:
        x = rng.standard_normal((1, ci, h, h)).astype(np.float32)
        w = (rng.standard_normal((co, ci // g, kk, kk)) * 0.1).astype(np.float32)
        bias = rng.standard_normal(co).astype(np.float32)
        op = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kk, kk],
                              strides=[s, s], pads=[p] * 4, group=g)  # fmt: skip
        model = _one_node(
            op,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
        )
        oh = (h + 2 * p - kk) // s + 1
        flops = 2.0 * co * (ci // g) * kk * kk * oh * oh
        t_us, o_us, err = _pair(model, {"x": x}, seconds)
        rows.append({"kind": "conv", "shape": label, "flops": flops, "kernel_gflops": float("nan"),
                     "tfrt_gflops": flops / t_us / 1e3, "ort_gflops": flops / o_us / 1e3,
                     "tfrt_us": t_us, "ort_us": o_us, "err": err})  # fmt: skip
    return rows


def child(seconds: float) -> dict:
    from tfrt_py.concurrency import numba_target
    from tfrt_py.kernels.lib import gemm_packed

    path, why = gemm_packed.path()
    vw = {"avx512": 16, "avx2": 8, "neon": 4}.get(path, 8)
    peak = peak_gflops(vw)
    rows = gemm_rows(seconds) + conv_rows(seconds)
    # numba's vector width is decided when tfrt_py first imports it (by the rows above)
    return {"path": path, "why": why, "numba": numba_target.state(), "peak_gflops": peak,
            "rows": rows}  # fmt: skip


# -- parent ------------------------------------------------------------------------------


def host_line() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def table(res: dict) -> str:
    peak = res["peak_gflops"]
    out = [
        f"### path {res['path']} ({res['why']}; numba: {res['numba']}); one core's measured "
        f"peak {peak:.1f} GFLOP/s; onnxruntime on its own kernels (MLAS picks its path: "
        f"TFRT_PY_ISA does not change it)",
        "",
        "| kind | shape | tfrt_py kernel GFLOP/s | tfrt_py GFLOP/s (% peak) | onnxruntime GFLOP/s "
        "(% peak) | tfrt_py / onnxruntime time | max rel diff |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        kg = "" if r["kernel_gflops"] != r["kernel_gflops"] else f"{r['kernel_gflops']:.1f}"
        out.append(
            f"| {r['kind']} | {r['shape']} | {kg} | {r['tfrt_gflops']:.1f} "
            f"({100 * r['tfrt_gflops'] / peak:.0f}%) | {r['ort_gflops']:.1f} "
            f"({100 * r['ort_gflops'] / peak:.0f}%) | {r['tfrt_us'] / r['ort_us']:.2f}x | "
            f"{r['err']:.1e} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default="", help="comma-separated; default: every path the host has")
    ap.add_argument("--seconds", type=float, default=1.5, help="timing per shape")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.seconds)))
        return 0
    sys.path.insert(0, ROOT)
    from tfrt_py.concurrency.isa import host_paths

    have = [p for p in host_paths() if p != "portable"]
    want = [p.strip() for p in a.paths.split(",") if p.strip()] or have
    print(f"host: {host_line()}; kernel paths it has: {', '.join(have) or 'none'}")
    results = []
    for path in want:
        if path not in have:
            print(f"\npath {path}: not run (this host has {', '.join(have) or 'none'})")
            continue
        env = dict(os.environ, TFRT_PY_ISA=path, PYTHONPATH=ROOT)
        proc = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(a.seconds)],
                              env=env, capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            print(f"\npath {path}: the child failed:\n{proc.stderr[-2000:]}")
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        print()
        print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"host": host_line(), "paths": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
