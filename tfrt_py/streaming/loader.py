"""``load(path, memory_budget=BYTES)``: decide whether to stream, and build the streamed model.

Runs once per load on the caller's thread. Weights = the main graph's initializers: external
data (``onnx.save(..., save_as_external_data=True)``) and those embedded in the proto. When
they fit the budget the model loads as usual (external data memory-mapped) and
``load_streamed`` returns None. Otherwise:

1. every external initializer is checked (file present and long enough, naming the tensor)
   and recorded as an ``ExternalRef``; no byte of it is read or mapped;
2. the importer makes each one an extra graph input typed (dtype, shape), so the load-time
   passes see a runtime value they cannot fold into; the ``shapes`` pass is off (its
   zero-feed probe would allocate every weight), ONNX shape inference still types values;
3. the optimized graph is cut into stages (``partition``) whose weights fit in half of what
   the budget leaves after the resident (embedded and folded) constants; each stage is
   compiled as its own Program; a node whose weights alone exceed that fails here, saying
   how much budget is needed;
4. the weight arena is sized for the largest pair of consecutive stages (at most the
   budget minus the resident constants).

A table read only by Gathers of rows (a token embedding) is not streamed whole: each such
Gather reads the rows it needs from the file when it runs (``rows.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np
import onnx

from ..compiler.pipeline import select_passes
from ..compiler.prepare import prepare
from ..errors import ModelLoadError, UnsupportedOpError
from ..executors.program import node_captures
from ..frontends.onnx import import_model
from ..frontends.onnx.external_ref import external_ref
from ..frontends.onnx.overridable import overridable_initializers
from ..frontends.onnx.tensors import is_external, onnx_dtype, tensor_shape
from ..ir import Graph, TensorType, Value, verify
from ..kernels import KernelRegistry
from .partition import ALIGN, Stage, compile_stages, max_node_weights, partition
from .pipeline import StreamedProgram, StreamInfo
from .rows import row_read_weights

__all__ = ["load_streamed"]


def load_streamed(
    proto: onnx.ModelProto,
    base_dir: str | None,
    *,
    memory_budget: int,
    origin: str,
    registry: KernelRegistry,
    optimize: bool | Collection[str] | None,
    executor: str,
) -> StreamedProgram | None:
    """The streamed model's executor (with ``graph``, ``prepared`` and ``why`` set), or
    None when the weights fit ``memory_budget`` (load normally)."""
    budget = _check_budget(memory_budget)
    inits = list(proto.graph.initializer)
    over = overridable_initializers(proto)  # never streamed: a call may replace them
    ext = [t for t in inits if is_external(t) and t.name not in over]
    refs = {t.name: external_ref(t, base_dir) for t in ext}
    embedded = sum(_embedded_bytes(t) for t in inits if t.name not in refs)
    streamed = sum(r.nbytes for r in refs.values())
    if streamed + embedded <= budget:
        return None
    if not refs:
        raise ModelLoadError(
            f"{origin}: its {embedded:,} bytes of weights exceed memory_budget={budget:,} "
            "and none is external data, so none can be streamed; save the model with "
            "onnx.save(..., save_as_external_data=True)"
        )
    if executor != "auto":
        raise ValueError(
            f"executor={executor!r} cannot serve a streamed model ({streamed:,} bytes of "
            f"weights exceed memory_budget={budget:,}): its stages run on the 'stream' "
            "executor; pass executor='auto'"
        )

    def hook(t: onnx.TensorProto) -> Value | None:
        r = refs.get(t.name) if is_external(t) else None
        return None if r is None else Value(t.name, TensorType(r.dtype, r.shape))

    graph = import_model(proto, base_dir, registry.has, stream=hook)
    verify(graph)
    prepared = prepare(graph, registry, select_passes(optimize) - {"shapes"})
    g, reg = prepared.graph, prepared.registry
    weights = {id(v): refs[v.name] for v in g.inputs if v.name in refs}
    user_inputs = [v for v in g.inputs if id(v) not in weights]
    resident = sum(int(c.const.nbytes) for c in g.constants if c.const is not None)
    limit = (budget - resident) // ALIGN * ALIGN
    captured = {id(v) for n in g.nodes for v in node_captures(n)}
    rows = row_read_weights(g, weights, captured)
    weights = {i: r for i, r in weights.items() if i not in rows}  # the arena's
    room = max_node_weights(g, weights)
    if limit < room[0]:
        need, node = room
        where = f"node {node.name!r} ({node.op_type}) reads" if node else "the weights take"
        raise ModelLoadError(
            f"memory_budget={budget:,} bytes is too small for {origin}: {where} {need:,} "
            f"bytes of streamed weights (64-byte aligned) and the constants that stay "
            f"resident take {resident:,} bytes; needs memory_budget >= {resident + need:,} "
            f"bytes (>= {resident + 2 * need:,} to overlap reading with compute)"
        )
    stages = partition(g, weights, limit // 2, limit, reg, needed_hint=resident, rows=rows)
    compile_stages(g, stages, reg)
    _check_sync_kernels(stages)
    arena = _arena_bytes(stages, limit)
    info = StreamInfo(budget, streamed, len(refs), len({r.path for r in refs.values()}),
                      resident, arena, sum(r.nbytes for r in rows.values()))  # fmt: skip
    prog = StreamedProgram(stages, user_inputs, list(g.outputs), arena, None, info)
    prog.graph = Graph(g.name, inputs=user_inputs, outputs=list(g.outputs), nodes=list(g.nodes),
                       constants=list(g.constants), opsets=dict(g.opsets))  # fmt: skip
    prog.prepared = prepared
    prog.why = (
        f"memory_budget {budget:,} B < {streamed + embedded:,} B of weights: "
        f"{len(stages)} stages streamed from disk"
    )
    prog.notes = (f"executor: stream ({prog.why})",)
    return prog


def _check_budget(budget: Any) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {budget!r}")
    return int(budget)


def _embedded_bytes(t: onnx.TensorProto) -> int:
    n = math.prod(tensor_shape(t))  # ModelLoadError naming the tensor for bad dims
    try:
        return n * onnx_dtype(t.data_type).itemsize
    except ModelLoadError:
        return 0


def _check_sync_kernels(stages: list[Stage]) -> None:
    for st in stages:
        if st.program is None:  # a row-gather stage
            continue
        for ins in st.program.instrs:
            if ins.flags.is_async:
                n = ins.node
                raise UnsupportedOpError(
                    n.op_type, n.domain, n.opset, n.name,
                    "async kernels cannot run in a streamed model (its stages run "
                    "synchronously)",
                )  # fmt: skip


def _arena_bytes(stages: list[Stage], limit: int) -> int:
    """Room for the largest pair of stages that are resident together (consecutive steps;
    the last stage is followed by the next window's first), capped at ``limit``."""
    sizes = [s.nbytes for s in stages]
    need = max(sizes)
    if len(sizes) > 1:
        need = max(need, *(a + b for a, b in zip(sizes, sizes[1:] + sizes[:1])))
    return max(min(need, limit), ALIGN)
