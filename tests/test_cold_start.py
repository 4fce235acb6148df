"""A fresh process's first result does not wait for numba (``tfrt_py.cold_start``, issue 33).

Each case is a fresh interpreter (the test process itself is warm, and runs with
``$TFRT_PY_COLD_START=0``: conftest), started without that switch: it loads a bundled
model, calls it and reports whether numba was imported by then, then waits for the switch
to the compiled kernels and calls again. Before the cold start, ``load()`` imported numba
and read every kernel from numba's cache on the loading thread (~1-2 s); now the model is
built on NumPy paths, served at once, and switched in the background.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.paths import ROOT
from tfrt_py.concurrency import call_yield
from tfrt_py.kernels.lib.jit import jit_enabled

pytestmark = pytest.mark.skipif(
    not jit_enabled(),
    reason="numba is not installed (or TFRT_PY_JIT=0): a process has no compiled kernels to warm",
)

MLP = str(ROOT / "tfrt_py" / "examples" / "mlp_small.onnx")

_PROBE = """
import json, sys
import numpy as np
import tfrt_py

m = tfrt_py.load({model!r}, executor={executor!r}, native={native!r})
rng = np.random.default_rng(0)
feeds = {{s.name: rng.random([d if isinstance(d, int) else 3 for d in s.shape]).astype(np.float32)
          for s in m.inputs}}
