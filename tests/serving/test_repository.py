"""Serving a model repository (``tfrt-py serve DIR``: ``NAME.onnx`` or
``NAME/VERSION/model.onnx``) and the repository extension (load, unload, index) through
tritonclient: the newest version is served, a new version is swapped in without dropping a
request in flight on the old one, an unloaded model is not ready and comes back on load,
and a model that fails to load leaves the version before it serving."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

import tfrt_py
from tests.support.waiting import until
from tfrt_py.concurrency import HostContext
from tfrt_py.examples import make_models
from tfrt_py.serving import ModelServer, ServerThread, create_app

TFRT_PY = str(Path(__import__("sys").executable).parent / "tfrt-py")
BLOCK = 42.0  # the gate model blocks on an input whose first value is this


def affine(scale: float, shift: float = 0.0, hold: bool = False) -> onnx.ModelProto:
    """y[N, 2] = x * scale + shift (through the app::Hold kernel when ``hold``)."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    opsets = [helper.make_opsetid("", 17)]
    if hold:
        nodes.insert(0, helper.make_node("Hold", ["x0"], ["x"], domain="app"))
        opsets.append(helper.make_opsetid("app", 1))
    graph = helper.make_graph(
        nodes,
        "affine",
        [helper.make_tensor_value_info("x0" if hold else "x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [
            numpy_helper.from_array(np.array(scale, np.float32), "s"),
            numpy_helper.from_array(np.array(shift, np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def save(proto: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, path)


class Hold:
    """Passes x through; blocks while ``open`` is clear if x's first value is BLOCK."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.blocked = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.size and float(x.flat[0]) == BLOCK:
            self.blocked += 1
            self.open.wait(60)
        return x


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    save(make_models.mlp_small(), root / "mlp.onnx")
    save(affine(2.0), root / "aff" / "1" / "model.onnx")
    save(affine(3.0), root / "aff" / "2" / "model.onnx")
    (root / "aff" / "notes").mkdir()  # not a version: ignored
    (root / "README.txt").write_text("not a model")
    save(affine(1.0), root / "bad name.onnx")  # not a valid name: skipped, said so
    (root / "empty").mkdir()  # no versions: skipped, said so
    return root


@pytest.fixture
def host() -> Iterator[HostContext]:
    with HostContext(num_workers=4, name="repository-test") as h:
        yield h


def client_for(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)


def infer(c: triton.InferenceServerClient, model: str, x: np.ndarray, version: str = "") -> Any:
    """The model's first output for x (FP32), through tritonclient (binary tensors)."""
    meta = c.get_model_metadata(model)
    t = triton.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
    t.set_data_from_numpy(x)
    return c.infer(model, [t], model_version=version).as_numpy(meta["outputs"][0]["name"])


X2 = np.array([[1.0, -2.0]], np.float32)


def test_the_newest_versions_are_served(repo: Path) -> None:
    log: list[str] = []
    server = ModelServer(repository=str(repo), log=log.append, model_control="explicit")
    assert sorted(server.configs) == ["aff", "mlp"]
    assert any("'bad name'" in line for line in log) and any("'empty'" in line for line in log)
    with ServerThread(create_app(server)) as url:
        c = client_for(url)
        try:
            assert c.is_server_ready()
            assert c.get_model_metadata("aff")["versions"] == ["2"]
            assert c.get_model_metadata("mlp")["versions"] == ["1"]
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 3)
            np.testing.assert_allclose(infer(c, "aff", X2, version="2"), X2 * 3)
            with pytest.raises(InferenceServerException) as info:
                infer(c, "aff", X2, version="1")
            assert info.value.status() == "404" and "'2'" in info.value.message()
            index = {m["name"]: m for m in c.get_model_repository_index()}
            assert index["aff"] == {"name": "aff", "version": "2", "state": "READY"}
        finally:
            c.close()


def test_load_swaps_in_a_new_version_without_dropping_requests_in_flight(
    repo: Path, host: HostContext
) -> None:
    hold = Hold()
    save(affine(1.0, 0.0, hold=True), repo / "gate" / "1" / "model.onnx")
    server = ModelServer(
        repository=str(repo),
        load_options={"custom_kernels": {("app", "Hold"): hold}, "host": host},
        model_control="explicit",
    )
    answers: list[Any] = []
    try:
        with ServerThread(create_app(server)) as url:
            c = client_for(url)
            try:
                blocked = np.array([[BLOCK, 1.0]], np.float32)

                def in_flight() -> None:
                    with client_for(url) as other:
                        answers.append(infer(other, "gate", blocked))

                thread = threading.Thread(target=in_flight, daemon=True)
                thread.start()
                until(lambda: hold.blocked == 1, "a request in flight on version 1")
                save(affine(1.0, 100.0, hold=True), repo / "gate" / "2" / "model.onnx")
                c.load_model("gate")
                assert c.get_model_metadata("gate")["versions"] == ["2"]
                np.testing.assert_allclose(infer(c, "gate", X2), X2 + 100)  # version 2
                assert thread.is_alive()  # version 1's request still in flight...
                hold.open.set()
                thread.join(120)
                np.testing.assert_allclose(answers[0], blocked)  # ...and answered by version 1
            finally:
                c.close()
    finally:
        hold.open.set()


def test_unload_then_load(repo: Path) -> None:
    server = ModelServer(repository=str(repo), model_control="explicit")
    with ServerThread(create_app(server)) as url:
        c = client_for(url)
        try:
            c.unload_model("aff")
            assert not c.is_model_ready("aff")
            assert c.is_server_ready()  # an unloaded model is not waited for
            with pytest.raises(InferenceServerException) as info:
                t = triton.InferInput("x", [1, 2], "FP32")
                t.set_data_from_numpy(X2)
                c.infer("aff", [t])
            assert info.value.status() == "503" and "unloaded" in info.value.message()
            index = {m["name"]: m for m in c.get_model_repository_index()}
            assert index["aff"]["state"] == "UNAVAILABLE" and index["aff"]["reason"] == "unloaded"
            c.load_model("aff")
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 3)
            for name, status in (("nope", "404"), ("mlp", None)):
                if status is None:
                    c.load_model(name)  # a reload of the same version is fine
                    continue
                with pytest.raises(InferenceServerException) as info:
                    c.load_model(name)
                assert info.value.status() == status
        finally:
            c.close()


def test_a_version_that_fails_to_load_leaves_the_old_one_serving(repo: Path) -> None:
    server = ModelServer(repository=str(repo), model_control="explicit")
    with ServerThread(create_app(server)) as url:
        c = client_for(url)
        try:
            bad = repo / "aff" / "3" / "model.onnx"
            bad.parent.mkdir()
            bad.write_bytes(b"not an onnx file")
            with pytest.raises(InferenceServerException) as info:
                c.load_model("aff")
            assert info.value.status() == "400" and "'aff'" in info.value.message()
            assert c.get_model_metadata("aff")["versions"] == ["2"]
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 3)
            with pytest.raises(InferenceServerException) as info:
                c.load_model("aff", config='{"backend": "onnxruntime"}')
            assert info.value.status() == "400" and "not supported" in info.value.message()
        finally:
            c.close()


def test_tfrt_py_serve_a_directory(repo: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                TFRT_PY,
                "serve",
                str(repo),
                "--port",
                "0",
                "--model-control-mode",
                "explicit",
                "--max-concurrency",
                "2",
                "--max-queue",
                "4",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        until(lambda: "on http://" in log.read_text() or proc.poll() is not None, "bound")
        url = log.read_text().split("on http://")[1].split()[0]
        with httpx.Client(base_url=f"http://{url}", timeout=60) as h:
            until(lambda: h.get("/v2/health/ready").status_code == 200, "ready")
            described = h.get("/v1/models/aff").json()
            assert (described["max_concurrency"], described["max_queue"]) == (2, 4)
        c = client_for(f"http://{url}")
        try:
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 3)
            save(affine(5.0), repo / "aff" / "7" / "model.onnx")
            c.load_model("aff")
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 5)
        finally:
            c.close()
        text = log.read_text()
        assert "aff: executor" in text and "version 7" in text
        assert "skipped" in text and "'bad name'" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM, log.read_text()


def test_one_bad_model_in_a_repository_does_not_stop_serve(repo: Path, tmp_path: Path) -> None:
    """Issue 38: a model that fails to load stopped ``tfrt-py serve DIR`` from starting,
    even in explicit mode; now the others serve, the index says UNAVAILABLE with the
    reason, and unloading it makes the server ready."""
    (repo / "broken.onnx").write_bytes(b"not an onnx file")
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [TFRT_PY, "serve", str(repo), "--port", "0", "--model-control-mode", "explicit"],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        until(lambda: "on http://" in log.read_text() or proc.poll() is not None, "bound")
        assert proc.poll() is None, log.read_text()
        url = log.read_text().split("on http://")[1].split()[0]
        c = client_for(f"http://{url}")
        try:
            np.testing.assert_allclose(infer(c, "aff", X2), X2 * 3)
            index = {m["name"]: m for m in c.get_model_repository_index()}
            assert index["broken"]["state"] == "UNAVAILABLE"
            assert "broken" in index["broken"]["reason"] and index["aff"]["state"] == "READY"
            assert not c.is_server_ready()  # strict readiness: every model it serves
            c.unload_model("broken")
            until(c.is_server_ready, "ready once the broken model is unloaded")
        finally:
            c.close()
        assert "model 'broken' failed to load" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM, log.read_text()


def test_loading_and_unloading_are_off_unless_asked_for(repo: Path) -> None:
    with ServerThread(create_app(ModelServer(repository=str(repo)))) as url:
        c = client_for(url)
        try:
            for call in (c.load_model, c.unload_model):
                with pytest.raises(InferenceServerException) as info:
                    call("aff")
                assert info.value.status() == "403"
                assert "--model-control-mode explicit" in info.value.message()
            assert c.is_model_ready("aff")  # nothing was unloaded
            assert {m["name"] for m in c.get_model_repository_index()} == {"aff", "mlp"}
        finally:
            c.close()


def test_serve_refuses_a_model_name_that_is_not_safe(tmp_path: Path) -> None:
    path = tmp_path / "a b.onnx"
    save(make_models.mlp_small(), path)
    r = subprocess.run(
        [TFRT_PY, "serve", str(path), "--port", "0"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "invalid model name 'a b'" in r.stderr


def test_loaded_models_name_their_version() -> None:
    server = ModelServer({"m": tfrt_py.load(make_models.mlp_small())})
    try:
        server.start()
        m = server.get("m")
        assert m is not None and m.version == "1" and m.describe()["version"] == "1"
    finally:
        server.close()
