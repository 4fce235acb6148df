"""com.microsoft MatMulNBits on the native tier (``native/lower/ops_nbits.py``): a decode
step's few rows against onnxruntime through the compiled function itself (4 and 8 bits,
zero points absent, packed and float, K not a whole number of blocks, N not a whole panel;
``accuracy_level`` 0 and 4);
a prompt's rows decline to the interpreter, which answers the same; and ONNX's type
inference reaches past the op (``frontends/onnx/importer._stand_ins``), so a norm after it
still fuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.contrib import nbits_inputs, node_model, ort_outputs, runtime_feeds
from tfrt_py.kernels.lib import qnbits_ir
from tfrt_py.native.lower.source import Declined

RNG = np.random.default_rng(41)


def _compiled_output(m: tfrt_py.Model, feeds: dict[str, Any]) -> np.ndarray:
    """The compiled function's own output for ``feeds`` (called directly: not the
    interpreter's, which the tier may also run)."""
    assert m.native.state == "ready"  # a static model: one function for its shapes
    low, fn = m.native.lowered, m.native.compiled.fn
    outs = fn(*[np.array(feeds[n], order="C") for n in low.input_names], *low.params)
    return (outs if isinstance(outs, tuple) else (outs,))[0]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize(
    ("bits", "k", "block", "zp", "rows"),
    [
        (4, 64, 32, "packed", 1),
        (4, 40, 16, "none", 3),  # K past the last whole block
        (4, 300, 128, "float", 2),
        (8, 48, 16, "packed", 1),
    ],
)
@pytest.mark.compiles
def test_decode_rows_on_the_native_tier_match_onnxruntime(bits: int, k: int, block: int,
                                                          zp: str, rows: int,
                                                          level: int) -> None:  # fmt: skip
    """At ``accuracy_level=4`` A's int8 blocks (onnxruntime's values there, ~0.5% of the
    scale from level 0's) are what the compiled function multiplies: with 4-bit codes and
    integer zero points on the integer kernels (``nbits_rows_i4``) where they are on."""
    n = 70  # one whole panel of 64 columns and a part of one
    inputs = nbits_inputs(RNG, (1, rows), k, n, bits, block, zp, False)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": level}
    model = node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3))
    feeds = runtime_feeds(inputs, (1, 2, 3))
    want = ort_outputs(model, feeds)[0]
    m = tfrt_py.load(model, executor="native", native="eager")
    m.warmup([feeds])
    on_integers = level == 4 and bits == 4 and zp != "float" and qnbits_ir.kernel() is not None
    assert ("nbits_rows_i4(" in m.native.lowered.source) == on_integers
    tol = 1e-4 * float(np.abs(want).max())
    np.testing.assert_allclose(_compiled_output(m, feeds), want, rtol=1e-4, atol=tol)
    np.testing.assert_allclose(m.run(feeds)["y0"], want, rtol=1e-4, atol=tol)


def test_a_prompts_rows_are_declined_with_the_reason() -> None:
    """More rows than a decode step's: the lowering declines (the interpreter's
    dequantize-and-gemm serves them), naming the node and the reason; the interpreter
    answers as onnxruntime does."""
    inputs = nbits_inputs(RNG, (1, 8), 64, 16, 4, 32, "packed", False)
    attrs = {"K": 64, "N": 16, "bits": 4, "block_size": 32}
    model = node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3))
    with pytest.raises(Declined, match="over 8 rows"):
        tfrt_py.load(model, executor="native", native="eager")
    feeds = runtime_feeds(inputs, (1, 2, 3))
    want = ort_outputs(model, feeds)[0]
    got = tfrt_py.load(model, executor="sync").run(feeds)["y0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.compiles
def test_a_prompts_rows_at_level_4_take_the_integer_kernels() -> None:
    """At ``accuracy_level=4`` the integer kernels take a prompt's rows too (4 at a
    time): 8 and 37 rows lower to ``nbits_rows_i4`` and answer as onnxruntime does."""
    if qnbits_ir.kernel() is None:
        pytest.skip(f"the integer kernels are off here ({qnbits_ir.describe()})")
    for rows in (8, 37):
        inputs = nbits_inputs(RNG, (1, rows), 96, 70, 4, 32, "packed", False)
        attrs = {"K": 96, "N": 70, "bits": 4, "block_size": 32, "accuracy_level": 4}
        model = node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3))
        feeds = runtime_feeds(inputs, (1, 2, 3))
        want = ort_outputs(model, feeds)[0]
        m = tfrt_py.load(model, executor="native", native="eager")
        m.warmup([feeds])
        assert "nbits_rows_i4(" in m.native.lowered.source
        tol = 1e-4 * float(np.abs(want).max())
        np.testing.assert_allclose(_compiled_output(m, feeds), want, rtol=1e-4, atol=tol)


def test_types_are_inferred_past_the_op_so_a_norm_after_it_fuses() -> None:
    """MatMulNBits, a head split whose target shape is computed from the product's own
    shape (Shape, Gather, Concat: ONNX's data propagation), then a decomposed RMS norm over
    the heads (Pow, ReduceMean, Add, Sqrt, Div, Mul). ONNX's inference alone leaves
    everything after the contrib op untyped and the norm unfused; with the stand-in it
    fuses, and the answer is onnxruntime's."""
    k, n = 32, 24
    _, b, scales, _ = nbits_inputs(RNG, (1,), k, n, 4, 16, "none", False)
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["a", "b", "scales"],
            ["h"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=16,
        ),
        helper.make_node("Shape", ["h"], ["hs"]),
        helper.make_node("Gather", ["hs", "zero"], ["rows"], axis=0),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        helper.make_node("Concat", ["rows1", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["h3"]),
        helper.make_node("Pow", ["h3", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["h3", "sd"], ["nh"]),
        helper.make_node("Mul", ["nh", "gamma"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, name) for name, v in [
        ("b", b), ("scales", scales), ("two", np.array(2.0, np.float32)),
        ("zero", np.array(0, np.int64)), ("axis0", np.array([0], np.int64)),
        ("heads", np.array([4, 6], np.int64)),
        ("axes", np.array([-1], np.int64)), ("eps", np.array(1e-6, np.float32)),
        ("gamma", RNG.standard_normal(6).astype(np.float32))]]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["s", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["s", 4, 6])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    onnx.checker.check_model(model)
    m = tfrt_py.load(model, executor="sync")
    assert "1 RMSNorm" in m.describe()
    feeds = {"a": RNG.standard_normal((5, k)).astype(np.float32)}
    want = ort_outputs(model, feeds)[0]
    np.testing.assert_allclose(m.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
