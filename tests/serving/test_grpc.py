"""The Open Inference Protocol over gRPC (``serving/grpc_service.py``, issue 38), with real
clients: ``tritonclient.grpc`` (sync) and ``tritonclient.grpc.aio`` against a server on
loopback (``create_app(..., grpc=)`` under uvicorn on a thread), and the wire schema
against tritonclient's own descriptors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("grpc", reason="grpcio is not installed (the [grpc] extra)")

import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

import tfrt_py
from tfrt_py.serving import ServerThread, create_app
from tfrt_py.serving.grpc_schema import MESSAGES

NAME = "mlp"
WIDTH = 8
MLP = ""  # the model file, written by ``served``


def _write_model(path: str) -> None:
    """x [N, 8] -> y = Relu(x W + b) [N, 4], s = Sigmoid(y): a dynamic batch, two outputs."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((WIDTH, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"]),
             helper.make_node("Sigmoid", ["y"], ["s"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("y", "s")],
        [w, b],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(grpc address, http url) of a server of the model (twice, as two names)."""
    global MLP
    MLP = str(tmp_path_factory.mktemp("grpc") / "mlp.onnx")
    _write_model(MLP)
    app = create_app({NAME: MLP, "other": MLP}, grpc="127.0.0.1:0")
    with ServerThread(app) as url:
        yield f"127.0.0.1:{app.state.grpc_port}", url


def _x(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, WIDTH)).astype(np.float32)


def _expected(x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(MLP, providers=["CPUExecutionProvider"])
    return list(sess.run(None, {"x": x}))


def _inputs(client_mod: Any, x: np.ndarray) -> list[Any]:
    inp = client_mod.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def test_the_schema_is_tritonclients_on_the_wire() -> None:
    """Every field we define has the name, number, type, cardinality, message type and
    oneof of tritonclient's (Triton's grpc_service.proto)."""
    for path, cls in MESSAGES.items():
        ours = cls.DESCRIPTOR
        outer, *inner = path.split(".")
        pb = service_pb2 if outer in service_pb2.DESCRIPTOR.message_types_by_name else None
        theirs = (pb or model_config_pb2).DESCRIPTOR.message_types_by_name[outer]
        for part in inner:
            theirs = theirs.nested_types_by_name[part]
        for f in ours.fields:
            g = theirs.fields_by_name[f.name]

            def shape(d: Any) -> tuple[Any, ...]:
                mt, et = d.message_type, d.enum_type
                values = [(v.name, v.number) for v in et.values] if et else None
                return (d.number, d.type, d.is_repeated, mt.full_name if mt else None, values,
                        mt.GetOptions().map_entry if mt else None,
                        d.containing_oneof.name if d.containing_oneof else None)  # fmt: skip

            assert shape(f) == shape(g), (path, f.name)


def test_sync_client_health_metadata_infer_and_statistics(served: tuple[str, str]) -> None:
    address, _ = served
    c = tgrpc.InferenceServerClient(address)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready(NAME) and not c.is_model_ready("nope")
    meta = c.get_server_metadata()
    assert meta.name == "tfrt_py" and "binary_tensor_data" in meta.extensions
    mm = c.get_model_metadata(NAME)
    assert mm.name == NAME and mm.inputs[0].datatype == "FP32"
    for rows in (1, 5):
        x = _x(rows)
        res = c.infer(NAME, _inputs(tgrpc, x))
        for out, want in zip(tfrt_py.load(MLP).outputs, _expected(x)):
            np.testing.assert_allclose(res.as_numpy(out.name), want, rtol=1e-5, atol=1e-6)
    stats = c.get_inference_statistics(NAME)
    assert stats.model_stats[0].inference_count >= 2
    config = c.get_model_config(NAME).config
    assert config.name == NAME and config.input[0].name == "x"
    assert model_config_pb2.DataType.Name(config.input[0].data_type) == "TYPE_FP32"
    assert list(config.output[0].dims)[-1] == 4
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    index = c.get_model_repository_index()
    assert {m.name for m in index.models} == {NAME, "other"}
    assert all(m.state == "READY" for m in index.models)


def test_typed_contents_and_a_chosen_output(served: tuple[str, str]) -> None:
    """An input sent as ``contents.fp32_contents`` (not raw) and ``outputs`` naming one."""
    address, _ = served
    c = tgrpc.InferenceServerClient(address)
    model = tfrt_py.load(MLP)
    x = _x(3)
    req = service_pb2.ModelInferRequest(model_name=NAME)
    t = req.inputs.add(name=model.inputs[0].name, datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.ravel().tolist())
    req.outputs.add(name=model.outputs[-1].name)
    resp = c._client_stub.ModelInfer(req)
    assert [o.name for o in resp.outputs] == [model.outputs[-1].name]
    got = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(resp.outputs[0].shape)
    np.testing.assert_allclose(got, _expected(x)[-1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("mutate", "code", "words"),
    [
        (lambda r: setattr(r, "model_name", "nope"), "NOT_FOUND", "unknown model"),
        (lambda r: r.inputs[0].__setattr__("datatype", "FP64"), "INVALID_ARGUMENT", "datatype"),
        (lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 3), "INVALID_ARGUMENT", "bytes"),
        (lambda r: r.raw_input_contents.append(b""), "INVALID_ARGUMENT", "raw_input_contents"),
        (lambda r: r.inputs[0].shape.__setitem__(0, 2**62), "INVALID_ARGUMENT", "too large"),
    ],
    ids=["unknown-model", "wrong-datatype", "short-raw", "extra-raw", "huge-dim"],
)
def test_bad_requests_are_statuses_with_the_reason(
    served: tuple[str, str], mutate: Any, code: str, words: str
) -> None:
    address, _ = served
    c = tgrpc.InferenceServerClient(address)
    x = _x(2)
    req = service_pb2.ModelInferRequest(model_name=NAME)
    req.inputs.add(name=tfrt_py.load(MLP).inputs[0].name, datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    mutate(req)
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        c._client_stub.ModelInfer(req)
    assert e.value.code().name == code, e.value.details()
    assert words in e.value.details()
    assert c.is_server_live() and c.is_model_ready(NAME)  # still serving


def test_aio_client_infers_concurrently(served: tuple[str, str]) -> None:
    address, _ = served

    async def main() -> list[np.ndarray]:
        c = tgrpc_aio.InferenceServerClient(address)
        try:
            xs = [_x(r) for r in (1, 2, 3, 4)]
            results = await asyncio.gather(*(c.infer(NAME, _inputs(tgrpc_aio, x)) for x in xs))
            out = tfrt_py.load(MLP).outputs[0].name
            for x, res in zip(xs, results):
                np.testing.assert_allclose(res.as_numpy(out), _expected(x)[0], rtol=1e-5,
                                           atol=1e-6)  # fmt: skip
            return [r.as_numpy(out) for r in results]
        finally:
            await c.close()

    assert len(asyncio.run(main())) == 4


def test_a_stream_of_requests_is_answered_in_order_and_survives_a_bad_one(
    served: tuple[str, str],
) -> None:
    """ModelStreamInfer through tritonclient's aio stream: answers in order, a request for
    an unknown model answered in-band with its error, the stream going on after it."""
    address, _ = served

    xs = [_x(r) for r in (1, 2, 3)]

    async def main() -> list[tuple[Any, Any]]:
        c = tgrpc_aio.InferenceServerClient(address)

        async def requests() -> Any:
            yield {"model_name": NAME, "inputs": _inputs(tgrpc_aio, xs[0])}
            yield {"model_name": "nope", "inputs": _inputs(tgrpc_aio, xs[1])}
            yield {"model_name": NAME, "inputs": _inputs(tgrpc_aio, xs[2])}

        got: list[tuple[Any, Any]] = []
        try:
            async for result, error in c.stream_infer(requests()):
                got.append((result, error))
                if len(got) == 3:
                    break
        finally:
            await c.close()
        return got

    got = asyncio.run(main())
    assert [e is None for _, e in got] == [True, False, True]
    assert "unknown model" in str(got[1][1])
    for x, (res, _) in zip((xs[0], xs[2]), (got[0], got[2])):
        np.testing.assert_allclose(res.as_numpy("y"), _expected(x)[0], rtol=1e-5, atol=1e-6)


def test_grpc_requests_are_counted_in_the_metrics(served: tuple[str, str]) -> None:
    import httpx

    address, url = served
    c = tgrpc.InferenceServerClient(address)
    before = httpx.get(url + "/metrics").text.count('protocol="grpc"')
    c.infer(NAME, _inputs(tgrpc, _x(1)))
    text = httpx.get(url + "/metrics").text
    assert 'tfrt_py_requests_total{code="200",model="mlp",protocol="grpc",version="1"}' in text
    assert text.count('protocol="grpc"') >= max(before, 1)


def test_deadline_from_the_client(served: tuple[str, str]) -> None:
    """A client deadline already spent is DEADLINE_EXCEEDED, and the server serves on. gRPC
    rounds deadlines up to the millisecond, and a warm one-row call can be answered
    within one (a flake under CI's load): the request is 2 MB, which no call answers in
    a millisecond."""
    address, _ = served
    c = tgrpc.InferenceServerClient(address)
    with pytest.raises(InferenceServerException) as e:
        c.infer(NAME, _inputs(tgrpc, _x(65536)), client_timeout=1e-6)
    assert "Deadline" in str(e.value) or "DEADLINE" in str(e.value)
    assert c.is_model_ready(NAME)


def test_tfrt_py_serve_speaks_grpc(tmp_path: Any) -> None:
    """``tfrt-py serve --grpc-port 0``: the bound address is printed and a client infers."""
    import os
    import re
    import signal
    import subprocess
    import sys

    path = str(tmp_path / "mlp.onnx")
    _write_model(path)
    exe = os.path.join(os.path.dirname(sys.executable), "tfrt-py")
    proc = subprocess.Popen([exe, "serve", path, "--port", "0", "--grpc-port", "0"],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stderr is not None
        address = None
        for line in proc.stderr:
            m = re.search(r"gRPC \(inference.GRPCInferenceService\) on (\S+)", line)
            if m:
                address = m.group(1)
                break
        assert address is not None
        c = tgrpc.InferenceServerClient(address)
        x = _x(2)
        res = c.infer("mlp", _inputs(tgrpc, x))
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(res.as_numpy("y"), sess.run(["y"], {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        if proc.stderr is not None:
            proc.stderr.close()


def test_repository_load_and_unload_over_grpc(tmp_path: Any) -> None:
    """RepositoryModelUnload/Load with model_control explicit: the model goes UNAVAILABLE
    and comes back; without it, PERMISSION_DENIED; a config sent along, INVALID_ARGUMENT."""
    path = str(tmp_path / "m.onnx")
    _write_model(path)
    for control in ("explicit", "none"):
        app = create_app({"m": path}, grpc="127.0.0.1:0", model_control=control)
        with ServerThread(app):
            c = tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc_port}")
            if control == "none":
                with pytest.raises(InferenceServerException) as e:
                    c.unload_model("m")
                assert "PERMISSION_DENIED" in str(e.value.status())
                continue
            c.unload_model("m")
            assert not c.is_model_ready("m")
            index = c.get_model_repository_index()
            assert [(m.name, m.state) for m in index.models] == [("m", "UNAVAILABLE")]
            c.load_model("m")
            assert c.is_model_ready("m")
            with pytest.raises(InferenceServerException) as e:
                c.load_model("m", config='{"max_batch_size": 8}')
            assert "INVALID_ARGUMENT" in str(e.value.status())
