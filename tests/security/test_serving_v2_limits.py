"""The v2 (Open Inference Protocol) request path is bounded before it allocates: the JSON
header's length (``Inference-Header-Content-Length``), each input's ``binary_data_size``
against the bytes sent and against its shape and datatype, shapes (ints, rank, a product
that would overflow int64 is refused by the decoded-bytes limit, not wrapped around),
BYTES elements' lengths and counts, BOOL bytes, and the number of inputs. Each bound has
a request here that, without it, would allocate on the request's word, read past the
data, or fail with a 500; every refusal is a 4xx JSON error on a connection that then
answers a good request (the client port shows it is the same one). A fuzz pass mutates
real tritonclient bodies: never a 5xx, never a dropped connection.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import tfrt_py
from tests.support.serving import X, client_port, mlp
from tfrt_py.serving import ServerThread, create_app

BODY_LIMIT = 1 << 20  # decoded limit: 4 MiB
HEADER = "Inference-Header-Content-Length"


def _model(node: Any, ins: list[Any], outs: list[Any]) -> tfrt_py.Model:
    graph = helper.make_graph([node], "g", ins, outs)
    return tfrt_py.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def dyn_model() -> tfrt_py.Model:
    """y = sum of x float32[A, B, C] (every dim dynamic)."""
    node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["A", "B", "C"])
    return _model(node, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])


def text_model() -> tfrt_py.Model:
    node = helper.make_node("StringNormalizer", ["s"], ["t"], case_change_action="UPPER")
    s = helper.make_tensor_value_info("s", TensorProto.STRING, ["N"])
    return _model(node, [s], [helper.make_tensor_value_info("t", TensorProto.STRING, ["N"])])


def flags_model() -> tfrt_py.Model:
    node = helper.make_node("Not", ["b"], ["nb"])
    b = helper.make_tensor_value_info("b", TensorProto.BOOL, [4])
    return _model(node, [b], [helper.make_tensor_value_info("nb", TensorProto.BOOL, [4])])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    models = {"mlp": mlp(), "dyn": dyn_model(), "text": text_model(), "flags": flags_model()}
    with ServerThread(create_app(models, max_body_bytes=BODY_LIMIT)) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=120) as c:
        yield c


def v2(header: dict[str, Any], data: bytes = b"", length: str | None = None) -> tuple[bytes, Any]:
    """A v2 body: the JSON header, then ``data``; the header-length header (``length``
    overrides the true one)."""
    head = json.dumps(header).encode()
    if not data and length is None:
        return head, {}
    return head + data, {HEADER: length if length is not None else str(len(head))}


def binary_input(name: str, datatype: str, shape: list[Any], size: Any) -> dict[str, Any]:
    params = {"binary_data_size": size}
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": params}


def x_json(shape: Any, data: Any, name: str = "x", datatype: str = "FP32") -> dict[str, Any]:
    return {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}


def good_v2() -> tuple[bytes, Any]:
    header = {
        "inputs": [binary_input("x", "FP32", [1, 64], 256)],
        "parameters": {"binary_data_output": True},
    }
    return v2(header, X.tobytes())


def assert_good_after(client: httpx.Client, r: httpx.Response) -> None:
    """The good request is answered correctly, on the connection ``r`` came over."""
    port = client_port(r)
    body, headers = good_v2()
    good = client.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert good.status_code == 200, good.text
    head = int(good.headers[HEADER])
    got = np.frombuffer(good.content[head:], np.float32).reshape(1, 10)
    np.testing.assert_allclose(got, mlp().run({"x": X})["probs"], rtol=1e-6, atol=1e-7)
    assert client_port(good) == port, "the server closed the connection after the error"


def _str(n: int) -> bytes:
    return struct.pack("<I", n)


CASES = [
    # binary_data_size against the bytes that follow the JSON
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], 256)]}, bytes(100)),
                 400, ["100 bytes of binary data", "256"], id="size-past-the-data"),
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], 10)]}, bytes(300)),
                 400, ["binary_data_size 10", "256 bytes"], id="size-not-the-shape"),
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], -4)]}, bytes(4)),
                 400, ["binary_data_size"], id="size-negative"),
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], 2**70)]}, bytes(4)),
                 400, ["binary_data_size"], id="size-huge"),
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], "256")]}, bytes(256)),
                 400, ["binary_data_size"], id="size-not-an-int"),
    # the JSON header's length
    pytest.param("mlp", v2({"inputs": []}, b"x", length="-1"), 400, ["must be a number"],
                 id="header-length-negative"),
    pytest.param("mlp", v2({"inputs": []}, b"x", length="9" * 40), 400, ["must be a number"],
                 id="header-length-40-digits"),
    pytest.param("mlp", v2({"inputs": []}, b"x", length=str(2**62)), 400, ["only"],
                 id="header-length-past-the-body"),
    pytest.param("mlp", v2({"inputs": []}, b"x", length="5"), 400,
                 ["malformed JSON request header"], id="header-length-cuts-the-json"),
    # shapes
    pytest.param("dyn", v2(x_json([2**31, 2**31, 2**31], [])), 400,
                 ["multiply to", "2**62"], id="shape-product-past-int64"),
    pytest.param("dyn", v2(x_json([2**61, 2**61, 0], [])), 400, ["multiply to", "2**62"],
                 id="shape-product-zero-with-huge-dims"),
    pytest.param("dyn", v2(x_json([2**20, 2**20, 2**20], [])), 413,
                 ["decoded bytes", str(4 * 2**60)], id="shape-product-past-the-limit"),
    pytest.param("dyn", v2(x_json([1024, 1024, 2], [])), 413, ["8388608 bytes"],
                 id="shape-over-the-decoded-limit"),
    pytest.param("dyn", v2({"inputs": [binary_input("x", "FP32", [2**20, 2**20, 2], 2**43)]},
                           bytes(16)), 413, ["decoded bytes"], id="binary-shape-over-the-limit"),
    pytest.param("dyn", v2(x_json([1] * 65, [1.0])), 400, ["at most 64"], id="rank-65"),
    pytest.param("dyn", v2(x_json([1, -1, 1], [1.0])), 400, ["dims are integers >= 0"],
                 id="dim-negative"),
    pytest.param("dyn", v2(x_json([1, 1.5, 1], [1.0])), 400, ["dims are integers"],
                 id="dim-float"),
    pytest.param("dyn", v2(x_json([1, True, 1], [1.0])), 400, ["dims are integers"],
                 id="dim-bool"),
    pytest.param("dyn", v2(x_json([2, 2, 2], [1.0] * 7)), 400, ["8 elements", "has 7"],
                 id="data-count"),
    pytest.param("mlp", v2(x_json([1, 64], [[0.5] * 64], datatype="FP64")), 400,
                 ["FP64", "FP32"], id="datatype"),
    # BYTES elements
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [1], 8)]},
                            _str(0xFFFFFFFF) + b"abcd"), 400,
                 ["declares 4294967295 bytes", "only 4 remain"], id="bytes-length-past-the-data"),
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [2], 8)]},
                            _str(1) + b"a" + _str(0)[:3]), 400, ["ends after 1 of 2"],
                 id="bytes-fewer-elements"),
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [1], 10)]},
                            _str(1) + b"a" + _str(1) + b"b"), 400, ["5 bytes left after"],
                 id="bytes-more-elements"),
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [2], 4)]}, _str(0)), 400,
                 ["too small for 2 BYTES elements"], id="bytes-size-below-the-count"),
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [10**8], 4 * 10**8)]},
                            _str(0)), 413, ["decoded bytes"], id="bytes-count-over-the-limit"),
    pytest.param("text", v2({"inputs": [binary_input("s", "BYTES", [1], 6)]},
                            _str(2) + b"\xff\xfe"), 400, ["not UTF-8"], id="bytes-not-utf8"),
    # BOOL bytes and the number of inputs
    pytest.param("flags", v2({"inputs": [binary_input("b", "BOOL", [4], 4)]}, b"\x00\x01\x02\x01"),
                 400, ["0 or 1"], id="bool-byte-2"),
    pytest.param("mlp", v2({"inputs": [{"name": f"i{k}"} for k in range(30_000)]}), 400,
                 ["30000 inputs sent", "has 1"], id="30k-inputs"),
    pytest.param("mlp", v2(x_json([1, 64], [0.5] * 64, name="n" * 100_000)), 400,
                 ["unknown input"], id="long-input-name"),
    pytest.param("mlp", v2({"inputs": [], "parameters": {"timeout": -5}}), 400,
                 ["parameters.timeout"], id="timeout-negative"),
    pytest.param("mlp", v2({"inputs": [], "parameters": {"priority": 2**64}}), 400,
                 ["parameters.priority"], id="priority-past-uint64"),
    pytest.param("mlp", v2({"inputs": [], "parameters": {"sequence_id": 7}}), 400,
                 ["sequence"], id="sequence"),
    pytest.param("mlp", v2({"inputs": [binary_input("x", "FP32", [1, 64], 256) | {
                     "parameters": {"shared_memory_region": "r"}}]}), 400, ["shared memory"],
                 id="shared-memory"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "request_", "status", "needles"), CASES)
def test_bounds_are_4xx_and_the_connection_stays_usable(
    client: httpx.Client,
    model: str,
    request_: tuple[bytes, Any],
    status: int,
    needles: list[str],
) -> None:
    body, headers = request_
    r = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert len(error) < 2000
    for needle in needles:
        assert needle in error, error
    assert_good_after(client, r)


def test_a_body_over_the_limit_is_413_before_it_is_read(client: httpx.Client) -> None:
    body, headers = v2(x_json([1, 64], [0.5] * 64), bytes(BODY_LIMIT))
    r = client.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == 413 and f"limit of {BODY_LIMIT} bytes" in r.json()["error"]
    assert_good_after(client, r)


# -- fuzzing real tritonclient bodies -------------------------------------------------------

FUZZ = settings(
    derandomize=True,
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _triton_body(binary: bool) -> tuple[bytes, int | None]:
    t = triton.InferInput("x", [1, 64], "FP32")
    t.set_data_from_numpy(X, binary_data=binary)
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [t], outputs=[triton.InferRequestedOutput("probs", binary_data=binary)], request_id="f"
    )
    return body, json_size


def _mutate(body: bytes, seed: int, kind: str) -> bytes:
    rng = random.Random(seed)
    b = bytearray(body)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == "byte":
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == "cut":
        del b[rng.randrange(len(b)) :]
    else:  # splice: a chunk moved elsewhere
        i, j = sorted(rng.sample(range(len(b)), 2))
        chunk = b[i:j]
        del b[i:j]
        k = rng.randrange(len(b) + 1)
        b[k:k] = chunk
    return bytes(b)


@FUZZ
@given(
    binary=st.booleans(),
    kind=st.sampled_from(["flip", "byte", "cut", "splice"]),
    seed=st.integers(0, 2**32),
    length_shift=st.sampled_from([0, 0, 0, -1, 1, -17, 1000]),
)
def test_mutated_tritonclient_bodies_are_never_5xx(
    client: httpx.Client, binary: bool, kind: str, seed: int, length_shift: int
) -> None:
    body, json_size = _triton_body(binary)
    mutated = _mutate(body, seed, kind)
    headers = {}
    if json_size is not None:
        headers[HEADER] = str(max(0, json_size + length_shift))
    r = client.post("/v2/models/mlp/infer", content=mutated, headers=headers)
    assert r.status_code < 500, r.text[:2000]
    if r.status_code >= 400:
        assert r.headers["content-type"] == "application/json"
        assert isinstance(r.json()["error"], str)
    assert_good_after(client, r)
