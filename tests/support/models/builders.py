"""Shared pieces of the test-model builders: ``ModelCase`` and ``Net``, a tiny graph writer.

Every model is built deterministically from a fixed seed with ``onnx.helper``; nothing is
downloaded. ``Net`` names every node and value, keeps the initializers, and checks the
finished model with ``onnx.checker`` (full check, so shapes are inferred and validated).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "DEFAULT_OPSET",
    "Feed",
    "ModelCase",
    "Net",
    "tensor_info",
]

DEFAULT_OPSET = 17

#: The IR version that goes with each default-domain opset (onnx's own table, capped so
#: onnxruntime accepts every model).
_IR_FOR_OPSET = {15: 8, 16: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10}

Feed = dict[str, Any]


@dataclass(frozen=True)
class ModelCase:
    """A model with sample feeds: what ``tests/models/test_models.py`` runs against onnxruntime."""

    name: str
    model: onnx.ModelProto
    #: One or more feed dicts; every one is run on the same loaded model.
    feeds: tuple[Feed, ...]
    rtol: float = 1e-4
    atol: float = 1e-5


def tensor_info(name: str, dtype: int, shape: Sequence[int | str | None] | None) -> Any:
    """A tensor ValueInfoProto; str dims are symbolic, None dims are unknown."""
    return helper.make_tensor_value_info(name, dtype, None if shape is None else list(shape))


class Net:
    """Collects nodes and initializers of one graph; subgraphs share the name counter."""

    def __init__(self, name: str, seed: int = 0, *, parent: Net | None = None) -> None:
        self.name = name
        self.rng: np.random.Generator = (
            parent.rng if parent is not None else np.random.default_rng(seed)
        )
        self._counter: itertools.count[int] = (
            parent._counter if parent is not None else itertools.count()
        )
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    # -- values ---------------------------------------------------------------------------

    def const(self, name: str, value: Any, dtype: Any = None) -> str:
        """Add an initializer holding ``value`` (converted with ``dtype`` when given)."""
        arr = np.asarray(value, dtype=dtype)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def weight(self, name: str, shape: Sequence[int], scale: float | None = None) -> str:
        """A float32 initializer drawn from N(0, scale^2); scale defaults to 1/sqrt(fan_in)."""
        if scale is None:
            fan_in = shape[-1] if len(shape) == 1 else int(np.prod(shape[1:]))
            scale = 1.0 / np.sqrt(max(fan_in, 1))
        arr = (self.rng.standard_normal(tuple(shape)) * scale).astype(np.float32)
        return self.const(name, arr)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        arr = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.const(name, arr)

    # -- nodes ----------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        *inputs: str,
        outputs: Sequence[str] | int = 1,
        name: str | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> str:
        """Append a node; return its first output's name (see ``op_multi`` for several)."""
        return self.op_multi(op_type, *inputs, outputs=outputs, name=name, domain=domain, **attrs)[
            0
        ]

    def op_multi(
        self,
        op_type: str,
        *inputs: str,
        outputs: Sequence[str] | int = 1,
        name: str | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        k = next(self._counter)
        node_name = name or f"{op_type.lower()}_{k}"
        if isinstance(outputs, int):
            outs = [f"{node_name}_out{i}" if outputs > 1 else node_name for i in range(outputs)]
        else:
            outs = list(outputs)
        node = helper.make_node(
            op_type, list(inputs), outs, name=node_name, domain=domain or None, **attrs
        )
        self.nodes.append(node)
        return outs

    def dense(
        self, x: str, n_in: int, n_out: int, *, act: str | None = "Relu", out: str | None = None
    ) -> str:
        """Gemm with a [n_out, n_in] weight (transB=1, as exported from PyTorch) + bias,
        then ``act``; ``out`` names the final value."""
        k = next(self._counter)
        w = self.weight(f"dense{k}_w", (n_out, n_in))
        b = self.weight(f"dense{k}_b", (n_out,), scale=0.1)
        last: list[str] | int = [out] if out else 1
        y = self.op("Gemm", x, w, b, transB=1, outputs=1 if act else last)
        return self.op(act, y, outputs=last) if act else y

    def sub_net(self, name: str) -> Net:
        """A Net for a subgraph (If branch, Loop body) that shares this Net's counter."""
        return Net(name, parent=self)

    # -- output ---------------------------------------------------------------------------

    def graph(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> onnx.GraphProto:
        return helper.make_graph(
            self.nodes, self.name, list(inputs), list(outputs), initializer=self.initializers
        )

    def model(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        *,
        opset: int = DEFAULT_OPSET,
        extra_opsets: dict[str, int] | None = None,
        check: bool = True,
    ) -> onnx.ModelProto:
        opsets = [helper.make_opsetid("", opset)]
        opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        model = helper.make_model(
            self.graph(inputs, outputs),
            opset_imports=opsets,
            ir_version=_IR_FOR_OPSET.get(opset, 8),
            producer_name="tfrt_py-tests",
        )
        if check:
            onnx.checker.check_model(model, full_check=True)
        return model


def float_feed(rng: np.random.Generator, shape: Sequence[int], scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 data of ``shape``."""
    return (rng.standard_normal(tuple(shape)) * scale).astype(np.float32)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
INT32 = TensorProto.INT32
BOOL = TensorProto.BOOL
