"""Native tier-up survives fork() (issue 12): in a child forked while a background compile
was in flight, that model becomes ready, so does one queued behind it, and a model loaded
in the child compiles too. Before, the child had no compile thread (and the parent's
thread would have left numba's compiler lock held), so its models never left the
interpreter.

The forking parent is a fresh interpreter running this file (``__main__`` below), like
tests/test_fork.py: the test process holds threads that have nothing to do with tfrt_py.
The child reports through a pipe and its exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import Graph, GraphBuilder, TensorType

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

F32 = np.float32
WAIT_S = 90.0


def _mlp(width: int, depth: int, act: str) -> Graph:
    rng = np.random.default_rng(width + depth)
    b = GraphBuilder(f"mlp_{width}_{depth}_{act}")
    h = x = b.input("x", F32, (2, width))
    for _ in range(depth):
        w = (rng.standard_normal((width, width)) / width).astype(F32)
        h = b.op(act, b.op("MatMul", h, b.const(w)))
    del x
    b.output(h, "y")
    return b.build()


def _ready_and_right(model: tfrt_py.Model, graph: Graph, deadline: float) -> dict[str, Any]:
    ok = model.native.wait(max(0.0, deadline - time.monotonic()))
    t = graph.inputs[0].type
    assert isinstance(t, TensorType) and t.shape is not None and isinstance(t.shape[1], int)
    x = np.linspace(-1, 1, 2 * t.shape[1], dtype=F32).reshape(2, -1)
    want = tfrt_py.load(graph, executor="sync").run({"x": x})["y"]
    got = model.run({"x": x})["y"]
    return {
        "state": model.native.state,
        "error": model.native.error,
        "waited_ok": bool(ok),
        "right": bool(np.allclose(got, want, rtol=1e-5, atol=1e-6)),
    }


def parent() -> dict[str, Any]:
    # Relu, not Sigmoid: a jitted kernel compiling at load would let the first tier finish
    graphs = {"inflight": _mlp(24, 6, "Tanh"), "queued": _mlp(20, 3, "Relu")}
    models = {k: tfrt_py.load(g) for k, g in graphs.items()}  # auto: background compiles
    report: dict[str, Any] = {
        "executors": {k: m.executor for k, m in models.items()},
        "states_at_fork": {k: m.native.state for k, m in models.items() if m.native},
    }
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        child: dict[str, Any] = {}
        try:
            deadline = time.monotonic() + WAIT_S
            for k, m in models.items():
                child[k] = _ready_and_right(m, graphs[k], deadline)
            g = _mlp(12, 2, "Relu")
            child["new"] = _ready_and_right(tfrt_py.load(g), g, time.monotonic() + WAIT_S)
            good = all(c["state"] == "ready" and c["right"] for c in child.values())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            child["exception"] = repr(e)
            good = False
        os.write(w, json.dumps(child).encode())
        os.close(w)
        os._exit(0 if good else 1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report["child"] = json.loads(f.read() or b"{}")
    report["child_exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    deadline = time.monotonic() + WAIT_S
    report["parent"] = {k: _ready_and_right(m, graphs[k], deadline) for k, m in models.items()}
    return report


@pytest.mark.compiles
def test_tier_up_restarts_in_a_forked_child(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TFRT_PY_NATIVE"}
    env["TFRT_PY_CACHE_DIR"] = str(tmp_path / "cache")  # cold: the compile takes a while
    root = str(Path(__file__).resolve().parents[2])  # the tfrt_py under test
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", __file__],
        capture_output=True, text=True, timeout=4 * WAIT_S, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["executors"] == {"inflight": "native", "queued": "native"}, report
    assert report["states_at_fork"]["inflight"] == "compiling", report  # the case under test
    assert report["child_exit"] == 0, report
    for k in ("inflight", "queued", "new"):
        assert report["child"][k]["state"] == "ready" and report["child"][k]["right"], report
    for k in ("inflight", "queued"):
        assert report["parent"][k]["state"] == "ready" and report["parent"][k]["right"], report


if __name__ == "__main__":
    print(json.dumps(parent()))
