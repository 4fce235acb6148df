"""A quantized conv's plan compiles the integer kernels for its own types only
(``Jitted.get_for``): a model of uint8 activations and int8 weights leaves the other
7 type combinations of each kernel uncompiled (before, the warm-ups compiled all 8 of
each, minutes a process on a cold numba cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import jit, qgemm_packed

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import tfrt_py
from tfrt_py.kernels.nn import conv_qdepthwise, conv_qint8

rng = np.random.default_rng(0)
def model(group, w):
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("xs", np.float32(0.05)), ("xz", np.uint8(128)), ("w", w), ("ws", np.float32(0.02)),
        ("wz", np.int8(0)), ("ys", np.float32(0.1)), ("yz", np.uint8(3)))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                            ["y"], pads=[1, 1, 1, 1], group=group)
    graph = helper.make_graph([node], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

x = rng.integers(0, 256, (1, 8, 6, 6)).astype(np.uint8)
for group, shape in ((1, (8, 8, 3, 3)), (8, (8, 1, 3, 3))):
    w = rng.integers(-60, 60, shape)
    tfrt_py.load(model(group, w.astype(np.int8)), executor="sync").run({"x": x})
out = {}
for name, k in (("conv", conv_qint8._QCONV), ("dw", conv_qdepthwise._QDEPTHWISE),
                ("dw_last", conv_qdepthwise._QDEPTHWISE_LAST)):
    fn = k.get()
    out[name] = [[str(t) for t in sig] for sig in fn.signatures] if fn is not None else None
print(json.dumps(out))
"""


@pytest.mark.skipif(not jit.jit_enabled() or qgemm_packed.available() is None,
                    reason="needs numba and the integer kernel ($TFRT_PY_JIT=0, "
                    "$TFRT_PY_PACKED_GEMM=0 or the portable path)")  # fmt: skip
@pytest.mark.compiles
def test_a_plan_compiles_only_its_own_types() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TFRT_PY_COLD_START": "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    sigs = json.loads(out.stdout.strip().splitlines()[-1])
    if sigs["conv"] is None or sigs["dw"] is None:
        pytest.skip("the compiled integer convs do not run here (no native thread layer)")
    # one tile (the weights pass pairs_exact or not), uint8 in and out: one signature
    assert len(sigs["conv"]) == 1, sigs["conv"]
    assert "uint8" in sigs["conv"][0][0] and "uint8" in sigs["conv"][0][-1], sigs["conv"]
    # depthwise: one sum type, uint8 in and out, both layouts
    assert len(sigs["dw"]) == 1 and len(sigs["dw_last"]) == 1, sigs
    assert all("int8" not in s[0].replace("uint8", "") for s in sigs["dw"] + sigs["conv"])


def _add_one(x: Any) -> Any:  # pragma: no cover - numba only
    return x + 1


@pytest.mark.skipif(not jit.jit_enabled(), reason="needs numba ($TFRT_PY_JIT=0 or none)")
def test_a_failed_warm_up_gives_the_numpy_path_for_its_key_only() -> None:
    """A ``get_for`` warm-up that raises (a compile failure) answers None for its key, as
    ``get()`` does when its own warm-up fails, and again without retrying; another key
    still gets the function."""
    kernel = jit.Jitted(_add_one)
    calls: list[str] = []

    def broken(fn: Any) -> None:
        calls.append("broken")
        raise RuntimeError("compile failed")

    assert kernel.get_for("bad", broken) is None
    assert kernel.get_for("bad", broken) is None
    assert calls == ["broken"]
    fn = kernel.get_for("good", lambda fn: fn(np.int64(1)))
    assert fn is not None and fn(np.int64(2)) == 3
