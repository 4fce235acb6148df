"""ONNX ModelProto -> IR Graph.

Honours the model's opset imports (each node records its domain's version), turns
initializers and Constant nodes into constant Values, imports nested graphs with
outer-scope names resolved to the enclosing graph's Values, inlines model-local functions,
and records value types from the model's value_info (after ONNX shape inference, when it
succeeds). Runs once per load, on the caller's thread.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from ...errors import GraphError, ModelLoadError
from ...ir import Graph, Node, TensorType, Value, ValueType
from ...records import record
from . import limits
from .functions import FunctionInliner, inline_call, schema_function
from .limits import check_nesting
from .overridable import defaulted_input, overridable_initializers
from .tensors import to_array, to_value_type

__all__ = ["OwnTypes", "import_model"]

_A = onnx.AttributeProto


#: Answers whether a kernel serves (domain, op_type, opset); ops without one are decomposed
#: into their ONNX schema function body when the schema has one.
HasKernel = Callable[[str, str, int], bool]

#: The streaming loader's hook: given a main-graph initializer, a Value to stand for it as
#: an extra graph input (its bytes are read later, by stage), or None to import it as usual.
StreamHook = Callable[[onnx.TensorProto], Value | None]


@record(frozen=True)
class OwnTypes:
    """A type propagation offered to ``import_model`` (``model.py`` offers the compiler's,
    ``compiler.shapes``, which this layer cannot import): ``ops``, the standard op types it
    types as ONNX's shape inference does; ``complete(graph)`` fills in the types it can,
    in place, and says whether every node output got one (dtype and every dim)."""

    ops: frozenset[str]
    complete: Callable[[Graph], bool]


#: ``import_model`` tries a model without ONNX shape inference only when its initializers
#: hold at most this many bytes: the try imports them, and a failed try imports them again.
TRY_WITHOUT_INFERENCE_BYTES = 16 << 20
#: Initializers over this many bytes reach ONNX's shape inference as inputs of their type
#: and shape, not as data: it serializes the model both ways (FCOS-R50's 129 MB of weights
#: were 0.52 s of its 0.53 s of inference).
INFER_DATA_MAX_BYTES = 4096


def import_model(
    model: onnx.ModelProto,
    base_dir: str | None,
    has_kernel: HasKernel | None = None,
    stream: StreamHook | None = None,
    own_types: OwnTypes | None = None,
) -> Graph:
    """Import ``model``'s main graph. Raises ModelLoadError/GraphError with the node name.

    ``stream``: main-graph initializers it returns a Value for become graph inputs (first,
    before the declared inputs) instead of constants, and their data is not touched.

    Overridable initializers (``overridable_initializers``) become graph inputs after the
    declared ones, with the initializer as their ``Value.default``: the caller may feed
    them, else the initializer is used (as onnxruntime does). They are never streamed.

    ``own_types``: a small model of ``own_types.ops`` only (no local functions, no
    subgraphs, a kernel for every node so nothing becomes a schema function's body,
    initializers within ``TRY_WITHOUT_INFERENCE_BYTES``) is first imported without ONNX
    shape inference, and kept when ``own_types.complete`` types every value from the
    declared ones; otherwise it is imported with inference, as without the argument.
    ONNX's first inference in a process builds its schema registry (~10-12 ms, most of a
    small model's load)."""
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        opsets["" if imp.domain == "ai.onnx" else imp.domain] = int(imp.version)
    if "" not in opsets and model.ir_version < 3:
        opsets[""] = 1
    _check_known_opsets(opsets)
    check_nesting(model)  # before anything recursive (shape inference, protobuf) sees it
    inliner = FunctionInliner(model.functions)
    inliner.check_calls(model.graph)  # recursion and blow-up, before shape inference
    overridable = overridable_initializers(model)

    def run(gp: onnx.GraphProto, inliner: FunctionInliner) -> tuple[Graph, _Importer]:
        imp = _Importer(opsets, base_dir, inliner, has_kernel)
        imp.stream = stream
        imp.overridable = overridable
        return imp.graph(gp, {}, gp.name or "main"), imp

    if own_types is not None and stream is None and _may_skip_inference(model, own_types.ops):
        # its own (empty) inliner: a failed try leaves the names of the import below as is
        graph, imp = run(model.graph, FunctionInliner(()))
        if not imp.expanded and own_types.complete(graph):
            return graph
    return run(_with_inferred_types(model).graph, inliner)[0]


