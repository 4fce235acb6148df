"""Load-time passes: each one does its job, reports it, can be switched off, and leaves
outputs unchanged (compared with the unoptimized model); the cost model."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given

import tfrt_py
from tests.support.agreement import assert_agrees_with_unoptimized
from tests.support.models import build
from tests.support.random_graphs import PROPERTY, random_graph
from tests.support.spies import record_calls
from tfrt_py.compiler import PASSES, estimate_cost, graph_cost
from tfrt_py.compiler.pipeline import ENV_DISABLE
from tfrt_py.ir import Graph, GraphBuilder, Node, TensorType, Value

F32 = np.float32


def _ops(model: tfrt_py.Model) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.nodes)


def _report(model: tfrt_py.Model, name: str) -> str:
    return next(r for r in model.prepared.reports if r.name == name).summary


def _agree(graph: Graph, feeds: dict[str, np.ndarray], passes: set[str] | None) -> tfrt_py.Model:
    """Load with ``passes`` and with none; outputs agree on the first (unplanned) and later
    (planned) calls. Returns the optimized model."""
    model = tfrt_py.load(graph, optimize=passes)
    plain = tfrt_py.load(graph, optimize=False)
    want = plain.run(feeds)
    for _ in range(2):
        got = model.run(feeds)
        assert list(got) == list(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    return model


def _rng_feed(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


# -- one test per pass -------------------------------------------------------------------------


def test_identity_and_dropout_removed() -> None:
    b = GraphBuilder("ids")
    x = b.input("x", F32, (2, 3))
    h = b.op("Identity", b.op("Relu", x))
    h = b.op("Dropout", h, b.const(np.float32(0.5)))
    b.output(b.op("Identity", b.op("Neg", h)), "y")
    model = _agree(b.build(), {"x": _rng_feed((2, 3))}, {"identity"})
    assert _ops(model) == Counter({"Relu": 1, "Neg": 1})
    assert [s.name for s in model.outputs] == ["y"]
    assert _report(model, "identity") == "removed 1 Dropout, 2 Identity"


def test_identity_chains_read_through_in_one_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of Identities read at the top level and inside an If's branches (outer-scope
    values) is read through in one walk of the graph; only an Identity that is a graph
    output is replaced on its own (it keeps the output's name). A walk per Identity took
    0.9 s of FCOS-R50's load."""
    from onnx import TensorProto, helper

    from tfrt_py.compiler import cleanup

    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("Neg", ["b"], ["t"])], "then", [],
                               [vi("t", TensorProto.FLOAT, [2, 3])])  # fmt: skip
    else_g = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [],
                               [vi("e", TensorProto.FLOAT, [2, 3])])  # fmt: skip
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Identity", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Identity", ["c"], ["z"]),
    ]
    g = helper.make_graph(
        nodes, "chain", [vi("x", TensorProto.FLOAT, [2, 3]), vi("cond", TensorProto.BOOL, [])],
        [vi("y", TensorProto.FLOAT, [2, 3]), vi("z", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    walks = record_calls(monkeypatch, cleanup, "replace_uses")
    model = tfrt_py.load(m, optimize={"identity"})
    assert len(walks) == 1  # the output Identity alone
    assert _report(model, "identity") == "removed 3 Identity"
    assert [v.name for v in model.outputs] == ["y", "z"]
    x = _rng_feed((2, 3))
    for cond, want_y in ((True, -x), (False, np.abs(x))):
        got = model.run({"x": x, "cond": np.array(cond)})
        np.testing.assert_array_equal(got["y"], want_y)
        np.testing.assert_array_equal(got["z"], np.maximum(x, 0))


def test_a_cast_to_the_type_its_input_has_is_removed() -> None:
    """torch's ``.float()`` of a float32 tensor (T5's norms and scores) is an Identity;
    a Cast that changes the type stays."""
    b = GraphBuilder("casts")
    x = b.input("x", F32, (2, 3))
    h = b.op("Relu", b.op("Cast", x, to=1))  # FLOAT to FLOAT
    b.output(b.op("Cast", b.op("Neg", h), to=11), "y")  # FLOAT to DOUBLE
    model = _agree(b.build(), {"x": _rng_feed((2, 3))}, {"identity"})
    assert _ops(model) == Counter({"Relu": 1, "Neg": 1, "Cast": 1})
    assert model.run({"x": _rng_feed((2, 3))})["y"].dtype == np.float64
    assert "1 Cast" in _report(model, "identity")


def _out(node: Node) -> Value:
    """The node's first output (every node here has one)."""
    v = node.outputs[0]
    assert v is not None
    return v


def test_shape_inference_fills_every_value() -> None:
    b = GraphBuilder("untyped")
    x = b.input("x", F32, (2, 8))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.ones((8, 4), F32))))
    h = b.op("Transpose", b.op("Concat", h, h, axis=1), perm=[1, 0])
    h = b.op("Reshape", h, b.const(np.array([-1], np.int64)))
    b.output(b.op("ReduceSum", h, keepdims=0), "y")
    graph = b.build()
    assert _out(graph.nodes[0]).type is None  # the builder records no types
    model = _agree(graph, {"x": _rng_feed((2, 8))}, {"shapes"})
    for node in model.graph.nodes:
        t = _out(node).type
        assert isinstance(t, TensorType) and t.is_static and t.dtype == np.float32, (node, t)
    assert _report(model, "shapes").startswith("6/6 values typed, 6 with static shapes")


