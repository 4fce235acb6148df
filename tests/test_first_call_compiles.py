"""A model built on the compiled kernels compiles nothing in its calls.

Kernels that pick a compiled function per call (by the call's shape: a split softmax, the
fused attention, a large Linear packed at its first batch, a conv's column blocks) used to
compile it in the call that first needed it -- seconds with an empty numba cache (BERT's
first call at a new length 4.4-8.2 s, 20-26 s after a cold load on a 2-core Zen 4). Their
builders now compile them. Each model runs in a fresh process (a kernel compiled by an
earlier test would hide the fault); a spy on ``Jitted._compile`` records any compile made
on a thread inside ``Model.run``, and a kernel that gained argument types in a call (numba
compiles, or loads from its cache, per argument types: a read-only array is another type)
is recorded too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba", reason="the compiled kernels need numba")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, threading
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import tfrt_py
from tfrt_py.kernels.lib import jit as J

import gc
seen, depth = [], threading.local()
compile_ = J.Jitted._compile
def spy(self):
    if self._compiled is None and not self._failed and getattr(depth, "n", 0):
        seen.append(self.fn.__name__)
    return compile_(self)
J.Jitted._compile = spy
def overloads():  # argument types each compiled kernel has machine code for
    return {j.fn.__name__: len(j._compiled.overloads) for j in gc.get_objects()
            if isinstance(j, J.Jitted) and j._compiled is not None}
def watched(call):  # a model's call (run, or generate: its steps skip Model.run)
    depth.n = getattr(depth, "n", 0) + 1
    before = overloads()
    try:
        return call()
    finally:
        depth.n -= 1
        seen.extend(f"{n} (new argument types)" for n, c in overloads().items()
                    if n in before and c > before[n])
run_, generate_ = tfrt_py.Model.run, tfrt_py.Model.generate
tfrt_py.Model.run = lambda self, *a, **k: watched(lambda: run_(self, *a, **k))
tfrt_py.Model.generate = lambda self, *a, **k: watched(lambda: generate_(self, *a, **k))

rng = np.random.default_rng(0)
F = TensorProto.FLOAT
def const(name, a):
    return numpy_helper.from_array(a.astype(np.float32), name)
def model(nodes, x_dims, inits, domain=""):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", F, x_dims)],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    ops = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=ops)

case = sys.argv[1]
if case == "softmax":  # long rows, split over two threads
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], ["r", "n"], [])
    feeds = [rng.standard_normal((64, 1024))]
elif case == "attention":  # com.microsoft Attention: the fused blocked kernel
    w, b = rng.standard_normal((64, 192)) * 0.1, rng.standard_normal(192) * 0.1
    m = model([helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft",
                                num_heads=4)], ["b", "s", 64], [const("w", w), const("b", b)],
              "com.microsoft")
    feeds = [rng.standard_normal((2, s, 64)) for s in (128, 96)]
elif case == "linear":  # a weight over linear_par.PACK_MAX_BYTES, packed at its first batch
    w, b = rng.standard_normal((512, 1024)) * 0.05, rng.standard_normal(1024)
    m = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], ["b", 512],
              [const("w", w), const("b", b)])
    feeds = [rng.standard_normal((1, 512)), rng.standard_normal((6, 512))]
elif case == "decoder":  # a Llama-style decoder's greedy steps (rotary, grouped heads)
    from tests.support.models.decoder import decoder
    m = decoder(kv_heads=2)
    feeds = []
elif case == "depthwise":  # MobileNetV3's 5x5/2 depthwise + HardSwish (the grid kernel)
    w = rng.standard_normal((96, 1, 5, 5)) * 0.1
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], group=96, pads=[2, 2, 2, 2],
                                strides=[2, 2]), helper.make_node("HardSwish", ["c"], ["y"])],
              ["b", 96, 28, 28], [const("w", w)])
    feeds = [rng.standard_normal((n, 96, 28, 28)) for n in (1, 8)]
else:  # "conv": a patch embedding at a batch of 32 (conv_cols' blocks)
    w = rng.standard_normal((192, 3, 16, 16)) * 0.05
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[16, 16])],
              ["b", 3, 224, 224], [const("w", w)])
    feeds = [rng.standard_normal((n, 3, 224, 224)) for n in (1, 32)]
mod = tfrt_py.load(m.SerializeToString())
for x in feeds:
    mod.run({"x": x.astype(np.float32)})
if case == "decoder":
    for n in (5, 17, 9):
        mod.generate(rng.integers(0, 50, (1, n)).astype(np.int64), max_new_tokens=12)
print(json.dumps(seen))
"""


@pytest.mark.parametrize("case", ["softmax", "attention", "linear", "conv", "depthwise", "decoder"])
@pytest.mark.compiles
def test_a_call_compiles_no_kernel_its_build_could_have(case: str) -> None:
    env = dict(os.environ, TFRT_PY_COLD_START="0", TFRT_PY_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", _CHILD, case], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