first = m.run(feeds)
numba_at_first = "numba" in sys.modules
lowering_at_first = "tfrt_py.native.lower.graph" in sys.modules
executor_at_first = m.executor
before = m.runtime, getattr(m.runtime, "interp", None)
ok = m.wait_compiled(120)
after = m.run(feeds)
print(json.dumps({{
    "numba_at_first": numba_at_first,
    "waited": ok,
    "numba_after": "numba" in sys.modules,
    "lowering_at_first": lowering_at_first,
    "executors": [executor_at_first, m.executor],
    "cold": m._switched is not None,
    "rebuilt": (m.runtime, getattr(m.runtime, "interp", None)) != before,
    "diff": max(float(np.abs(first[k] - after[k]).max()) for k in first),
    "describe": [ln for ln in m.describe().splitlines() if "cold start" in ln],
}}))
"""


def _env(**extra: str) -> dict[str, str]:
    """This process's environment less conftest's switches (a user's defaults)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TFRT_PY_COLD_START", "TFRT_PY_NATIVE")}
    env.update(extra)
    return env


def _probe(executor: str = "auto", native: str = "background", **env: str) -> dict[str, Any]:
    src = _PROBE.format(model=MLP, executor=executor, native=native)
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         cwd=str(ROOT), env=_env(**env), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def _script(src: str) -> dict[str, Any]:
    """Run ``src`` in a fresh interpreter (a user's environment); its last line, as JSON."""
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                         cwd=str(ROOT), env=_env(), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("executor", ["auto", "sync", "async"])
def test_the_first_result_does_not_wait_for_numba_and_the_model_switches_later(
    executor: str,
) -> None:
    r = _probe(executor)
    assert r["cold"] and not r["numba_at_first"], r
    assert r["waited"] and r["numba_after"] and r["rebuilt"], r
    assert r["diff"] <= 1e-5, r  # NumPy paths and compiled kernels agree
    assert any("switched to the compiled kernels" in ln for ln in r["describe"]), r
    if executor == "auto":  # a tiny model: the native tier, chosen (and lowered) after the switch
        assert not r["lowering_at_first"] and r["executors"] == ["sync", "native"], r
    else:
        assert r["executors"] == [executor, executor], r


def test_the_switch_turns_cold_starts_off() -> None:
    r = _probe(TFRT_PY_COLD_START="0")
    assert not r["cold"] and r["numba_at_first"] and not r["rebuilt"], r


def test_an_eager_load_builds_on_the_compiled_kernels() -> None:
    r = _probe(native="eager")
    assert not r["cold"] and r["numba_at_first"], r


def test_without_compiled_kernels_nothing_is_warmed() -> None:
    r = _probe("sync", TFRT_PY_JIT="0", TFRT_PY_PACKED_GEMM="0")
    assert not r["cold"] and not r["numba_after"] and not r["rebuilt"], r


_TWO = """
import json
import tfrt_py
from tfrt_py import cold_start

a = tfrt_py.load({model!r}, executor="sync")
cold_start.hurry()  # the warm-up starts now: the second load meets it in flight
b = tfrt_py.load({model!r}, executor="async")
ok = a.wait_compiled(120) and b.wait_compiled(120)
print(json.dumps({{"ok": ok, "switched": [a._switched.is_set(), b._switched is None or
                                            b._switched.is_set()]}}))
"""


def test_a_model_loaded_during_the_warm_up_switches_too() -> None:
    out = subprocess.run([sys.executable, "-c", _TWO.format(model=MLP)], capture_output=True,
                         text=True, cwd=str(ROOT), env=_env(), timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"] and all(r["switched"]), r


_TOGETHER = """
import json
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import tfrt_py
from tfrt_py.concurrency import compiled_gate

def convs(n, c, side, group):
    rng = np.random.default_rng(n)
    nodes, inits, last = [], [], "x"
    for i in range(n):
        w = (rng.standard_normal((c, c // group, 3, 3)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{{i}}"))
        nodes.append(helper.make_node("Conv", [last, f"w{{i}}"], [f"y{{i}}"], pads=[1, 1, 1, 1],
                                      group=group))
        last = f"y{{i}}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                          [1, c, side, side])], [helper.make_tensor_value_info(last,
                          TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()

a = tfrt_py.load(convs(1, 96, 14, 96), executor="sync")  # a depthwise conv
b = tfrt_py.load(convs(24, 64, 28, 1), executor="sync")  # switched after a, longer
ok = a.wait_compiled(120)
held = compiled_gate.held()  # a switched: may its calls plan on the compiled kernels?
x = np.ones((1, 96, 14, 14), np.float32)
a.run({{"x": x}})
print(json.dumps({{"ok": ok and b.wait_compiled(120), "held_when_a_switched": held}}))
"""


@pytest.mark.compiles
def test_a_model_switches_only_once_the_kernels_are_released() -> None:
    """Two models loaded together in a cold process: the first is not handed its compiled
    program while the warm-up still holds the kernels back for the second's switch. It
    was, and its first calls on the caller's thread then planned their shapes on NumPy
    paths for good (MobileNetV3-small 3-4x slower than when loaded alone)."""
    r = _script(_TOGETHER.format())
    assert r["ok"] and r["held_when_a_switched"] is False, r


_EXIT = """
import atexit, json, os, signal, sys, time
import numpy as np
import tfrt_py
from tfrt_py import cold_start

m = tfrt_py.load({model!r})
m.run({{s.name: np.ones([d if isinstance(d, int) else 1 for d in s.shape], np.float32)
       for s in m.inputs}})
atexit.register(lambda: print(json.dumps({{"in_flight": cold_start._job is not None}})))
cold_start.hurry()
time.sleep({delay})
way = {way!r}
if way == "exit3":
    sys.exit(3)
if way == "sigterm":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
"""
_WAYS = [("return", 0), ("exit3", 3), ("sigterm", 0)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals: Linux")
def test_processes_that_exit_during_the_warm_up_exit_cleanly() -> None:
    """The warm-up imports numba and builds with LLVM on the worker thread: an exit meanwhile
    waits for the step in flight (LLVM must not be torn down under it) and then ends with
    the expected status, never an abort or a segfault."""
    cases = [(_WAYS[i % 3], 0.05 * i) for i in range(9)]

    def run(case: tuple[tuple[str, int], float]) -> tuple[str, int, int, str]:
        (way, expected), delay = case
        src = _EXIT.format(model=MLP, delay=delay, way=way)
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             cwd=str(ROOT), env=_env(), timeout=300)  # fmt: skip
        return way, expected, out.returncode, out.stdout + out.stderr[-2000:]

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, cases))
    bad = [r for r in results if r[2] != r[1]]
    assert not bad, bad
    in_flight = sum('"in_flight": true' in r[3] for r in results)
    assert in_flight >= 5, results  # the case under test: most exits met the warm-up


_SHARE = """
import json
import tfrt_py
from tfrt_py.sharing import share_weights

m = tfrt_py.load({model!r})
cold = m._switched is not None and not m._switched.is_set()
share_weights(m)
print(json.dumps({{"cold": cold, "switched": m._switched.is_set()}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="share_weights: Linux")
def test_share_weights_switches_a_cold_model_first() -> None:
    """Before a fork (serve --workers, gunicorn --preload): the compiled kernels' own
    arrays (packed weights) must exist before the weights are shared, not be made later
    in every worker."""
    r = _script(_SHARE.format(model=MLP))
    assert r == {"cold": True, "switched": True}, r


_PROFILE = """
import json
import numpy as np
import tfrt_py

m = tfrt_py.load({model!r}, executor="sync")
cold = m._switched is not None and not m._switched.is_set()
feeds = {{s.name: np.ones([d if isinstance(d, int) else 3 for d in s.shape], np.float32)
          for s in m.inputs}}
