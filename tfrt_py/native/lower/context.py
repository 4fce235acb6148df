"""What an op lowering sees (``NodeContext``): refs of a node's inputs, destinations for
its outputs, the packed constants, arena buffers and ``decline``. ``lower.py`` makes one
per body it lowers (rows mode's tile body shares the row body's constants through
``share_constants``). Load time, one thread: not thread-safe.
"""

from __future__ import annotations

import collections
import hashlib
import math
from typing import Any, NoReturn

import numpy as np

from ...executors.plan import ALIGN, Buffer
from ...ir import Graph, Node, Value
from .emit import BLAS_MIN_MACS, tname
from .loops import Ref
from .source import ChoicesDiffer, ConstantsDiffer, Declined, literal

__all__ = ["CACHE_DECLINE", "NodeContext"]

#: How a reason that only the in-place form of a KV cache declines starts: ``lower`` then
#: lowers the graph again with the cache copied (``cache.py``).
CACHE_DECLINE = "cache in place:"


class NodeContext:
    """What an op lowering sees (``ops.py``): refs of its inputs, destinations for its
    outputs, constants, and ``decline``. One per lowering; not thread-safe."""

    def __init__(self, graph: Graph, shapes: dict[int, tuple[tuple[int, ...], np.dtype]]) -> None:
        self.refs: dict[int, Ref] = {}
        self.shapes = shapes
        # Big products call NumPy's gemm (``kern_blas``) in rows mode's tile body
        # (``_tile``) and in signature bodies; static bodies keep loops. (Never numba's
        # np.dot: it went to SciPy's OpenBLAS, whose threads fought NumPy's.)
        self.blas = False
        # Products by constant float32 weights on kernels/lib/gemm_packed (products.py): in
        # signature bodies and both of rows mode's bodies (the row body and the tile share
        # the packed weights); static bodies keep their loops.
        self.packed_products = False
        self.tag = "n0_"
        self.node: Node | None = None
        self.step = 0
        self.outputs = {id(v): k for k, v in reversed(list(enumerate(graph.outputs)))}
        self.params: dict[str, list[np.ndarray]] = {}
        self.param_size: dict[str, int] = {}
        self.buffers: dict[int, tuple[Buffer, str]] = {}  # root -> (buffer, dtype alias)
        self.written: set[int] = set()  # output positions already written
        #: a KV cache written in place (``cache.py``): the past inputs' value ids (their
        #: data is never read: it is already in the present's buffer), and per present's
        #: output position the expression of its matrix stride in that buffer
        self.unread: set[int] = set()
        self.cache_mat: dict[int, str] = {}
        #: output position -> (array, element offset) of the current row (rows mode)
        self.out_buf: dict[int, tuple[str, str]] = {}
        self.hoisted: list[str] = []  # lines before the body: constant slices
        self.label_tables: dict[int, Any] = {}  # value id -> string labels it indexes
        self.finishers: dict[int, Any] = {}  # graph output value id -> finisher
        self.readers: dict[int, int] = collections.Counter(
            id(v) for n in graph.nodes for v in n.inputs if v is not None)  # fmt: skip
        #: value id -> the (node, input position) reading it, once per input read
        self.consumers: dict[int, list[tuple[Node, int]]] = {}
        for n in graph.nodes:
            for slot, v in enumerate(n.inputs):
                if v is not None:
                    self.consumers.setdefault(id(v), []).append((n, slot))
        self.uses_kernels = False
        self.imports: set[str] = set()  # import lines the code needs (``emit``'s)
        self.packed: list[tuple[np.ndarray, Ref]] = []  # every constant put, with its ref
        self._same: dict[tuple[Any, ...], Ref] = {}  # (shape, dtype, digest) -> ref
        #: value id -> its value for this signature (``fold.shape_values``): constants
        self.folded: dict[int, np.ndarray] = {}
        #: folded values that a node reads as data written by code into the arena, not
        #: packed (``generic.py``: small values that change inside a box, whose numbers
        #: it fits), and the lines writing them, which ``_body`` puts before the node
        self.spelled: frozenset[int] = frozenset()
        self.pre: list[str] = []
        #: elements to reserve for each constant packed, in order (``generic.py``: the room
        #: a box's largest signature needs, so that every signature packs alike)
        self.const_room: tuple[int, ...] | None = None
        #: the choices between two correct forms of code (``choose``) made so far, and the
        #: ones to make instead (``generic.py``: the box's top's, so that every sample of
        #: a box writes the same code)
        self.choices: list[bool] = []
        self.replay: tuple[bool, ...] | None = None

    def share_constants(self, other: NodeContext) -> None:
        """Start from ``other``'s packed constants (a copy: ``other`` is unchanged); a
        constant equal to one of them reuses it instead of packing it again."""
        self.params = {t: list(arrs) for t, arrs in other.params.items()}
        self.param_size = dict(other.param_size)
        self.hoisted = list(other.hoisted)
        self.packed = list(other.packed)
        self._same = {_digest(arr): r for arr, r in other.packed}

    def choose(self, value: bool) -> bool:
        """A choice between two correct forms of code: ``value``, or when replaying the
        choice made at the same point of the lowering replayed."""
        k = len(self.choices)
        if self.replay is not None:
            if k >= len(self.replay):
                raise ChoicesDiffer(["the lowering's choices differ from the plan's"])
            value = self.replay[k]
        self.choices.append(value)
        return value

    def blas_for(self, macs: int) -> bool:
        """Whether a product of ``macs`` multiply-adds calls BLAS (``emit.matmul`` still
        checks its layout): big enough for it (``emit.BLAS_MIN_MACS``), where this body
        may call it (``blas``)."""
        return self.blas and self.choose(macs >= BLAS_MIN_MACS)

    def decline(self, reason: str) -> NoReturn:
        n = self.node
        where = f"{n.op_type} node {n.name!r}: " if n is not None else ""
        raise Declined([where + reason])

    def put_const(self, arr: np.ndarray) -> Ref:
        arr = np.ascontiguousarray(arr)
        if self._same:
            known = self._same.get(_digest(arr))
            if known is not None:
                return known
        t = tname(arr.dtype)
        off = self.param_size.get(t, 0)
        self.params.setdefault(t, []).append(arr.ravel())
        size = arr.size
        if self.const_room is not None:
            k = len(self.packed)
            if k >= len(self.const_room) or self.const_room[k] < arr.size:
                raise ConstantsDiffer(["the constants differ from the plan's"])
            size = self.const_room[k]
            if size > arr.size:
                self.params[t].append(np.zeros(size - arr.size, arr.dtype))
        pad = (-(off + size)) % (ALIGN // arr.dtype.itemsize or 1)
        if pad:
            self.params[t].append(np.zeros(pad, arr.dtype))
        self.param_size[t] = off + size + pad
        ref = Ref(f"P_{t}", literal(off), tuple(arr.shape), arr.dtype)
        self.packed.append((arr, ref))
        return ref

    def const(self, v: Value) -> np.ndarray | None:
        """``v``'s value when it is known at lowering: a constant, or shape arithmetic
        folded for this signature."""
        if v.const is not None:
            return np.asarray(v.const)
        return self.folded.get(id(v))

    def ref(self, v: Value | None) -> Ref:
        """``v``'s ref, contiguous: a KV cache in place (``cache.py``) declines here."""
        r = self.stack_ref(v)
        if r.mat:
            self.decline(f"{CACHE_DECLINE} the present is read by a lowering of flat tensors")
        return r

    def stack_ref(self, v: Value | None) -> Ref:
        """``v``'s ref, which may be a stack of matrices (``Ref.mat``): for the lowerings
        that index each matrix by its own offset."""
        if v is None:
            self.decline("an omitted input")
        if id(v) in self.unread:
            self.decline(f"{CACHE_DECLINE} the past is read beyond its Concat")
        if id(v) in self.label_tables or id(v) in self.finishers:
            self.decline("string labels or ZipMap output read by another node")
        r = self.refs.get(id(v))
        if r is None:
            value = self.const(v)
            if value is None:
                self.decline(f"value {v.name!r} has no native storage")
            if id(v) in self.spelled and v.const is None:
                r = self.refs[id(v)] = self.new_buffer(tuple(value.shape), value.dtype)
                self.pre += [f"{r.buf}[{r.off} + {literal(k)}] = {literal(x)}"
                             for k, x in enumerate(value.ravel().tolist())]  # fmt: skip
            else:
                r = self.refs[id(v)] = self.put_const(value)
        if r.root >= 0:
            self.buffers[r.root][0].last = self.step
        return r

    def out(self, v: Value | None) -> Ref:
        if v is None:
            self.decline("an omitted output")
        shape, dtype = self.shapes[id(v)]
        k = self.outputs.get(id(v))
        tname(dtype)  # Declined for a dtype the lowering does not know
        if k is not None:
            self.written.add(k)
            buf, off = self.out_buf.get(k, (f"r{k}", "0"))
            r = Ref(buf, off, shape, dtype, mat=self.cache_mat.get(k, ""))
        else:
            r = self.new_buffer(shape, dtype)
        self.refs[id(v)] = r
        return r

    def new_buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> Ref:
        """A fresh arena buffer, live from the current step."""
        t = tname(dtype)
        root = len(self.buffers)
        nbytes = math.prod(shape) * dtype.itemsize
        self.buffers[root] = (Buffer(nbytes, self.step, self.step, [f"node {self.step}"]), t)
        return Ref(f"A_{t}", f"@{root}@", shape, dtype, root)

    def const_slice(self, arr: np.ndarray) -> str:
        """A name (ours) bound, before the body, to ``arr`` packed as a constant: the
        kernels' view of model data."""
        self.uses_kernels = True
        arr = np.asarray(arr)
        r = self.put_const(arr)
        name = f"k{len(self.hoisted)}"
        self.hoisted.append(f"{name} = {r.buf}[{r.off}:{r.off} + {literal(arr.size)}]")
        return name

    def view(self, r: Ref) -> str:
        """``r`` as a 1-D array expression (an arena scratch buffer for a kernel)."""
        return f"{r.buf}[{r.off}:{r.off} + {literal(r.size)}]"

    def out_labels(self, v: Value, shape: tuple[int, ...], table: Any) -> Ref:
        """``v``'s ref, holding int64 indices into the string ``table`` (the entry maps
        them; only views and graph outputs may read it)."""
        self.shapes[id(v)] = (tuple(shape), np.dtype(np.int64))
        r = self.out(v)
        self.label_tables[id(v)] = table
        return r

    def finish_output(self, v: Value, src: Ref, finisher: Any) -> None:
        """``v`` is a graph output the entry makes from ``src``'s array (ZipMap)."""
        if id(v) not in self.outputs or self.readers.get(id(v)):
            self.decline("a ZipMap output read by another node")
        self.refs[id(v)] = src
        self.shapes[id(v)] = (src.shape, src.dtype)
        self.finishers[id(v)] = finisher

    def extend(self, *refs: Ref) -> None:
        """Keep these arena buffers live up to the current step."""
        for r in refs:
            if r.root >= 0:
                buf = self.buffers[r.root][0]
                buf.last = max(buf.last, self.step)


def _digest(arr: np.ndarray) -> tuple[Any, ...]:
    return (arr.shape, arr.dtype.str, hashlib.blake2b(arr.tobytes(), digest_size=16).digest())
