"""A default skl2onnx classifier (ZipMap on: probabilities as a sequence of {class: p}
maps) over the Open Inference Protocol (issue 38, item 4). Before: the metadata said
``UNSUPPORTED(None)`` and infer answered BYTES holding Python reprs of dicts. Now the
output is BYTES, one JSON object per row, over JSON, binary tensors and gRPC, and its
metadata and configuration say so. Real exports (skl2onnx), real clients (httpx,
tritonclient.http, tritonclient.grpc), onnxruntime's answers as the reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as thttp
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

from tfrt_py.serving import ServerThread, create_app

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (the [grpc] extra)")


@pytest.fixture(scope="module")
def zipmap_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0)  # three classes
    onx = to_onnx(LogisticRegression(max_iter=300).fit(x, y), x[:1])
    path = tmp_path_factory.mktemp("zipmap") / "clf.onnx"
    path.write_bytes(onx.SerializeToString())
    return str(path), x[:5]


@pytest.fixture(scope="module")
def served(zipmap_model: tuple[str, np.ndarray]) -> Iterator[tuple[str, str]]:
    app = create_app({"clf": zipmap_model[0]}, grpc="127.0.0.1:0")
    with ServerThread(app) as url:
        yield url, f"127.0.0.1:{app.state.grpc_port}"


def _reference(path: str, x: np.ndarray) -> list[dict[str, float]]:
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    maps = sess.run(["output_probability"], {"X": x})[0]
    return [{str(k): float(v) for k, v in row.items()} for row in maps]


def _check(rows: list[str], want: list[dict[str, float]]) -> None:
    got = [json.loads(r) for r in rows]
    assert [list(g) for g in got] == [list(w) for w in want]  # the classes, in order
    for g, w in zip(got, want):
        np.testing.assert_allclose(list(g.values()), list(w.values()), rtol=1e-5, atol=1e-6)


def test_metadata_and_config_call_it_bytes(served: tuple[str, str]) -> None:
    url, _ = served
    meta = httpx.get(url + "/v2/models/clf").json()
    out = {o["name"]: o for o in meta["outputs"]}
    assert out["output_probability"] == {"name": "output_probability", "datatype": "BYTES",
                                         "shape": [-1]}  # fmt: skip
    config = httpx.get(url + "/v2/models/clf/config").json()
    types = {o["name"]: o["data_type"] for o in config["output"]}
    assert types["output_probability"] == "TYPE_STRING"


def test_json_binary_and_grpc_answer_one_json_object_per_row(
    served: tuple[str, str], zipmap_model: tuple[str, np.ndarray]
) -> None:
    url, address = served
    path, x = zipmap_model
    want = _reference(path, x)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                        "data": x.ravel().tolist()}]}  # fmt: skip
    r = httpx.post(url + "/v2/models/clf/infer", json=body)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o for o in r.json()["outputs"]}
    assert outs["output_probability"]["datatype"] == "BYTES"
    _check(outs["output_probability"]["data"], want)

    client = thttp.InferenceServerClient(url.removeprefix("http://"))
    inp = thttp.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = client.infer("clf", [inp])
    _check([b.decode() for b in res.as_numpy("output_probability")], want)

    import tritonclient.grpc as tgrpc

    gclient = tgrpc.InferenceServerClient(address)
    ginp = tgrpc.InferInput("X", list(x.shape), "FP32")
    ginp.set_data_from_numpy(x)
    gres = gclient.infer("clf", [ginp])
    _check([b.decode() for b in gres.as_numpy("output_probability")], want)


def test_labels_still_answer_as_int64(served: tuple[str, str]) -> None:
    url, _ = served
    x = np.zeros((2, 4), np.float32)
    inputs = [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": x.ravel().tolist()}]
    body = {"inputs": inputs, "outputs": [{"name": "output_label"}]}
    r = httpx.post(url + "/v2/models/clf/infer", json=body)
    assert r.status_code == 200 and r.json()["outputs"][0]["datatype"] == "INT64"


def test_the_dense_form_is_one_fp32_column_per_class(
    served: tuple[str, str], zipmap_model: tuple[str, np.ndarray]
) -> None:
    """``"parameters": {"dense": true}`` on the output: FP32 [rows, classes], columns in
    the classes' order, over JSON and gRPC."""
    url, address = served
    path, x = zipmap_model
    want = np.array([list(row.values()) for row in _reference(path, x)], np.float32)
    body = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                    "data": x.ravel().tolist()}],
        "outputs": [{"name": "output_probability", "parameters": {"dense": True}}],
    }  # fmt: skip
    r = httpx.post(url + "/v2/models/clf/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == "FP32" and out["shape"] == [len(x), 3]
    np.testing.assert_allclose(np.reshape(out["data"], out["shape"]), want, rtol=1e-5, atol=1e-6)

    import tritonclient.grpc as tgrpc
    from tritonclient.grpc import service_pb2

    stub = tgrpc.InferenceServerClient(address)
    req = service_pb2.ModelInferRequest(model_name="clf")
    t = req.inputs.add(name="X", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    o = req.outputs.add(name="output_probability")
    o.parameters["dense"].bool_param = True
    resp = stub._client_stub.ModelInfer(req)
    assert t.name == "X" and resp.outputs[0].datatype == "FP32"
    got = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(resp.outputs[0].shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