m.profile(feeds, repeat=3)
print(json.dumps({{"cold": cold, "switched": m._switched.is_set()}}))
"""


def test_profile_times_the_compiled_kernels_not_the_cold_stand_ins() -> None:
    """``profile()`` in a fresh process (``tfrt-py profile``) waits for the switch to the
    compiled kernels: before, it timed the NumPy paths that serve while they warm (a
    quantized BERT's integer products showed 9x their real cost)."""
    r = _script(_PROFILE.format(model=MLP))
    assert r == {"cold": True, "switched": True}, r


_FIT = """
import json
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import tfrt_py

k, chain, batch = {k}, {chain}, {batch!r}  # a chain of Softmaxes beside the product: dear plans
w = numpy_helper.from_array(np.ones((k, 256), np.float32), "w")
nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
nodes += [helper.make_node("Softmax", [f"z{{i}}"], [f"z{{i + 1}}"]) for i in range(chain)]
g = helper.make_graph(nodes, "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64, k]),
                       helper.make_tensor_value_info("z0", TensorProto.FLOAT, [batch, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                       helper.make_tensor_value_info(f"z{{chain}}", TensorProto.FLOAT, None)],
                      [w])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 9
m = tfrt_py.load(model, executor="sync")
rt = m.runtime  # the stand-in, called directly below whether or not the switch came
before = {{"cold": not m._switched.is_set(), "note": rt.generic_note,
           "fitted": rt._generic is not None}}
for b in ((3, 3, 2, 3) if batch == "b" else (3, 3, 3, 3)):
    rt.run({{"x": np.ones((b, 64, k), np.float32), "z0": np.ones((b, 4), np.float32)}})
before["plans"] = rt._plans_made
before["memory"] = [ln for ln in rt.plan_lines() if "memory" in ln]
m.wait_compiled(120)
m.run({{"x": np.ones((3, 64, k), np.float32), "z0": np.ones((3, 4), np.float32)}})
print(json.dumps({{"before": before, "after": m.runtime._generic is not None}}))
"""


def test_a_cold_load_fits_the_shape_model_only_when_its_probes_are_cheap() -> None:
    """A cold load's stand-in interpreter (NumPy paths) fits the shape model when its
    probes are cheap, so new lengths run on one plan (a BERT's stand-in planned and
    generated code for each length: 3-5 ms a call instead of ~1.4); a dear model's would
    run it 2**n + 2 times on the NumPy paths (2 s of a quantized ResNet-18's load). The
    interpreter the switch makes fits it on the compiled kernels."""
    cheap = _script(_FIT.format(k=8, chain=0, batch="b"))
    assert {k: cheap["before"][k] for k in ("cold", "note", "fitted", "plans")} == {
        "cold": True, "note": "", "fitted": True, "plans": 0}, cheap  # fmt: skip
    assert cheap["after"] is True, cheap
    # est. 34 MFLOP a run at b=1, 14 runs' worth of probes
    dear = _script(_FIT.format(k=1024, chain=200, batch="b"))
    assert dear["before"]["cold"] is True and dear["before"]["fitted"] is False, dear
    assert "cold start's stand-in" in dear["before"]["note"], dear
    assert "MFLOP" in dear["before"]["note"], dear
    assert dear["after"] is True, dear


def test_a_stand_in_plans_per_signature_only_when_its_calls_cost_more_than_plans() -> None:
    """Without the shape model, a stand-in plans a signature only once its calls are seen
    to cost more than a plan would (``PLAN_S_PER_INSTR`` per instruction): a decoder's
    stand-in planned every step (~20 ms a GPT-2 step against ~2.5 unplanned), a CNN's
    calls of tens of milliseconds gain from their arenas."""
    # 201 instructions (a plan est. 30 ms), calls of a few ms
    cheap_calls = _script(_FIT.format(k=1024, chain=200, batch="b"))
    assert cheap_calls["before"]["plans"] == 0, cheap_calls
    assert "not planned per signature" in cheap_calls["before"]["memory"][0], cheap_calls
    dear_calls = _script(_FIT.format(k=8192, chain=0, batch="b"))  # 1 instruction, ~10 ms calls
    assert dear_calls["before"]["fitted"] is False, dear_calls
    assert dear_calls["before"]["plans"] > 0, dear_calls


def test_a_static_stand_in_plans_only_when_its_calls_cost_more_than_plans() -> None:
    """The same rule for static shapes: a small model's stand-in plan (~2 ms of a fresh
    process's first result for a 6-node MLP, thrown away at the switch) is not made; a
    model whose calls are dear plans them."""
    cheap_calls = _script(_FIT.format(k=1024, chain=200, batch=3))
    assert cheap_calls["before"]["cold"] is True, cheap_calls
    assert cheap_calls["before"]["plans"] == 0, cheap_calls
    dear_calls = _script(_FIT.format(k=8192, chain=0, batch=3))
    assert dear_calls["before"]["plans"] > 0, dear_calls


_YIELD = """
import json, threading, time
import numpy as np
import tfrt_py
from tfrt_py import cold_start

m = tfrt_py.load({model!r}, executor="sync")
feeds = {{s.name: np.ones([d if isinstance(d, int) else 3 for d in s.shape], np.float32)
          for s in m.inputs}}
stop = threading.Event()
calls = [0, 0]


def caller(k):
    while not stop.is_set():  # back to back: some call is always in flight
        m.run(feeds)
        calls[k] += 1


threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
t0 = time.monotonic()
switched = m._switched.wait({wait})  # the warm-up's own pace, under the calls
waited = m.wait_compiled(120) if {hurry} else switched  # hurry: someone waits for it
stop.set()
for t in threads:
    t.join()
# the job records its note just after it switched the last model: read it once it ended
cold_start.wait_released(30)
print(json.dumps({{"switched": switched, "waited": waited, "calls": calls,
                   "secs": time.monotonic() - t0, "note": cold_start.describe()}}))
"""


@pytest.mark.compiles
def test_the_warm_up_yields_to_calls_but_finishes_under_a_stream_of_them() -> None:
    """While calls run on a cold model's stand-in, the warm-up pauses (a trace function on
    its thread) so each NumPy operation that drops the GIL does not hand it to the warm-up
    (BERT-2L's calls took 10-45 ms instead of ~1.5 in the second after load); yet two
    threads calling back to back, never idle, do not starve it: it keeps its share of the
    time and switches the model."""
    r = _script(_YIELD.format(model=MLP, wait=120, hurry=False))
    assert r["switched"] is True and min(r["calls"]) > 0, r
    assert "yielded" in r["note"] and "s of it yielded to calls" in r["note"], r


def test_waiting_for_the_compiled_kernels_ends_the_yielding() -> None:
    """``wait_compiled`` (and ``warmup``, a server's readiness) hurries the warm-up: it
    stops yielding to the calls in flight and finishes at its own speed."""
    r = _script(_YIELD.format(model=MLP, wait=0, hurry=True))
    assert r["waited"] is True and min(r["calls"]) > 0, r
    assert "switched" in r["note"] and "yielded" not in r["note"], r


_SEED = """
import json
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import tfrt_py
from tfrt_py.concurrency import call_yield

k = {k}
w = numpy_helper.from_array(np.ones((k, k), np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, k])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
m = tfrt_py.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
print(json.dumps({{"cold": not m._switched.is_set(), "call_s": call_yield.call_s(),
                  "est_s": m.prepared.cost.call_us() * 1e-6}}))
"""


def test_the_warm_up_knows_a_dear_models_calls_are_long_before_one_ran() -> None:
    """The cost model's estimate seeds the calls' smoothed time: a model whose calls the
    estimate puts at ``SHORT_CALL_S`` or more gets no yielding from the warm-up from its
    first call (a CNN's first stand-in call of seconds gave ~1 s of the warm-up away); a
    cheap model's calls are yielded to as before."""
    dear = _script(_SEED.format(k=4096))  # 64 x 4096 x 4096: ~1 GFLOP a call
    assert dear["cold"] and dear["est_s"] >= call_yield.SHORT_CALL_S, dear
    assert dear["call_s"] >= call_yield.SHORT_CALL_S, dear
    cheap = _script(_SEED.format(k=16))
    assert cheap["cold"] and cheap["call_s"] < call_yield.SHORT_CALL_S, cheap


_SWITCH_FAILS = """
import json
import numpy as np
import tfrt_py
from tfrt_py import cold_start
from tfrt_py.model import Model

real = Model._compiled_switch

def failing(self):
    real(self)  # built on the compiled kernels; then the switch itself fails
    def install():
        raise RuntimeError("no room for the compiled program")
    return install

Model._compiled_switch = failing
m = tfrt_py.load({model!r}, executor="sync")
x = {{s.name: np.ones([d if isinstance(d, int) else 1 for d in s.shape], np.float32)
      for s in m.inputs}}
before = m.run(x)
waited = m.wait_compiled(120)
after = m.run(x)
same = all(np.allclose(before[k], after[k]) for k in before)
print(json.dumps({{"waited": waited, "same": bool(same), "line": cold_start.describe()}}))
"""


def test_a_model_whose_switch_fails_keeps_serving_and_the_failure_is_said() -> None:
    """A built model whose switch to the compiled kernels fails keeps its NumPy paths and
    its answers, and ``cold_start.describe()`` says so (the failure was swallowed
    silently)."""
    r = _script(_SWITCH_FAILS.format(model=MLP))
    assert r["waited"] and r["same"], r
    assert "could not switch" in r["line"] and "no room for the compiled program" in r["line"], r
