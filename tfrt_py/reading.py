"""Stage 1 of ``load()``: the verified IR graph of a source, with its origin, metadata
and how it was obtained.

An ONNX path or bytes source goes through the import cache first
(``frontends.graph_cache``: a hit imports no ``onnx``); otherwise, or on a miss, the ONNX
frontend reads and imports it, and a miss stores the graph for the next load. A
``tfrt_py.ir.Graph`` is taken as it is. A ``memory_budget`` the weights exceed hands the
load to ``tfrt_py.streaming``, which returns its own program. Runs on the loading thread;
keeps no state.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from .ir import Graph, verify
from .kernels import KernelRegistry, default_registry
from .metadata import ModelMetadata, from_graph, from_proto

if TYPE_CHECKING:
    from .streaming import StreamedProgram

__all__ = ["read_source"]


def read_source(
    source: Any,
    base_dir: str | os.PathLike[str] | None,
    memory_budget: int | None,
    registry: KernelRegistry,
    optimize: bool | Collection[str] | None,
    executor: str,
) -> tuple[Graph | StreamedProgram, str, ModelMetadata, str]:
    """Stage 1: the verified IR graph of ``source``, where it came from (for messages), its
    metadata and how the graph was obtained (for ``describe()``), or the executor
    ``tfrt_py.streaming`` made of a model whose weights exceed ``memory_budget``.

    An ONNX path or bytes source without custom kernels or ``memory_budget`` goes through
    the imported-graph cache (``frontends.graph_cache``): a hit imports no ``onnx``; a miss
    imports the model and stores its graph before any pass changes it."""
    if isinstance(source, Graph):
        return _python_graph(source, base_dir, memory_budget)
    from .frontends import graph_cache
    from .frontends.source import model_bytes

    origin = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "ONNX model"
    read = model_bytes(source, base_dir)  # None: a ModelProto (or no model at all)
    digest = None
    cacheable = memory_budget is None and registry is default_registry()
    if read is not None and cacheable and graph_cache.eligible(len(read[0])):
        digest = graph_cache.key(read[0])
        hit = graph_cache.lookup(digest)
        if hit is not None:
            return hit[0], origin, hit[1], "the graph read from the import cache"

    from .compiler.shapes import AS_ONNX, propagates_fully
    from .frontends.onnx import OwnTypes, import_model, read_model
    from .frontends.onnx.reader import parse_model
    from .frontends.onnx.tensor_meta import uses_external_data

    if read is None:
        proto, directory = read_model(source, base_dir)
    else:
        proto, directory = parse_model(read[0], read[1]), read[2]
    meta = from_proto(proto)
    if memory_budget is not None:
        from .streaming import load_streamed

        streamed = load_streamed(
            proto, directory, memory_budget=memory_budget, origin=origin, registry=registry,
            optimize=optimize, executor=executor,
        )  # fmt: skip
        if streamed is not None:
            return streamed, origin, meta, "imported; weights streamed from disk"
    graph = import_model(
        proto, directory, registry.has, own_types=OwnTypes(AS_ONNX, propagates_fully)
    )
    verify(graph)
    how = "imported"
    if (
        digest is not None
        and not uses_external_data(proto)  # its weights stay in (and are read from) files
        and graph_cache.store(digest, graph, meta)
    ):
        how = "imported; the graph kept in the import cache for the next load"
    return graph, origin, meta, how


def _python_graph(
    graph: Graph, base_dir: Any, memory_budget: int | None
) -> tuple[Graph, str, ModelMetadata, str]:
    """``read_source`` of a ``tfrt_py.ir.Graph``: verified as it is."""
    if base_dir is not None:
        raise ValueError("base_dir is for ONNX sources; a tfrt_py.ir.Graph has no files")
    if memory_budget is not None:
        raise ValueError(
            "memory_budget streams ONNX external-data weights from disk; a tfrt_py.ir.Graph "
            "already holds its weights in memory (save it as ONNX with external data)"
        )
    verify(graph)
    return graph, f"graph {graph.name!r}", from_graph(graph.name, graph.opsets), "built in Python"
