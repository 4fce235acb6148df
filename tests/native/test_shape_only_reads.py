"""A node whose outputs only a Shape reads does not run in native code
(``graph._only_shape_read``: T5's K heads, whose Transpose a Shape sizes a Reshape by);
the function still agrees with the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import Graph, GraphBuilder
from tfrt_py.native.lower.graph import lower

F32 = np.float32
RNG = np.random.default_rng(37)


def _sized_by_a_transpose() -> Graph:
    """y = Reshape(Relu(x) @ W, (-1, Shape(Transpose(Neg(x)))[2])), the length S: the
    Transpose's data is never read, only its (dynamic) shape."""
    b = GraphBuilder("sized")
    x = b.input("x", F32, ("B", "S", 8))
    t = b.op("Transpose", b.op("Neg", x), perm=[0, 2, 1])
    width = b.op("Gather", b.op("Shape", t), b.const(np.array([2], np.int64)))
    target = b.op("Concat", b.const(np.array([-1], np.int64)), width, axis=0)
    w = RNG.standard_normal((8, 8)).astype(F32)
    b.output(b.op("Reshape", b.op("MatMul", b.op("Relu", x), b.const(w)), target), "y")
    return b.build()


@pytest.mark.compiles
def test_a_node_only_a_shape_reads_does_not_run() -> None:
    g = _sized_by_a_transpose()
    sync = tfrt_py.load(g, executor="sync")
    prepared = sync.prepared
    t = next(i for i, n in enumerate(prepared.graph.nodes) if n.op_type == "Transpose")
    source = lower(prepared.graph, prepared.program, shapes=[(2, 5, 8)]).source
    assert f"# node {t}: only its shape is read" in source
    native = tfrt_py.load(g, executor="native", native="eager")
    for shape in [(2, 5, 8), (1, 9, 8), (3, 17, 8)]:
        feeds = {"x": RNG.standard_normal(shape).astype(F32)}
        native.run(feeds)
        native.native.wait(120)
        got, want = native.run(feeds), sync.run(feeds)
        assert got["y"].shape == want["y"].shape == (shape[0] * 8, shape[1])
        np.testing.assert_allclose(got["y"], want["y"], rtol=2e-5, atol=2e-6)
    assert native.native.sigs and all(j.lowered is not None for j in native.native.sigs.values())
