"""The LLVM IR kernel of a few query rows against many key rows (``kernels/lib/dotrows_ir``,
a decode step's attention scores with grouped KV heads): on every vector width the host
has, the scores match float64 NumPy on shapes around the vector, block and query-group
edges, NaN and infinities reach exactly their scores, rows longer than the kernel takes are
refused with nothing written, and nothing past the scores is written; a decoder with
grouped KV heads calls it (and the grouped values product) and generates onnxruntime's
tokens, one prompt and a left-padded batch."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the kernel is LLVM IR built with llvmlite")

from tests.support.jit_paths import need_lanes
from tfrt_py.kernels.lib import dotrows_ir

_PROTO = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_float)  # fmt: skip


QUERY_ROWS = [1, 2, 3, 4, 5, 9]
SHAPES = [  # (key rows n, row length k)
    (513, 32), (129, 64), (17, 128), (16, 16), (15, 17), (33, 8), (7, 1), (1, 5), (0, 32),
    (40, 0), (65, 100),
]  # fmt: skip


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_scores_rows_as_numpy(lanes: int) -> None:
    need_lanes(lanes)
    engine = dotrows_ir.build(lanes)
    fn = _PROTO(engine.get_function_address(dotrows_ir.SYMBOL))
    rng = np.random.default_rng(lanes)
    longest = dotrows_ir.max_k(lanes)
    for m in QUERY_ROWS:
        for n, k in [*SHAPES, (9, longest), (9, longest + 1)]:
            a = rng.standard_normal(m * k).astype(np.float32)
            b = rng.standard_normal(n * k).astype(np.float32)
            y = np.full(m * n + 19, 5.0, np.float32)  # sentinels past the scores
            got = fn(a.ctypes.data, m, k, b.ctypes.data, n, y.ctypes.data, 0.25)
            if k > longest:
                assert got == -1 and (y == 5.0).all(), f"row of {k} not refused"
                continue
            assert got == 0
            a2, b2 = a.reshape(m, k).astype(np.float64), b.reshape(n, k).T.astype(np.float64)
            # float32 sums in any order: within k roundings of the products' magnitudes
            bound = 1e-6 + 0.25 * k * np.finfo(np.float32).eps * (abs(a2) @ abs(b2))
            got_y = y[: m * n].reshape(m, n)
            assert (abs(got_y - 0.25 * (a2 @ b2)) <= bound).all(), f"{(m, n, k)}"
            assert (y[m * n :] == 5.0).all(), f"written past the scores at {(m, n, k)}"
    a = np.ones(3 * 20, np.float32)
    b = np.ones(40 * 20, np.float32)
    b[7 * 20 + 3], b[31 * 20 + 18] = np.nan, np.inf  # keys 7 and 31
    y = np.zeros(3 * 40, np.float32)
    fn(a.ctypes.data, 3, 20, b.ctypes.data, 40, y.ctypes.data, 1.0)
    scores = y.reshape(3, 40)
    assert np.isnan(scores[:, 7]).all() and np.isposinf(scores[:, 31]).all()
    assert (np.delete(scores, [7, 31], axis=1) == 20.0).all()


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_a_vector_count_runs_once_its_function_is_built(lanes: int) -> None:
    """The process's kernel builds only the table's caller: a row length whose vector
    count is not built yet is refused (-1, nothing written); once ``add_count`` built
    that count, the same call computes the scores, and other counts are still refused."""
    need_lanes(lanes)
    engine = dotrows_ir.build(lanes, 0)
    fn = _PROTO(engine.get_function_address(dotrows_ir.SYMBOL))
    rng = np.random.default_rng(1)
    m, n, k = 3, 21, 2 * lanes - 3  # two vectors, the second masked
    a = rng.standard_normal(m * k).astype(np.float32)
    b = rng.standard_normal(n * k).astype(np.float32)
    y = np.full(m * n, 5.0, np.float32)
    assert fn(a.ctypes.data, m, k, b.ctypes.data, n, y.ctypes.data, 1.0) == -1
    assert (y == 5.0).all()
    dotrows_ir.add_count(engine, lanes, dotrows_ir.chunks_of(k, lanes))
    assert fn(a.ctypes.data, m, k, b.ctypes.data, n, y.ctypes.data, 1.0) == 0
    want = a.reshape(m, k).astype(np.float64) @ b.reshape(n, k).T.astype(np.float64)
    np.testing.assert_allclose(y.reshape(m, n), want, rtol=1e-5, atol=1e-5)
    y[:] = 5.0
    assert fn(a.ctypes.data, 1, lanes, b.ctypes.data, n, y.ctypes.data, 1.0) == -1
    assert (y == 5.0).all()
    # rows of no float need no count: every score 0
    assert fn(a.ctypes.data, m, 0, b.ctypes.data, n, y.ctypes.data, 1.0) == 0
    assert (y == 0.0).all()


def test_generated_code_imports_the_wrapper_by_a_count_up_to_the_longest_rows() -> None:
    """``wrapper_name`` names counts 1..CHUNKS; a name past them is no attribute."""
    if dotrows_ir.kernel() is None:
        pytest.skip(f"the kernel does not run here ({dotrows_ir.describe() or 'off'})")
    assert dotrows_ir.wrapper_name(1) == "dotrows_f4_c1"
    assert dotrows_ir.wrapper_name(dotrows_ir.max_k()) == f"dotrows_f4_c{dotrows_ir.CHUNKS}"
    assert dotrows_ir.dotrows_f4_c1 is dotrows_ir.kernel()
    with pytest.raises(AttributeError):
        getattr(dotrows_ir, f"dotrows_f4_c{dotrows_ir.CHUNKS + 1}")
    assert not dotrows_ir.ready(dotrows_ir.max_k() + 1) and not dotrows_ir.ready(0)


@pytest.mark.parametrize(
    "prompts",
    [[[3, 14, 15, 9]], pytest.param([[3, 14, 15, 9], [27, 1]], marks=pytest.mark.slow)],
    ids=["one", "left-padded batch"],
)
@pytest.mark.compiles
def test_grouped_heads_decoder_calls_it_and_generates_onnxruntimes_tokens(
    prompts: list[list[int]],
) -> None:
    """Greedy decoding (8 query heads over 2 KV heads of 16): the box of pasts 17..128
    computes each group's scores as one ``dotrows_f4`` call over its 4 query rows and its
    attention output as one ``rowvec_f4`` call over them, and the tokens are
    onnxruntime's."""
    pytest.importorskip("numba", reason="the native tier needs numba")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    from tfrt_py.kernels.lib import rowvec_ir

    if dotrows_ir.kernel() is None or rowvec_ir.kernel() is None:
        pytest.skip(f"the kernels do not run here ({dotrows_ir.describe() or 'off'})")
    if dotrows_ir.lanes() > 16:  # pragma: no cover - no such width today
        pytest.skip("heads of 16 are narrower than this host's vectors")
    import tfrt_py
    from tests.support.models.decoder import decoder, reference_greedy

    onx = decoder(heads=8, kv_heads=2, head_dim=16).SerializeToString()
    model = tfrt_py.load(onx, executor="native", native="eager")
    got = model.generate(prompts, max_new_tokens=56)
    session = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, reference_greedy(session, prompts, 56))
    (box,) = [job for key, job in model.native.sigs.items()
              if key[0] == "box" and key[1][1:] == ((0, 1), (16, 128))]  # fmt: skip
    assert box is not None and box.state == "ready" and box.lowered is not None
    # a group's 4 query rows in one call each
    assert ", 4, 16, 1 + dv2, " in box.lowered.source  # dotrows_f4(..., m, k, n, alpha)
    # heads of 16 floats: the wrapper imported by their vector count's name
    wrapper = dotrows_ir.wrapper_name(16)
    assert f"import {wrapper}" in box.lowered.source and f"{wrapper}(" in box.lowered.source
    assert "rowvec_f4(" in box.lowered.source
    assert ", 4, 1 + dv2, 16)" in box.lowered.source  # rowvec_f4(..., m, k, n)
