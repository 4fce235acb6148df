"""Turn the QDQ groups of a quantized model into integer ops at load, as onnxruntime's QDQ
transformer does (``onnxruntime/core/optimizer/qdq_transformer``).

``quantize_static(quant_format=QDQ)`` wraps every float op as ``DequantizeLinear -> op ->
QuantizeLinear``. A *group* is such an op with a DequantizeLinear (DQ) on each input it
computes with and one QuantizeLinear (Q) as the only reader of its output (not a graph
output). The pass replaces the op and its Q with one integer op reading the DQs' quantized
inputs and writing the Q's output Value (names and types unchanged):

* ``Conv`` -> ``QLinearConv``: the weight a constant, per tensor or per output channel
  (DQ axis 0); the bias, if any, a DQ of a constant int32 with zero point 0 and scale
  ``x_scale * w_scale`` (float32, within 1e-6 relative; the integer op adds it unscaled);
* ``MatMul`` -> ``QLinearMatMul``: b per tensor, or per column when 2-D (DQ axis 1);
* ``Gemm`` -> ``com.microsoft::QGemm``: ``transA=0``; b per tensor or per output column;
  C a DQ of int32 (zero point 0, scale ``alpha * a_scale * b_scale``) with ``beta=1``;
  with no Q after it, QGemm's float output;
* ``Add``/``Mul`` -> ``QLinearAdd``/``QLinearMul``, ``GlobalAveragePool`` ->
  ``QLinearGlobalAveragePool``, ``Concat`` -> ``QLinearConcat``, ``Sigmoid`` ->
  ``QLinearSigmoid``, ``LeakyRelu`` -> ``QLinearLeakyRelu``, and a ``Relu`` the quantizer
  kept (``QDQKeepRemovableActivations``) -> ``QLinearLeakyRelu(alpha=0)`` (com.microsoft;
  the unary ones are a 256-entry table of exactly the float path's arithmetic);
* ``MaxPool``, ``Reshape``, ``Flatten``, ``Transpose``, ``Squeeze``, ``Unsqueeze`` and
  nearest ``Resize`` between a DQ and a Q of the same type, scale and zero point run on the
  quantized tensor itself (the DQ/Q pair dropped): exact, they only select or move elements.

A ``Relu`` or ``Clip`` between the op and its Q joins the group when the Q makes it
redundant (``Q(clip(x)) == Q(x)`` for every x: the Q maps the bounds to its type's limits,
e.g. a Relu before a zero point at the type's minimum), as onnxruntime's selectors do;
otherwise the group stays float (the integer ops have no clamp of their own).

Every scale and zero point must be a constant, activations per tensor, the quantized types
uint8/int8 (16- and 4-bit groups stay float: there are no such integer kernels here), the
op's input and output types equal. A DQ whose output is read elsewhere stays for those
readers; a DQ left unread is removed. Anything else stays float and the report says why.
Runs before ``fold``, which would turn the weights' DQs into float constants. Only the
top-level graph; model text never reaches code (the rewrite is graph data).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import field

import numpy as np

from ..ir import Graph, Node, Value
from ..records import record
from .context import PassContext
from .rewrite import Uses, op_names, tensor_dtype

__all__ = ["fuse_qdq"]

MS = "com.microsoft"
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
_F32 = np.float32
#: ONNX element type codes of a Q's ``output_dtype`` this pass accepts.
_ELEM = {2: np.dtype(np.uint8), 3: np.dtype(np.int8)}


class _Refused(Exception):
    """The group stays float; the message is the reason the report gives."""


@record(frozen=True)
class _QParams:
    """One DQ's or Q's quantization: the quantized tensor (a DQ's input, a Q's output), the
    scale and zero point Values, their constant data (zero point: zeros when absent)."""

    node: Node
    data: Value
    scale: Value
    zero_point: Value | None
    dtype: np.dtype
    s: np.ndarray
    z: np.ndarray
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.s.size == 1


def _is(node: Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", MS)


def _params(node: Node, eight_bit: bool = True) -> _QParams:
    """The quantization of DQ/Q ``node``; _Refused unless its scale and zero point are
    constants (and, with ``eight_bit``, its type uint8/int8)."""
    dq = node.op_type == "DequantizeLinear"
    ins = node.inputs
    scale = ins[1] if len(ins) > 1 else None
    zp = ins[2] if len(ins) > 2 else None
    if scale is None or scale.const is None:
        raise _Refused("scale not constant")
    if zp is not None and zp.const is None:
        raise _Refused("zero point not constant")
    if int(node.attrs.get("block_size", 0)):
        raise _Refused("blocked quantization")
    s = np.asarray(scale.const)
    if s.dtype != _F32:
        raise _Refused(f"{s.dtype} scale")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise _Refused("scale not positive")
    out_code = int(node.attrs.get("output_dtype", 0))
    if dq and out_code not in (0, 1):
        raise _Refused("DequantizeLinear output not float32")
    if not dq and int(node.attrs.get("precision", 0) or 0) not in (0, 1):
        raise _Refused("QuantizeLinear precision not float32")
    data = ins[0] if dq else node.outputs[0]
    dt = zp.const.dtype if zp is not None and zp.const is not None else None
    if dt is None:
        dt = tensor_dtype(data) if dq else _ELEM.get(out_code, np.dtype(np.uint8))
    if data is None or dt is None:
        raise _Refused("quantized type unknown")
    if eight_bit and np.dtype(dt) not in _EIGHT_BIT:
        raise _Refused(f"{np.dtype(dt).name} not 8-bit")
    z = np.zeros(s.shape, dt) if zp is None else np.asarray(zp.const)
    if z.size != s.size:
        raise _Refused("zero point and scale of different sizes")
    return _QParams(node, data, scale, zp, np.dtype(dt), s, z, int(node.attrs.get("axis", 1)))


def _quantize(v: float, q: _QParams) -> int:
    """QuantizeLinear of one value with ``q`` (per tensor), its kernel's float32 steps."""
    r = float(np.rint(np.divide(_F32(v), _F32(q.s.reshape(-1)[0]), dtype=_F32)))
    info = np.iinfo(q.dtype)
    return int(min(max(r + float(q.z.reshape(-1)[0]), info.min), info.max))