def test_fold_constants_and_shape_chains() -> None:
    b = GraphBuilder("fold")
    x = b.input("x", F32, (2, 3, 4))
    shape = b.op("Shape", x)
    first = b.op("Gather", shape, b.const(np.array([0], np.int64)), axis=0)
    target = b.op("Concat", first, b.const(np.array([-1], np.int64)), axis=0)
    scale = b.op("Mul", b.const(np.float32(2.0)), b.const(np.float32(3.0)))
    y = b.op("Mul", b.op("Reshape", x, target), scale)
    b.output(y, "y")
    model = _agree(b.build(), {"x": _rng_feed((2, 3, 4))}, {"shapes", "fold"})
    assert _ops(model) == Counter({"Reshape": 1, "Mul": 1})
    assert _report(model, "fold").startswith("folded 4 nodes into constants")


def test_fold_picks_the_static_dims_of_a_shape_whose_other_dims_vary() -> None:
    # scaled dot-product attention's exports: scale = 1 / sqrt(Shape(q)[-1]), per call
    b = GraphBuilder("fold_partial")
    x = b.input("x", F32, ("batch", 3, 4))
    shape = b.op("Shape", x)
    last = b.op("Slice", shape, b.const(np.array([-1], np.int64)),
                b.const(np.array([2**63 - 1], np.int64)))  # fmt: skip
    scale = b.op("Sqrt", b.op("Cast", last, to=1))
    first = b.op("Gather", shape, b.const(np.array([0], np.int64)), axis=0)  # varies
    target = b.op("Concat", first, b.const(np.array([-1], np.int64)), axis=0)
    b.output(b.op("Mul", b.op("Reshape", x, target), scale), "y")
    graph = b.build()
    model = _agree(graph, {"x": _rng_feed((2, 3, 4))}, {"shapes", "fold"})
    _agree(graph, {"x": _rng_feed((5, 3, 4))}, {"shapes", "fold"})
    ops = _ops(model)
    assert "Slice" not in ops and "Sqrt" not in ops and "Cast" not in ops
    assert ops["Gather"] == 1 and ops["Shape"] == 1  # the batch dim stays computed
    np.testing.assert_allclose(
        model.run({"x": np.ones((2, 3, 4), F32)})["y"], np.full((2, 12), 2.0, F32)
    )


