"""``compiler/fuse_rotary.py``: the rotate-half rotary embedding Hugging Face's Llama-style
decoders export becomes one ``RotaryHalf`` node whose values are the seven nodes' bit for
bit -- at a constant half and at the shape-arithmetic half torch.onnx writes, at every
length (the generic plan), against onnxruntime too -- and look-alikes stay as they are."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py

F = TensorProto.FLOAT
I64 = TensorProto.INT64
BIG = (1 << 63) - 1


def _model(
    *,
    half: str = "shape",
    order: str = "hf",
    variant: str = "",
    cos_shape: tuple[Any, ...] = ("b", 1, "s", 8),
    rank: int = 4,
    reread: bool = False,
) -> bytes:
    """q (b, 2, s, 8) rotated by cos/sin inputs: ``q*cos + rotate_half(q)*sin``. ``half``:
    "shape" (Shape(q)[-1] / 2 as torch.onnx writes it) or "const"; ``order`` "hf" or
    "swapped" (the Muls' and the Add's operands the other way round); ``variant``: a
    look-alike -- "concat" (the halves concatenated the other way round), "neg_first"
    (the first half negated: the rotation the other way); ``reread``: the rotation also a
    graph output."""
    shape: list[Any] = ["b", 2, "s", 8] if rank == 4 else ["s", 8]
    if rank != 4:
        cos_shape = ("s", 8)
    nodes, inits = [], []

    def const(name: str, v: Any) -> str:
        inits.append(numpy_helper.from_array(np.array(v, np.int64), name))
        return name

    if half == "shape":
        nodes += [
            helper.make_node("Shape", ["q"], ["sh"]),
            helper.make_node("Gather", ["sh", const("last", rank - 1)], ["d"], axis=0),
            helper.make_node("Div", ["d", const("two", 2)], ["dh"]),
            helper.make_node("Unsqueeze", ["dh", const("zero_ax", [0])], ["h"]),
        ]
    else:
        const("h", [4])
    ax = const("ax", [-1])
    nodes += [
        helper.make_node("Slice", ["q", const("z", [0]), "h", ax], ["x1"]),
        helper.make_node("Slice", ["q", "h", const("e", [BIG]), ax, const("stp", [1])], ["x2"]),
    ]
    if variant == "neg_first":
        nodes += [
            helper.make_node("Neg", ["x1"], ["n"]),
            helper.make_node("Concat", ["n", "x2"], ["rot"], axis=-1),
        ]
    else:
        cat = ["x1", "n"] if variant == "concat" else ["n", "x1"]
        nodes += [
            helper.make_node("Neg", ["x2"], ["n"]),
            helper.make_node("Concat", cat, ["rot"], axis=-1),
        ]
    if order == "hf":
        nodes += [
            helper.make_node("Mul", ["q", "cos"], ["qc"]),
            helper.make_node("Mul", ["rot", "sin"], ["rs"]),
            helper.make_node("Add", ["qc", "rs"], ["y"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", ["cos", "q"], ["qc"]),
            helper.make_node("Mul", ["sin", "rot"], ["rs"]),
            helper.make_node("Add", ["rs", "qc"], ["y"]),
        ]
    outs = [helper.make_tensor_value_info("y", F, shape)]
    if reread:
        outs.append(helper.make_tensor_value_info("rot", F, shape))
    graph = helper.make_graph(
        nodes, "rope",
        [helper.make_tensor_value_info("q", F, shape),
         helper.make_tensor_value_info("cos", F, list(cos_shape)),
         helper.make_tensor_value_info("sin", F, list(cos_shape))],
        outs, inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _feeds(b: int, s: int, rank: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, 2, s, 8) if rank == 4 else (s, 8)).astype(np.float32)
    ang = rng.uniform(0, 6.3, (b, 1, s, 8) if rank == 4 else (s, 8)).astype(np.float32)
    return {"q": q, "cos": np.cos(ang), "sin": np.sin(ang)}


def _fused(model: tfrt_py.Model) -> int:
    return sum(n.op_type == "RotaryHalf" for n in model.prepared.graph.nodes)


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize(
    ("half", "order"), [("shape", "hf"), ("const", "hf"), ("shape", "swapped")]
)
def test_the_rotary_embedding_becomes_one_node_with_the_same_bits(
    executor: str, half: str, order: str
) -> None:
    data = _model(half=half, order=order)
    fused = tfrt_py.load(data, executor=executor)
    plain = tfrt_py.load(data, executor=executor, optimize=False)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert _fused(fused) == 1
    assert not any(n.op_type in ("Slice", "Neg", "Concat") for n in fused.prepared.graph.nodes)
    for b, s in [(1, 1), (1, 7), (2, 5), (1, 1), (3, 33), (1, 2)]:  # new lengths, one again
        feeds = _feeds(b, s, seed=s)
        got = fused.run(feeds)["y"]
        np.testing.assert_array_equal(got, plain.run(feeds)["y"])
        np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=1e-6, atol=1e-6)


def test_other_layouts_and_a_caller_buffer_run_the_numpy_forms() -> None:
    """Rank 2 (no compiled pass), cos broadcast over a batch, and an outputs= buffer:
    the unfused graph's values still."""
    for data, feeds in [
        (_model(rank=2), _feeds(1, 6, rank=2)),
        (_model(cos_shape=(1, 1, "s", 8)), {**_feeds(3, 4), "cos": _feeds(1, 4)["cos"],
                                            "sin": _feeds(1, 4)["sin"]}),
    ]:  # fmt: skip
        fused = tfrt_py.load(data, executor="sync")
        assert _fused(fused) == 1
        want = tfrt_py.load(data, optimize=False).run(feeds)["y"]
        np.testing.assert_array_equal(fused.run(feeds)["y"], want)
        buf = np.empty_like(want)
        assert fused.run(feeds, outputs={"y": buf})["y"] is buf
        np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize(
    "kwargs", [{"variant": "concat"}, {"variant": "neg_first"}, {"reread": True}]
)
def test_look_alikes_are_left_as_they_are(kwargs: dict[str, Any]) -> None:
    data = _model(half="const", **kwargs)
    fused = tfrt_py.load(data, executor="sync")
    assert _fused(fused) == 0
    feeds = _feeds(1, 4)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fused.run(feeds)["y"], session.run(None, feeds)[0], rtol=1e-6,
                               atol=1e-6)  # fmt: skip