def _bounds(act: Node) -> tuple[float, float]:
    """A Relu's or Clip's (min, max), infinite where absent; _Refused for computed ones."""
    if act.op_type == "Relu":
        return 0.0, np.inf
    if act.opset < 11:
        return float(act.attrs.get("min", -np.inf)), float(act.attrs.get("max", np.inf))
    out = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        v = act.inputs[i] if len(act.inputs) > i else None
        if v is not None and (v.const is None or v.const.size != 1):
            raise _Refused("Clip bounds not constant")
        out.append(default if v is None else float(np.asarray(v.const).reshape(())))
    return out[0], out[1]


def _redundant(act: Node, q: _QParams) -> bool:
    """Whether ``Q(act(x)) == Q(x)`` for every x: Q maps the bounds to its type's limits
    (Q is monotone, so everything past a bound then maps to the same limit)."""
    lo, hi = _bounds(act)
    info = np.iinfo(q.dtype)
    return (lo == -np.inf or _quantize(lo, q) == info.min) and (
        hi == np.inf or _quantize(hi, q) == info.max
    )


@record
class _Edits:
    """The rewrite under way: who reads what (before it), the nodes replaced (None:
    removed), the zero points made for DQs/Qs without one, the new constants."""

    graph: Graph
    uses: Uses
    gone: dict[int, Node | None] = field(default_factory=dict)
    zeros: dict[int, Value] = field(default_factory=dict)
    consts: list[Value] = field(default_factory=list)

    def dq(self, node: Node, i: int, eight_bit: bool = True) -> _QParams:
        v = node.inputs[i] if len(node.inputs) > i else None
        if v is None or not _is(v.producer, "DequantizeLinear"):
            raise _Refused(f"input {i} not dequantized")
        return _params(v.producer, eight_bit)  # type: ignore[arg-type]

    def q_after(self, node: Node, act: bool = True, optional: bool = False) -> tuple[
        _QParams | None, list[Node]
    ]:  # fmt: skip
        """The Q reading ``node``'s output alone (through a Relu/Clip it makes redundant,
        with ``act``) and the nodes the group takes with it; (None, []) with ``optional``
        when no Q reads the output."""
        if not node.outputs or node.outputs[0] is None:
            raise _Refused("no output")
        if any(o is not None and self.uses.count(o) for o in node.outputs[1:]):
            raise _Refused("second output used")
        out = node.outputs[0]
        readers = self.uses.readers.get(id(out), [])
        if optional and not any(_is(r, "QuantizeLinear") for r in readers):
            return None, []  # its float output, graph output or not
        if self.uses.is_output(out):
            raise _Refused("output is a graph output")
        taken: list[Node] = []
        r = self.uses.only_reader(out)
        if act and r is not None and r.op_type in ("Relu", "Clip") and r.domain == "":
            if r.inputs[0] is not out or len(r.outputs) != 1 or r.outputs[0] is None:
                raise _Refused(f"{r.op_type} after it")
            taken.append(r)
            out = r.outputs[0]
            r = None if self.uses.is_output(out) else self.uses.only_reader(out)
        if r is None:
            raise _Refused("output read by other nodes")
        if not _is(r, "QuantizeLinear") or r.inputs[0] is not out:
            raise _Refused("output not quantized")
        q = _params(r)
        if not q.per_tensor:
            raise _Refused("per-channel output")
        if taken and not _redundant(taken[0], q):
            raise _Refused(f"{taken[0].op_type} not made redundant by Q")
        return q, [*taken, r]

    def zp(self, p: _QParams) -> Value:
        """``p``'s zero point Value, or a constant 0 of its type made once per DQ/Q."""
        if p.zero_point is not None:
            return p.zero_point
        made = self.zeros.get(id(p.node))
        if made is None:
            made = Value(f"{p.data.name}/zero_point", const=np.zeros((), p.dtype))
            self.zeros[id(p.node)] = made
            self.consts.append(made)
        return made

    def commit(self, node: Node, new: Node, taken: list[Node]) -> None:
        self.gone[id(node)] = new
        for t in taken:
            self.gone[id(t)] = None


