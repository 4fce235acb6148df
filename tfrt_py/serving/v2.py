"""The Open Inference Protocol (KServe v2) REST routes, as Triton, KServe, Seldon MLServer
and OpenVINO Model Server serve them, so their clients (tritonclient, KServe's SDK, Triton's
perf_analyzer) work unchanged:

* ``GET /v2/health/live`` -- 200 while the process answers;
  ``GET /v2/health/ready`` -- 200 when every model is ready, else 400 with the reason;
* ``GET /v2`` -- server metadata (name, version, extensions);
* ``GET /v2/models/{name}[/versions/{v}]`` -- model metadata: inputs and outputs with
  their ``datatype`` and ``shape`` (-1 for a dynamic dim);
* ``GET /v2/models/{name}[/versions/{v}]/ready`` -- 200 ready, else 400/404;
* ``POST /v2/models/{name}[/versions/{v}]/infer`` -- inference: JSON, or JSON and binary
  tensors (``v2_codec``, ``v2_binary``); ``parameters.timeout`` (µs) and ``priority``;
* the repository extension: ``POST /v2/repository/index``,
  ``POST /v2/repository/models/{name}/load`` (load, or swap in the newest version
  without dropping requests in flight) and ``.../unload`` (``hub.ModelServer``; 403
  unless the server runs with ``model_control="explicit"``).

Errors are 4xx/5xx with ``{"error": message}`` naming the input, field or model: the
protocol's shape, which tritonclient raises as ``InferenceServerException`` with the
message and status. The Content-Type of a request is not looked at (the protocol fixes the
body's format; ``curl -d`` sends form-urlencoded); a compressed body
(``Content-Encoding``) is refused with 415.

Which thread runs what: every handler runs on the event loop; bodies over
``INLINE_DECODE_BYTES`` are decoded, and outputs over ``INLINE_ENCODE_BYTES`` encoded, on
the server's decode threads; a model is loaded and warmed on a thread of its own.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .body import maybe_offload, read_body
from .codec import load_json
from .errors import RequestError
from .handling import (
    Deadline,
    Handler,
    counted,
    errors_as_json,
    json_response,
    read_in_time,
    run_in_time,
    served_model,
)
from .hub import ModelServer
from .limits import INLINE_DECODE_BYTES, INLINE_ENCODE_BYTES
from .served import ServedModel
from .v2_binary import HEADER_LENGTH, decode_infer, encode_infer
from .v2_codec import metadata_shape, spec_datatype

__all__ = ["EXTENSIONS", "PLATFORM", "tensor_meta", "triton_config", "v2_routes"]

#: The protocol extensions served (``GET /v2``).
EXTENSIONS = ["binary_tensor_data", "model_repository", "schedule_policy", "parameters", "generate"]
#: A model's ``platform`` in its metadata.
PLATFORM = "tfrt_py_onnx"


def tensor_meta(specs: Any) -> list[dict[str, Any]]:
    """A model's inputs or outputs as the protocol's metadata (name, datatype, shape)."""
    return [
        {
            "name": s.name,
            "datatype": spec_datatype(s) or f"UNSUPPORTED({s.type})",
            "shape": metadata_shape(s.shape),
        }
        for s in specs
    ]


def v2_routes(server: ModelServer) -> list[Route]:
    """The v2 routes over ``server`` (see the module docstring)."""
    return [*_server_routes(server), *_model_routes(server), *_repository_routes(server)]


def _route(path: str, fn: Handler, method: str) -> Route:
    return Route(path, errors_as_json(fn), methods=[method])


def _server_routes(server: ModelServer) -> list[Route]:
    """Health and server metadata."""

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        if server.ready:
            return json_response({"ready": True})
        return json_response({"ready": False, "error": server.error or "loading"}, 400)

    async def metadata(request: Request) -> Response:
        import tfrt_py

        return json_response(
            {"name": "tfrt_py", "version": tfrt_py.__version__, "extensions": EXTENSIONS}
        )

    return [
        _route("/v2/health/live", live, "GET"),
        _route("/v2/health/ready", ready, "GET"),
        _route("/v2", metadata, "GET"),
    ]


def _model_routes(server: ModelServer) -> list[Route]:
    """Model metadata, readiness and inference, with and without a version."""

    def loaded(request: Request) -> ServedModel:
        """The model the route names, loaded (warmed or not), of the version named."""
        name = request.path_params["name"]
        m = server.get(name)
        version = request.path_params.get("version")
        if m is None or (version is not None and version != m.version) or not m.warmed:
            served_model(server, request, version)  # raises the 404 or 503
        assert m is not None
        return m

    async def model_metadata(request: Request) -> Response:
        m = loaded(request)
        return json_response(
            {
                "name": m.name,
                "versions": [m.version],
                "platform": PLATFORM,
                "inputs": tensor_meta(m.inputs),
                "outputs": tensor_meta(m.outputs),
            }
        )

    async def model_ready(request: Request) -> Response:
        try:
            m = loaded(request)
        except RequestError as e:
            status = 404 if e.status == 404 else 400
            return json_response({"ready": False, "error": e.message}, status)
        return json_response({"name": m.name, "version": m.version, "ready": True})

    async def model_config(request: Request) -> Response:
        return json_response(triton_config(loaded(request)))

    async def model_stats(request: Request) -> Response:
        m = loaded(request)
        return json_response({"model_stats": [m.metrics.inference_stats(m.name, m.version)]})

    async def all_stats(request: Request) -> Response:
        stats = [m.metrics.inference_stats(m.name, m.version) for m in server.models.values()]
        return json_response({"model_stats": stats})

    counted_infer = counted(server, "v2", errors_as_json(_infer_handler(server)))
    model_routes: list[Route] = [_route("/v2/models/stats", all_stats, "GET")]
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        model_routes += [
            _route(base, model_metadata, "GET"),
            _route(base + "/ready", model_ready, "GET"),
            _route(base + "/config", model_config, "GET"),
            _route(base + "/stats", model_stats, "GET"),
            Route(base + "/infer", counted_infer, methods=["POST"]),
        ]
    return model_routes


def triton_config(m: ServedModel) -> dict[str, Any]:
    """Triton's model configuration (JSON) of a served model, as tritonclient's
    ``get_model_config`` and perf_analyzer read it: with batching on, ``max_batch_size``
    and dims without the batch dim; else 0 and the whole shape (-1: any size)."""
    batched = m.policy.enabled

    def tensors(specs: Any, kind: str) -> list[dict[str, Any]]:
        out = []
        for s in specs:
            dims = metadata_shape(s.shape)
            out.append({
                "name": s.name,
                "data_type": "TYPE_" + (spec_datatype(s) or "INVALID").replace(
                    "BYTES", "STRING"),
                "dims": dims[1:] if batched and dims else dims,
                **({"format": "FORMAT_NONE"} if kind == "input" else {"label_filename": ""}),
            })  # fmt: skip
        return out

    config: dict[str, Any] = {
        "name": m.name,
        "platform": PLATFORM,
        "backend": "tfrt_py",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": m.policy.max_batch if batched else 0,
        "input": tensors(m.inputs, "input"),
        "output": tensors(m.outputs, "output"),
        "instance_group": [{"name": m.name, "kind": "KIND_CPU", "count": 1}],
        "parameters": {},
    }
    if batched:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": m.policy.max_wait_us}
    return config


def _infer_handler(server: ModelServer) -> Handler:
    """``POST .../infer``: decode, run within the request's deadline, encode."""

    async def infer(request: Request) -> Response:
        model = served_model(server, request, request.path_params.get("version"))
        refused = model.overloaded()  # before the body is even read
        if refused is not None:
            raise refused
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise RequestError(
                415, f"Content-Encoding {encoding[:40]!r} is not supported; send the body as is"
            )
        deadline = Deadline(server.timeout)
        body = await read_in_time(request, server, deadline)
        req, feeds = await maybe_offload(
            len(body) > INLINE_DECODE_BYTES,
            server.decode_pool,
            decode_infer,
            body,
            _header_length(request),
            model.name,
            model.inputs,
            model.outputs,
            server.max_decoded_bytes,
        )
        if req.timeout_s is not None:
            deadline.tighten(req.timeout_s)
        outputs = await run_in_time(model, feeds, deadline, req.level)
        size = sum(int(getattr(v, "nbytes", 0)) for v in outputs.values())
        payload, headers, media = await maybe_offload(
            size > INLINE_ENCODE_BYTES,
            server.decode_pool,
            encode_infer,
            model.name,
            model.version,
            req,
            outputs,
        )
        return Response(payload, headers=headers, media_type=media)

    return infer


