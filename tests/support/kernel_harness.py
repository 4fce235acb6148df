"""One-node kernel tests: build a kernel straight from a registry (no frontend, no
executor) and run the same node through onnxruntime, so a kernel family is checked alone.

``const`` names the input positions given to the kernel as load-time constants, so both
the constant-weight path (prepared at load) and the runtime path are exercised.

A test module uses these through ``Harness`` (the ``harness`` fixture of
``tests/kernels/conftest.py``): the module declares the kernel families it tests
(``KERNEL_FAMILIES``) and, where its checks differ from the defaults, ``KERNEL_OPSET`` and
``KERNEL_TOL``; ``harness_for`` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import helper

from tfrt_py.ir import Node, TensorType, Value
from tfrt_py.kernels.base import ComputeFn, KernelContext
from tfrt_py.kernels.registry import KernelRegistry

__all__ = [
    "DEFAULT_OPSET",
    "DEFAULT_TOL",
    "Harness",
    "build_node",
    "check_vs_ort",
    "harness_for",
    "ort_run",
    "reference_run",
    "registry_of",
]

#: The opset of a check that names none, and the rtol and atol of ``Harness.check``.
DEFAULT_OPSET = 19
DEFAULT_TOL = 1e-4


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


@dataclass(frozen=True)
class Harness:
    """The one-node helpers above bound to one registry, with a test module's defaults:
    ``opset`` for a call that names none, ``tol`` (rtol and atol) for ``check``."""

    registry: KernelRegistry
    opset: int = DEFAULT_OPSET
    tol: float = DEFAULT_TOL

    @classmethod
    def of(
        cls, *families: ModuleType, opset: int = DEFAULT_OPSET, tol: float = DEFAULT_TOL
    ) -> Harness:
        """A harness over a registry holding only ``families``."""
        return cls(registry_of(*families), opset, tol)

    def _opset(self, opset: int | None) -> int:
        return self.opset if opset is None else opset

    def build(
        self,
        op: str,
        inputs: Sequence[Any],
        attrs: dict[str, Any],
        *,
        const: tuple[int, ...] = (),
        opset: int | None = None,
        n_out: int = 1,
    ) -> ComputeFn:
        """``build_node`` on this registry."""
        return build_node(
            self.registry, op, inputs, attrs, opset=self._opset(opset), const=const, n_out=n_out
        )

    def ort(
        self,
        op: str,
        inputs: Sequence[Any],
        attrs: dict[str, Any],
        *,
        opset: int | None = None,
        n_out: int = 1,
    ) -> list[Any]:
        """``ort_run`` at this harness's opset unless ``opset`` is given."""
        return ort_run(op, inputs, attrs, opset=self._opset(opset), n_out=n_out)

    def check(
        self,
        op: str,
        inputs: Sequence[Any],
        attrs: dict[str, Any],
        *,
        tol: float | None = None,
        opset: int | None = None,
        n_out: int = 1,
    ) -> None:
        """``check_vs_ort`` on this registry, ``tol`` as both rtol and atol."""
        tol = self.tol if tol is None else tol
        check_vs_ort(
            self.registry,
            op,
            inputs,
            attrs,
            opset=self._opset(opset),
            n_out=n_out,
            rtol=tol,
            atol=tol,
        )


def harness_for(module: ModuleType) -> Harness:
    """The harness a test module declares: its ``KERNEL_FAMILIES``, with its
    ``KERNEL_OPSET`` and ``KERNEL_TOL`` where it sets them."""
    families: tuple[ModuleType, ...] = module.KERNEL_FAMILIES
    return Harness.of(
        *families,
        opset=getattr(module, "KERNEL_OPSET", DEFAULT_OPSET),
        tol=getattr(module, "KERNEL_TOL", DEFAULT_TOL),
    )
