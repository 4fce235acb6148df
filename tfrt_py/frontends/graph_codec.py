"""An imported graph and its metadata as bytes, and back: the format of the graph cache.

``encode(graph, meta)`` gives the chunks of one file: a magic line, the length and CRC-32
of a JSON header, the header (the graphs, their nodes and values, the metadata, and a
table of arrays with their CRC-32s) and the arrays' raw data, each at a 64-byte aligned
offset. The checksums catch a truncated or damaged file, not a forged one (the cache
directory is trusted only when nobody else can write it). ``decode(buf)`` rebuilds an equal IR:
the same graphs, nodes in the same order, the same sharing of Values between nodes and
nested graphs (outer-scope captures included), the same attributes and types; each array
is read into its own writable buffer, like the importer's.

What it takes is what ``frontends.onnx.import_model`` makes: attributes that are int, float,
str, lists of those, arrays, Graphs, lists of Graphs and value types. Anything else -- an
array memory-mapped from an external-data file, a subclass, a dtype outside the ONNX
table, an object array of anything but str -- raises ``Unsupported`` (the caller then does
not cache the model). ``decode`` raises ``ValueError``/``KeyError``/``TypeError``/
``IndexError``/``RecursionError`` for bytes it did not write; the caller treats all of them
as a miss.

Model text (names, attribute strings, doc strings) is kept as JSON data and never
evaluated. Neither function keeps state; both may run on any thread.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
import zlib
from io import BufferedIOBase
from types import MappingProxyType
from typing import Any

import numpy as np

from ..ir.dtypes import elem_type, numpy_dtype
from ..ir.graph import Graph, Node, Value
from ..ir.types import OpaqueType, OptionalType, SequenceType, TensorType
from ..metadata import ModelMetadata

__all__ = ["MAGIC", "Unsupported", "decode", "encode"]

#: The first bytes of every encoded graph; the last byte is the format's version.
MAGIC = b"TFRTPYGRAPH\x02"
#: The header's length and its CRC-32.
_LENGTH = struct.Struct("<QI")
_ALIGN = 64


class Unsupported(Exception):
    """The graph holds something the codec does not write: do not cache it."""


def encode(graph: Graph, meta: ModelMetadata) -> list[Any]:
    """``graph`` (as imported: no pass has run) and ``meta`` as chunks to write one after
    the other (joined, they are what ``decode`` reads): bytes, and each array's own memory
    as a flat uint8 view (not copied; valid while ``graph`` is unchanged)."""
    enc = _Encoder()
    root = enc.graph(graph)
    header = {
        "graph": root,
        "values": enc.values,
        "arrays": enc.array_table,
        "opsets": graph.opsets,
        "meta": meta.as_dict(),
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    written = len(MAGIC) + _LENGTH.size + len(head)
    chunks = [MAGIC, _LENGTH.pack(len(head), zlib.crc32(head)), head]
    chunks.append(bytes(_aligned(written) - written))
    for data in enc.blobs:
        chunks.append(data)
        chunks.append(bytes(_aligned(len(data)) - len(data)))
    return chunks


def decode(f: BufferedIOBase, size: int) -> tuple[Graph, ModelMetadata]:
    """The graph and metadata ``encode`` wrote, read from ``f`` (positioned at its start,
    ``size`` bytes long). Each array is read into its own buffer."""
    head = f.read(len(MAGIC) + _LENGTH.size)
    if head[: len(MAGIC)] != MAGIC or len(head) != len(MAGIC) + _LENGTH.size:
        raise ValueError("not an encoded graph of this version")
    n, crc = _LENGTH.unpack_from(head, len(MAGIC))
    head_end = len(head) + n
    if head_end > size:
        raise ValueError("the header runs past the end")
    text = f.read(n)
    if zlib.crc32(text) != crc:
        raise ValueError("the header's checksum differs")
    header = json.loads(text)
    dec = _Decoder(f, size, _aligned(head_end), header)
    graph = dec.graph(header["graph"])
    return graph, _meta(header["meta"])


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _dtype_name(dt: np.dtype) -> str:
    """``dt`` as its ONNX element type's name (``numpy_dtype`` reads it back)."""
    t = elem_type(dt)
    if t is None:
        raise Unsupported(f"dtype {dt} is not an ONNX element type")
    if dt.itemsize > 1 and dt.kind != "O" and not dt.isnative:
        raise Unsupported(f"byte-swapped array ({dt})")
    return t.name