def _same_types(*ps: _QParams | None) -> None:
    if len({p.dtype for p in ps if p is not None}) > 1:
        raise _Refused("types differ")


def _per_tensor(*ps: _QParams) -> None:
    if not all(p.per_tensor for p in ps):
        raise _Refused("per-channel activation")


def _weight(w: _QParams, axis: int, what: str) -> np.ndarray:
    """A constant weight quantized per tensor or along ``axis``; its data."""
    if w.data.const is None:
        raise _Refused(f"{what} not constant")
    c = np.asarray(w.data.const)
    if not w.per_tensor and (c.ndim < 1 or w.axis % c.ndim != axis or w.s.ndim != 1):
        raise _Refused(f"{what} quantized along axis {w.axis}")
    return c


def _bias(c: _QParams, expected: np.ndarray, n: int) -> None:
    """A bias the integer op may add unscaled: a constant int32 of zero point 0 and scale
    ``expected`` (one value or ``n``, float32, within 1e-6 relative)."""
    if c.dtype != np.int32 or c.data.const is None:
        raise _Refused("bias not a constant int32")
    if np.any(c.z != 0):
        raise _Refused("bias zero point not 0")
    got = np.broadcast_to(c.s.reshape(-1), (n,)) if c.s.size in (1, n) else None
    want = np.broadcast_to(np.asarray(expected, _F32).reshape(-1), (n,))
    if got is None or not np.allclose(got, want, rtol=1e-6, atol=0.0):
        raise _Refused("bias scale is not the product of the input scales")


def _name(node: Node, suffix: str) -> str:
    return f"{node.name or node.op_type}/{suffix}"


def _conv(node: Node, ed: _Edits) -> str:
    x, w = ed.dq(node, 0), ed.dq(node, 1)
    b = ed.dq(node, 2, eight_bit=False) if len(node.inputs) > 2 and node.inputs[2] else None
    q, taken = ed.q_after(node)
    assert q is not None
    _same_types(x, q)
    _per_tensor(x)
    wc = _weight(w, 0, "weight")
    if b is not None:
        _bias(b, _F32(x.s.reshape(-1)[0]) * w.s.astype(_F32), wc.shape[0])
    ins: list[Value | None] = [x.data, x.scale, ed.zp(x), w.data, w.scale, ed.zp(w), q.scale,
                               ed.zp(q)]  # fmt: skip
    new = Node("QLinearConv", ins + ([b.data] if b else []), [q.data], dict(node.attrs),
               name=_name(node, "qlinear"), opset=max(node.opset, 10))  # fmt: skip
    ed.commit(node, new, taken)
    return "QLinearConv"


