"""The Open Inference Protocol (KServe v2) over real HTTP, driven by Triton's own client
(tritonclient[http], a test-only dependency): health, server and model metadata, inference
with JSON and with binary tensors (tritonclient's default) on models of several dtypes
(float, int64 ids, bool, fp16, strings), output selection, a dynamic batch, the ``id``
echo, the ``timeout`` parameter, and errors -- read back through the client's
``InferenceServerException`` -- each followed by a correct answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

import tfrt_py
from tfrt_py.examples import make_models
from tfrt_py.serving import ServerThread, create_app

TABLE = np.arange(30, dtype=np.float32).reshape(10, 3) / 7


def _info(name: str, dtype: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes: list[Any], ins: list[Any], outs: list[Any], inits: Any = ()) -> Any:
    graph = helper.make_graph(nodes, "g", ins, outs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ids_model() -> tfrt_py.Model:
    """ids int64[N,4], mask bool[N,4] -> emb float32[N,4,3] (rows of TABLE), count
    int64[N] (mask's trues per row), inv bool[N,4] (not mask)."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Cast", ["mask"], ["m64"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["m64", "axes"], ["count"], keepdims=0),
        helper.make_node("Not", ["mask"], ["inv"]),
    ]
    inits = [
        numpy_helper.from_array(TABLE, "table"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    ins = [_info("ids", TensorProto.INT64, ["N", 4]), _info("mask", TensorProto.BOOL, ["N", 4])]
    outs = [
        _info("emb", TensorProto.FLOAT, ["N", 4, 3]),
        _info("count", TensorProto.INT64, ["N"]),
        _info("inv", TensorProto.BOOL, ["N", 4]),
    ]
    return tfrt_py.load(_model(nodes, ins, outs, inits))


def half_model() -> tfrt_py.Model:
    nodes = [helper.make_node("Relu", ["h"], ["r"])]
    return tfrt_py.load(
        _model(
            nodes,
            [_info("h", TensorProto.FLOAT16, ["N", 2])],
            [_info("r", TensorProto.FLOAT16, ["N", 2])],
        )
    )


def text_model() -> tfrt_py.Model:
    node = helper.make_node("StringNormalizer", ["s"], ["t"], case_change_action="UPPER")
    return tfrt_py.load(
        _model(
            [node], [_info("s", TensorProto.STRING, ["N"])], [_info("t", TensorProto.STRING, ["N"])]
        )
    )


def loop_model() -> tfrt_py.Model:
    """y = x + n by a Loop whose trip count n is a feed (2**62: forever)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("Add", ["v", "one"], ["v_out"]),
        ],
        "body",
        [_info("i", TensorProto.INT64, []), _info("c", TensorProto.BOOL, []),
         _info("v", TensorProto.FLOAT, [2])],
        [_info("c_out", TensorProto.BOOL, []), _info("v_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )  # fmt: skip
    node = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
    ins = [_info("n", TensorProto.INT64, []), _info("x", TensorProto.FLOAT, [2])]
    return tfrt_py.load(_model([node], ins, [_info("y", TensorProto.FLOAT, [2])]))


MODELS: dict[str, tfrt_py.Model] = {}
X = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    MODELS.update(mlp=tfrt_py.load(make_models.mlp_small()), ids=ids_model())
    MODELS.update(half=half_model(), text=text_model(), loop=loop_model())
    app = create_app(dict(MODELS), max_body_bytes=1 << 20)
    with ServerThread(app) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    try:
        yield c
    finally:
        c.close()


def tensor(name: str, arr: np.ndarray, datatype: str, binary: bool = True) -> Any:
    t = triton.InferInput(name, list(arr.shape), datatype)
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def assert_serving(c: triton.InferenceServerClient) -> None:
    """The server still answers a good request correctly."""
    r = c.infer("mlp", [tensor("x", X, "FP32")])
    np.testing.assert_allclose(r.as_numpy("probs"), MODELS["mlp"].run({"x": X})["probs"])


def refused(c: triton.InferenceServerClient, status: int, *needles: str, **infer: Any) -> None:
    """``c.infer(**infer)`` fails with ``status`` and a message holding ``needles``; then
    the server answers correctly."""
    with pytest.raises(InferenceServerException) as info:
        c.infer(**infer)
    assert info.value.status() == str(status), info.value.message()
    for needle in needles:
        assert needle in info.value.message(), info.value.message()
    assert_serving(c)


# -- health and metadata --------------------------------------------------------------------


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "tfrt_py" and meta["version"] == tfrt_py.__version__
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("nope")


def test_model_config_and_statistics(client: triton.InferenceServerClient) -> None:
    """Issue 38: /config and /stats answered 404, so tritonclient's get_model_config and
    get_inference_statistics failed (perf_analyzer and model_analyzer read them)."""
    cfg = client.get_model_config("mlp")
    assert cfg["name"] == "mlp" and cfg["max_batch_size"] == 0
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        ("x", "TYPE_FP32", [1, 64])]  # fmt: skip
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
        ("probs", "TYPE_FP32", [1, 10])]  # fmt: skip
    assert client.get_model_config("mlp", "1") == cfg

    def totals() -> dict[str, Any]:
        (stats,) = client.get_inference_statistics("mlp")["model_stats"]
        assert (stats["name"], stats["version"]) == ("mlp", "1")
        return stats

    before = totals()
    for _ in range(3):
        client.infer("mlp", [tensor("x", X, "FP32")])
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [tensor("x", X[:, :32], "FP32")])  # refused: a failure
    after = totals()
    grew = {k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"]
            for k in ("success", "fail", "queue", "compute_infer")}  # fmt: skip
    assert grew == {"success": 3, "fail": 1, "queue": 3, "compute_infer": 3}
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"][
        "compute_infer"]["ns"]  # fmt: skip
    assert after["last_inference"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} == set(MODELS)
    with pytest.raises(InferenceServerException):
        client.get_model_config("nope")


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("mlp")
    assert meta["name"] == "mlp" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 64]}]
    assert meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [1, 10]}]
    ids = client.get_model_metadata("ids", "1")
    assert ids["inputs"] == [
        {"name": "ids", "datatype": "INT64", "shape": [-1, 4]},
        {"name": "mask", "datatype": "BOOL", "shape": [-1, 4]},
    ]
    assert [(o["name"], o["datatype"]) for o in ids["outputs"]] == [
        ("emb", "FP32"), ("count", "INT64"), ("inv", "BOOL"),
    ]  # fmt: skip
    assert client.get_model_metadata("half")["inputs"][0]["datatype"] == "FP16"
    assert client.get_model_metadata("text")["outputs"][0] == {
        "name": "t", "datatype": "BYTES", "shape": [-1],
    }  # fmt: skip
    for args in (("nope",), ("mlp", "7")):
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata(*args)
        assert info.value.status() == "404"


# -- inference ------------------------------------------------------------------------------


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_infer_float(
    client: triton.InferenceServerClient, binary_in: bool, binary_out: bool
) -> None:
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    out = triton.InferRequestedOutput("probs", binary_data=binary_out)
    r = client.infer("mlp", [tensor("x", x, "FP32", binary_in)], outputs=[out], request_id="r-1")
    assert r.get_response()["id"] == "r-1"
    assert r.get_response()["model_version"] == "1"
    assert ("parameters" in r.get_output("probs")) == binary_out
    np.testing.assert_allclose(r.as_numpy("probs"), MODELS["mlp"].run({"x": x})["probs"])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_int64_ids_and_bool_in_a_dynamic_batch(
    client: triton.InferenceServerClient, binary: bool
) -> None:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 10, (5, 4)).astype(np.int64)
    mask = rng.random((5, 4)) < 0.5
    outs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("emb", "count", "inv")]
    r = client.infer(
        "ids", [tensor("ids", ids, "INT64", binary), tensor("mask", mask, "BOOL", binary)],
        outputs=outs,
    )  # fmt: skip
    np.testing.assert_array_equal(r.as_numpy("emb"), TABLE[ids])
    np.testing.assert_array_equal(r.as_numpy("count"), mask.sum(axis=1))
    assert r.as_numpy("count").dtype == np.int64
    np.testing.assert_array_equal(r.as_numpy("inv"), ~mask)
    assert r.as_numpy("inv").dtype == bool
    assert [o["shape"] for o in r.get_response()["outputs"]] == [[5, 4, 3], [5], [5, 4]]


def test_outputs_selection(client: triton.InferenceServerClient) -> None:
    ids = np.array([[1, 2, 3, 4]], np.int64)
    mask = np.array([[True, False, True, True]])
    outs = [
        triton.InferRequestedOutput("inv", binary_data=False),
        triton.InferRequestedOutput("count", binary_data=True),
    ]
    r = client.infer(
        "ids", [tensor("ids", ids, "INT64"), tensor("mask", mask, "BOOL")], outputs=outs
    )
    assert [o["name"] for o in r.get_response()["outputs"]] == ["inv", "count"]
    assert r.as_numpy("emb") is None
    assert r.get_output("inv")["data"] == [False, True, False, False]
    np.testing.assert_array_equal(r.as_numpy("count"), [3])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp16_and_strings(client: triton.InferenceServerClient, binary: bool) -> None:
    h = np.array([[-1.5, 2.25], [0.5, -0.0]], np.float16)
    r = client.infer("half", [tensor("h", h, "FP16", binary)])
    assert r.as_numpy("r").dtype == np.float16
    np.testing.assert_array_equal(r.as_numpy("r"), np.maximum(h, 0))
    s = np.array(["hello", "Wörld", ""], dtype=object)
    out = triton.InferRequestedOutput("t", binary_data=binary)
    r = client.infer("text", [tensor("s", s, "BYTES", binary)], outputs=[out])
    got = [v.decode() if isinstance(v, bytes) else v for v in r.as_numpy("t")]
    assert got == ["HELLO", "WÖRLD", ""]


def test_nested_and_flat_json_data_and_the_id_echo(url: str) -> None:
    want = MODELS["ids"].run({"ids": np.array([[1, 2, 3, 4]] * 2), "mask": np.ones((2, 4), bool)})
    for data in ([[1, 2, 3, 4], [1, 2, 3, 4]], [1, 2, 3, 4, 1, 2, 3, 4]):
        body = {
            "id": "xyz",
            "inputs": [
                {"name": "ids", "datatype": "INT64", "shape": [2, 4], "data": data},
                {"name": "mask", "datatype": "BOOL", "shape": [2, 4], "data": [True] * 8},
            ],
            "outputs": [{"name": "count"}],
        }
        r = httpx.post(f"{url}/v2/models/ids/infer", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        doc = r.json()
        assert doc["id"] == "xyz" and doc["model_name"] == "ids"
        assert doc["outputs"] == [
            {"name": "count", "datatype": "INT64", "shape": [2], "data": want["count"].tolist()}
        ]


def test_the_timeout_parameter_is_the_runtime_deadline(
    client: triton.InferenceServerClient,
) -> None:
    n, x = np.array(2**62, np.int64), np.zeros(2, np.float32)
    inputs = [tensor("n", n, "INT64"), tensor("x", x, "FP32")]
    # timeout in microseconds, as tritonclient sends it; the server's own deadline is 30 s
    refused(client, 504, "'loop'", "deadline", model_name="loop", inputs=inputs, timeout=200_000)
    r = client.infer("loop", [tensor("n", np.array(3, np.int64), "INT64"), inputs[1]])
    np.testing.assert_array_equal(r.as_numpy("y"), [3.0, 3.0])


# -- errors, each followed by a correct answer ----------------------------------------------


def test_wrong_datatype(client: triton.InferenceServerClient) -> None:
    x64 = X.astype(np.float64)
    refused(client, 400, "'x'", "FP64", "FP32", model_name="mlp", inputs=[tensor("x", x64, "FP64")])
    ids = np.zeros((1, 4), np.int32)
    refused(
        client, 400, "'ids'", "INT32", "INT64",
        model_name="ids", inputs=[tensor("ids", ids, "INT32"), tensor("mask", ids > 0, "BOOL")],
    )  # fmt: skip


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_wrong_shape(client: triton.InferenceServerClient, binary: bool) -> None:
    bad = np.zeros((1, 63), np.float32)
    refused(
        client, 400, "'x'", "[1, 63]", "[1, 64]",
        model_name="mlp", inputs=[tensor("x", bad, "FP32", binary)],
    )  # fmt: skip
    ids = np.zeros((2, 5), np.int64)
    refused(
        client, 400, "'ids'", "[-1, 4]",
        model_name="ids", inputs=[tensor("ids", ids, "INT64"), tensor("mask", ids > 0, "BOOL")],
    )  # fmt: skip


def test_unknown_model_input_and_output(client: triton.InferenceServerClient) -> None:
    refused(
        client, 404, "'nope'", "unknown model", model_name="nope", inputs=[tensor("x", X, "FP32")]
    )
    refused(
        client, 404, "version", model_name="mlp", model_version="3", inputs=[tensor("x", X, "FP32")]
    )
    z = tensor("z", X, "FP32")
    refused(client, 400, "unknown input", "'z'", "['x']", model_name="mlp", inputs=[z])
    out = triton.InferRequestedOutput("logits")
    refused(
        client, 400, "unknown output", "'logits'", "['probs']",
        model_name="mlp", inputs=[tensor("x", X, "FP32")], outputs=[out],
    )  # fmt: skip
    refused(
        client,
        400,
        "missing input",
        "'mask'",
        model_name="ids",
        inputs=[tensor("ids", np.zeros((1, 4), np.int64), "INT64")],
    )


def test_a_compressed_body_is_415(client: triton.InferenceServerClient) -> None:
    refused(
        client, 415, "Content-Encoding",
        model_name="mlp", inputs=[tensor("x", X, "FP32")], request_compression_algorithm="gzip",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "headers", "needle"),
    [
        (b'{"inputs": [', {}, "malformed JSON"),
        (b"[1, 2]", {}, '"inputs"'),
        (b'{"inputs": {"x": 1}}', {}, '"inputs" must be a list'),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64]}]}).encode(),
         {}, "no data"),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "abc"}, "must be a number"),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "99"}, "only 14 bytes"),
        (b'{"inputs": []}xyz', {"Inference-Header-Content-Length": "14"}, "3 bytes of binary"),
        # issue 38's four small faults: each was a misleading message or a 200
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2**62, 4],
                                 "data": [0]}]}).encode(), {},
         "dim 4611686018427387904 is too large"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                 "parameters": {"binary_data_size": 256}}]}).encode()
         + np.zeros(64, np.float32).tobytes() + b"\xff", {},
         "binary tensor data follows a JSON header whose length the Inference-Header"),
        (b'{"inputs": []}' + b"\x00" * 8, {}, "binary tensor data after the JSON needs the"),
        (b'{"inputs": []}', [("Inference-Header-Content-Length", "14"),
                             ("Inference-Header-Content-Length", "14")], "given 2 times"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                 "data": [[0.0] * 32, [0.0] * 32]}]}).encode(), {},
         '"data" is nested as [2, 32], but the shape is [1, 64]'),
    ],
)  # fmt: skip
def test_malformed_requests_are_400_as_json(
    url: str, client: triton.InferenceServerClient, body: bytes, headers: Any, needle: str
) -> None:
    r = httpx.post(f"{url}/v2/models/mlp/infer", content=body, headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert needle in r.json()["error"]
    assert_serving(client)
