"""Runs of identical Linear layers, lowered as one loop over stacked weights.

A model like M1 (64 x MatMul 16x16 + Relu) would otherwise become 64 copies of the same
loop nest: numba's compile time grows much faster than linearly with function size, and
the straight-line machine code thrashes the instruction cache. A run is a chain of
``tfrt_py.fused::Linear`` nodes, each reading the previous one's output (read by nothing
else, not a graph output), with the same shapes (square weights), the same activation and
no extra operands. Its first and last layers lower as usual; the middle ones run in a loop
whose weights sit at a fixed stride in the packed constants and whose activations
ping-pong between two arena buffers. The arithmetic is exactly the per-layer code's.

Load time only; pure functions of the graph and the lowering context.
"""

from __future__ import annotations

from typing import Any

from ...ir import Graph, Node
from ...kernels.fused.domain import DOMAIN
from .loops import Ref
from .ops import linear_lines
from .source import literal

__all__ = ["MIN_RUN", "find_runs", "lower_run_middle"]

#: Shorter chains are simply unrolled.
MIN_RUN = 4


def _signature(node: Node, cx: Any) -> Any:
    if node.domain != DOMAIN or node.op_type != "Linear" or len(node.inputs) > 3:
        return None
    x, w, out = node.inputs[0], node.inputs[1], node.outputs[0]
    if x is None or w is None or w.const is None or out is None or w.const.ndim != 2:
        return None
    if w.const.shape[0] != w.const.shape[1] or id(out) not in cx.shapes:
        return None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if b is not None and b.const is None:
        return None
    return (w.const.shape, w.const.dtype, None if b is None or b.const is None else b.const.shape,
            repr(node.attrs.get("activation")), cx.shapes[id(out)])  # fmt: skip


def find_runs(graph: Graph, cx: Any) -> dict[int, int]:
    """Start index -> length of each run of at least ``MIN_RUN`` layers."""
    readers: dict[int, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                readers[id(v)] = readers.get(id(v), 0) + 1
    outputs = {id(v) for v in graph.outputs}
    runs: dict[int, int] = {}
    nodes = graph.nodes
    i = 0
    while i < len(nodes):
        sig = _signature(nodes[i], cx)
        j = i + 1
        while sig is not None and j < len(nodes):
            prev = nodes[j - 1].outputs[0]
            assert prev is not None
            if (
                _signature(nodes[j], cx) != sig
                or nodes[j].inputs[0] is not prev
                or readers.get(id(prev), 0) != 1
                or id(prev) in outputs
            ):
                break
            j += 1
        if sig is not None and j - i >= MIN_RUN:
            runs[i] = j - i
            i = j
        else:
            i += 1
    return runs


def lower_run_middle(cx: Any, layers: list[Node], first_out: Ref) -> list[str] | None:
    """The loop over ``layers`` (a run without its first and last layer); ``first_out``
    holds the first layer's output. Sets the ref of the last middle output. None when
    the packed weights do not come out at a fixed stride (then lower them one by one)."""
    w_refs, b_refs = [], []
    for node in layers:
        w_refs.append(cx.put_const(node.inputs[1].const))  # type: ignore[union-attr]
        b = node.inputs[2] if len(node.inputs) > 2 else None
        b_refs.append(None if b is None else cx.put_const(b.const))
    offs = [int(r.off) for r in w_refs] + [int(r.off) for r in b_refs if r is not None]
    n = len(layers)
    stride = int(w_refs[1].off) - int(w_refs[0].off) if n > 1 else 0
    groups = [offs[:n], offs[n:]] if b_refs[0] is not None else [offs[:n]]
    if any(g[i] - g[0] != i * stride for g in groups for i in range(n)):
        return None
    g = cx.tag
    other = cx.new_buffer(first_out.shape, first_out.dtype)
    bufs = (first_out, other)
    x = first_out.reshaped(first_out.shape)
    src = Ref(x.buf, f"{g}src", x.shape, x.dtype)
    dst = Ref(x.buf, f"{g}dst", x.shape, x.dtype)
    step = literal(stride)
    w = Ref(w_refs[0].buf, f"{w_refs[0].off} + {g}l * {step}", w_refs[0].shape, w_refs[0].dtype)
    ins: list[Ref | None] = [src, w]
    if b_refs[0] is not None:
        b0 = b_refs[0]
        ins.append(Ref(b0.buf, f"{b0.off} + {g}l * {step}", b0.shape, b0.dtype))
    body = linear_lines(cx, layers[0], src, w, dst, ins)
    lines = [
        f"for {g}l in range({literal(n)}):",
        f"    if {g}l % 2 == 0:",
        f"        {g}src, {g}dst = {first_out.off}, {other.off}",
        "    else:",
        f"        {g}src, {g}dst = {other.off}, {first_out.off}",
        *["    " + ln for ln in body],
    ]
    cx.refs[id(layers[-1].outputs[0])] = bufs[n % 2 == 1]  # layer l writes bufs[(l + 1) % 2]
    return lines