def test_the_kernel_follows_slices_index_rules_for_any_half() -> None:
    """``h`` negative, past the end, zero or odd: what the Slice/Neg/Concat/Mul/Add
    composition gives, compiled or not."""
    from tfrt_py.kernels.fused.rotary import _ROTARY4, rotary_half

    feeds = _feeds(2, 3)
    q, c, s = feeds["q"], feeds["cos"], feeds["sin"]
    compiled = _ROTARY4.get()
    for h in (-3, -20, 0, 1, 3, 4, 7, 8, 40):
        k = min(max(h + 8 if h < 0 else h, 0), 8)
        rot = np.concatenate([-q[..., k:], q[..., :k]], axis=-1)
        want = q * c + rot * s
        for fn in (None, compiled):
            got = rotary_half(q, c, s, np.array([h], np.int64), compiled=fn)
            np.testing.assert_array_equal(got, want)
    for dt in ("float16", "float64"):  # the NumPy passes: no compile inside a call
        q2, c2, s2 = q.astype(dt), c.astype(dt), s.astype(dt)
        want = q2 * c2 + np.concatenate([-q2[..., 4:], q2[..., :4]], axis=-1) * s2
        got = rotary_half(q2, c2, s2, np.array([4], np.int64), compiled=compiled)
        assert got.dtype == dt
        np.testing.assert_array_equal(got, want)


def test_a_decode_step_s_layouts_need_no_compile_in_a_call() -> None:
    """A decode step passes the heads' strided view of q and cos/sin gathered per position
    (Fortran-ordered): the kernel's warm-up compiled those argument types, so the call
    compiles nothing (numba compiles per layout: optimum's Llama did, in a step)."""
    from tfrt_py.kernels.fused.rotary import _ROTARY4, rotary_half

    compiled = _ROTARY4.get()
    if compiled is None:
        pytest.skip("the compiled kernels are off here (numba missing or $TFRT_PY_JIT=0)")
    known = len(compiled.overloads)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    c = np.asfortranarray(rng.standard_normal((1, 1, 4, 8)).astype(np.float32))
    s = np.asfortranarray(rng.standard_normal((1, 1, 4, 8)).astype(np.float32))
    got = rotary_half(q, c, s, np.array([4], np.int64), compiled=compiled)
    want = q * c + np.concatenate([-q[..., 4:], q[..., :4]], axis=-1) * s
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert len(compiled.overloads) == known