def _may_skip_inference(model: onnx.ModelProto, ops: frozenset[str]) -> bool:
    """Whether ``import_model`` may try ``model`` without ONNX shape inference (cheap)."""
    if model.functions:
        return False
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            return False
    size = 0
    for t in model.graph.initializer:
        size += len(t.raw_data) or t.ByteSize()
        if size > TRY_WITHOUT_INFERENCE_BYTES or t.data_location == onnx.TensorProto.EXTERNAL:
            return False
    return not any(a.type in (_A.GRAPH, _A.GRAPHS) for n in model.graph.node for a in n.attribute)


def _newest_opsets() -> dict[str, int]:
    newest = {"": onnx.defs.onnx_opset_version()}
    newest["ai.onnx.ml"] = max(int(row[3]) for row in onnx.helper.VERSION_TABLE)
    return newest


def _check_known_opsets(opsets: dict[str, int]) -> None:
    """A model importing a standard domain at a version newer than any ONNX release this
    build knows fails here: its ops may mean something our kernels do not implement."""
    for domain, newest in _newest_opsets().items():
        version = opsets.get(domain)
        if version is not None and version > newest:
            raise ModelLoadError(
                f"model imports {domain or 'ai.onnx'} opset {version}, newer than this build "
                f"supports (up to {newest}, onnx {onnx.__version__})"
            )


