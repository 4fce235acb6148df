"""A hypothesis strategy over small random float32 ``tfrt_py.ir`` graphs (``GraphBuilder``:
elementwise, MatMul/Gemm, Reshape, Concat, Softmax) with feeds, for the planner and the
compiler passes (``test_planner.py``, ``test_compiler.py``). ``fuzz_graphs`` is the other
generator: ONNX models, some deliberately broken, for the frontend and the kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tfrt_py.ir import Graph, GraphBuilder, Value

__all__ = ["PROPERTY", "random_graph"]

F32 = np.float32
#: The settings of the property tests over ``random_graph``: derandomized, 40 examples.
PROPERTY = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Identity")
_BINARY = ("Add", "Sub", "Mul")


def _grow(b: GraphBuilder, vals: list[tuple[Value, tuple[int, ...]]], data: Any, i: int) -> None:
    """Append one random node reading existing values."""
    rng_seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(rng_seed)
    kind = data.draw(
        st.sampled_from(("unary", "binary", "const", "matmul", "reshape", "concat", "softmax")),
        label=f"op{i}",
    )
    x, shape = vals[data.draw(st.integers(0, len(vals) - 1), label="x")]
    if kind == "unary":
        op = data.draw(st.sampled_from(_UNARY))
        vals.append((b.op(op, x), shape))
    elif kind in ("binary", "const"):
        op = data.draw(st.sampled_from(_BINARY))
        same = [v for v, s in vals if s == shape]
        if kind == "const" or len(same) < 2:
            y = b.const((rng.standard_normal(shape[-1:]) * 0.5).astype(F32))
        else:
            y = same[data.draw(st.integers(0, len(same) - 1))]
        args = (x, y) if data.draw(st.booleans()) else (y, x)
        vals.append((b.op(op, *args), shape))
    elif kind == "matmul":
        n = data.draw(st.sampled_from((4, 8, 12)))
        w = b.const((rng.standard_normal((shape[-1], n)) / np.sqrt(shape[-1])).astype(F32))
        if data.draw(st.booleans()):
            bias = b.const((rng.standard_normal(n) * 0.1).astype(F32))
            y = (
                b.op("Gemm", x, w, bias)
                if len(shape) == 2
                else b.op("Add", b.op("MatMul", x, w), bias)
            )
        else:
            y = b.op("MatMul", x, w)
        vals.append((y, (*shape[:-1], n)))
    elif kind == "reshape":
        flat = (int(np.prod(shape)),) if len(shape) == 2 else (shape[0], int(np.prod(shape[1:])))
        target = b.const(np.array(flat if len(shape) > 2 else (*shape[::-1],), np.int64))
        new_shape = flat if len(shape) > 2 else shape[::-1]
        vals.append((b.op("Reshape", x, target), tuple(new_shape)))
    elif kind == "concat":
        same = [v for v, s in vals if len(s) == len(shape) and s[:-1] == shape[:-1]]
        other = same[data.draw(st.integers(0, len(same) - 1))]
        other_shape = next(s for v, s in vals if v is other)
        y = b.op("Concat", x, other, axis=-1)
        vals.append((y, (*shape[:-1], shape[-1] + other_shape[-1])))
    else:
        vals.append((b.op("Softmax", x, axis=-1), shape))


@st.composite
def random_graph(draw: Callable[..., Any]) -> tuple[Graph, dict[str, np.ndarray]]:
    """A small random float32 graph and feeds for it."""
    data = draw(st.data())
    b = GraphBuilder("random")
    n_in = data.draw(st.integers(1, 2), label="inputs")
    vals: list[tuple[Value, tuple[int, ...]]] = []
    feeds = {}
    rng = np.random.default_rng(data.draw(st.integers(0, 1000), label="feed seed"))
    for i in range(n_in):
        shape = data.draw(st.sampled_from([(2, 8), (3, 4), (1, 2, 8)]), label="shape")
        vals.append((b.input(f"x{i}", F32, shape), shape))
        feeds[f"x{i}"] = rng.standard_normal(shape).astype(F32)
    n_ops = data.draw(st.integers(1, 12), label="ops")
    for i in range(n_ops):
        _grow(b, vals, data, i)
    n_out = data.draw(st.integers(1, 3), label="outputs")
    picks = data.draw(
        st.lists(st.integers(0, len(vals) - 1), min_size=n_out, max_size=n_out), label="outs"
    )
    for k, idx in enumerate(picks):
        v = vals[idx][0]
        if any(v is o for o in b._graph.outputs) or any(v is x for x in b._graph.inputs):
            v = b.op("Identity", v)
        b.output(v, f"y{k}")
    return b.build(), feeds
