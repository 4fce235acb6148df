"""A model loaded before fork (gunicorn --preload style) works in the forked children, and
its memory-mapped external weights are shared with them, not copied. The forking parent
is a fresh interpreter running this file (see ``parent``).

Sharing is read from /proc/self/smaps in each child: the mapping of the weight file is
resident there (the child computed with those pages) yet holds no private dirty pages,
and the child's private dirty memory overall grows far less than the weights' size.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="fork and /proc/self/smaps are Linux's"
)

D = 1024  # two 1024x1024 float32 weights: 8 MiB in the external data file
WEIGHT_BYTES = 2 * D * D * 4


def _write_model(path: Path) -> None:
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, D)) / 32).astype(np.float32), f"W{i}")
        for i in range(2)
    ]
    nodes = [  # two expensive branches: the async executor sends one to the host's pool
        helper.make_node("MatMul", ["x", "W0"], ["h0"]),
        helper.make_node("MatMul", ["x", "W1"], ["h1"]),
        helper.make_node("Relu", ["h0"], ["r"]),
        helper.make_node("Add", ["r", "h1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fork_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )


def _smaps_for(path: str) -> dict[str, int]:
    """kB fields summed over this process's mappings of ``path``."""
    totals: dict[str, int] = {}
    current = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping header line
                current = len(head) >= 6 and head[5] == path
            elif current and head[0].endswith(":") and len(head) == 3 and head[2] == "kB":
                totals[head[0][:-1]] = totals.get(head[0][:-1], 0) + int(head[1])
    return totals


def _private_dirty_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))


def _child(model: tfrt_py.Model, x: np.ndarray, weights: str, conn: Connection) -> None:
    try:
        before = _private_dirty_kb()
        out = model.run({"x": x})["y"]
        for _ in range(3):
            model.run({"x": x})
        grown = _private_dirty_kb() - before
        conn.send(("ok", out, _smaps_for(weights), grown))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", repr(e), {}, 0))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fork") / "model.onnx"
    _write_model(path)
    assert (path.parent / "weights.bin").stat().st_size == WEIGHT_BYTES
    return path


def _run_children(model: tfrt_py.Model, x: np.ndarray, weights: str, n: int) -> list[Any]:
    ctx = mp.get_context("fork")
    results = []
    procs = []
    for _ in range(n):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(model, x, weights, child_end))
        p.start()
        child_end.close()
        procs.append((p, parent_end))
    for p, conn in procs:
        assert conn.poll(60), "a forked child did not answer within 60 s (hung after fork?)"
        results.append(conn.recv())
        p.join(30)
        assert p.exitcode == 0
    return results


def parent(model_path: str, executor: str, rows: int) -> dict[str, Any]:
    """The pre-forking server's side: load, run, fork two children that run the model too;
    what each saw, as JSON. Runs in a fresh interpreter (``__main__`` below), as a
    gunicorn master would: the test process may hold threads of unrelated libraries
    (JAX warns at every fork) that have nothing to do with tfrt_py."""
    model = tfrt_py.load(model_path, executor=executor)
    x = np.random.default_rng(1).standard_normal((rows, D)).astype(np.float32)
    expected = model.run({"x": x})["y"]  # the parent has used it (and its threads) first
    weights = os.path.realpath(os.path.join(os.path.dirname(model_path), "weights.bin"))
    report: dict[str, Any] = {"parent_smaps": _smaps_for(weights), "children": []}
    for status, out, smaps, grown in _run_children(model, x, weights, n=2):
        same = status == "ok" and bool(np.allclose(out, expected, rtol=1e-5, atol=1e-5))
        error = out if status != "ok" else None
        report["children"].append({"same": same, "error": error, "smaps": smaps, "grown_kb": grown})
    again = model.run({"x": x})["y"]
    report["parent_after_fork_same"] = bool(np.allclose(again, expected, rtol=1e-5, atol=1e-5))
    return report


def _forking_parent(model_path: Path, executor: str, rows: int) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, __file__, str(model_path), executor, str(rows)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    report: dict[str, Any] = json.loads(r.stdout)
    return report


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_model_loaded_before_fork_runs_in_children(model_path: Path, executor: str) -> None:
    report = _forking_parent(model_path, executor, rows=4)
    assert len(report["children"]) == 2
    for child in report["children"]:
        assert child["error"] is None and child["same"], child
    assert report["parent_after_fork_same"]


def test_memory_mapped_weights_are_shared_with_children(model_path: Path) -> None:
    report = _forking_parent(model_path, "sync", rows=1)
    parent = report["parent_smaps"]
    assert parent.get("Rss", 0) * 1024 >= 0.9 * WEIGHT_BYTES, parent  # mapped, not copied
    for child in report["children"]:
        assert child["error"] is None and child["same"], child
        smaps = child["smaps"]
        rss = smaps.get("Rss", 0) * 1024
        shared = (smaps.get("Shared_Clean", 0) + smaps.get("Shared_Dirty", 0)) * 1024
        assert rss >= 0.9 * WEIGHT_BYTES, smaps  # the child computed from the mapping
        assert shared >= 0.9 * WEIGHT_BYTES, smaps  # ... whose pages are the parent's too
        assert smaps.get("Private_Dirty", 0) == 0, smaps  # no copy-on-write of weights
        assert child["grown_kb"] * 1024 < WEIGHT_BYTES / 4, child  # no copy elsewhere either


if __name__ == "__main__":
    print(json.dumps(parent(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
