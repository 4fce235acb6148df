"""The LLVM IR kernel of a few rows times a matrix of many rows (``kernels/lib/rowvec_ir``,
a decode step's probabilities times a KV cache's values): on every vector width the host
has, the sums match float64 NumPy on shapes around the vector, block, partial-sum and
row-group edges,
NaN and infinities propagate, and nothing past the row of sums is written; a decoder's
box of past lengths calls it and generates onnxruntime's tokens."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the kernel is LLVM IR built with llvmlite")

from tests.support.jit_paths import need_lanes
from tfrt_py.kernels.lib import rowvec_ir

_PROTO = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)  # fmt: skip


ROWS = [1, 2, 3, 4, 5, 9]  # rows of a (a group's query rows: 4 a pass with AVX-512, 2 AVX2)
SHAPES = [  # (rows k, columns n)
    (513, 32), (513, 64), (1, 1), (3, 5), (17, 16), (100, 100), (7, 200), (0, 8),
    (64, 128), (9, 48), (130, 65), (2, 7),
]  # fmt: skip


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_sums_rows_as_numpy(lanes: int) -> None:
    need_lanes(lanes)
    engine = rowvec_ir.build(lanes)
    fn = _PROTO(engine.get_function_address(rowvec_ir.SYMBOL))
    rng = np.random.default_rng(lanes)
    for m, (k, n) in itertools.product(ROWS, SHAPES):
        a = rng.standard_normal(m * k).astype(np.float32)
        b = rng.standard_normal(k * n).astype(np.float32)
        y = np.full(m * n + 19, 5.0, np.float32)  # sentinels past the rows
        assert fn(a.ctypes.data, m, k, b.ctypes.data, n, y.ctypes.data) == 0
        a2, b2 = a.reshape(m, k).astype(np.float64), b.reshape(k, n).astype(np.float64)
        # float32 sums in any order: within k roundings of the products' magnitudes
        bound = 1e-6 + k * np.finfo(np.float32).eps * (abs(a2) @ abs(b2))
        assert (abs(y[: m * n].reshape(m, n) - a2 @ b2) <= bound).all(), f"{(m, k, n)}"
        assert (y[m * n :] == 5.0).all(), f"written past the rows at {(m, k, n)}"
    a = np.ones(40, np.float32)
    b = np.ones(40 * 20, np.float32)
    b[7 * 20 + 3], b[11 * 20 + 18] = np.nan, np.inf
    y = np.zeros(20, np.float32)
    fn(a.ctypes.data, 1, 40, b.ctypes.data, 20, y.ctypes.data)
    assert np.isnan(y[3]) and np.isposinf(y[18]) and (y[[0, 1, 2, 17, 19]] == 40.0).all()


@pytest.mark.compiles
def test_a_decoders_box_calls_it_and_generates_onnxruntimes_tokens() -> None:
    """Greedy decoding of 58 tokens after 4 (4 heads of 16, pasts up to 61): the box of
    pasts 17..128 writes each head's attention output as a ``rowvec_f4`` call, and the
    tokens are onnxruntime's (grouped KV heads: ``test_dotrows_ir``)."""
    pytest.importorskip("numba", reason="the native tier needs numba")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    if rowvec_ir.kernel() is None:
        pytest.skip(f"the kernel does not run here ({rowvec_ir.describe() or 'off'})")
    if rowvec_ir.lanes() > 16:  # pragma: no cover - no such width today
        pytest.skip("heads of 16 are narrower than this host's vectors")
    import tfrt_py
    from tests.support.models.decoder import decoder, reference_greedy

    onx = decoder(kv_heads=4, head_dim=16).SerializeToString()
    model = tfrt_py.load(onx, executor="native", native="eager")
    prompt = [3, 14, 15, 9]
    got = model.generate(prompt, max_new_tokens=58)
    session = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, reference_greedy(session, [prompt], 58)[0])
    box = model.native.sigs.get(("box", ((0, 1), (0, 1), (16, 128))))
    assert box is not None and box.state == "ready" and box.lowered is not None
    assert "rowvec_f4(" in box.lowered.source
