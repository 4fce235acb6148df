"""One-node kernel tests: build a kernel straight from a registry (no frontend, no
executor) and run the same node through onnxruntime, so a kernel family is checked alone.

``const`` names the input positions given to the kernel as load-time constants, so both
the constant-weight path (prepared at load) and the runtime path are exercised.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import helper

from tfrt_py.ir import Node, TensorType, Value
from tfrt_py.kernels.base import ComputeFn, KernelContext
from tfrt_py.kernels.registry import KernelRegistry

__all__ = ["build_node", "check_vs_ort", "ort_run", "registry_of"]


def registry_of(*families: ModuleType) -> KernelRegistry:
    """A registry holding only the given kernel family modules."""
    reg = KernelRegistry()
    for family in families:
        family.register_kernels(reg)
    return reg


def build_node(
    registry: KernelRegistry,
    op: str,
    inputs: Sequence[Any],
    attrs: dict[str, Any],
    *,
    opset: int,
    const: tuple[int, ...] = (),
    n_out: int = 1,
) -> ComputeFn:
    """The compute function of a one-node ``op`` with inputs typed like ``inputs``."""
    vals: list[Value | None] = [
        None
        if a is None
        else Value(f"i{i}", TensorType(a.dtype, a.shape), a if i in const else None)
        for i, a in enumerate(inputs)
    ]
    outs: list[Value | None] = [Value(f"y{k}") for k in range(n_out)]
    node = Node(op, vals, outs, attrs, name="n", opset=opset)
    return registry.lookup("", op, opset).build(KernelContext(node))


def one_node_model(
    op: str, inputs: Sequence[Any], attrs: dict[str, Any], *, opset: int, n_out: int = 1
) -> onnx.ModelProto:
    """A model of one ``op`` node whose inputs ``i0, i1, ...`` are typed like ``inputs``
    (None: an omitted optional input) and whose outputs are ``y0, y1, ...``."""
    names = [f"i{i}" if a is not None else "" for i, a in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{k}" for k in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, inputs)
            if a is not None
        ],
        [onnx.ValueInfoProto(name=f"y{k}") for k in range(n_out)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _one_node_feeds(inputs: Sequence[Any]) -> dict[str, Any]:
    return {f"i{i}": a for i, a in enumerate(inputs) if a is not None}


def reference_run(
    op: str, inputs: Sequence[Any], attrs: dict[str, Any], *, opset: int, n_out: int = 1
) -> list[Any]:
    """The outputs of onnx's reference evaluator (the spec's own implementation) for the
    same one-node model: the reference where onnxruntime departs from the spec."""
    from onnx.reference import ReferenceEvaluator

    model = one_node_model(op, inputs, attrs, opset=opset, n_out=n_out)
    return list(ReferenceEvaluator(model).run(None, _one_node_feeds(inputs)))


def ort_run(
    op: str, inputs: Sequence[Any], attrs: dict[str, Any], *, opset: int, n_out: int = 1
) -> list[Any]:
    """onnxruntime's outputs for the same one-node model."""
    import onnxruntime as ort

    model = one_node_model(op, inputs, attrs, opset=opset, n_out=n_out)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, _one_node_feeds(inputs)))


def check_vs_ort(
    registry: KernelRegistry,
    op: str,
    inputs: Sequence[Any],
    attrs: dict[str, Any],
    *,
    opset: int,
    n_out: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    """Every output equals onnxruntime's (dtype, shape, values), with inputs 1.. given as
    runtime values and again as load-time constants."""
    want = ort_run(op, inputs, attrs, opset=opset, n_out=n_out)
    for const in ((), tuple(range(1, len(inputs)))):
        got = build_node(registry, op, inputs, attrs, opset=opset, const=const, n_out=n_out)(
            *inputs
        )
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, (const, g.dtype, w.dtype, g.shape)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
