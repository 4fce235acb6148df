"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), beside HTTP:
``tfrt-py serve --grpc-port 8001`` (Triton's port), for ``tritonclient.grpc`` (sync and
aio), perf_analyzer and KServe's gRPC clients.

Served RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
ModelInfer, ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload (as the HTTP
repository routes: 403 unless ``model_control`` is "explicit", a config or files sent
along refused), ModelConfig (the HTTP route's Triton configuration,
``v2.triton_config``), and ModelStreamInfer: a stream of ModelInfer
requests answered in order on one stream, a failed request answered in-band with its
``error_message`` while the stream goes on (messages: ``grpc_schema``). Others answer
UNIMPLEMENTED, as gRPC does for any unknown method.

ModelInfer is the HTTP route's request in another envelope: the message is turned into the
v2 JSON document (``raw_input_contents`` as binary data of the sizes sent, typed
``contents`` as ``data``) and checked and decoded by the same code (``v2_codec``,
``v2_binary``: datatypes exact, shapes the model's rank and dims, the decoded-bytes
limit), run by the same ``ServedModel`` (admission, micro-batching, priorities), and its
outputs answered as ``raw_output_contents`` (what tritonclient reads). Deadline: the
earliest of the server's ``--timeout``, the call's gRPC deadline and
``parameters.timeout`` (µs). A client that goes away cancels its call (gRPC cancels the
handler's task). Errors are gRPC statuses with the HTTP route's message: 400 and 422
INVALID_ARGUMENT, 404 NOT_FOUND, 408 and 504 DEADLINE_EXCEEDED, 413 RESOURCE_EXHAUSTED,
429 and 503 UNAVAILABLE, 501 UNIMPLEMENTED, else INTERNAL. Counted in the metrics with
``protocol="grpc"`` and the HTTP status the same error would have.

Which thread runs what: the gRPC server (grpcio's asyncio server) runs on the HTTP
server's event loop, started and stopped by the app's lifespan (``app.create_app(...,
grpc=)``), so both protocols share the models, their admission and batching. Under
``--workers`` every worker binds the port with SO_REUSEPORT (grpcio's default) and the
kernel spreads connections over them. Needs ``grpcio`` (the ``[grpc]`` extra).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import RequestError
from .grpc_schema import MESSAGES, RPCS, SERVICE, STREAMS
from .handling import Deadline, find_model, run_in_time
from .hub import ModelServer
from .served import ServedModel
from .v2 import EXTENSIONS, PLATFORM, tensor_meta, triton_config
from .v2_binary import decode_document, encode_blob
from .v2_codec import answer_array, datatype_of

__all__ = ["GrpcFrontend"]

#: HTTP status -> the gRPC status code's name.
_CODES = {
    400: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED",
    404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 504: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED", 429: "UNAVAILABLE", 503: "UNAVAILABLE", 501: "UNIMPLEMENTED",
}  # fmt: skip
#: The typed ``contents`` field of each datatype (FP16 and BF16 come raw only).
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


def _param(p: Any) -> Any:
    """An InferParameter's value (None when none of its choices is set)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _params(m: Any) -> dict[str, Any]:
    return {k: _param(v) for k, v in m.items()}


def _contents(name: str, datatype: str, contents: Any) -> list[Any]:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise RequestError(
            400, f"input {name!r}: {datatype[:20]!r} data comes in raw_input_contents only"
        )
    values = list(getattr(contents, field))
    if datatype != "BYTES":
        return values
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        raise RequestError(400, f"input {name!r}: BYTES contents are not UTF-8") from None


def _document(req: Any) -> tuple[dict[str, Any], memoryview | None]:
    """The v2 JSON document of a ModelInferRequest and its raw contents, joined."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise RequestError(
            400, f"raw_input_contents has {len(raw)} entries for {len(req.inputs)} inputs"
        )
    inputs = []
    for i, t in enumerate(req.inputs):
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape),
                                 "parameters": _params(t.parameters)}  # fmt: skip
        if raw:
            entry["parameters"]["binary_data_size"] = len(raw[i])
        else:
            entry["data"] = _contents(t.name, t.datatype, t.contents)
        inputs.append(entry)
    doc: dict[str, Any] = {"inputs": inputs, "parameters": _params(req.parameters)}
    if req.id:
        doc["id"] = req.id
    if req.outputs:
        doc["outputs"] = [
            {"name": o.name,
             "parameters": {k: v for k, v in _params(o.parameters).items() if k != "binary_data"}}
            for o in req.outputs
        ]  # fmt: skip
    return doc, memoryview(b"".join(raw)) if raw else None