def _mapped(a: np.ndarray) -> bool:
    """True when ``a`` is (a view of) a file mapping: external data, not ours to copy."""
    base: Any = a
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


class _Encoder:
    def __init__(self) -> None:
        self.values: list[list[Any]] = []
        self.array_table: list[list[Any]] = []
        self.blobs: list[Any] = []
        self.size = 0
        self._value_ids: dict[int, int] = {}
        self._graph_ids: set[int] = set()

    def graph(self, g: Graph) -> dict[str, Any]:
        if id(g) in self._graph_ids:
            raise Unsupported("a Graph object appears twice")
        self._graph_ids.add(id(g))
        return {
            "name": g.name,
            "opsets": g.opsets,
            "inputs": [self.value(v) for v in g.inputs],
            "constants": [self.value(v) for v in g.constants],
            "nodes": [self.node(n) for n in g.nodes],
            "outputs": [self.value(v) for v in g.outputs],
        }

    def node(self, n: Node) -> list[Any]:
        return [
            n.op_type,
            n.domain,
            n.name,
            n.opset,
            [None if v is None else self.value(v) for v in n.inputs],
            [None if v is None else self.value(v) for v in n.outputs],
            {k: self.attr(a) for k, a in n.attrs.items()},
        ]

    def value(self, v: Value) -> int:
        vid = self._value_ids.get(id(v))
        if vid is None:
            vid = self._value_ids[id(v)] = len(self.values)
            entry: list[Any] = [v.name, self.type(v.type), None, None]
            self.values.append(entry)
            entry[2] = None if v.const is None else self.array(v.const)
            entry[3] = None if v.default is None else self.array(v.default)
        return vid

    def array(self, a: Any) -> int:
        if type(a) is not np.ndarray or _mapped(a):
            raise Unsupported(f"array of type {type(a).__name__} (external data?)")
        name = _dtype_name(a.dtype)
        idx = len(self.array_table)
        if a.dtype.kind == "O":
            items = a.ravel().tolist()
            if not all(type(s) is str for s in items):
                raise Unsupported("an object array holds something other than str")
            self.array_table.append([name, list(a.shape), items])
            return idx
        data: Any = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # a buffer
        self.array_table.append([name, list(a.shape), self.size, len(data), zlib.crc32(data)])
        self.blobs.append(data)
        self.size = _aligned(self.size + len(data))
        return idx

    def attr(self, a: Any) -> Any:
        kind = type(a)
        if kind is int or kind is float or kind is str:
            return a
        if kind is list:
            return [self.attr(x) for x in a]
        if kind is np.ndarray:
            return {"a": self.array(a)}
        if kind is Graph:
            return {"g": self.graph(a)}
        if kind in (TensorType, SequenceType, OptionalType, OpaqueType):
            return {"t": self.type(a)}
        raise Unsupported(f"attribute value of type {kind.__name__}")

    def type(self, t: Any) -> Any:
        if t is None:
            return None
        kind = type(t)
        if kind is TensorType:
            dims = None if t.shape is None else list(t.shape)
            if dims is not None and not all(d is None or type(d) in (int, str) for d in dims):
                raise Unsupported(f"a dim of {t} is neither int, str nor None")
            return ["t", None if t.dtype is None else _dtype_name(t.dtype), dims]
        if kind is SequenceType:
            return ["s", self.type(t.elem)]
        if kind is OptionalType:
            return ["o", self.type(t.elem)]
        if kind is OpaqueType:
            return ["x", t.name]
        raise Unsupported(f"value type {kind.__name__}")


