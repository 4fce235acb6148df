"""`tfrt-py serve` through its installed entry point: a real subprocess on a free port
(--port 0; the bound address is printed), polled until /readyz, then predictions,
then SIGTERM and a clean exit. Startup errors are one line and a non-zero exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.paths import EXAMPLES
from tests.support.serving import wait_for_url, wait_ready

MLP = str(EXAMPLES / "mlp_small.onnx")
TFRT_PY = os.path.join(os.path.dirname(sys.executable), "tfrt-py")


def _wide_onnx(path: Path) -> None:
    """x[N,96] -> MatMul 96x768 -> Relu -> MatMul 768x4 (a batch dim; 0.15 MFLOP per row)."""
    rng = np.random.default_rng(5)
    w0 = (rng.standard_normal((96, 768)) / 10).astype(np.float32)
    w1 = (rng.standard_normal((768, 4)) / 30).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W0"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "W1"], ["y"]),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w0, "W0"), numpy_helper.from_array(w1, "W1")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    tmp = tmp_path_factory.mktemp("serve")
    wide = tmp / "wide.onnx"
    _wide_onnx(wide)
    log = tmp / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                TFRT_PY,
                "serve",
                MLP,
                str(wide),
                "--port",
                "0",
                "--batching",
                "on",
                "--max-batch",
                "8",
                "--max-wait-us",
                "200",
                "--warmup",
                "wide:x=5x96",
                "--warmup",
                "wide:x=7x96",
                "--warmup",
                "mlp_small:x=1x64",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield wait_for_url(proc, log), wide, log
    finally:
        proc.terminate()
        code = proc.wait(30)
        # uvicorn shuts down gracefully (the lifespan's end is logged), then re-raises
        assert code == -signal.SIGTERM, log.read_text()
        assert "tfrt-py serve: stopped" in log.read_text()


def test_serve_answers_after_ready(served: tuple[str, Path, Path]) -> None:
    url, wide, log = served
    with httpx.Client(base_url=url, timeout=30) as c:
        wait_ready(c)
        names = {m["name"]: m for m in c.get("/v1/models").json()["models"]}
        assert set(names) == {"mlp_small", "wide"}  # named by file stem
        assert names["wide"]["batching"]["enabled"] is True  # --batching on, batch dim
        assert names["wide"]["batching"]["max_batch"] == 8
        assert names["mlp_small"]["batching"]["enabled"] is False  # no batch dim
        assert names["wide"]["warmup"] == 2 and names["mlp_small"]["warmup"] == 1  # --warmup
        x = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
        r = c.post("/v1/models/wide:predict", json={"inputs": {"x": x.tolist()}})
        assert r.status_code == 200, r.text
        want = tfrt_py.load(wide).run({"x": x})["y"]
        np.testing.assert_allclose(r.json()["outputs"]["y"], want, rtol=1e-5, atol=1e-5)
        r = c.post("/v1/models/mlp_small:predict", json={"inputs": {"x": [[1.0] * 64]}})
        assert r.status_code == 200 and len(r.json()["outputs"]["probs"][0]) == 10
        r = c.post("/v1/models/wide:predict", json={"inputs": {"x": [[1.0] * 95]}})
        assert r.status_code == 400 and "'x'" in r.json()["error"]
    assert "wide: executor" in log.read_text()  # the policy of each model is logged


def test_serve_refuses_a_missing_model_in_one_line() -> None:
    r = subprocess.run(
        [TFRT_PY, "serve", "/nonexistent/m.onnx", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("tfrt-py: error:") and "m.onnx" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_serve_refuses_two_models_with_one_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    other = tmp_path / "a" / "mlp_small.onnx"
    other.write_bytes(Path(MLP).read_bytes())
    r = subprocess.run(
        [TFRT_PY, "serve", MLP, str(other), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "two models named 'mlp_small'" in r.stderr


def test_serve_refuses_a_malformed_warmup_in_one_line() -> None:
    r = subprocess.run(
        [TFRT_PY, "serve", MLP, "--port", "0", "--warmup", "x=1xfour"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--warmup 'x=1xfour'" in r.stderr