class _Rpcs:
    """The handlers over one ModelServer (each a coroutine on the event loop)."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server

    async def ServerLive(self, req: Any, ctx: Any) -> Any:
        return MESSAGES["ServerLiveResponse"](live=True)

    async def ServerReady(self, req: Any, ctx: Any) -> Any:
        return MESSAGES["ServerReadyResponse"](ready=self.server.ready)

    async def ModelReady(self, req: Any, ctx: Any) -> Any:
        try:
            find_model(self.server, req.name, req.version or None)
        except RequestError:
            return MESSAGES["ModelReadyResponse"](ready=False)
        return MESSAGES["ModelReadyResponse"](ready=True)

    async def ServerMetadata(self, req: Any, ctx: Any) -> Any:
        import tfrt_py

        return MESSAGES["ServerMetadataResponse"](
            name="tfrt_py", version=tfrt_py.__version__, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, req: Any, ctx: Any) -> Any:
        m = find_model(self.server, req.name, req.version or None)
        meta = MESSAGES["ModelMetadataResponse.TensorMetadata"]
        return MESSAGES["ModelMetadataResponse"](
            name=m.name, versions=[m.version], platform=PLATFORM,
            inputs=[meta(**t) for t in tensor_meta(m.inputs)],
            outputs=[meta(**t) for t in tensor_meta(m.outputs)],
        )  # fmt: skip

    async def ModelStatistics(self, req: Any, ctx: Any) -> Any:
        if req.name:
            models: list[ServedModel] = [find_model(self.server, req.name, req.version or None)]
        else:
            models = list(self.server.models.values())
        stats = []
        for m in models:
            doc = m.metrics.inference_stats(m.name, m.version)
            doc.pop("batch_stats", None)
            stats.append(MESSAGES["ModelStatistics"](**doc))
        return MESSAGES["ModelStatisticsResponse"](model_stats=stats)

    async def ModelConfig(self, req: Any, ctx: Any) -> Any:
        from google.protobuf import json_format

        config = triton_config(find_model(self.server, req.name, req.version or None))
        message = json_format.ParseDict(config, MESSAGES["ModelConfig"]())
        return MESSAGES["ModelConfigResponse"](config=message)

    async def RepositoryIndex(self, req: Any, ctx: Any) -> Any:
        entry = MESSAGES["RepositoryIndexResponse.ModelIndex"]
        index = [e for e in self.server.index() if not req.ready or e["state"] == "READY"]
        return MESSAGES["RepositoryIndexResponse"](models=[entry(**e) for e in index])

    async def RepositoryModelLoad(self, req: Any, ctx: Any) -> Any:
        _only_repository_models(req)
        await self.server.load_model(req.model_name)
        return MESSAGES["RepositoryModelLoadResponse"]()

    async def RepositoryModelUnload(self, req: Any, ctx: Any) -> Any:
        _only_repository_models(req)
        await self.server.unload_model(req.model_name)
        return MESSAGES["RepositoryModelUnloadResponse"]()

    async def ModelStreamInfer(self, requests: Any, ctx: Any) -> Any:
        answer = MESSAGES["ModelStreamInferResponse"]
        async for req in requests:
            try:
                yield answer(infer_response=await self.ModelInfer(req, ctx))
            except RequestError as e:
                yield answer(error_message=e.message)

    async def ModelInfer(self, req: Any, ctx: Any) -> Any:
        t0 = time.perf_counter()
        server, model, code = self.server, None, 500
        try:
            model = find_model(server, req.model_name, req.model_version or None)
            refused = model.overloaded()
            if refused is not None:
                raise refused
            deadline = Deadline(server.timeout)
            left = ctx.time_remaining()
            if left is not None:
                deadline.tighten(max(0.0, left))
            doc, data = _document(req)
            checked, feeds = decode_document(doc, data, model.name, model.inputs,
                                             model.outputs, server.max_decoded_bytes)  # fmt: skip
            if checked.timeout_s is not None:
                deadline.tighten(checked.timeout_s)
            outputs = await run_in_time(model, feeds, deadline, checked.level)
            names = [n for n, _ in checked.outputs]
            response = _response(model, req.id, names, outputs, checked.dense)
            code = 200
            return response
        except RequestError as e:
            code = e.status
            raise
        finally:
            if model is not None:
                model.metrics.request("grpc", code, time.perf_counter() - t0)
            elif req.model_name not in server.configs:
                server.metrics.unknown.labels("grpc").inc()


def _only_repository_models(req: Any) -> None:
    """A load or unload names its model; a config or files sent along are refused (models
    come from the repository), as on the HTTP route."""
    sent = sorted(k for k in req.parameters if k == "config" or k.startswith("file:"))
    if sent:
        raise RequestError(
            400, f"loading with {sent[:4]} is not supported; models come from the repository"
        )


def _response(
    model: ServedModel, rid: str, names: list[str], outputs: dict[str, Any], dense: Any
) -> Any:
    tensor = MESSAGES["ModelInferResponse.InferOutputTensor"]
    out, raw = [], []
    for name in names:
        arr = answer_array(name, outputs[name], name in dense)
        datatype = datatype_of(arr.dtype)
        if datatype is None:
            raise RequestError(
                501, f"output {name!r} has dtype {arr.dtype}, which no v2 datatype carries"
            )
        out.append(tensor(name=name, datatype=datatype, shape=list(arr.shape)))
        raw.append(encode_blob(arr, datatype))
    return MESSAGES["ModelInferResponse"](
        model_name=model.name, model_version=model.version, id=rid, outputs=out,
        raw_output_contents=raw,
    )  # fmt: skip


def _guarded(fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """``fn`` with a RequestError answered as its gRPC status and message."""
    import grpc

    async def call(req: Any, ctx: Any) -> Any:
        try:
            return await fn(req, ctx)
        except RequestError as e:
            code = getattr(grpc.StatusCode, _CODES.get(e.status, "INTERNAL"))
            await ctx.abort(code, e.message)

    return call


class GrpcFrontend:
    """The gRPC server of one ModelServer on ``address`` ("host:port"; port 0 picks one)."""

    def __init__(self, server: ModelServer, address: str) -> None:
        self.server = server
        self.address = address
        self.port: int | None = None
        self._grpc: Any = None

    async def start(self) -> int:
        """Bind and serve (on the running loop); the bound port. RuntimeError when the
        address cannot be bound."""
        import grpc
        from grpc import aio

        rpcs = _Rpcs(self.server)
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                _guarded(getattr(rpcs, name)),
                request_deserializer=MESSAGES[req].FromString,
                response_serializer=MESSAGES[resp].SerializeToString,
            )
            for name, (req, resp) in RPCS.items()
        }
        for name, (req, resp) in STREAMS.items():
            handlers[name] = grpc.stream_stream_rpc_method_handler(
                getattr(rpcs, name),
                request_deserializer=MESSAGES[req].FromString,
                response_serializer=MESSAGES[resp].SerializeToString,
            )
        limit = int(self.server.max_body_bytes)
        self._grpc = aio.server(options=[("grpc.max_receive_message_length", limit),
                                         ("grpc.max_send_message_length", -1)])  # fmt: skip
        service = grpc.method_handlers_generic_handler(SERVICE, handlers)
        self._grpc.add_generic_rpc_handlers((service,))
        self.port = self._grpc.add_insecure_port(self.address)
        await self._grpc.start()
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stop accepting calls; calls in flight get ``grace`` seconds."""
        if self._grpc is not None:
            await self._grpc.stop(grace)
