"""MatMulNBits at ``accuracy_level=4`` (``kernels/contrib/matmul_nbits_int8.py``, issue 36):
A quantized to int8 per block as onnxruntime's MLAS does it, then multiplied by the 4-bit
codes in integers (``kernels/lib/qnbits_ir.py``).

The IR kernel in every path this host has (a path it lacks is skipped with the reason),
exactly against an int64 reference at the extremes (codes 0 and 15, ``qa`` at +-127: no
16-bit stage saturates); its quantizer on half-way values (rounding half to even), zero,
inf and NaN blocks; the node against onnxruntime at level 4 (4 bits on the kernel, 8 bits
on the float product of the same quantized A), at row counts around the kernel's row
passes, K not a multiple of the block, each kind of zero point (float ones keep level 0's
product, as onnxruntime's); the kernel is what ran, the weight is held once in its
layout, and the float fallback answers the same."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import nbits_inputs, node_model, ort_outputs, runtime_feeds
from tfrt_py.kernels.contrib import matmul_nbits, matmul_nbits_int8
from tfrt_py.kernels.lib import qnbits_ir
from tfrt_py.native.runtime.entry import ROUNDING_TOL, agree, rounding_tolerance

RNG = np.random.default_rng(39)
F32 = np.float32


def _host_paths() -> list[str]:
    try:
        return qnbits_ir.host_paths()
    except ImportError:  # no llvmlite
        return []


def _engine_fns(path: str) -> tuple[Any, Any, Any]:
    engine = qnbits_ir.build(path)
    p, n = ctypes.c_void_p, ctypes.c_int64
    gemv = ctypes.CFUNCTYPE(n, p, p, p, p, p, p, n, n, n, n, n, n)(
        engine.get_function_address(qnbits_ir.SYMBOL)
    )
    quant = ctypes.CFUNCTYPE(n, p, n, n, n, p, p)(
        engine.get_function_address(qnbits_ir.SYMBOL_QUANT)
    )
    return engine, gemv, quant


def _panels(a: np.ndarray, dt: Any) -> np.ndarray:
    n, r = a.shape
    panels = -(-n // 64)
    out = np.zeros((panels * 64, r), dt)
    out[:n] = a
    return np.ascontiguousarray(out.reshape(panels, 64, r).transpose(0, 2, 1))


@pytest.mark.parametrize("path", list(qnbits_ir.PATHS))
def test_every_path_sums_the_blocks_exactly(path: str) -> None:
    """The product kernel through ctypes: per block the exact integer sum of ``qa * code``
    (codes at 15 against ``qa`` at +-127, the largest pair sums a 16-bit stage could
    meet), times the two scales, less the zero point's term; rows in passes of the
    path's ``ROWS`` and the rows left; columns past N in the last panel."""
    if path not in _host_paths():
        pytest.skip(f"this host has no {path} path ({', '.join(_host_paths()) or 'no llvmlite'})")
    _engine, gemv, _ = _engine_fns(path)  # the engine holds the code: kept alive
    for m, k, n, block in [(1, 64, 64, 16), (3, 256, 130, 32), (7, 512, 70, 128),
                           (9, 128, 200, 64)]:  # fmt: skip
        kb = k // block
        codes = RNG.integers(0, 16, (n, k)).astype(np.uint8)
        codes[0] = 15
        qa = RNG.integers(-127, 128, (m, k)).astype(np.int8)
        qa[0], qa[-1] = 127, -127
        ablk = RNG.uniform(0.01, 0.1, (m, kb, 2)).astype(F32)
        scale = RNG.uniform(0.01, 0.1, (n, kb)).astype(F32)
        zp = RNG.integers(0, 16, (n, kb)).astype(np.uint8)
        zp[0] = 0
        packed, ps, pz = qnbits_ir.pack(codes), _panels(scale, F32), _panels(zp, np.uint8)
        y = np.full((m, ps.shape[0] * 64), np.nan, F32)
        assert gemv(packed.ctypes.data, qa.ctypes.data, ablk.ctypes.data, ps.ctypes.data,
                    pz.ctypes.data, y.ctypes.data, y.shape[1], m, k // 8, block // 8, 0,
                    ps.shape[0]) == 0  # fmt: skip
        d = np.einsum("rbk,nbk->rbn", qa.reshape(m, kb, block).astype(np.int64),
                      codes.reshape(n, kb, block).astype(np.int64))  # fmt: skip
        want = (ablk[:, :, :1] * scale.T[None] * d
                - ablk[:, :, 1:] * (scale * zp).T[None]).sum(axis=1)  # fmt: skip
        np.testing.assert_allclose(y[:, :n], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert np.all(y[:, n:] == 0)  # the zero columns past N


@pytest.mark.parametrize("path", list(qnbits_ir.PATHS))
def test_every_path_quantizes_a_as_mlas_does(path: str) -> None:
    """The quantizer: per block ``rint(a * 127 / amax)`` (half to even: with amax 127
    the values 2.5, 3.5, -2.5 become 2, 4, -2), ``(amax / 127, amax / 127 * sum q)``; a
    zero block gives zeros; an inf or NaN block gives NaN scales and zero codes; it is
    what the NumPy form (``int8_blocks``) computes."""
    if path not in _host_paths():
        pytest.skip(f"this host has no {path} path ({', '.join(_host_paths()) or 'no llvmlite'})")
    _engine, _, quant = _engine_fns(path)  # the engine holds the code: kept alive
    block, kb, m = 32, 4, 3
    a = RNG.standard_normal((m, kb * block)).astype(F32) * 3
    a[0, :block] = 0.0
    a[0, block : 2 * block] = np.linspace(-4, 4, block)
    a[0, block : block + 5] = [127.0, 2.5, 3.5, -2.5, -0.5]
    a[1, 2 * block + 3] = np.inf
    a[2, 3 * block + 7] = np.nan
    qa = np.full((m, kb * block), 99, np.int8)
    ablk = np.zeros((m, kb, 2), F32)
    assert quant(a.ctypes.data, m, kb * block, block, qa.ctypes.data, ablk.ctypes.data) == 0
    np.testing.assert_array_equal(qa[0, block : block + 5], [127, 2, 4, -2, 0])
    assert np.all(qa[0, :block] == 0) and np.all(ablk[0, 0] == 0)
    assert np.all(np.isnan(ablk[1, 2])) and np.all(qa[1, 2 * block : 3 * block] == 0)
    assert np.all(np.isnan(ablk[2, 3])) and np.all(qa[2, 3 * block :] == 0)
    want_q, want_ablk = matmul_nbits_int8.int8_blocks(a, block, kb)
    np.testing.assert_array_equal(qa, want_q)
    np.testing.assert_array_equal(ablk, want_ablk)  # NaN where both are
    ok = np.isfinite(want_ablk[..., 0])
    sums = want_q.reshape(m, kb, block).astype(np.int64).sum(axis=2)
    np.testing.assert_allclose(want_ablk[..., 1][ok], (want_ablk[..., 0] * sums)[ok], rtol=1e-6)


class _Ctx:
    """What ``NBitsWeight`` raises through (a kernel context's ``unsupported``)."""

    @staticmethod
    def unsupported(message: str) -> ValueError:
        return ValueError(message)


def _model(inputs: list[Any], k: int, n: int, bits: int, block: int, level: int) -> Any:
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": level}
    return node_model("MatMulNBits", inputs, attrs, const=(1, 2, 3))


@pytest.mark.parametrize("m", [1, 3, 4, 5, 40])
@pytest.mark.parametrize(("k", "n", "block"), [(200, 130, 32), (256, 64, 16), (300, 70, 128)])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ["none", "packed"])
@pytest.mark.compiles
def test_level_4_matches_onnxruntime_at_level_4(m: int, k: int, n: int, block: int, bits: int,
                                                 zp: str) -> None:  # fmt: skip
    """Within float rounding of onnxruntime's level-4 answer (its A quantized the same,
    value for value), which differs from level 0's by ~0.5% of the output's scale."""
    inputs = nbits_inputs(RNG, (m,), k, n, bits, block, zp, bias=False)
    feeds = runtime_feeds(inputs, (1, 2, 3))
    model = _model(inputs, k, n, bits, block, 4)
    want = ort_outputs(model, feeds)[0]
    level0 = ort_outputs(_model(inputs, k, n, bits, block, 0), feeds)[0]
    scale = float(np.abs(want).max())
    assert np.abs(level0 - want).max() > 1e-3 * scale  # the levels differ: the test can fail
    for ex in ("sync", "async"):
        got = tfrt_py.load(model, executor=ex).run(feeds)["y0"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * scale)


