"""A fresh process's first result imports only what a small static model needs (issue 33:
the first result of a new process against onnxruntime's, where most of our time is
imports). Each module below was imported by that path before it was made lazy."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import ROOT

_FIRST_RESULT = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
import tfrt_py
m = tfrt_py.load({str(ROOT / "tfrt_py" / "examples" / "mlp_small.onnx")!r})
m.run({{s.name: np.ones([1 if isinstance(d, str) else d for d in s.shape], np.float32)
        for s in m.inputs}})
print(" ".join(sorted(k for k in sys.modules if k.startswith("tfrt_py"))))
"""

#: Not imported for a static MLP's first result, and why not.
NOT_NEEDED = {
    "tfrt_py.executors.dims": "the shape model: models with dynamic dims only",
    "tfrt_py.executors.plan_generic": "the one plan for every signature: dynamic dims only",
    "tfrt_py.compiler.shape_model": "fitting the shape model: dynamic dims only",
    "tfrt_py.concurrency.native_pool": "the compiled kernels' thread pool: installed by them",
    "tfrt_py.native.runtime.compile": "compiling a lowered model: the native tier only",
    "tfrt_py.frontends.onnx.external_ref": "external data: models that have it",
    **{
        f"tfrt_py.compiler.{p}": "a pass without its trigger ops (pipeline.TRIGGERS)"
        for p in (
            "fuse_qdq",
            "merge_branches",
            "fuse_conv",
            "channels_last",
            "fuse_trees",
            "fuse_ml",
            "hoist",
            "fuse_transformer",
            "fuse_attention",
        )
    },
}


def test_a_static_models_first_result_imports_only_what_it_uses() -> None:
    """With the native tier and the compiled kernels off: no background thread (a cold
    start's warm-up, a native compile) imports anything while the script lists the
    modules; the rest is a user's default."""
    env = {**os.environ, "TFRT_PY_NATIVE": "0", "TFRT_PY_JIT": "0"}
    env.pop("TFRT_PY_COLD_START", None)
    out = subprocess.run([sys.executable, "-c", _FIRST_RESULT], capture_output=True, text=True,
                         timeout=300, check=True, env=env).stdout.split()  # fmt: skip
    assert "tfrt_py.executors.interpreter" in out  # it did run
    assert "tfrt_py.compiler.fuse_linear" in out  # and the passes that apply
    assert {m: why for m, why in NOT_NEEDED.items() if m in out} == {}


def test_with_its_three_switches_off_a_process_imports_no_numba() -> None:
    """docs/configuration.md: ``TFRT_PY_JIT=0`` alone leaves the native tier and the
    packed-weight product, each with its own switch; all three off, neither numba nor
    llvmlite is imported (a deployment without a JIT)."""
    script = _FIRST_RESULT.replace(
        'print(" ".join(sorted(k for k in sys.modules if k.startswith("tfrt_py"))))',
        'print(" ".join(sorted(k for k in ("numba", "llvmlite") if k in sys.modules)) or "-")',
    )
    env = {**os.environ, "TFRT_PY_NATIVE": "0", "TFRT_PY_JIT": "0", "TFRT_PY_PACKED_GEMM": "0"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, check=True, env=env).stdout.split()  # fmt: skip
    assert out == ["-"], out
