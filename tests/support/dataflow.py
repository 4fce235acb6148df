"""Models and helpers shared by the dataflow executor tests (``test_dataflow*.py``); their
fixtures (``executor``, ``host``, ``anyio_backend``, the seeded ready queue) are in
``conftest.py``, and they load models with ``tests.support.executors.load_on``."""

from __future__ import annotations

import threading

import numpy as np

from tfrt_py.ir import Graph, GraphBuilder, Value, tensor_type

__all__ = ["F32", "ROWS", "Calls", "N", "_agree", "_branchy", "_wide"]

F32 = np.float32


def _agree(outs: list[dict[str, np.ndarray]]) -> None:
    for other in outs[1:]:
        assert list(other) == list(outs[0])
        for k, v in outs[0].items():
            np.testing.assert_allclose(other[k], v, rtol=1e-6, atol=1e-7, err_msg=k)


N, ROWS = 1024, 256


def _wide(b: GraphBuilder, x: Value, rng: np.random.Generator) -> Value:
    """An expensive kernel that is not BLAS (concurrent multithreaded BLAS calls thrash on
    the 2-core test machines): ``x [1,N] + C [ROWS,N]`` touches ~2 MB, about a pool hop of
    NumPy work, and its static output type lets any cost estimate see that. Then a cheap
    ReduceMean back to [1,N]."""
    c = b.const((rng.standard_normal((ROWS, N)) * 0.01).astype(F32))
    wide = b.op("Add", x, c, output_types=[tensor_type(F32, (ROWS, N))])
    return b.op("ReduceMean", wide, axes=[0], keepdims=1)


def _branchy() -> Graph:
    """Two parallel branches of two expensive kernels each, cheap ops around them, and a
    second output."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("branchy")
    x = b.input("x", F32, (1, N))
    heads = [_wide(b, b.op("Relu", _wide(b, x, rng)), rng) for _ in range(2)]
    b.output(b.op("Tanh", b.op("Add", heads[0], heads[1])), "y")
    b.output(b.op("Neg", x), "neg")
    return b.build()


class Calls:
    """Counts kernel calls by name (kernels run on many threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def hit(self, name: str) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + 1

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)
