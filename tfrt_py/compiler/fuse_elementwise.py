"""Fuse chains of elementwise ops into one ``tfrt_py.fused::ElementwiseChain`` node.

A chain is a run of float elementwise ops where each op reads the previous op's output
(the accumulator) exactly once, that output is read by nothing else and is not a graph
output, every accumulator has the chain output's shape and dtype, and the other operands
broadcast to it without growing it. The fused kernel runs each op's own kernel into one
output buffer (the planner may even reuse the chain's head input), so a chain of n ops
needs one buffer instead of n and one kernel call instead of n.
"""

from __future__ import annotations

from ..ir import Graph, Node, TensorType, Value
from ..kernels.fused.domain import DOMAIN, Step
from .context import PassContext, flags_lookup
from .fuse_linear import ACTIVATIONS
from .rewrite import Uses, op_names

__all__ = ["fuse_elementwise_chains"]

_UNARY = ACTIVATIONS | frozenset(
    op_names(
        """
        Exp Log Neg Abs Sqrt Reciprocal Floor Ceil Erf Softsign Sin Cos
        """
    )
)
_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
#: Binary ops whose operands may be swapped (exactly, in IEEE arithmetic) so that the
#: accumulator is operand 0.
_COMMUTATIVE = frozenset({"Add", "Mul"})


def fuse_elementwise_chains(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    uses = Uses(graph)
    flags_of = flags_lookup(ctx)

    def eligible(node: Node) -> bool:
        f = flags_of(node)  # each step runs in place: its kernel must allow out=input 0
        return f is not None and f.inplace and f.supports_out and _eligible(node)

    taken: set[int] = set()
    fused: dict[int, Node | None] = {}
    lengths: list[int] = []
    for node in graph.nodes:
        if id(node) in taken or not eligible(node):
            continue
        chain = [node]
        cur = node
        while True:
            out = cur.outputs[0]
            assert out is not None
            nxt = uses.only_reader(out)
            if nxt is None or id(nxt) in taken or not eligible(nxt):
                break
            if not _same_type(nxt.outputs[0], out):
                break
            if nxt.inputs[0] is not out and nxt.op_type not in _COMMUTATIVE:
                break  # the accumulator must be operand 0 (the kernels' in-place promise)
            chain.append(nxt)
            cur = nxt
        if len(chain) < 2:
            continue
        made = _fuse(chain)
        if made is None:
            continue
        for c in chain:
            taken.add(id(c))
            fused[id(c)] = None
        # At the last op's place: every operand of every step is defined by then.
        fused[id(chain[-1])] = made
        lengths.append(len(chain))
    if not lengths:
        return "no chains"
    graph.nodes = [r for r in (fused.get(id(n), n) for n in graph.nodes) if r is not None]
    graph.opsets.setdefault(DOMAIN, 1)
    return f"{len(lengths)} chains ({sum(lengths)} ops, longest {max(lengths)})"


def _ttype(v: Value | None) -> TensorType | None:
    t = None if v is None else v.type
    return t if isinstance(t, TensorType) and t.shape is not None else None


def _same_type(a: Value | None, b: Value | None) -> bool:
    ta, tb = _ttype(a), _ttype(b)
    return ta is not None and tb is not None and ta == tb


def _eligible(node: Node) -> bool:
    """A float elementwise op with one output of known shape, operands that do not grow
    it, and any extra (non-tensor-data) operands constant."""
    if node.domain != "" or len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    t = _ttype(node.outputs[0])
    if t is None or t.dtype is None or t.dtype.kind != "f" or t.shape is None:
        return False
    if node.op_type in _BINARY:
        if len(node.inputs) != 2 or any(v is None for v in node.inputs):
            return False
        return all(_fits(v, t) for v in node.inputs)
    if node.op_type in _UNARY:
        x = node.inputs[0] if node.inputs else None
        if x is None or not _same_type(x, node.outputs[0]):
            return False
        return all(v is None or v.const is not None for v in node.inputs[1:])
    return False


def _fits(v: Value | None, out: TensorType) -> bool:
    """``v`` broadcasts to ``out`` without growing it, with ``out``'s dtype."""
    t = _ttype(v)
    if t is None or t.dtype != out.dtype or t.shape is None or out.shape is None:
        return False
    if len(t.shape) > len(out.shape):
        return False
    tail = out.shape[len(out.shape) - len(t.shape) :]
    return all(a == 1 or (a == b and a is not None) for a, b in zip(t.shape, tail))


def _fuse(chain: list[Node]) -> Node | None:
    first = chain[0]
    out_t = _ttype(chain[-1].outputs[0])
    # The head is operand 0, or for Add/Mul operand 1 when only that one already has the
    # output's type (so the planner may run the chain in the head's buffer).
    head = first.inputs[0]
    if (
        first.op_type in _COMMUTATIVE
        and _ttype(head) != out_t
        and first.inputs[1] is not None
        and _ttype(first.inputs[1]) == out_t
    ):
        head = first.inputs[1]
    assert head is not None
    inputs: list[Value | None] = [head]
    index: dict[int, int] = {id(head): 0}
    steps: list[Step] = []
    acc: Value | None = None
    for node in chain:
        refs: list[int] = []
        for v in node.inputs:
            if acc is not None and v is acc:
                refs.append(-1)
                continue
            if v is None:
                inputs.append(None)
                refs.append(len(inputs) - 1)
                continue
            if id(v) not in index:
                index[id(v)] = len(inputs)
                inputs.append(v)
            refs.append(index[id(v)])
        if acc is None:  # the first op: its head operand starts the accumulator
            refs = [-1 if (r == 0) else r for r in refs]
        if len(refs) == 2 and refs[1] == -1 and refs[0] != -1:
            refs = [refs[1], refs[0]]  # Add/Mul only (checked when the chain grew)
        steps.append((node.op_type, node.opset, dict(node.attrs), tuple(refs)))
        acc = node.outputs[0]
    head_reads = sum(r == 0 for s in steps for r in s[3])
    first_refs = steps[0][3]
    if first_refs.count(-1) != 1:
        return None  # e.g. x * x as the first op: keep it simple
    op = "ElementwiseChain" if head_reads == 0 else "ElementwiseChainShared"
    return Node(
        op,
        inputs,
        [chain[-1].outputs[0]],
        {"steps": steps},
        name=f"{first.name}/chain",
        domain=DOMAIN,
        opset=1,
    )
