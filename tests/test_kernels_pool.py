"""Pool-family kernels against onnxruntime on one-node models."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from tfrt_py.ir import Node, Value
from tfrt_py.ir.types import TensorType
from tfrt_py.kernels import pool
from tfrt_py.kernels.base import KernelContext
from tfrt_py.kernels.registry import KernelRegistry

ort = pytest.importorskip("onnxruntime")

_REG = KernelRegistry()
pool.register_kernels(_REG)
_RNG = np.random.default_rng(0)


def _build(
    op: str, inputs: list[Any], attrs: dict[str, Any], const: tuple[int, ...] = (), opset=19
):
    vals: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            vals.append(None)
        else:
            vals.append(Value(f"i{i}", TensorType(a.dtype, a.shape), a if i in const else None))
    node = Node(op, vals, [Value("y")], attrs, name="n", opset=opset)
    return _REG.lookup("", op, opset).build(KernelContext(node))


def _ort(op: str, inputs: list[Any], attrs: dict[str, Any], opset=19, n_out=1) -> list[Any]:
    names = [f"i{i}" if a is not None else "" for i, a in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{k}" for k in range(n_out)], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, inputs)
            if a is not None
        ],
        [onnx.ValueInfoProto(name=f"y{k}") for k in range(n_out)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: a for n, a in zip(names, inputs) if a is not None})


def _check(op: str, inputs: list[Any], attrs: dict[str, Any], rtol=1e-4, atol=1e-4, opset=19):
    (want,) = _ort(op, inputs, attrs, opset)
    args = [None if a is None else a for a in inputs]
    for const in ((), tuple(range(1, len(inputs)))):
        got = _build(op, inputs, attrs, const, opset)(*args)
        assert got.dtype == want.dtype and got.shape == want.shape, (const, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _r(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


POOL_CASES = [
    # (op, x shape, attrs)
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 3, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [0, 1, 1, 0]}),
    (
        "MaxPool",
        (1, 2, 7, 8),
        {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    ),
    ("MaxPool", (1, 3, 12), {"kernel_shape": [4], "strides": [3], "pads": [2, 2]}),
    ("MaxPool", (1, 4, 7, 7), {"kernel_shape": [7, 7]}),  # reduce path
    (
        "AveragePool",
        (1, 2, 9, 9),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    (
        "AveragePool",
        (1, 2, 9, 9),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    ("AveragePool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", (2, 8, 7, 7), {"kernel_shape": [7, 7]}),  # reduce path
    ("AveragePool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2]}),
    ("LpPool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "p": 3, "pads": [1, 1, 1, 1]}),
    ("LpPool", (1, 2, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("GlobalAveragePool", (2, 3, 5, 4), {}),
    ("GlobalMaxPool", (2, 3, 5, 4, 3), {}),
    ("GlobalLpPool", (2, 3, 5, 4), {"p": 3}),
]


@pytest.mark.parametrize(("op", "xs", "attrs"), POOL_CASES)
def test_pool_matches_onnxruntime(op, xs, attrs) -> None:
    x = _r(*xs)
    (want,) = _ort(op, [x], attrs)
    fn = _build(op, [x], attrs)
    got = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if op in ("MaxPool", "AveragePool"):
        out = np.empty_like(want)
        assert fn(x, out=out) is out
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_match_onnxruntime(storage_order) -> None:
    x = _r(2, 3, 7, 6)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    attrs["storage_order"] = storage_order
    want_y, want_i = _ort("MaxPool", [x], attrs, n_out=2)
    node = Node(
        "MaxPool",
        [Value("x", TensorType(x.dtype, x.shape))],
        [Value("y"), Value("i")],
        attrs,
        name="n",
        opset=19,
    )
    y, i = _REG.lookup("", "MaxPool", 19).build(KernelContext(node))(x)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)
    assert i.dtype == np.int64


def test_maxpool_int8_and_avgpool_float16() -> None:
    x = _RNG.integers(-128, 128, (1, 2, 6, 6)).astype(np.int8)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    (want,) = _ort("MaxPool", [x], attrs)
    np.testing.assert_array_equal(_build("MaxPool", [x], attrs)(x), want)
    x16 = _r(1, 2, 6, 6, dtype=np.float16)
    got = _build("AveragePool", [x16], attrs)(x16)
    assert got.dtype == np.float16
    (want16,) = _ort("AveragePool", [x16.astype(np.float32)], attrs)
    np.testing.assert_allclose(got, want16, rtol=2e-3, atol=2e-3)


def test_maxunpool_inverts_maxpool() -> None:
    x = _r(1, 2, 6, 6)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    want_y, want_i = _ort("MaxPool", [x], attrs, n_out=2)
    fn = _build("MaxUnpool", [want_y, want_i], attrs)
    up = fn(want_y, want_i)
    (want,) = _ort("MaxUnpool", [want_y, want_i], attrs)
    np.testing.assert_array_equal(up, want)
