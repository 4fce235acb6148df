"""The kernel contract.

A *kernel builder* is called once per node at load time with a ``KernelContext`` and
returns the node's *compute function*. Everything that can be decided at load time
(attribute parsing, defaults, opset differences, constant inputs such as a Reshape's
shape, transposed weights) is decided in the builder, so the compute function does only
the math.

Compute function contract (all executors rely on it):

* It is called with the node's inputs as positional arguments, in ONNX order, ``None``
  for an omitted optional input. Control-flow nodes (If/Loop/Scan) get, after those, the
  values their subgraphs capture from enclosing graphs (see ``KernelContext.subgraph``).
* A node with one output returns that array; a node with several outputs returns a tuple
  with exactly ``ctx.n_outputs`` entries (any entry may be ``None`` where
  ``ctx.has_output(i)`` is false).
* It returns NumPy arrays (a 0-d NumPy scalar is accepted). It never mutates its inputs,
  unless registered ``inplace`` *and* the executor passes ``out`` aliasing input 0.
* It may return a view of an input (Reshape, Identity); the executor copies before handing
  a value to the user when it aliases a feed or a constant.
* When registered ``supports_out``, it also accepts ``out=`` (a preallocated array of the
  right shape and dtype) and writes its single output there, returning ``out``.
* It is thread-compatible: one compute function may run on many threads at once, so it
  keeps no per-call state outside its locals.

Builders raise ``ctx.unsupported("why")`` for attribute combinations they cannot run, so
the model fails at load, naming the node.

A builder may also *offer an inline form* (``ctx.offer_inline``): an ``InlineFn`` that,
given the call's planned shapes, returns the statements (``Inline``) the sync
interpreter's generated code runs in place of the call -- the same NumPy calls without the
kernel's Python frame -- or None where it does not apply. The executor reads it from
``ctx.inline`` after the build; every other caller of the compute function ignores it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Graph, Node, TensorType
from ..ir.dtypes import numpy_dtype
from ..records import record

__all__ = [
    "CONTROL_FLOW",
    "OUT",
    "OUT_INPLACE",
    "REQUIRED",
    "ComputeFn",
    "Cost",
    "Inline",
    "InlineFn",
    "KernelBuilder",
    "KernelContext",
    "KernelFlags",
    "SubgraphFn",
]

ComputeFn = Callable[..., Any]
#: Runs a nested graph: ``fn(inputs, captured) -> list of outputs``. ``inputs`` are the
#: subgraph's formal inputs in order; ``captured`` is the tuple of the node's trailing
#: positional arguments (its captured outer-scope values), passed through unchanged.
SubgraphFn = Callable[[Sequence[Any], Sequence[Any]], list[Any]]


@record(frozen=True, slots=True)
class Inline:
    """Statements that replace a kernel's call in generated code. In ``lines``, ``{out}``
    and ``{in0}``, ``{in1}``... stand for the call's output and inputs, and ``{key}`` for
    each key of ``env``: the objects the statements use, bound by the generator under
    names of its own (model text never reaches the statements)."""

    lines: list[str]
    env: dict[str, Any]


#: ``inline(in_shapes, out_shape, dtype) -> Inline | None``: a kernel's statements for one
#: planned call. ``in_shapes`` are the inputs' shapes (None where unknown), ``out_shape``
#: the output's (ints, or a generic plan's symbolic dims), ``dtype`` the output's; None:
#: the generator emits the plain call.
InlineFn = Callable[[list[Any], Any, Any], "Inline | None"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class Cost(NamedTuple):
    """A kernel's estimated work for one call: floating-point ops and bytes touched."""

    flops: float
    bytes: float


@record(frozen=True, slots=True)
class KernelFlags:
    """Properties executors and the planner may rely on.

    ``pure``: no side effects; same inputs give same outputs.
    ``inplace``: output 0 may be written into input 0's buffer (same shape and dtype).
    ``supports_out``: the compute function accepts ``out=`` for its single output.
    ``is_async``: the compute function is a coroutine function (awaited on the loop).
    ``control_flow``: runs nested graphs (If/Loop/Scan); executors treat it as non-strict.
    """

    pure: bool = True
    inplace: bool = False
    supports_out: bool = False
    is_async: bool = False
    control_flow: bool = False