def _matmul(node: Node, ed: _Edits) -> str:
    a, b = ed.dq(node, 0), ed.dq(node, 1)
    q, taken = ed.q_after(node)
    assert q is not None
    _same_types(a, q)
    _per_tensor(a)
    if not b.per_tensor:
        c = b.data.const
        if c is None or c.ndim != 2 or b.axis % 2 != 1:
            raise _Refused("b quantized per row or of rank > 2")
    ins: list[Value | None] = [a.data, a.scale, ed.zp(a), b.data, b.scale, ed.zp(b), q.scale,
                               ed.zp(q)]  # fmt: skip
    ed.commit(node, Node("QLinearMatMul", ins, [q.data], {}, name=_name(node, "qlinear"),
                         opset=max(node.opset, 10)), taken)  # fmt: skip
    return "QLinearMatMul"


def _gemm(node: Node, ed: _Edits) -> str:
    if int(node.attrs.get("transA", 0)):
        raise _Refused("transA=1")
    trans_b = int(node.attrs.get("transB", 0))
    alpha = float(node.attrs.get("alpha", 1.0))
    a, b = ed.dq(node, 0), ed.dq(node, 1)
    c = ed.dq(node, 2, eight_bit=False) if len(node.inputs) > 2 and node.inputs[2] else None
    if c is not None and float(node.attrs.get("beta", 1.0)) != 1.0:
        raise _Refused("beta != 1")
    q, taken = ed.q_after(node, optional=True)
    _same_types(a, q)
    _per_tensor(a)
    if not b.per_tensor and (b.data.const is None or b.data.const.ndim != 2):
        raise _Refused("b not a constant matrix")
    bc = b.data.const
    n = None if bc is None else bc.shape[0 if trans_b else 1]
    if not b.per_tensor:
        _weight(b, 0 if trans_b else 1, "b")
    if c is not None:
        if n is None:
            raise _Refused("C with b not constant")
        _bias(c, _F32(alpha) * _F32(a.s.reshape(-1)[0]) * b.s.astype(_F32), n)
    ins: list[Value | None] = [a.data, a.scale, ed.zp(a), b.data, b.scale, ed.zp(b),
                               c.data if c else None]  # fmt: skip
    if q is not None:
        ins += [q.scale, ed.zp(q)]
    while ins[-1] is None:
        ins.pop()
    attrs = {"alpha": alpha, "transA": 0, "transB": trans_b}
    out = q.data if q is not None else node.outputs[0]
    ed.commit(node, Node("QGemm", ins, [out], attrs, name=_name(node, "qgemm"), domain=MS,
                         opset=1), taken)  # fmt: skip
    return "QGemm" if q is not None else "QGemm (float output)"


def _per_tensor_group(
    node: Node, ed: _Edits, n_in: int
) -> tuple[list[_QParams], _QParams, list[Node]]:
    """The DQs of ``node``'s first ``n_in`` inputs and its Q, all per tensor, one type."""
    ins = [ed.dq(node, i) for i in range(n_in)]
    q, taken = ed.q_after(node, act=node.op_type not in ("Relu", "Clip"))
    assert q is not None
    _same_types(*ins, q)
    _per_tensor(*ins)
    return ins, q, taken


def _contrib(op: str) -> Callable[[Node, _Edits], str]:
    """Add/Mul, GlobalAveragePool, Sigmoid, LeakyRelu, Relu -> their com.microsoft op."""

    def build(node: Node, ed: _Edits) -> str:
        n_in = 2 if op in ("QLinearAdd", "QLinearMul") else 1
        if len([v for v in node.inputs if v is not None]) != n_in:
            raise _Refused(f"{len(node.inputs)} inputs")
        ins, q, taken = _per_tensor_group(node, ed, n_in)
        vals = [v for p in ins for v in (p.data, p.scale, ed.zp(p))] + [q.scale, ed.zp(q)]
        attrs: dict[str, object] = {}
        if op == "QLinearGlobalAveragePool":
            attrs["channels_last"] = 0
        elif op == "QLinearLeakyRelu":
            attrs["alpha"] = float(node.attrs.get("alpha", 0.01)) if node.op_type != "Relu" else 0.0
        new = Node(op, list(vals), [q.data], attrs, name=_name(node, "qlinear"), domain=MS, opset=1)
        ed.commit(node, new, taken)
        return op

    return build