class _Decoder:
    def __init__(self, f: BufferedIOBase, size: int, start: int, header: dict[str, Any]) -> None:
        self.f = f
        self.size = size
        self.start = start
        self.opsets: dict[str, int] = {str(k): int(v) for k, v in header["opsets"].items()}
        self.arrays = [self.array(entry) for entry in header["arrays"]]
        self.values = [self.value(entry) for entry in header["values"]]

    def array(self, entry: list[Any]) -> np.ndarray:
        dt = numpy_dtype(entry[0])
        shape = tuple(_index(d) for d in entry[1])
        if dt.kind == "O":
            arr = np.empty(len(entry[2]), dtype=object)
            arr[:] = [str(s) for s in entry[2]]
            return arr.reshape(shape)
        offset, nbytes = _index(entry[2]), _index(entry[3])
        if math.prod(shape) * dt.itemsize != nbytes or self.start + offset + nbytes > self.size:
            raise ValueError("an array lies outside the data")
        arr = np.empty(shape, dt)
        if nbytes:
            self.f.seek(self.start + offset)
            raw: Any = arr.reshape(-1).view(np.uint8)  # a buffer (NumPy's stubs lack it)
            if self.f.readinto(raw) != nbytes:
                raise ValueError("the data ends early")
            if zlib.crc32(raw) != entry[4]:
                raise ValueError("an array's checksum differs")
        return arr

    def value(self, entry: list[Any]) -> Value:
        v = Value(str(entry[0]))
        v.type = self.type(entry[1])
        v.const = None if entry[2] is None else self.arrays[_index(entry[2])]
        v.default = None if entry[3] is None else self.arrays[_index(entry[3])]
        return v

    def type(self, t: Any) -> Any:
        if t is None:
            return None
        tag = t[0]
        if tag == "t":
            dtype = None if t[1] is None else numpy_dtype(t[1])
            shape = None if t[2] is None else tuple(_dim(d) for d in t[2])
            return TensorType(dtype, shape)
        if tag == "s":
            return SequenceType(self.type(t[1]))
        if tag == "o":
            return OptionalType(self.type(t[1]))
        if tag == "x":
            return OpaqueType(str(t[1]))
        raise ValueError(f"unknown type tag {tag!r}")

    def graph(self, g: dict[str, Any]) -> Graph:
        values = self.values
        graph = Graph(
            name=str(g["name"]),
            inputs=[values[_index(i)] for i in g["inputs"]],
            outputs=[values[_index(i)] for i in g["outputs"]],
            constants=[values[_index(i)] for i in g["constants"]],
            opsets=self.opsets,
        )
        if {str(k): int(v) for k, v in g["opsets"].items()} != self.opsets:
            raise ValueError("a nested graph's opsets differ from the model's")
        graph.nodes = [self.node(n) for n in g["nodes"]]
        return graph

    def node(self, n: list[Any]) -> Node:
        op_type, domain, name, opset, inputs, outputs, attrs = n
        values = self.values
        return Node(
            str(op_type),
            [None if i is None else values[_index(i)] for i in inputs],
            [None if i is None else values[_index(i)] for i in outputs],
            {str(k): self.attr(a) for k, a in attrs.items()},
            name=str(name),
            domain=str(domain),
            opset=int(opset),
        )

    def attr(self, a: Any) -> Any:
        if isinstance(a, list):
            return [self.attr(x) for x in a]
        if isinstance(a, dict):
            if "a" in a:
                return self.arrays[_index(a["a"])]
            if "g" in a:
                return self.graph(a["g"])
            return self.type(a["t"])
        if type(a) in (int, float, str):
            return a
        raise ValueError(f"attribute value {type(a).__name__}")


def _index(i: Any) -> int:
    """``i`` if it is an int >= 0 (an index, a size or an offset the encoder wrote)."""
    if type(i) is int and i >= 0:
        return i
    raise ValueError(f"{i!r} is not an index")


def _dim(d: Any) -> int | str | None:
    if d is None or type(d) in (int, str):
        return d
    raise ValueError(f"dim {d!r}")


def _meta(m: dict[str, Any]) -> ModelMetadata:
    return ModelMetadata(
        producer_name=str(m["producer_name"]),
        producer_version=str(m["producer_version"]),
        domain=str(m["domain"]),
        model_version=int(m["model_version"]),
        doc_string=str(m["doc_string"]),
        graph_name=str(m["graph_name"]),
        graph_doc_string=str(m["graph_doc_string"]),
        metadata_props=MappingProxyType({str(k): str(v) for k, v in m["metadata_props"].items()}),
        ir_version=int(m["ir_version"]),
        opset_imports=MappingProxyType({str(k): int(v) for k, v in m["opset_imports"].items()}),
    )