# The flag sets kernels register with. ``registry.add`` defaults to ``KernelFlags()`` (pure,
# no ``out=``); a kernel with other needs (impure, async) builds its own KernelFlags.
#: The compute function takes ``out=``.
OUT = KernelFlags(supports_out=True)
#: Takes ``out=``, and ``out`` may be input 0's buffer (elementwise ops, in-place updates).
OUT_INPLACE = KernelFlags(inplace=True, supports_out=True)
#: Runs nested graphs (If/Loop/Scan, SequenceMap, FlexAttention's modifiers).
CONTROL_FLOW = KernelFlags(control_flow=True)


class KernelContext:
    """What a kernel builder knows about one node at load time. Read-only, but for the
    inline form a builder may offer (``offer_inline``; the builder's thread, at load).

    Built by the executor layer; ``subgraph_compiler`` turns a nested Graph into a
    ``SubgraphFn`` (kernels never see executors).
    """

    def __init__(
        self,
        node: Node,
        input_types: Sequence[Any] | None = None,
        subgraph_compiler: Callable[[Node, Graph], SubgraphFn] | None = None,
    ) -> None:
        self.node = node
        self.node_name = node.name
        self.op_type = node.op_type
        self.domain = node.domain
        self.opset = node.opset
        self.attrs = node.attrs
        self.n_inputs = len(node.inputs)
        self.n_outputs = len(node.outputs)
        self._input_types = list(input_types) if input_types is not None else None
        self._subgraph_compiler = subgraph_compiler
        #: The inline form the builder offered, or None (see ``offer_inline``).
        self.inline: InlineFn | None = None

    def offer_inline(self, inline: InlineFn) -> None:
        """Offer generated code ``inline`` for the compute function being built: the sync
        interpreter calls it per planned call and emits its statements instead of the
        call where it returns an ``Inline``."""
        self.inline = inline

    # -- attributes ---------------------------------------------------------------------
    def attr(self, name: str, default: Any = REQUIRED) -> Any:
        """The attribute's value, or ``default``; a missing required one is a load error."""
        if name in self.attrs:
            return self.attrs[name]
        if default is REQUIRED:
            raise self.unsupported(f"required attribute {name!r} is missing")
        return default

    # -- inputs and outputs -------------------------------------------------------------
    def has_input(self, i: int) -> bool:
        return i < self.n_inputs and self.node.inputs[i] is not None

    def has_output(self, i: int) -> bool:
        return i < self.n_outputs and self.node.outputs[i] is not None

    def input_type(self, i: int) -> TensorType | None:
        """The static type of input ``i`` when known (dtype and/or shape), else None."""
        if not self.has_input(i):
            return None
        if self._input_types is not None and i < len(self._input_types):
            t = self._input_types[i]
            if t is not None:
                return t  # type: ignore[no-any-return,unused-ignore]
        v = self.node.inputs[i]
        t = v.type if v is not None else None
        return t if isinstance(t, TensorType) else None

    def input_dtype(self, i: int) -> np.dtype | None:
        t = self.input_type(i)
        return None if t is None else t.dtype

    def const_input(self, i: int) -> np.ndarray | None:
        """Input ``i``'s value when it is a load-time constant (initializer), else None."""
        if not self.has_input(i):
            return None
        v = self.node.inputs[i]
        return None if v is None else v.const

    def elem_dtype(self, elem_type: Any, what: str = "element type") -> np.dtype:
        """The NumPy dtype of ONNX element type ``elem_type`` (a ``TensorProto.DataType``
        code, or its name as Cast-1 gives it), read from an attribute such as Cast's ``to``
        (``what`` names it in the error). A load-time error naming the node when NumPy has
        no such dtype. The one way kernels map element types (``tfrt_py.ir.dtypes``)."""
        try:
            return numpy_dtype(elem_type)
        except ValueError as e:
            raise self.unsupported(f"{what}={elem_type!r} has no NumPy dtype") from e

    # -- nested graphs ------------------------------------------------------------------
    def subgraph(self, attr_name: str) -> SubgraphFn:
        """The compiled nested graph held by attribute ``attr_name``."""
        graph = self.attr(attr_name)
        if not isinstance(graph, Graph):
            raise self.unsupported(f"attribute {attr_name!r} is not a graph")
        if self._subgraph_compiler is None:
            raise self.unsupported("this executor cannot run nested graphs")
        return self._subgraph_compiler(self.node, graph)

    # -- errors -------------------------------------------------------------------------
    def unsupported(self, detail: str) -> UnsupportedOpError:
        """An error to *raise* for a node this kernel cannot run."""
        return UnsupportedOpError(self.op_type, self.domain, self.opset, self.node_name, detail)


KernelBuilder = Callable[[KernelContext], ComputeFn]
