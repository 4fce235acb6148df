"""Run a quantized CNN's integer ops channels-last (NHWC), as onnxruntime's NHWC
transformer does for its QLinearConv: the integer conv reads a pixel's channels as one
contiguous run (a 1x1 conv is then a plain product over the input as it is, a depthwise
conv vectorizes over the channels) and stores its rows without a transpose.

Each 2-D ``QLinearConv`` with constant weights, scales and zero points becomes
``com.microsoft::QLinearConv(channels_last=1)`` between ``Transpose`` nodes (to NHWC before,
back to NCHW after, the back one writing the original output Value so readers are
unchanged). ``com.microsoft`` QLinearAdd/QLinearMul whose two tensor inputs both come from
such a back-transpose, and QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu and
an 8-bit 2-D MaxPool (without Indices) whose input does, read the NHWC values instead (the
pooling with ``channels_last=1``, the MaxPool as ``com.microsoft::NhwcMaxPool``) and get a
back-transpose of their own. A back-transpose that nothing reads any more is removed, so
a chain of integer ops pays one transpose in and one out. Runs only where the integer
conv kernel can (``kernels.lib.qgemm_packed``: numba, an x86 CPU with AVX2); elsewhere the
NCHW float path stays.
Top-level graph only; names of new Values derive from the old ones.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir import Graph, Node, Value
from ..ir.types import TensorType
from .context import PassContext
from .rewrite import Uses

__all__ = ["channels_last"]

MS = "com.microsoft"
TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]
_UNARY = ("QLinearSigmoid", "QLinearLeakyRelu")
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _integer_kernel_possible() -> bool:
    """Whether this host can run the integer conv kernel, decided without building it (a
    cold load must not import numba or LLVM on the caller's thread): numba and TBB (its
    thread layer) installed and on, the packed kernels not switched off, an x86 CPU with
    AVX2. Where the kernel then does not build, the channels-last convs transpose around
    the NCHW path: the same values."""
    import importlib.util

    from ..concurrency import native_threads
    from ..concurrency.env_switch import switched_off
    from ..kernels.lib.features import cpu_flags
    from ..kernels.lib.gemm_packed import ENV_PACKED_GEMM
    from ..kernels.lib.jit import ENV_JIT

    if any(switched_off(e) for e in (ENV_JIT, ENV_PACKED_GEMM, native_threads.ENV_NATIVE_THREADS)):
        return False
    if not cpu_flags().get("AVX2") or importlib.util.find_spec("numba") is None:
        return False
    # the conv loops are numba's parallel ones: without its thread layer they are off
    return native_threads.layer_expected()


def _permuted(v: Value, perm: list[int], name: str) -> Value:
    t = v.type
    if isinstance(t, TensorType) and t.shape is not None and len(t.shape) == 4:
        return Value(name, TensorType(t.dtype, tuple(t.shape[i] for i in perm)))
    return Value(name, TensorType(t.dtype if isinstance(t, TensorType) else None, None))


def _conv_eligible(node: Node) -> bool:
    """A 2-D QLinearConv whose every operand but x is a constant (the integer kernel's)."""
    if node.op_type != "QLinearConv" or node.domain != "" or len(node.inputs) < 8:
        return False
    w = node.inputs[3]
    if w is None or w.const is None or w.const.ndim != 4:
        return False
    if str(node.attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        return False
    group = int(node.attrs.get("group", 1))
    if group != 1 and not (w.const.shape[1] == 1 and group == w.const.shape[0]):
        return False
    return all(v is None or v.const is not None for v in node.inputs[1:])


def _tensor_inputs(node: Node) -> tuple[int, ...] | None:
    """The inputs a channels-last form of ``node`` reads as NHWC, None if it has none."""
    if node.domain == "" and node.op_type == "MaxPool":
        x = node.inputs[0]
        t = x.type if x is not None else None
        one_out = len(node.outputs) == 1 or all(v is None for v in node.outputs[1:])
        ks = node.attrs.get("kernel_shape")
        if one_out and isinstance(t, TensorType) and t.dtype in _EIGHT_BIT and ks and len(ks) == 2:
            return (0,)
        return None
    if node.domain != MS:
        return None
    if node.op_type in ("QLinearAdd", "QLinearMul") and len(node.inputs) >= 6:
        return (0, 3)
    if node.op_type in (*_UNARY, "QLinearGlobalAveragePool"):
        if node.op_type == "QLinearGlobalAveragePool" and int(node.attrs.get("channels_last", 0)):
            return None
        return (0,)
    return None


def channels_last(graph: Graph, ctx: PassContext) -> str:
    """The pass. Returns its one-line report."""
    if not any(_conv_eligible(n) for n in graph.nodes):
        return "nothing to do"
    if not _integer_kernel_possible():
        return "off: no integer conv kernel on this host (the NCHW float path stays)"
    nhwc_of: dict[int, Value] = {}  # NCHW value -> the NHWC value it was transposed from
    made_in: dict[int, Value] = {}  # NCHW value -> its NHWC transpose made here
    backs: set[int] = set()
    out: list[Node] = []
    done: Counter[str] = Counter()
    transposes_in = 0

    def nhwc(v: Value) -> Value:
        nonlocal transposes_in
        src = nhwc_of.get(id(v)) or made_in.get(id(v))
        if src is None:
            src = _permuted(v, TO_NHWC, f"{v.name}/nhwc")
            out.append(Node("Transpose", [v], [src], {"perm": TO_NHWC},
                            name=f"{v.name}/to_nhwc", opset=13))  # fmt: skip
            made_in[id(v)] = src
            transposes_in += 1
        return src

    for node in graph.nodes:
        conv = _conv_eligible(node)
        idx = (0,) if conv else _tensor_inputs(node)
        y = node.outputs[0] if node.outputs else None
        if idx is None or y is None:
            out.append(node)
            continue
        if not conv and not all(
            node.inputs[i] is not None and id(node.inputs[i]) in nhwc_of for i in idx
        ):
            out.append(node)  # its inputs are not channels-last already: no gain
            continue
        ins = list(node.inputs)
        for i in idx:
            v = ins[i]
            assert v is not None
            ins[i] = nhwc(v)
        attrs = dict(node.attrs)
        op = node.op_type
        if conv or op == "QLinearGlobalAveragePool":
            attrs["channels_last"] = 1
        elif op == "MaxPool":  # onnxruntime's contrib op for 8-bit NHWC max pooling
            op = "NhwcMaxPool"
            attrs.pop("storage_order", None)
            ins = ins[:1]
        y_nhwc = _permuted(y, TO_NHWC, f"{y.name}/nhwc")
        # the node keeps its name: errors and profiles name the user's node
        out.append(Node(op, ins, [y_nhwc], attrs, name=node.name, domain=MS, opset=1))
        back = Node("Transpose", [y_nhwc], [y], {"perm": TO_NCHW}, name=f"{y.name}/to_nchw",
                    opset=13)  # fmt: skip
        out.append(back)
        backs.add(id(back))
        nhwc_of[id(y)] = y_nhwc
        done[node.op_type] += 1
    graph.nodes = out
    uses = Uses(graph)
    graph.nodes = [
        n for n in out
        if not (id(n) in backs and uses.count(n.outputs[0]) == 0)  # type: ignore[arg-type]
    ]  # fmt: skip
    kept = sum(1 for n in graph.nodes if id(n) in backs)
    graph.opsets.setdefault(MS, 1)
    ops = ", ".join(f"{k} x{v}" for k, v in done.most_common())
    total = sum(done.values())
    return f"{total} integer ops channels-last ({ops}); transposes: {transposes_in} in, {kept} out"