def _with_inferred_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with value_info filled by ONNX shape inference, when it succeeds: with
    data propagation first (the static dims a computed Reshape target keeps, such as an
    attention head split's head count and size), without it if that fails. ONNX does not
    know com.microsoft MatMulNBits, and would type nothing after one (a 4-bit decoder's
    whole graph): inference sees a MatMul by a stand-in (K, N) input in its place
    (``_stand_ins``), and the returned model has the real nodes back."""
    if model.ByteSize() > 1 << 30:
        return model  # the typed model holds a copy of the weights; skip it for huge ones
    probe, swapped = _stand_ins(model)
    probe, stripped = _weights_as_inputs(probe)
    for data_prop in (True, False):  # data_prop: Shape -> Gather -> Reshape chains give dims
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = onnx.shape_inference.infer_shapes(
                    probe, strict_mode=False, data_prop=data_prop
                )
        except Exception:  # noqa: BLE001 - inference is best effort; declared types still apply
            continue
        for i, node in swapped:
            out.graph.node[i].CopyFrom(node)
        del out.graph.input[len(model.graph.input) :]  # stand-ins' stubs, weights as inputs
        if stripped:
            del out.graph.initializer[:]
            out.graph.initializer.extend(model.graph.initializer)
        return out
    return model


def _weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """(``model`` for shape inference, whether it differs): the main graph's initializers
    over ``INFER_DATA_MAX_BYTES`` become inputs of their type and shape, appended after the
    declared ones (none is read for its values: shape arithmetic is small). The model
    itself when there is none (not copied)."""
    g = model.graph
    big = {t.name for t in g.initializer if t.ByteSize() > INFER_DATA_MAX_BYTES}
    if not big:
        return model, False
    probe = onnx.ModelProto(ir_version=model.ir_version)  # what inference reads, no weights
    probe.opset_import.extend(model.opset_import)
    probe.functions.extend(model.functions)
    pg = probe.graph
    pg.name = g.name
    for name in _GRAPH_PARTS:
        getattr(pg, name).extend(getattr(g, name))
    probe.graph.initializer.extend(t for t in g.initializer if t.name not in big)
    declared = {v.name for v in g.input}
    probe.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in g.initializer
        if t.name in big and t.name not in declared
    )
    return probe, True


#: The repeated fields of a main graph that ``_weights_as_inputs`` copies (all but its
#: initializers); the importer reads no other field of the inferred model.
_GRAPH_PARTS = ("node", "input", "output", "value_info", "sparse_initializer")


def _stand_ins(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[int, Any]]]:
    """(the model to infer types on, [(index, original node)] swapped): each main-graph
    com.microsoft MatMulNBits with int K and N as ``MatMul(A, stub)``, the stub a new
    float input (K, N) of the scales' type (float32 when that is unknown). The model
    itself where there is none (not copied)."""
    at = [i for i, n in enumerate(model.graph.node)
          if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]  # fmt: skip
    if not at:
        return model, []
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    elem = {t.name: t.data_type for t in model.graph.initializer}
    taken = {v for n in model.graph.node for v in (*n.input, *n.output)}
    taken |= {v.name for v in (*model.graph.input, *model.graph.initializer)}
    swapped = []
    for i in at:
        node = probe.graph.node[i]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        k, n = attrs.get("K"), attrs.get("N")
        if not isinstance(k, int) or not isinstance(n, int) or len(node.input) < 3:
            continue
        stub = f"tfrt_py.stand_in.{i}"
        while stub in taken:  # a name no model value has
            stub += "_"
        t = elem.get(node.input[2], onnx.TensorProto.FLOAT)
        probe.graph.input.append(onnx.helper.make_tensor_value_info(stub, t, [k, n]))
        swapped.append((i, onnx.NodeProto()))
        swapped[-1][1].CopyFrom(node)
        node.CopyFrom(onnx.helper.make_node("MatMul", [node.input[0], stub], list(node.output),
                                            name=node.name))  # fmt: skip
    return probe, swapped


class _Importer:
    def __init__(
        self,
        opsets: dict[str, int],
        base_dir: str | None,
        inliner: FunctionInliner,
        has_kernel: HasKernel | None,
    ) -> None:
        self.opsets = opsets
        self.base_dir = base_dir
        self.types: dict[str, ValueType] = {}
        self.protos: dict[str, onnx.TypeProto] = {}
        self.inliner = inliner
        self.has_kernel = has_kernel
        self.stream: StreamHook | None = None  # the main graph's only; nested graphs: None
        self.overridable: frozenset[str] = frozenset()  # the main graph's only
        self._depth = 0  # subgraphs entered (limits.MAX_GRAPH_DEPTH)
        self._calls = 0  # functions being inlined (limits.MAX_FUNCTION_DEPTH)
        self.expanded = False  # a node without a kernel was offered to its schema function

    def subgraph(self, gp: onnx.GraphProto, outer: dict[str, Value], name: str) -> Graph:
        """Import a nested graph (an attribute), at most ``MAX_GRAPH_DEPTH`` levels deep
        (counting those reached through inlined function bodies)."""
        if self._depth >= limits.MAX_GRAPH_DEPTH:
            raise ModelLoadError(
                f"graph {name!r} nests subgraphs more than {limits.MAX_GRAPH_DEPTH} levels "
                "deep (limit MAX_GRAPH_DEPTH in tfrt_py.frontends.onnx.limits)"
            )
        self._depth += 1
        try:
            return self.graph(gp, outer, name)
        finally:
            self._depth -= 1

    def inline(
        self,
        body: list[onnx.NodeProto],
        size: int,
        g: Graph,
        scope: dict[str, Value],
        opsets: dict[str, int],
        name: str,
    ) -> None:
        """Import the nodes of an inlined function body standing for node ``name``; ``size``
        is what the call adds to the model's inlined node count."""
        if self._calls >= limits.MAX_FUNCTION_DEPTH:
            raise ModelLoadError(
                f"node {name!r}: functions nest more than {limits.MAX_FUNCTION_DEPTH} calls "
                "deep (limit MAX_FUNCTION_DEPTH in tfrt_py.frontends.onnx.limits)"
            )
        self.inliner.account(size, body)
        self._calls += 1
        try:
            for inner in body:
                self.node(inner, g, scope, opsets)
        finally:
            self._calls -= 1

    def graph(self, gp: onnx.GraphProto, outer: dict[str, Value], name: str) -> Graph:
        g = Graph(name=name, opsets=self.opsets)
        scope: dict[str, Value] = dict(outer)
        for vi in list(gp.value_info) + list(gp.output) + list(gp.input):
            self.protos[vi.name] = vi.type
            t = to_value_type(vi.type)
            if t is not None:
                self.types[vi.name] = t
        init_names = set()
        stream, self.stream = self.stream, None
        over, self.overridable = self.overridable, frozenset()
        declared = {vi.name: vi for vi in gp.input}
        defaulted: list[Value] = []
        for t in gp.initializer:
            self.protos[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, t.dims)
            streamed = stream(t) if stream is not None and t.name not in over else None
            if t.name in over:
                v = defaulted_input(t, declared[t.name], self.base_dir)
                defaulted.append(v)
            elif streamed is not None:
                v = streamed
                g.inputs.append(v)
            else:
                v = Value(t.name, const=to_array(t, self.base_dir))
                g.constants.append(v)
            scope[t.name] = v
            init_names.add(t.name)
        for t in gp.sparse_initializer:
            dense = _sparse_to_dense(t, self.base_dir)
            v = Value(t.values.name, const=dense)
            g.constants.append(v)
            scope[v.name] = v
            init_names.add(v.name)
        for vi in gp.input:
            if vi.name in init_names:
                continue  # an initializer with a declared input: a constant, or defaulted
            t = to_value_type(vi.type) or self.types.get(vi.name)
            v = Value(vi.name, t)
            g.inputs.append(v)
            scope[vi.name] = v
        g.inputs.extend(defaulted)
        for np_ in gp.node:
            self.node(np_, g, scope)
        for vi in gp.output:
            found = scope.get(vi.name)
            if found is None:
                raise GraphError(f"graph {name!r}: output {vi.name!r} is never defined")
            v = found
            if v.type is None or (isinstance(v.type, TensorType) and v.type.dtype is None):
                t = to_value_type(vi.type)
                if t is not None:
                    v.type = t
            g.outputs.append(v)
        return g

    def node(
        self,
        np_: onnx.NodeProto,
        g: Graph,
        scope: dict[str, Value],
        opsets: dict[str, int] | None = None,
    ) -> None:
        """Import one node into ``g``; ``opsets`` overrides the model's inside a function."""
        opsets = opsets or self.opsets
        domain = "" if np_.domain == "ai.onnx" else np_.domain
        name = np_.name or f"{np_.op_type}_{len(g.nodes)}"
        if self.inliner.has(domain, np_.op_type):
            fn = self.inliner.get(domain, np_.op_type)
            size, _ = self.inliner.expansion(domain, np_.op_type)  # recursion, blow-up
            inner_opsets = {**opsets, **_function_opsets(fn)}
            body = inline_call(fn, np_, self.inliner.prefix(name))
            # Calls inside this body are part of ``size``: count only the outermost call.
            self.inline(body, size if self._calls == 0 else 0, g, scope, inner_opsets, name)
            return
        if domain == "" and np_.op_type == "Constant":
            self._constant(np_, name, g, scope)
            return
        if domain not in opsets:
            opsets = {**opsets, domain: 1}  # ONNX wants an import; custom ops often lack one
        opset = opsets[domain]
        if self.has_kernel is not None and not self.has_kernel(domain, np_.op_type, opset):
            self.expanded = True  # the body may depend on the inputs' inferred types
            found = schema_function(np_, opset, [self.protos.get(n) for n in np_.input])
            if found is not None:
                fn, defaults = found
                inner_opsets = {**opsets, **_function_opsets(fn)}
                body = inline_call(fn, np_, self.inliner.prefix(name), defaults)
                self.inline(body, len(body), g, scope, inner_opsets, name)
                return
        inputs: list[Value | None] = []
        for i, iname in enumerate(np_.input):
            if not iname:
                inputs.append(None)
                continue
            v = scope.get(iname)
            if v is None:
                raise GraphError(
                    f"node {name!r} ({np_.op_type}) input {i} {iname!r} is not defined "
                    "(not a graph input, initializer or earlier output)"
                )
            inputs.append(v)
        attrs = {a.name: self.attr(a, scope, name) for a in np_.attribute}
        outputs: list[Value | None] = []
        for oname in np_.output:
            if not oname:
                outputs.append(None)
                continue
            v = Value(oname, self.types.get(oname))
            outputs.append(v)
        node = Node(
            np_.op_type,
            inputs,
            outputs,
            attrs,
            name=name,
            domain=domain,
            opset=opset,
        )
        g.nodes.append(node)
        for v in outputs:
            if v is not None:
                scope[v.name] = v

    def _constant(self, np_: onnx.NodeProto, name: str, g: Graph, scope: dict[str, Value]) -> None:
        if len(np_.attribute) != 1:
            raise ModelLoadError(f"Constant node {name!r} must have exactly one value attribute")
        a = np_.attribute[0]
        val = self.attr(a, scope, name)
        kind = a.name
        if kind in ("value", "sparse_value"):
            arr = np.asarray(val)
        elif kind in ("value_float", "value_floats"):
            arr = np.array(val, dtype=np.float32)
        elif kind in ("value_int", "value_ints"):
            arr = np.array(val, dtype=np.int64)
        elif kind in ("value_string", "value_strings"):
            arr = np.array(val, dtype=object)
        else:
            raise ModelLoadError(f"Constant node {name!r}: unknown attribute {kind!r}")
        v = Value(np_.output[0], const=arr)
        g.constants.append(v)
        scope[v.name] = v

    def attr(self, a: onnx.AttributeProto, scope: dict[str, Value], node_name: str) -> Any:
        t = a.type
        if t == _A.FLOAT:
            return float(a.f)
        if t == _A.INT:
            return int(a.i)
        if t == _A.STRING:
            return a.s.decode("utf-8", errors="surrogateescape")
        if t == _A.TENSOR:
            return to_array(a.t, self.base_dir)
        if t == _A.SPARSE_TENSOR:
            return _sparse_to_dense(a.sparse_tensor, self.base_dir)
        if t == _A.GRAPH:
            return self.subgraph(a.g, scope, f"{node_name}.{a.name}")
        if t == _A.FLOATS:
            return [float(x) for x in a.floats]
        if t == _A.INTS:
            return [int(x) for x in a.ints]
        if t == _A.STRINGS:
            return [s.decode("utf-8", errors="surrogateescape") for s in a.strings]
        if t == _A.TENSORS:
            return [to_array(x, self.base_dir) for x in a.tensors]
        if t == _A.GRAPHS:
            return [self.subgraph(x, scope, f"{node_name}.{a.name}") for x in a.graphs]
        if t == _A.TYPE_PROTO:
            return to_value_type(a.tp)
        if t == _A.TYPE_PROTOS:
            return [to_value_type(x) for x in a.type_protos]
        raise ModelLoadError(f"node {node_name!r}: attribute {a.name!r} has unknown type {t}")


def _function_opsets(fn: onnx.FunctionProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in fn.opset_import}


def _sparse_to_dense(sp: onnx.SparseTensorProto, base_dir: str | None) -> np.ndarray:
    """The dense array of a sparse tensor. Its dense shape is checked like any tensor's, its
    byte size against ``limits.MAX_SPARSE_DENSE_BYTES``, and its indices against the shape
    (ModelLoadErrors naming the tensor) before anything is allocated."""
    name = sp.values.name or "<sparse>"
    values = to_array(sp.values, base_dir)
    indices = to_array(sp.indices, base_dir)
    shape = tuple(int(d) for d in sp.dims)
    if any(d < 0 for d in shape):
        raise ModelLoadError(f"sparse tensor {name!r}: negative dim in shape {list(shape)}")
    dense_bytes = math.prod(shape) * values.dtype.itemsize
    if dense_bytes > limits.MAX_SPARSE_DENSE_BYTES:
        raise ModelLoadError(
            f"sparse tensor {name!r}: dense shape {list(shape)} would take {dense_bytes:,} "
            f"bytes, more than {limits.MAX_SPARSE_DENSE_BYTES:,} (limit MAX_SPARSE_DENSE_BYTES "
            "in tfrt_py.frontends.onnx.limits)"
        )
    if values.ndim != 1 or indices.dtype.kind not in "iu":
        raise ModelLoadError(f"sparse tensor {name!r}: values must be 1-D, indices integers")
    nnz, size = values.shape[0], math.prod(shape)
    indices = indices.astype(np.int64)
    if indices.ndim == 1 and indices.shape[0] == nnz:
        bad = bool(nnz) and (indices.min() < 0 or indices.max() >= size)
        where: Any = indices
    elif indices.ndim == 2 and indices.shape == (nnz, len(shape)):
        bad = bool(nnz) and bool(((indices < 0) | (indices >= np.array(shape))).any())
        where = tuple(indices.T)
    else:
        raise ModelLoadError(
            f"sparse tensor {name!r}: indices of shape {list(indices.shape)} do not match "
            f"{nnz} values of a rank-{len(shape)} tensor"
        )
    if bad:
        raise ModelLoadError(f"sparse tensor {name!r}: an index is outside shape {list(shape)}")
    dense = np.zeros(shape, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[where] = values
    else:
        dense[where] = values
    return dense
