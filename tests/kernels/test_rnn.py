"""RNN/GRU/LSTM kernels against onnxruntime on one-node models (constant and fed weights)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tfrt_py.ir import Node, Value
from tfrt_py.kernels import KernelContext, default_registry

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
IN_NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def _inputs(op: str, T: int, N: int, I: int, H: int, nd: int, layout: int, rng: Any) -> dict:
    G = GATES[op]
    f = np.float32
    x_shape = (N, T, I) if layout else (T, N, I)
    h_shape = (N, nd, H) if layout else (nd, N, H)
    d = {
        "X": rng.standard_normal(x_shape).astype(f),
        "W": (rng.standard_normal((nd, G * H, I)) * 0.5).astype(f),
        "R": (rng.standard_normal((nd, G * H, H)) * 0.5).astype(f),
        "B": (rng.standard_normal((nd, 2 * G * H)) * 0.3).astype(f),
        "sequence_lens": rng.integers(0, T + 1, size=N).astype(np.int32),
        "initial_h": rng.standard_normal(h_shape).astype(f),
    }
    if op == "LSTM":
        d["initial_c"] = rng.standard_normal(h_shape).astype(f)
        d["P"] = (rng.standard_normal((nd, 3 * H)) * 0.5).astype(f)
    return d


def _check(op: str, attrs: dict, data: dict, const_weights: bool, opset: int = 14) -> None:
    n_out = 3 if op == "LSTM" else 2
    in_names = [k if k in data else "" for k in IN_NAMES]
    while not in_names[-1]:
        in_names.pop()
    out_names = ["Y", "Y_h", "Y_c"][:n_out]
    consts = {"W", "R", "B", "P"} if const_weights else set()
    node = helper.make_node(op, in_names, out_names, **attrs)
    inits = [numpy_helper.from_array(data[k], k) for k in in_names if k in consts]
    present = [k for k in in_names if k]
    g_inputs = [
        helper.make_tensor_value_info(
            k, TensorProto.INT32 if k == "sequence_lens" else TensorProto.FLOAT, None
        )
        for k in present
        if k not in consts
    ]
    g_outputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in out_names]
    graph = helper.make_graph([node], "g", g_inputs, g_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {k: data[k] for k in present if k not in consts}
    expected = sess.run(None, feed)

    ins = [Value(k, const=data[k] if k in consts else None) if k else None for k in in_names]
    tnode = Node(op, ins, [Value(k) for k in out_names], dict(attrs), name="n", opset=opset)
    fn = default_registry().lookup("", op, opset).build(KernelContext(tnode))
    got = fn(*[None if not k or k in consts else data[k] for k in in_names])
    for o, e in zip(got, expected, strict=True):
        assert o.dtype == e.dtype
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("const_weights", [True, False])
def test_directions_seq_lens_initial_state(op: str, direction: str, const_weights: bool) -> None:
    rng = np.random.default_rng(0)
    nd = 2 if direction == "bidirectional" else 1
    data = _inputs(op, 5, 4, 3, 6, nd, 0, rng)
    data["sequence_lens"] = np.array([5, 2, 1, 4], np.int32)
    _check(op, {"hidden_size": 6, "direction": direction}, data, const_weights)


def _run(op: str, attrs: dict, args: list) -> Any:
    n_out = 3 if op == "LSTM" else 2
    ins = [Value(str(i)) if a is not None else None for i, a in enumerate(args)]
    node = Node(op, ins, [Value(f"o{i}") for i in range(n_out)], attrs, name="n", opset=14)
    return default_registry().lookup("", op, 14).build(KernelContext(node))(*args)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_matches_layout_0(op: str) -> None:
    # onnxruntime's CPU kernels reject layout=1, so compare with our own time-major run.
    rng = np.random.default_rng(1)
    d = _inputs(op, 4, 3, 2, 5, 2, 0, rng)
    args: list[Any] = [d.get(k) for k in IN_NAMES[: 8 if op == "LSTM" else 6]]
    attrs = {"hidden_size": 5, "direction": "bidirectional"}
    ref = _run(op, attrs, args)
    args[0] = args[0].transpose(1, 0, 2).copy()
    for i in (5, 6)[: len(args) - 5]:
        args[i] = args[i].transpose(1, 0, 2).copy()
    got = _run(op, {**attrs, "layout": 1}, args)
    np.testing.assert_allclose(got[0], ref[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for g, r in zip(got[1:], ref[1:], strict=True):
        np.testing.assert_allclose(g, r.transpose(1, 0, 2), rtol=1e-6)


def test_gru_linear_before_reset_and_clip() -> None:
    rng = np.random.default_rng(2)
    data = _inputs("GRU", 6, 2, 3, 4, 1, 0, rng)
    data["X"] *= 4
    del data["sequence_lens"], data["initial_h"]
    _check("GRU", {"hidden_size": 4, "linear_before_reset": 1, "clip": 0.7}, data, True)


def test_lstm_input_forget_activations_alpha_beta() -> None:
    rng = np.random.default_rng(3)
    data = _inputs("LSTM", 5, 2, 3, 4, 2, 0, rng)
    del data["sequence_lens"]
    attrs = {
        "hidden_size": 4,
        "direction": "bidirectional",
        "input_forget": 1,
        "activations": ["HardSigmoid", "LeakyRelu", "Tanh", "Sigmoid", "ScaledTanh", "Softsign"],
        "activation_alpha": [0.3, 0.05, 0.9],
        "activation_beta": [0.4, 1.5],
    }
    _check("LSTM", attrs, data, True)


def test_rnn_float64_only_y_h() -> None:
    rng = np.random.default_rng(4)
    X = rng.standard_normal((3, 2, 4))
    W = rng.standard_normal((1, 5, 4))
    R = rng.standard_normal((1, 5, 5)) * 0.3
    node = Node(
        "RNN", [Value("X"), Value("W", const=W), Value("R", const=R)], [None, Value("Y_h")],
        {"hidden_size": 5}, name="n", opset=22,
    )  # fmt: skip
    fn = default_registry().lookup("", "RNN", 22).build(KernelContext(node))
    y, y_h = fn(X, None, None)
    assert y is None and y_h.dtype == np.float64
    h = np.zeros((2, 5))
    for t in range(3):
        h = np.tanh(X[t] @ W[0].T + h @ R[0].T)
    np.testing.assert_allclose(y_h[0], h, rtol=1e-12)