def test_float_zero_points_keep_level_0s_product_as_onnxruntime_does() -> None:
    """onnxruntime quantizes A at level 4 only with absent or packed zero points; with
    float ones it answers level 0's values, and so does tfrt_py."""
    inputs = nbits_inputs(RNG, (2,), 300, 70, 4, 128, "float", bias=False)
    feeds = runtime_feeds(inputs, (1, 2, 3))
    model = _model(inputs, 300, 70, 4, 128, 4)
    want = ort_outputs(model, feeds)[0]
    np.testing.assert_array_equal(want, ort_outputs(_model(inputs, 300, 70, 4, 128, 0), feeds)[0])
    got = tfrt_py.load(model, executor="sync").run(feeds)["y0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max())


def test_4_bit_codes_take_the_int8_kernel_and_are_held_once() -> None:
    if qnbits_ir.kernel() is None or not matmul_nbits_int8.kernel_ready():
        pytest.skip(f"the int8 kernel is off in this process ({qnbits_ir.describe()})")
    k, n = 256, 130
    inputs = nbits_inputs(RNG, (1,), k, n, 4, 32, "packed", bias=False)
    codes, scales, zps = inputs[1], inputs[2], inputs[3]

    w = matmul_nbits.NBitsWeight(_Ctx(), codes, scales, zps, k, n, 4, 32, int8_a=True)  # type: ignore[arg-type]
    assert w.icodes is not None and w.codes is None and w.scale_zp is None
    assert w.icodes.nbytes == 3 * 64 * k // 2  # 3 panels of 64 columns, 4 bits a code
    a = inputs[0]
    got = matmul_nbits_int8.product(w, a)
    assert got is not None  # the compiled loop ran
    want = ort_outputs(_model(inputs, k, n, 4, 32, 4), runtime_feeds(inputs, (1, 2, 3)))[0]
    np.testing.assert_allclose(got[:, :n], want, rtol=1e-4, atol=2e-6 * np.abs(want).max())
    # the NumPy fallback (the weight dequantized from the kernel's layout) answers the same
    qa_f = matmul_nbits_int8.fake_quantized(a, 32, w.k_blocks)[:, :k]
    np.testing.assert_allclose(qa_f @ w.dequantized(0, 192)[:, :n], want, rtol=1e-4,
                               atol=2e-6 * np.abs(want).max())  # fmt: skip


def test_without_the_kernel_the_float_product_gives_level_4s_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The packed kernels switched off (``$TFRT_PY_PACKED_GEMM=0``, read per call): the
    weight is laid out for the float product and A's int8 blocks are dequantized into it."""
    monkeypatch.setenv("TFRT_PY_PACKED_GEMM", "0")
    assert qnbits_ir.kernel() is None
    for m in (1, 9):
        inputs = nbits_inputs(RNG, (m,), 200, 70, 4, 32, "none", bias=False)
        feeds = runtime_feeds(inputs, (1, 2, 3))
        model = _model(inputs, 200, 70, 4, 32, 4)
        want = ort_outputs(model, feeds)[0]
        got = tfrt_py.load(model, executor="sync").run(feeds)["y0"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max())


def test_switching_the_kernels_off_after_load_takes_the_float_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``$TFRT_PY_PACKED_GEMM=0`` is read per call: a model loaded on the integer kernel
    then multiplies the same int8 blocks through its weight dequantized in NumPy."""
    if qnbits_ir.kernel() is None or not matmul_nbits_int8.kernel_ready():
        pytest.skip(f"the int8 kernel is off in this process ({qnbits_ir.describe()})")
    inputs = nbits_inputs(RNG, (2,), 200, 70, 4, 32, "packed", bias=False)
    feeds = runtime_feeds(inputs, (1, 2, 3))
    model = _model(inputs, 200, 70, 4, 32, 4)
    loaded = tfrt_py.load(model, executor="sync")
    want = ort_outputs(model, feeds)[0]
    monkeypatch.setenv("TFRT_PY_PACKED_GEMM", "0")
    b, scales, zps = inputs[1], inputs[2], inputs[3]
    w = matmul_nbits.NBitsWeight(_Ctx(), b, scales, zps, 200, 70, 4, 32, int8_a=True)  # type: ignore[arg-type]
    assert w.icodes is None  # laid out for the float product while the kernels are off
    got = loaded.run(feeds)["y0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max())


def test_a_non_finite_a_makes_its_rows_nan_and_the_model_stays_usable() -> None:
    inputs = nbits_inputs(RNG, (3,), 64, 70, 4, 32, "packed", bias=False)
    feeds = runtime_feeds(inputs, (1, 2, 3))
    model = tfrt_py.load(_model(inputs, 64, 70, 4, 32, 4), executor="sync")
    bad = dict(feeds)
    bad["i0"] = feeds["i0"].copy()
    bad["i0"][1, 5] = np.inf
    got = model.run(bad)["y0"]
    assert np.all(np.isnan(got[1])) and np.all(np.isfinite(got[[0, 2]]))
    good = model.run(feeds)["y0"]
    np.testing.assert_allclose(good[[0, 2]], got[[0, 2]], rtol=1e-6)


def test_the_native_trial_allows_a_rounding_step_only_for_level_4_models() -> None:
    """Two tiers' level-4 outputs differ where a value upstream crosses a rounding
    boundary (one step of its block: ~1e-3 of an output's scale); the trial comparing
    them allows ``ROUNDING_TOL`` of the scale for such a model and nothing more."""
    inputs = nbits_inputs(RNG, (1,), 64, 70, 4, 32, "packed", bias=False)
    graphs = {
        lvl: tfrt_py.load(_model(inputs, 64, 70, 4, 32, lvl), executor="sync").graph
        for lvl in (0, 4)
    }
    assert rounding_tolerance(graphs[0]) == 0.0
    assert rounding_tolerance(graphs[4]) == ROUNDING_TOL
    want = RNG.standard_normal(1000).astype(F32)
    step = want.copy()
    step[3] += 2e-3 * np.abs(want).max()  # one flipped rounding's size
    assert not agree(step, want) and agree(step, want, ROUNDING_TOL)
    wrong = want.copy()
    wrong[3] += 0.1 * np.abs(want).max()  # a wrong answer stays one
    assert not agree(wrong, want, ROUNDING_TOL)