def test_dead_code_removed_but_custom_kernels_kept() -> None:
    calls = []

    def side_effect(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return x

    b = GraphBuilder("dead")
    x = b.input("x", F32, (3,))
    b.op("Exp", b.op("Abs", x))  # unread: dead
    b.op("Effect", x, domain="app")  # unread, but a custom kernel may have side effects
    b.output(b.op("Neg", x), "y")
    graph = b.build()
    model = tfrt_py.load(graph, optimize={"dce"}, custom_kernels={("app", "Effect"): side_effect})
    assert _ops(model) == Counter({"Effect": 1, "Neg": 1})
    model.run({"x": np.ones(3, F32)})
    assert calls == [1]
    assert _report(model, "dce") == "removed 2 dead nodes"


def test_common_subexpressions_merged() -> None:
    b = GraphBuilder("cse")
    x = b.input("x", F32, (2, 4))
    w1, w2 = b.const(np.ones((4, 4), F32)), b.const(np.ones((4, 4), F32))  # equal constants
    a = b.op("Relu", b.op("MatMul", x, w1))
    c = b.op("Relu", b.op("MatMul", x, w2))
    b.output(b.op("Add", a, c), "y")
    model = _agree(b.build(), {"x": _rng_feed((2, 4))}, {"cse"})
    assert _ops(model) == Counter({"MatMul": 1, "Relu": 1, "Add": 1})
    assert _report(model, "cse") == "merged 2 nodes and 1 constants"


def test_many_duplicates_merge_in_one_walk_of_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """skl2onnx's IsolationForest repeats one Gather per tree: 500 trees made CSE walk the
    13k-node graph 999 times (21 s of a load). Duplicates now merge in one walk; only a
    duplicate that is a graph output (it keeps its name) is replaced on its own."""
    from tfrt_py.compiler import rewrite

    b = GraphBuilder("dups")
    x = b.input("x", F32, (2, 4))
    k = b.const(np.array([2.0], F32))
    copies = [b.op("Mul", b.op("Relu", x), k) for _ in range(300)]
    total = copies[0]
    for c in copies[1:]:
        total = b.op("Add", total, c)
    b.output(total, "y")
    b.output(copies[7], "one_copy")  # a duplicate that is an output
    walks: list[int] = []
    real = rewrite._replace_in

    def counting(*a: Any) -> None:
        walks.append(1)
        real(*a)

    monkeypatch.setattr(rewrite, "_replace_in", counting)
    model = _agree(b.build(), {"x": _rng_feed((2, 4))}, {"cse"})
    assert _ops(model) == Counter({"Relu": 1, "Mul": 1, "Add": 299})
    assert _report(model, "cse") == "merged 598 nodes and 0 constants"
    assert len(walks) <= 2  # the output's Relu and Mul, not one per duplicate


def test_hoist_over_concat_is_m3s_rewrite() -> None:
    case = build("anchor_m3")
    model = tfrt_py.load(case.model, optimize={"hoist"})
    assert _ops(model) == Counter({"Concat": 1, "Div": 1, "Gemm": 2, "Relu": 1, "Sigmoid": 1})
    assert _report(model, "hoist") == "hoisted 1 ops over Concat (17 kernels fewer per call)"
    plain = tfrt_py.load(case.model, optimize=False)
    feed = case.feeds[0]
    for _ in range(2):
        got, want = model.run(feed), plain.run(feed)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_hoist_unary_and_broadcast_constants() -> None:
    b = GraphBuilder("hoist")
    xs = [b.input(f"x{i}", F32, (2, i + 1)) for i in range(3)]
    relu = [b.op("Relu", x) for x in xs]
    scaled = [b.op("Mul", b.const(np.array([0.5 * (i + 1)], F32)), r) for i, r in enumerate(relu)]
    b.output(b.op("Concat", *scaled, axis=1), "y")
    feeds = {f"x{i}": _rng_feed((2, i + 1), i) for i in range(3)}
    model = _agree(b.build(), feeds, {"shapes", "hoist"})
    # Mul hoisted over the Concat of Relus; the Relus then hoisted over the new Concat.
    assert _ops(model) == Counter({"Concat": 1, "Relu": 1, "Mul": 1})
    assert _report(model, "hoist") == "hoisted 2 ops over Concat (4 kernels fewer per call)"


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
     ("MaxPool", {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [1, 0, 0, 1]}),
     ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                      "count_include_pad": 1})],
)  # fmt: skip
def test_pool_pushed_below_its_channel_join(op: str, attrs: dict[str, Any]) -> None:
    """``Pool(Concat(x0, x1, x2, axis=1))`` -> ``Concat(Pool(x0), Pool(x1), Pool(x2))``:
    the same values (a pool reads one plane), NaN and -inf included, at two batches."""
    b = GraphBuilder("pooled_join")
    xs = [b.input(f"x{i}", F32, ("n", c, 9, 9)) for i, c in enumerate((2, 3, 1))]
    parts = [b.op("Relu", xs[0]), xs[1], b.op("Sigmoid", xs[2])]  # nothing to hoist over it
    b.output(b.op(op, b.op("Concat", *parts, axis=-3), **attrs), "y")
    graph = b.build()
    for n in (1, 2):
        feeds = {f"x{i}": _rng_feed((n, c, 9, 9), i) for i, c in enumerate((2, 3, 1))}
        feeds["x1"][0, 1, 4, 4] = np.nan
        feeds["x0"][-1, 0, 0, :] = np.inf
        model = _agree(graph, feeds, {"shapes", "hoist"})
    assert _ops(model) == Counter({op: 3, "Concat": 1, "Relu": 1, "Sigmoid": 1})
    assert _report(model, "hoist") == "1 pools pushed below their Concat"