def _repository_routes(server: ModelServer) -> list[Route]:
    """The repository extension: index, load, unload."""

    async def repository_index(request: Request) -> Response:
        await read_body(request, server.max_body_bytes)
        return json_response(server.index())

    async def _load_request(request: Request) -> None:
        """The body of a load/unload request: empty, or JSON whose parameters we can honour
        (a config or files sent along are refused: models come from the repository)."""
        body = await read_body(request, server.max_body_bytes)
        if not body.strip():
            return
        doc = load_json(body, "JSON body")
        params = doc.get("parameters") if isinstance(doc, dict) else None
        if not isinstance(params, dict):
            return
        sent = sorted(k for k in params if k == "config" or k.startswith("file:"))
        if sent:
            raise RequestError(
                400, f"loading with {sent[:4]} is not supported; models come from the repository"
            )

    async def repository_load(request: Request) -> Response:
        await _load_request(request)
        m = await server.load_model(request.path_params["name"])
        return json_response({"name": m.name, "version": m.version, "state": "READY"})

    async def repository_unload(request: Request) -> Response:
        await _load_request(request)
        await server.unload_model(request.path_params["name"])
        return json_response({})

    return [
        _route("/v2/repository/index", repository_index, "POST"),
        _route("/v2/repository/models/{name}/load", repository_load, "POST"),
        _route("/v2/repository/models/{name}/unload", repository_unload, "POST"),
    ]


def _header_length(request: Any) -> str | None:
    """The one ``Inference-Header-Content-Length`` of a request (None: absent); 400 when it
    comes more than once (which one splits the body would be a guess)."""
    values = request.headers.getlist(HEADER_LENGTH)
    if len(values) > 1:
        raise RequestError(400, f"{HEADER_LENGTH} is given {len(values)} times; give it once")
    return values[0] if values else None
