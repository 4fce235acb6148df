"""The messages of the Open Inference Protocol's gRPC service, built at import from the
table below into a descriptor pool of their own.

``inference.GRPCInferenceService`` as KServe's ``grpc_predict_v2.proto`` defines it and
Triton extends it (``grpc_service.proto``): the field names, numbers and types are the
wire format tritonclient and perf_analyzer speak (``tests/serving/test_grpc.py`` checks
them against tritonclient's own descriptors). Only the RPCs ``grpc_service`` serves are
here. The pool is private: a process that also imports tritonclient (which registers the
same ``inference.*`` names in protobuf's default pool) has no clash.

``MESSAGES[name]`` is the message class of ``inference.<name>`` (nested ones as
``"ModelInferRequest.InferInputTensor"``). No model or request text is ever part of a
descriptor: the table is fixed here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["MESSAGES", "PACKAGE", "RPCS", "SERVICE", "STREAMS"]

PACKAGE = "inference"
SERVICE = "inference.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
    "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE,
}  # fmt: skip

# A field: (name, number, type); a type ending in "*" is repeated, "map:T" is
# map<string, T>, "enum:E" an enum of ``_ENUMS``, "?name" after a type puts the field in
# that oneof. Message and enum types are named from the package
# ("ModelInferRequest.InferInputTensor").
_TENSOR_META = [("name", 1, "string"), ("datatype", 2, "string"), ("shape", 3, "int64*")]
_IO_TENSOR = [*_TENSOR_META, ("parameters", 4, "map:InferParameter"),
              ("contents", 5, "InferTensorContents")]  # fmt: skip
_NAME_VERSION = [("name", 1, "string"), ("version", 2, "string")]
_DURATION = "StatisticDuration"
_TABLE: dict[str, list[tuple[str, int, str]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool")],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool")],
    "ModelReadyRequest": _NAME_VERSION,
    "ModelReadyResponse": [("ready", 1, "bool")],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [
        ("name", 1, "string"),
        ("version", 2, "string"),
        ("extensions", 3, "string*"),
    ],
    "ModelMetadataRequest": _NAME_VERSION,
    "ModelMetadataResponse.TensorMetadata": _TENSOR_META,
    "ModelMetadataResponse": [
        ("name", 1, "string"),
        ("versions", 2, "string*"),
        ("platform", 3, "string"),
        ("inputs", 4, "ModelMetadataResponse.TensorMetadata*"),
        ("outputs", 5, "ModelMetadataResponse.TensorMetadata*"),
    ],
    "InferParameter": [
        ("bool_param", 1, "bool?parameter_choice"),
        ("int64_param", 2, "int64?parameter_choice"),
        ("string_param", 3, "string?parameter_choice"),
        ("double_param", 4, "double?parameter_choice"),
        ("uint64_param", 5, "uint64?parameter_choice"),
    ],
    "InferTensorContents": [
        ("bool_contents", 1, "bool*"),
        ("int_contents", 2, "int32*"),
        ("int64_contents", 3, "int64*"),
        ("uint_contents", 4, "uint32*"),
        ("uint64_contents", 5, "uint64*"),
        ("fp32_contents", 6, "float*"),
        ("fp64_contents", 7, "double*"),
        ("bytes_contents", 8, "bytes*"),
    ],
    "ModelInferRequest.InferInputTensor": _IO_TENSOR,
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, "string"),
        ("parameters", 2, "map:InferParameter"),
    ],
    "ModelInferRequest": [
        ("model_name", 1, "string"),
        ("model_version", 2, "string"),
        ("id", 3, "string"),
        ("parameters", 4, "map:InferParameter"),
        ("inputs", 5, "ModelInferRequest.InferInputTensor*"),
        ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor*"),
        ("raw_input_contents", 7, "bytes*"),
    ],
    "ModelInferResponse.InferOutputTensor": _IO_TENSOR,
    "ModelInferResponse": [
        ("model_name", 1, "string"),
        ("model_version", 2, "string"),
        ("id", 3, "string"),
        ("parameters", 4, "map:InferParameter"),
        ("outputs", 5, "ModelInferResponse.InferOutputTensor*"),
        ("raw_output_contents", 6, "bytes*"),
    ],
    "ModelStreamInferResponse": [
        ("error_message", 1, "string"),
        ("infer_response", 2, "ModelInferResponse"),
    ],
    "ModelStatisticsRequest": _NAME_VERSION,
    "StatisticDuration": [("count", 1, "uint64"), ("ns", 2, "uint64")],
    "InferStatistics": [
        (k, i, _DURATION)
        for i, k in enumerate(
            (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            ),
            1,
        )
    ],
    "ModelStatistics": [
        *_NAME_VERSION,
        ("last_inference", 3, "uint64"),
        ("inference_count", 4, "uint64"),
        ("execution_count", 5, "uint64"),
        ("inference_stats", 6, "InferStatistics"),
    ],
    "ModelStatisticsResponse": [("model_stats", 1, "ModelStatistics*")],
    "RepositoryIndexRequest": [("repository_name", 1, "string"), ("ready", 2, "bool")],
    "RepositoryIndexResponse.ModelIndex": [
        *_NAME_VERSION,
        ("state", 3, "string"),
        ("reason", 4, "string"),
    ],
    "RepositoryIndexResponse": [("models", 1, "RepositoryIndexResponse.ModelIndex*")],
    "ModelRepositoryParameter": [
        ("bool_param", 1, "bool?parameter_choice"),
        ("int64_param", 2, "int64?parameter_choice"),
        ("string_param", 3, "string?parameter_choice"),
        ("bytes_param", 4, "bytes?parameter_choice"),
    ],
    "RepositoryModelLoadRequest": [
        ("repository_name", 1, "string"),
        ("model_name", 2, "string"),
        ("parameters", 3, "map:ModelRepositoryParameter"),
    ],
    "RepositoryModelLoadResponse": [],
    "RepositoryModelUnloadRequest": [
        ("repository_name", 1, "string"),
        ("model_name", 2, "string"),
        ("parameters", 3, "map:ModelRepositoryParameter"),
    ],
    "RepositoryModelUnloadResponse": [],
    # Triton's model configuration (model_config.proto): the fields a served model has.
    "ModelConfigRequest": _NAME_VERSION,
    "ModelConfigResponse": [("config", 1, "ModelConfig")],
    "ModelVersionPolicy.Latest": [("num_versions", 1, "uint32")],
    "ModelVersionPolicy": [("latest", 1, "ModelVersionPolicy.Latest?policy_choice")],
    "ModelInput": [
        ("name", 1, "string"),
        ("data_type", 2, "enum:DataType"),
        ("format", 3, "enum:ModelInput.Format"),
        ("dims", 4, "int64*"),
    ],
    "ModelOutput": [
        ("name", 1, "string"),
        ("data_type", 2, "enum:DataType"),
        ("dims", 3, "int64*"),
        ("label_filename", 4, "string"),
    ],
    "ModelInstanceGroup": [
        ("name", 1, "string"),
        ("count", 2, "int32"),
        ("kind", 4, "enum:ModelInstanceGroup.Kind"),
    ],
    "ModelDynamicBatching": [("max_queue_delay_microseconds", 2, "uint64")],
    "ModelParameter": [("string_value", 1, "string")],
    "ModelConfig": [
        ("name", 1, "string"),
        ("platform", 2, "string"),
        ("version_policy", 3, "ModelVersionPolicy"),
        ("max_batch_size", 4, "int32"),
        ("input", 5, "ModelInput*"),
        ("output", 6, "ModelOutput*"),
        ("instance_group", 7, "ModelInstanceGroup*"),
        ("dynamic_batching", 11, "ModelDynamicBatching?scheduling_choice"),
        ("parameters", 14, "map:ModelParameter"),
        ("backend", 17, "string"),
    ],
}

#: Enums: name -> value names, numbered from 0 in order.
_ENUMS: dict[str, list[str]] = {
    "DataType": [
        "TYPE_INVALID",
        "TYPE_BOOL",
        "TYPE_UINT8",
        "TYPE_UINT16",
        "TYPE_UINT32",
        "TYPE_UINT64",
        "TYPE_INT8",
        "TYPE_INT16",
        "TYPE_INT32",
        "TYPE_INT64",
        "TYPE_FP16",
        "TYPE_FP32",
        "TYPE_FP64",
        "TYPE_STRING",
        "TYPE_BF16",
    ],
    "ModelInput.Format": ["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"],
    "ModelInstanceGroup.Kind": ["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"],
}

#: The RPCs served: name -> (request message, response message).
RPCS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
    "ModelStatistics": ("ModelStatisticsRequest", "ModelStatisticsResponse"),
    "RepositoryIndex": ("RepositoryIndexRequest", "RepositoryIndexResponse"),
    "ModelConfig": ("ModelConfigRequest", "ModelConfigResponse"),
    "RepositoryModelLoad": ("RepositoryModelLoadRequest", "RepositoryModelLoadResponse"),
    "RepositoryModelUnload": ("RepositoryModelUnloadRequest", "RepositoryModelUnloadResponse"),
}
#: The streaming RPCs served (a stream of requests, a stream of responses).
STREAMS = {"ModelStreamInfer": ("ModelInferRequest", "ModelStreamInferResponse")}


def _add_field(msg: Any, name: str, number: int, spec: str) -> None:
    f = msg.field.add(name=name, number=number, json_name=_camel(name))
    spec, _, oneof = spec.partition("?")
    if oneof:
        names = [o.name for o in msg.oneof_decl]
        if oneof not in names:
            msg.oneof_decl.add(name=oneof)
            names.append(oneof)
        f.oneof_index = names.index(oneof)
    if spec.startswith("map:"):  # a repeated entry message marked map_entry
        entry = msg.nested_type.add(name=_camel(name, upper=True) + "Entry")
        entry.options.map_entry = True
        _add_field(entry, "key", 1, "string")
        _add_field(entry, "value", 2, spec[4:])
        f.label, f.type = _F.LABEL_REPEATED, _F.TYPE_MESSAGE
        f.type_name = f".{PACKAGE}.{_path_of(msg)}.{entry.name}"
        return
    repeated = spec.endswith("*")
    spec = spec.rstrip("*")
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if spec.startswith("enum:"):
        f.type, f.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{spec[5:]}"
    elif spec in _SCALARS:
        f.type = _SCALARS[spec]
    else:
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{spec}"


_PATHS: dict[int, str] = {}


def _path_of(msg: Any) -> str:
    return _PATHS[id(msg)]


def _camel(name: str, upper: bool = False) -> str:
    head, *rest = name.split("_")
    out = head + "".join(p.title() for p in rest)
    return out[:1].upper() + out[1:] if upper else out


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="tfrt_py/grpc_predict_v2.proto", package=PACKAGE, syntax="proto3"
    )
    made: dict[str, Any] = {}
    for path in sorted(_TABLE, key=lambda p: p.count(".")):  # outer messages first
        outer, _, inner = path.rpartition(".")
        msg = (made[outer].nested_type if outer else fd.message_type).add(name=inner)
        made[path] = msg
        _PATHS[id(msg)] = path
    for path, values in _ENUMS.items():
        outer, _, inner = path.rpartition(".")
        enum = (made[outer].enum_type if outer else fd.enum_type).add(name=inner)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for path, fields in _TABLE.items():
        for name, number, spec in fields:
            _add_field(made[path], name, number, spec)
    service = fd.service.add(name="GRPCInferenceService")
    for rpc, (req, resp) in [*RPCS.items(), *STREAMS.items()]:
        streams = rpc in STREAMS
        service.method.add(name=rpc, input_type=f".{PACKAGE}.{req}",
                           output_type=f".{PACKAGE}.{resp}", client_streaming=streams,
                           server_streaming=streams)  # fmt: skip
    return fd


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        path: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{path}"))
        for path in _TABLE
    }


MESSAGES: dict[str, Any] = _classes()