def _concat(node: Node, ed: _Edits) -> str:
    if any(v is None for v in node.inputs) or not node.inputs:
        raise _Refused("missing input")
    ins, q, taken = _per_tensor_group(node, ed, len(node.inputs))
    vals = [q.scale, ed.zp(q)] + [v for p in ins for v in (p.data, p.scale, ed.zp(p))]
    new = Node("QLinearConcat", list(vals), [q.data], {"axis": int(node.attrs.get("axis", 0))},
               name=_name(node, "qlinear"), domain=MS, opset=1)  # fmt: skip
    ed.commit(node, new, taken)
    return "QLinearConcat"


def _drop(node: Node, ed: _Edits) -> str:
    """An op that only selects or moves elements, run on the quantized tensor."""
    if node.op_type == "Resize":
        mode = node.attrs.get("mode", "nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        ct = node.attrs.get("coordinate_transformation_mode", "")
        if mode != "nearest":
            raise _Refused(f"mode {mode}")
        if ct in ("tf_crop_and_resize", b"tf_crop_and_resize"):
            raise _Refused("tf_crop_and_resize")
    x = ed.dq(node, 0)
    q, taken = ed.q_after(node, act=False)
    assert q is not None
    _same_types(x, q)
    _per_tensor(x)
    if not np.array_equal(x.s.reshape(-1), q.s.reshape(-1)):
        raise _Refused("scales differ")
    if not np.array_equal(x.z.reshape(-1), q.z.reshape(-1)):
        raise _Refused("zero points differ")
    outs: list[Value | None] = [q.data] + [None] * (len(node.outputs) - 1)
    new = Node(node.op_type, [x.data, *node.inputs[1:]], outs, dict(node.attrs),
               name=_name(node, "int"), domain=node.domain, opset=node.opset)  # fmt: skip
    ed.commit(node, new, taken)
    return f"int {node.op_type}"


_RULES: dict[str, Callable[[Node, _Edits], str]] = {
    "Conv": _conv,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Add": _contrib("QLinearAdd"),
    "Mul": _contrib("QLinearMul"),
    "GlobalAveragePool": _contrib("QLinearGlobalAveragePool"),
    "Sigmoid": _contrib("QLinearSigmoid"),
    "LeakyRelu": _contrib("QLinearLeakyRelu"),
    "Relu": _contrib("QLinearLeakyRelu"),
    "Concat": _concat,
    **dict.fromkeys(op_names("MaxPool Reshape Flatten Transpose Squeeze Unsqueeze Resize"), _drop),
}


def _counted(c: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def fuse_qdq(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    if not any(_is(n, "QuantizeLinear") for n in graph.nodes):
        return "nothing to fuse"
    ed = _Edits(graph, Uses(graph))
    done: Counter[str] = Counter()
    left: Counter[str] = Counter()
    for node in graph.nodes:
        if id(node) in ed.gone or _is(node, "QuantizeLinear") or _is(node, "DequantizeLinear"):
            continue
        if not any(v is not None and _is(v.producer, "DequantizeLinear") for v in node.inputs):
            continue
        rule = _RULES.get(node.op_type) if node.domain == "" else None
        try:
            if rule is None:
                raise _Refused("no integer op")
            done[rule(node, ed)] += 1
        except _Refused as why:
            left[f"{node.op_type}: {why}"] += 1
    if done:
        nodes = [r for r in (ed.gone.get(id(n), n) for n in graph.nodes) if r is not None]
        graph.nodes = nodes
        graph.constants += ed.consts
        if any(n.domain == MS for n in nodes):
            graph.opsets.setdefault(MS, 1)
        _drop_unread_dqs(graph)
    n = sum(done.values())
    said = f"{n} group{'s' * (n != 1)} to integer ops"
    said += f" ({_counted(done)})" if done else ""
    said += f"; {sum(left.values())} left float ({_counted(left)})" if left else "; none left float"
    return said


def _drop_unread_dqs(graph: Graph) -> None:
    """Remove the DequantizeLinear nodes the rewritten groups no longer read."""
    uses = Uses(graph)
    graph.nodes = [
        n for n in graph.nodes
        if not (_is(n, "DequantizeLinear") and n.outputs[0] is not None
                and not uses.count(n.outputs[0]))
    ]  # fmt: skip