def test_pool_stays_after_a_join_it_does_not_own() -> None:
    """No rewrite where the join is not over the channels, is read by another node too, or
    the pool also gives its Indices."""
    b = GraphBuilder("joins")
    x0, x1 = (b.input(f"x{i}", F32, (1, 2, 6, 6)) for i in range(2))
    mp: dict[str, Any] = {"kernel_shape": [2, 2], "strides": [2, 2]}
    b.output(b.op("MaxPool", b.op("Concat", x0, x1, axis=2), **mp), "rows")
    shared = b.op("Concat", x0, x1, axis=1)
    b.output(b.op("MaxPool", shared, **mp), "pooled")
    b.output(b.op("Relu", shared), "relu")
    y, idx = b.op("MaxPool", b.op("Concat", x1, x0, axis=1), n_outputs=2, **mp)
    b.output(y, "y")
    b.output(idx, "indices")
    feeds = {f"x{i}": _rng_feed((1, 2, 6, 6), i) for i in range(2)}
    model = _agree(b.build(), feeds, {"shapes", "hoist"})
    assert _ops(model) == Counter({"MaxPool": 3, "Concat": 3, "Relu": 1})
    assert _report(model, "hoist") == "nothing to hoist"


def _join_conv(b: GraphBuilder, parts: list[Value], cin: int, out: int, k: int,
               seed: int) -> Value:  # fmt: skip
    """Conv(Concat(parts, axis=1)) over ``cin`` channels with constant random weights and
    bias, same padding."""
    rng = np.random.default_rng(seed)
    w = b.const((rng.standard_normal((out, cin, k, k)) * 0.1).astype(F32))
    bias = b.const(rng.standard_normal(out).astype(F32))
    return b.op("Conv", b.op("Concat", *parts, axis=1), w, bias, pads=[k // 2] * 4)


@pytest.mark.parametrize(
    ("channels", "k", "act"), [((8, 16, 12), 3, "Relu"), ((64, 80), 1, "Clip")]
)
def test_conv_over_a_join_reads_its_parts(channels: tuple[int, ...], k: int, act: str) -> None:
    """A fused conv reading a channel join becomes a chain of convs over the parts, each
    adding the one before as its residual, the last with the bias and the activation: no
    Concat runs; the values agree to float rounding at two batches."""
    b = GraphBuilder("conv_join")
    xs = [b.input(f"x{i}", F32, ("n", c, 7, 7)) for i, c in enumerate(channels)]
    y = _join_conv(b, xs, sum(channels), 10, k, 3)
    if act == "Clip":
        y = b.op("Clip", y, b.const(np.float32(0.0)), b.const(np.float32(0.5)))
    else:
        y = b.op(act, y)
    b.output(y, "y")
    graph = b.build()
    for n in (1, 3):
        feeds = {f"x{i}": _rng_feed((n, c, 7, 7), i) for i, c in enumerate(channels)}
        model = _agree(graph, feeds, {"shapes", "fuse_conv", "hoist"})
    assert _ops(model) == Counter({"Conv": len(channels)})
    assert _report(model, "hoist") == "1 convs over their Concat's parts"


def test_conv_stays_over_a_join_it_cannot_split() -> None:
    """No split for a conv with a residual of its own, one whose join has a part of few
    channels, one of more filters than its join has channels (the chain's passes over its
    output would cost more than the join), or a join two convs read."""
    b = GraphBuilder("joins")
    x0, x1 = b.input("x0", F32, (1, 16, 6, 6)), b.input("x1", F32, (1, 16, 6, 6))
    y = _join_conv(b, [x0, x1], 32, 16, 3, 1)
    b.output(b.op("Add", y, x0), "residual")
    thin = b.input("thin", F32, (1, 4, 6, 6))
    b.output(_join_conv(b, [x0, thin], 20, 8, 3, 2), "thin_part")
    x2, x3 = b.input("x2", F32, (1, 32, 6, 6)), b.input("x3", F32, (1, 32, 6, 6))
    b.output(b.op("Relu", _join_conv(b, [x2, x3], 64, 64, 3, 4)), "wide")  # 64 of 64
    shared = b.op("Concat", x1, x0, axis=1)
    w = b.const(np.ones((4, 32, 1, 1), F32))
    b.output(b.op("Conv", shared, w), "a")
    b.output(b.op("Conv", shared, w, strides=[2, 2]), "b")
    feeds = {"x0": _rng_feed((1, 16, 6, 6), 0), "x1": _rng_feed((1, 16, 6, 6), 1),
             "thin": _rng_feed((1, 4, 6, 6), 2), "x2": _rng_feed((1, 32, 6, 6), 3),
             "x3": _rng_feed((1, 32, 6, 6), 4)}  # fmt: skip
    model = _agree(b.build(), feeds, {"shapes", "fuse_conv", "hoist"})
    assert _ops(model) == Counter({"Conv": 5, "Concat": 4})  # the Relu fused
    assert _report(model, "hoist") == "nothing to hoist"


def test_fuse_linear_matmul_bias_activation() -> None:
    rng = np.random.default_rng(0)
    b = GraphBuilder("linear")
    x = b.input("x", F32, (3, 8))
    w = b.const(rng.standard_normal((8, 6)).astype(F32))
    h = b.op("Relu", b.op("Add", b.const(np.full(6, 0.1, F32)), b.op("MatMul", x, w)))
    w2 = b.const(rng.standard_normal((5, 6)).astype(F32))
    b2 = b.const(rng.standard_normal((1, 5)).astype(F32))
    g = b.op("Gemm", h, w2, b2, transB=1, alpha=0.5, beta=2.0)
    g = b.op("Clip", g, b.const(np.float32(-0.5)), b.const(np.float32(0.5)))
    scaled = b.op("Div", g, b.const(np.array([1.0, 2.0, 4.0, 8.0, 16.0], F32)))
    b.output(b.op("MatMul", scaled, b.const(rng.standard_normal((5, 2)).astype(F32))), "y")
    model = _agree(b.build(), {"x": _rng_feed((3, 8))}, {"shapes", "fuse_linear"})
    assert _ops(model) == Counter({"Linear": 3})
    assert _report(model, "fuse_linear") == (
        "3 Linear nodes (2 with bias, 2 with activation, 1 input scalings and 0 output "
        "scalings folded into the weights)"
    )


def _head_split(b: GraphBuilder, x: Value, w: Any, perm: list[int]) -> Value:
    """(B, S, 8) -> Linear -> (B, S, 2, 4) -> Transpose(perm): an attention head split."""
    h = b.op("Add", b.op("MatMul", x, b.const(w)), b.const(np.linspace(-1, 1, 8).astype(F32)))
    return b.op("Transpose", b.op("Reshape", h, b.const(np.array([0, 0, 2, 4], np.int64))),
                perm=perm)  # fmt: skip


def test_fuse_linear_folds_a_scaling_after_the_head_split() -> None:
    w = np.random.default_rng(1).standard_normal((8, 8)).astype(F32)
    b = GraphBuilder("qk_scale")
    x = b.input("x", F32, ("batch", "seq", 8))
    q = b.op("Mul", _head_split(b, x, w, [0, 2, 1, 3]), b.const(np.float32(0.42)))
    k = b.op("Mul", b.const(np.array([0.42], F32)), _head_split(b, x, w, [0, 2, 3, 1]))
    b.output(b.op("MatMul", q, k), "scores")
    graph = b.build()
    for shape in ((1, 3, 8), (2, 5, 8)):
        model = _agree(graph, {"x": _rng_feed(shape)}, {"shapes", "fuse_linear"})
    assert _ops(model) == Counter({"Linear": 2, "Reshape": 2, "Transpose": 2, "MatMul": 1})
    assert "2 output scalings" in _report(model, "fuse_linear")


@pytest.mark.parametrize("case", ["activation", "read_twice", "per_column", "above_one"])
def test_fuse_linear_keeps_a_scaling_it_cannot_fold(case: str) -> None:
    w = np.random.default_rng(2).standard_normal((8, 8)).astype(F32)
    b = GraphBuilder("kept_scale")
    x = b.input("x", F32, (2, 3, 8))
    h = b.op("MatMul", x, b.const(w))
    h = b.op("Relu", h) if case == "activation" else h  # relu(x) * c: c must stay after
    t = b.op("Transpose", b.op("Reshape", h, b.const(np.array([0, 0, 2, 4], np.int64))),
             perm=[0, 2, 1, 3])  # fmt: skip
    c = np.linspace(0.5, 2, 4).astype(F32) if case == "per_column" else np.float32(-0.5)
    c = np.float32(2.0) if case == "above_one" else c  # W c or x W c could overflow
    b.output(b.op("Mul", t, b.const(c)), "y")
    if case == "read_twice":
        b.output(b.op("Neg", t), "t")
    model = _agree(b.build(), {"x": _rng_feed((2, 3, 8))}, {"shapes", "fuse_linear"})
    assert _ops(model)["Mul"] == 1
    assert "0 output scalings" in _report(model, "fuse_linear")


def test_fuse_elementwise_chains() -> None:
    b = GraphBuilder("chains")
    x = b.input("x", F32, (4, 8))
    h = b.op("Tanh", b.op("Mul", b.op("Add", x, b.const(np.ones(8, F32))), b.const(F32(0.5))))
    swish = b.op("Mul", h, b.op("Sigmoid", h))  # h read twice: the "shared" chain
    b.output(b.op("Abs", swish), "y")
    model = _agree(b.build(), {"x": _rng_feed((4, 8))}, {"shapes", "fuse_elementwise"})
    assert _ops(model) == Counter({"ElementwiseChain": 1, "ElementwiseChainShared": 1})
    assert _report(model, "fuse_elementwise") == "2 chains (6 ops, longest 3)"


# -- the pipeline ---------------------------------------------------------------------------------


@PROPERTY
@given(random_graph())
def test_all_passes_keep_random_graphs_equal(case: Any) -> None:
    graph, feeds = case
    _agree(graph, feeds, None)


@pytest.mark.parametrize(
    "name", ["mlp", "cnn", "transformer_erf", "transformer_gelu20", "recommender", "if_loop"]
)
@pytest.mark.parametrize("only", PASSES)
def test_each_pass_alone_keeps_test_models_equal(name: str, only: str) -> None:
    case = build(name)
    assert_agrees_with_unoptimized(tfrt_py.load(case.model, optimize={only, "shapes"}), case)


def test_passes_switch_off_by_argument_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    case = build("anchor_m2")
    assert "fuse_linear: off" in tfrt_py.load(case.model, optimize={"fold"}).describe()
    monkeypatch.setenv(ENV_DISABLE, "fuse_linear, cse")
    text = tfrt_py.load(case.model).describe()
    assert "fuse_linear: off" in text and "cse: off" in text and "fold: folded" in text
    monkeypatch.setenv(ENV_DISABLE, "nonsense")
    with pytest.raises(ValueError, match="unknown optimization pass"):
        tfrt_py.load(case.model)
    monkeypatch.delenv(ENV_DISABLE)
    with pytest.raises(ValueError, match="fuse_linear"):
        tfrt_py.load(case.model, optimize={"fuse"})


def test_the_callers_graph_is_not_mutated() -> None:
    b = GraphBuilder("mine")
    x = b.input("x", F32, (2, 2))
    b.output(b.op("Relu", b.op("Identity", b.op("MatMul", x, b.const(np.eye(2, dtype=F32))))), "y")
    graph = b.build()
    before = [(n.op_type, [v.name for v in n.outputs if v]) for n in graph.nodes]
    tfrt_py.load(graph)
    assert [(n.op_type, [v.name for v in n.outputs if v]) for n in graph.nodes] == before
    assert all(_out(n).type is None for n in graph.nodes[:-1])


def test_describe_reports_every_pass_and_the_loaded_ops() -> None:
    model = tfrt_py.load(build("anchor_m3").model)
    model.run(build("anchor_m3").feeds[0])
    text = model.describe()
    for name in PASSES:
        assert f"    {name}: " in text
    assert "Div x18" in text and "memory: 1 plan(s)" in text


# -- the cost model -------------------------------------------------------------------------


def test_costs_from_shapes() -> None:
    b = GraphBuilder("costs")
    x = b.input("x", F32, (4, 64))
    h = b.op("MatMul", x, b.const(np.ones((64, 32), F32)))
    h = b.op("Relu", h)
    b.output(b.op("Reshape", h, b.const(np.array([-1], np.int64))), "y")
    model = tfrt_py.load(b.build(), optimize={"shapes"})
    mm, relu, reshape = model.graph.nodes
    reg = model.prepared.registry
    assert estimate_cost(mm, reg).flops == 2 * 4 * 64 * 32
    assert estimate_cost(relu, reg).flops == 4 * 32
    assert estimate_cost(reshape, reg).flops == 0
    fused = tfrt_py.load(model.graph)  # all passes on the typed graph: MatMul+Relu fuse
    linear = next(n for n in fused.graph.nodes if n.op_type == "Linear")
    assert estimate_cost(linear, fused.prepared.registry).flops >= 2 * 4 * 64 * 32
    assert graph_cost(model.graph, reg).flops == 2 * 4 * 64 * 32 + 4 * 32
