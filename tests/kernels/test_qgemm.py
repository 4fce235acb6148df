"""The integer product kernel (``kernels/lib/qgemm_packed.py``) on every path this host has,
and what is built on it: ``lib/qgemm_rows.IntegerWeights`` (MatMulInteger, QLinearMatMul,
QGemm, ...) and ``nn/conv_qint8`` (QLinearConv NCHW, channels-last, depthwise).

Each result is compared exactly with an int64 reference, on random cases with the edges:
codes at both type limits (every product at its extreme: no path may saturate), zero points
at both ends, K not a multiple of the group or the vector width, rows and columns not
whole tiles. A path the host lacks is skipped with the reason; a test that expects the
integer path checks that it ran (the plan exists)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.contrib import edge_codes
from tfrt_py.concurrency import native_threads
from tfrt_py.kernels.lib import qgemm_packed
from tfrt_py.kernels.lib.jit import jit_enabled
from tfrt_py.kernels.lib.qgemm_rows import IntegerWeights
from tfrt_py.kernels.lib.quant import requantize
from tfrt_py.kernels.nn import conv_qdepthwise, conv_qint8

PATHS = ["vnni512", "avx512", "vnni256", "avx2"]
RNG = np.random.default_rng(36)


def _host_paths() -> list[str]:
    try:
        return qgemm_packed.host_paths()
    except ImportError:  # no llvmlite: no path at all
        return ["portable"]


def _need_kernel(numba: bool = False) -> None:
    """Skip unless this process has the integer kernel (and, with ``numba``, the compiled
    loops the convs drive it from)."""
    if qgemm_packed.available() is None:
        pytest.skip(f"no integer kernel in this process ({qgemm_packed.path()[1]})")
    if numba and not jit_enabled():
        pytest.skip("numba is off here ($TFRT_PY_JIT=0 or not installed): convs stay on BLAS")
    if numba and not native_threads.ready():
        pytest.skip(f"numba's thread layer is not running here ({native_threads.state()[1]}): "
                    "the parallel conv loops are off, convs stay on BLAS")  # fmt: skip


def _codes(shape: tuple[int, ...], dt: Any) -> np.ndarray:
    return edge_codes(RNG, shape, dt)


@pytest.mark.parametrize("path", PATHS)
def test_every_path_is_exact_at_the_extremes(path: str) -> None:
    if path not in _host_paths():
        pytest.skip(f"this CPU has no {path} path ({', '.join(_host_paths())})")
    built = qgemm_packed.build(path)
    tile = built.tile
    for m, k, n in [(1, 1, 1), (7, 5, 3), (9, 64, 33), (17, 577, 70), (3, 1100, 130)]:
        a = _codes((m, k), np.uint8)
        w = _codes((k, n), np.int8)
        a[0, :] = 255  # the largest products, summed over the whole of K
        w[:, 0] = -128
        kp = -(-k // tile.g) * tile.g
        a2 = np.zeros((m, kp), qgemm_packed.a_dtype(tile))
        a2[:, :k] = a
        got = qgemm_packed.qgemm(built, a2, qgemm_packed.pack(w, tile), m)[:, :n]
        want = a.astype(np.int64) @ w.astype(np.int64)
        np.testing.assert_array_equal(got, want)
        assert got[0, 0] == 255 * -128 * k


@pytest.mark.parametrize("path", PATHS)
def test_every_path_stores_scaled_floats_as_the_separate_steps(path: str) -> None:
    """The float-storing build (MatMulIntegerToFloat's store): ``float32(acc - a_zp *
    colsum - wz * row_term) * (scale * a_scale) + bias`` equals the int64 reference rounded
    step by step, at the extremes (the largest sums, zero points at both ends, a column
    count that ends inside a vector: nothing stored past it)."""
    if path not in _host_paths():
        pytest.skip(f"this CPU has no {path} path ({', '.join(_host_paths())})")
    built = qgemm_packed.build(path, scaled=True)
    tile = built.tile
    for m, k, n, a_zp in [(1, 1, 1, 0), (7, 5, 3, 255), (9, 64, 33, 0), (17, 577, 70, 128),
                          (3, 1100, 130, 255)]:  # fmt: skip
        a = _codes((m, k), np.uint8).astype(np.int64)
        w = _codes((k, n), np.int8).astype(np.int64)
        a[0, :], w[:, 0] = 255, -128
        packed = qgemm_packed.pack(w, tile)
        npad = packed.shape[0] * tile.nr
        wz = np.zeros(npad, np.int32)
        wz[:n] = RNG.integers(-128, 128, n)
        wz[0] = -128
        colsum = np.zeros(npad, np.int32)
        colsum[:n] = w.sum(axis=0)
        row_term = (a.sum(axis=1) - k * a_zp).astype(np.int32)
        scale, bias = np.zeros(npad, np.float32), np.zeros(npad, np.float32)
        scale[:n] = RNG.uniform(1e-4, 1e-2, n)
        bias[:n] = RNG.standard_normal(n)
        a_scale = np.array([0.037], np.float32)
        kp = -(-k // tile.g) * tile.g
        a2 = np.zeros((m, kp), qgemm_packed.a_dtype(tile))
        a2[:, :k] = a
        y = np.full((m, npad), np.nan, np.float32)
        qgemm_packed.qgemm_scaled(built, a2, packed, m, colsum, wz, row_term, scale, bias,
                                  a_scale, a_zp, n, y)  # fmt: skip
        exact = (a - a_zp) @ (w - wz[:n].astype(np.int64))
        want = exact.astype(np.float32) * (scale[:n] * a_scale[0]) + bias[:n]
        np.testing.assert_array_equal(y[:, :n], want)
        vw = tile.vw
        assert np.isnan(y[:, -(-n // vw) * vw :]).all()  # whole vectors past N: untouched


def test_a_matrix_packed_for_another_path_is_refused() -> None:
    paths = [p for p in PATHS if p in _host_paths()]
    if len(paths) < 2 or all(qgemm_packed.TILES[p].nr == qgemm_packed.TILES[paths[0]].nr
                             and qgemm_packed.TILES[p].g == qgemm_packed.TILES[paths[0]].g
                             for p in paths):  # fmt: skip
        pytest.skip("this CPU has only one integer kernel layout")
    first, other = qgemm_packed.build(paths[0]), qgemm_packed.TILES[paths[-1]]
    packed = qgemm_packed.pack(np.ones((8, 4), np.int8), other)
    a = np.ones((2, 8), qgemm_packed.a_dtype(first.tile))
    with pytest.raises(ValueError, match=r"another path|layout"):
        qgemm_packed.qgemm(first, a, packed, 2)


def test_the_path_is_chosen_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    have = _host_paths()
    for asked in have:
        monkeypatch.setenv(qgemm_packed.ENV_QGEMM, asked)
        assert qgemm_packed.choose_path() == (asked, f"${qgemm_packed.ENV_QGEMM}={asked}")
    monkeypatch.setenv(qgemm_packed.ENV_QGEMM, "sse9")
    path, why = qgemm_packed.choose_path()
    assert path == have[0] and "not a path of this host" in why
    monkeypatch.delenv(qgemm_packed.ENV_QGEMM)
    monkeypatch.setenv("TFRT_PY_ISA", "portable")
    assert qgemm_packed.choose_path()[0] == "portable"


@pytest.mark.parametrize("a_dt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dt", [np.int8, np.uint8])
def test_integer_weights_products_with_zero_points(a_dt: Any, b_dt: Any) -> None:
    _need_kernel()
    for m, k, n in [(1, 3, 5), (16, 130, 40), (5, 259, 3), (96, 700, 260)]:  # the last split
        a, b = _codes((m, k), a_dt), _codes((k, n), b_dt)
        ainfo, binfo = np.iinfo(a_dt), np.iinfo(b_dt)
        for a_zp, b_zp in [
            (None, None),
            (np.array(ainfo.max, a_dt), np.array(binfo.min, b_dt)),
            (RNG.integers(ainfo.min, ainfo.max + 1, m).astype(a_dt),
             RNG.integers(binfo.min, binfo.max + 1, n).astype(b_dt)),
        ]:  # fmt: skip
            plan = IntegerWeights.make(b, b_zp)
            assert plan is not None
            got = plan.product(a, a_zp)
            az = 0 if a_zp is None else a_zp.astype(np.int64).reshape(-1, 1)
            bz = 0 if b_zp is None else b_zp.astype(np.int64)
            want = (a.astype(np.int64) - az) @ (b.astype(np.int64) - bz)
            assert got is not None and got.dtype == np.int32
            np.testing.assert_array_equal(got, want)
    plan = IntegerWeights.make(_codes((4, 2), b_dt), None)
    assert plan is not None
    assert plan.product(np.ones((2, 4), np.float32), None) is None  # not codes: the caller's
    assert plan.product(np.ones((2, 5), a_dt), None) is None  # another K


@pytest.mark.parametrize("a_dt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dt", [np.int8, np.uint8])
def test_scaled_products_are_the_separate_steps_bit_for_bit(a_dt: Any, b_dt: Any) -> None:
    """``product_scaled`` (MatMulIntegerToFloat's store: zero points, scale and bias as the
    kernel's parts store) equals float32(product) * scale + bias, rounded step by step as
    the Cast, Mul and Add nodes it stands for; it runs compiled (not the NumPy fallback)."""
    _need_kernel(numba=True)
    from tfrt_py.kernels.lib import qgemm_rows

    assert qgemm_rows._SCALED.get() is not None
    for m, k, n in [(1, 3, 5), (16, 130, 40), (96, 700, 260)]:  # the last split over parts
        a, b = _codes((2, m, k), a_dt), _codes((k, n), b_dt)
        b_zp = np.array(np.iinfo(b_dt).min + 3, b_dt)
        plan = IntegerWeights.make(b, b_zp)
        assert plan is not None
        scale = RNG.uniform(-1e-3, 1e-3, n).astype(np.float32)
        bias = RNG.standard_normal(n).astype(np.float32)
        for a_zp, bz in [(np.array(np.iinfo(a_dt).max, a_dt), bias), (None, None)]:
            got = plan.product_scaled(a, a_zp, scale, bz)
            acc = plan.product(a, a_zp)
            assert got is not None and acc is not None and got.shape == (2, m, n)
            want = acc.astype(np.float32) * scale
            if bz is not None:
                want = want + bz
            np.testing.assert_array_equal(got, want)
            # the constants padded at load, A's scale apart (MatMulIntegerToFloat's call)
            pb = None if bz is None else plan.padded(bz)
            a_scale = np.float32(0.37)
            got = plan.product_scaled(a, a_zp, plan.padded(scale), pb, a_scale)
            want = acc.astype(np.float32) * (scale * a_scale)
            if bz is not None:
                want = want + bz
            assert got is not None
            np.testing.assert_array_equal(got, want)
    per_row = np.zeros(2 * 16, np.uint8)
    plan = IntegerWeights.make(_codes((130, 40), np.int8), None)
    assert plan is not None  # one zero point a row: the caller scales product()'s sums
    assert plan.product_scaled(_codes((32, 130), np.uint8), per_row, scale[:40], None) is None


def _reference(x: np.ndarray, xz: Any, w: np.ndarray, wz: np.ndarray, b: Any, xs: Any,
               ws: Any, ys: Any, yz: Any, geo: tuple[int, ...]) -> np.ndarray:  # fmt: skip
    kh, kw, sh, sw, dh, dw, pt, pl, pb, pr = geo
    xf = np.pad(x.astype(np.int64) - xz.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (xf.shape[2] - ((kh - 1) * dh + 1)) // sh + 1
    ow = (xf.shape[3] - ((kw - 1) * dw + 1)) // sw + 1
    wf = w.astype(np.int64) - wz.astype(np.int64).reshape(-1, 1, 1, 1)
    groups = x.shape[1] // w.shape[1]
    acc = np.zeros((x.shape[0], w.shape[0], oh, ow), np.int64)
    per = w.shape[0] // groups
    for gi in range(groups):
        xg = xf[:, gi * w.shape[1] : (gi + 1) * w.shape[1]]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                           j * dw : j * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
                acc[:, gi * per : (gi + 1) * per] += np.einsum(
                    "nchw,oc->nohw", patch, wf[gi * per : (gi + 1) * per, :, i, j]
                )
    if b is not None:
        acc += b.reshape(1, -1, 1, 1)
    scale = (xs * ws.reshape(-1) / ys).astype(np.float32).reshape(1, -1, 1, 1)
    return requantize(acc, scale, yz, np.dtype(np.uint8))


def _run_nchw(plan: Any, x: np.ndarray, channels_last: bool) -> np.ndarray | None:
    """``plan.run`` on NCHW ``x``, or on its channels-last copy with the result read back
    as NCHW."""
    if not channels_last:
        return plan.run(x)
    got = plan.run(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), channels_last=True)
    assert got is not None
    return got.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv", "depthwise"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.compiles
def test_integer_convs_are_exact(depthwise: bool, channels_last: bool) -> None:
    _need_kernel(numba=True)
    for case in range(24):
        xdt, wdt, ydt = ((np.uint8, np.int8)[case % 2], (np.int8, np.uint8)[case // 2 % 2],
                         (np.uint8, np.int8)[case // 4 % 2])  # fmt: skip
        c = int(RNG.integers(1, 20))
        co = c if depthwise else int(RNG.integers(1, 70))
        pointwise = case % 5 == 0
        kh, kw = (1, 1) if pointwise else (int(RNG.integers(1, 5)), int(RNG.integers(1, 5)))
        sh, sw = (1, 1) if pointwise else (int(RNG.integers(1, 3)), int(RNG.integers(1, 3)))
        dh, dw = (1, 1) if pointwise else (int(RNG.integers(1, 3)), int(RNG.integers(1, 3)))
        pads = [0] * 4 if pointwise else [int(v) for v in RNG.integers(0, 3, 4)]
        h, w_ = int(RNG.integers(kh * dh, 14)), int(RNG.integers(kw * dw, 14))
        xinfo, winfo, yinfo = np.iinfo(xdt), np.iinfo(wdt), np.iinfo(ydt)
        x = _codes((2, c, h, w_), xdt)
        w = _codes((co, 1 if depthwise else c, kh, kw), wdt)
        xz = np.array((xinfo.min, xinfo.max, 0)[case % 3], xdt)
        yz = np.array((yinfo.max, yinfo.min)[case % 2], ydt)
        wz = (RNG.integers(winfo.min, winfo.max + 1, co) if case % 4 == 0 else
              np.full(co, 0 if wdt == np.int8 else 128)).astype(wdt)  # fmt: skip
        b = RNG.integers(-50000, 50000, co).astype(np.int32) if case % 6 else None
        xs, ys = np.array(0.02, np.float32), np.array(RNG.uniform(0.05, 2.0), np.float32)
        ws = RNG.uniform(0.001, 0.01, co).astype(np.float32)
        geo = (kh, kw, sh, sw, dh, dw, *pads)
        make = conv_qdepthwise.plan_depthwise if depthwise else conv_qint8.plan
        plan = make(w, ws, wz, xs, xz, ys, yz, b, geo)
        assert plan is not None, "the integer path did not plan"
        want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
        got = _run_nchw(plan, x, channels_last)
        assert got is not None and got.dtype == want.dtype, (case, ydt)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}, geo {geo}")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize(
    ("window", "bias", "sums"),
    [
        ((3, 3), 50_000, "float32"),  # the nine-tap form
        ((16, 16), 130_000, "float32"),  # 256 * 255**2 + 130,000 < 2**24: still exact
        ((16, 16), 131_000, "int32"),  # past 2**24: float32 could round
        ((3, 3), 2**24, "int32"),
        ((1, 2), -70_000, "float32"),
    ],
)
@pytest.mark.compiles
def test_depthwise_sums_in_float32_only_where_they_are_exact(
    window: tuple[int, int], bias: int, sums: str, channels_last: bool
) -> None:
    """Every product at its largest magnitude (x codes 255 against a zero point of 0,
    weights 255 away from theirs): the plan sums in float32 exactly when the window's
    sums and the bias stay below 2**24, else in int32, and both equal the reference."""
    _need_kernel(numba=True)
    kh, kw = window
    c = 5
    x = np.full((2, c, kh + 2, kw + 3), 255, np.uint8)
    x[1, :, 0, 0] = 0
    w = np.zeros((c, 1, kh, kw), np.uint8)  # minus a zero point of 255: -255
    wz = np.full(c, 255, np.uint8)
    b = np.full(c, bias, np.int32)
    b[1] = -bias
    xs, ys = np.array(0.02, np.float32), np.array(7.0, np.float32)
    ws = np.full(c, 0.003, np.float32)
    xz, yz = np.array(0, np.uint8), np.array(128, np.uint8)
    geo = (kh, kw, 1, 1, 1, 1, 1, 0, 1, 1)
    plan = conv_qdepthwise.plan_depthwise(w, ws, wz, xs, xz, ys, yz, b, geo)
    assert plan is not None and plan.sums == sums
    want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
    np.testing.assert_array_equal(_run_nchw(plan, x, channels_last), want)


def _at_page_end(shape: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, Any]:
    """An array whose last byte is followed by a page that cannot be read (reading past
    its end crashes the process instead of passing unseen)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = -(-nbytes // page) + 1
    buf = mmap.mmap(-1, pages * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(ctypes.c_void_p(base + (pages - 1) * page), page, 0) != 0:
        pytest.skip("mprotect is not available")
    off = (pages - 1) * page - nbytes
    x = np.frombuffer(buf, dtype, count=int(np.prod(shape)), offset=off).reshape(shape)
    return x, buf


@pytest.mark.compiles
def test_a_pointwise_conv_reads_nothing_past_its_input() -> None:
    """A channels-last 1x1 conv over 3 channels: the kernel takes its rows in groups of 4
    codes; the last row's group must not reach past the input (the guard page)."""
    _need_kernel(numba=True)
    x, keep = _at_page_end((1, 5, 7, 3), np.uint8)
    x[...] = 7
    w = np.ones((8, 3, 1, 1), np.int8)
    plan = conv_qint8.plan(w, np.full(8, 0.01, np.float32), None, np.array(0.02, np.float32),
                           np.array(3, np.uint8), np.array(0.1, np.float32),
                           np.array(5, np.uint8), None, (1, 1, 1, 1, 1, 1, 0, 0, 0, 0))  # fmt: skip
    assert plan is not None
    y = plan.run(x, channels_last=True)
    assert y is not None and y.shape == (1, 5, 7, 8)
    # (7 - 3) * 3 channels * 0.02 * 0.01 / 0.1 = 0.024 -> 0, + 5
    assert (y == 5).all()
    del keep


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.compiles
def test_stem_convs_read_their_rows_in_place(channels_last: bool) -> None:
    """Few input channels (RGB, grayscale), symmetric weights, no dilation: the plan takes
    ``conv_qrows`` (the staged, row-interleaved input read in place: no im2row), and its
    answers are the exact reference's: 3x3/2 and 7x7/2 stems, asymmetric pads, output
    channels that are and are not whole vectors, both input and output types, a
    channels-last view of NCHW planes (read without a copy). Weights with
    zero points or a dilation keep the im2row form."""
    _need_kernel(numba=True)
    cases = [  # c, co, h, w, geo
        (3, 32, 33, 30, (3, 3, 2, 2, 1, 1, 1, 1, 1, 1)),
        (3, 64, 29, 31, (7, 7, 2, 2, 1, 1, 3, 3, 3, 3)),
        (1, 5, 12, 9, (3, 2, 1, 2, 1, 1, 0, 2, 1, 0)),
        (4, 20, 10, 11, (5, 3, 3, 1, 1, 1, 2, 0, 0, 1)),
        (2, 48, 8, 8, (1, 1, 1, 1, 1, 1, 0, 0, 0, 0)),
    ]
    for case, (c, co, h, w_, geo) in enumerate(cases):
        xdt, ydt = (np.uint8, np.int8)[case % 2], (np.int8, np.uint8)[case % 2]
        wdt = (np.int8, np.uint8)[case // 2 % 2]
        x = _codes((2, c, h, w_), xdt)
        w = _codes((co, c, geo[0], geo[1]), wdt)
        w[0] = np.iinfo(wdt).min  # the largest sums
        x[0] = np.iinfo(xdt).max
        xz = np.array(np.iinfo(xdt).min + 7, xdt)
        yz = np.array(np.iinfo(ydt).max - 3, ydt)
        wz = np.full(co, 0 if wdt == np.int8 else 128).astype(wdt)  # symmetric
        b = RNG.integers(-50000, 50000, co).astype(np.int32)
        xs, ys = np.array(0.02, np.float32), np.array(RNG.uniform(0.05, 2.0), np.float32)
        ws = RNG.uniform(0.001, 0.01, co).astype(np.float32)
        plan = conv_qint8.plan(w, ws, wz, xs, xz, ys, yz, b, geo)
        assert plan is not None and plan.rows_packed is not None, case
        want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
        got = _run_nchw(plan, x, channels_last)
        assert got is not None and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}, geo {geo}")
        if channels_last:  # a channels-last view of planes: the planes read, as they are
            view = plan.run(x.transpose(0, 2, 3, 1), channels_last=True)
            assert view is not None
            np.testing.assert_array_equal(view.transpose(0, 3, 1, 2), want)
    w = _codes((8, 3, 3, 3), np.int8)
    one = np.array(0.01, np.float32)
    zp = np.zeros(8, np.int8)
    zp[2] = 5
    asym = conv_qint8.plan(w, one, zp, one, None, one, None, None, (3, 3, 1, 1, 1, 1, 1, 1, 1, 1))
    dilated = conv_qint8.plan(w, one, None, one, None, one, None, None,
                              (3, 3, 1, 1, 2, 2, 0, 0, 0, 0))  # fmt: skip
    assert asym is not None and dilated is not None
    assert asym.rows_packed is None and dilated.rows_packed is None


def test_a_conv_with_large_weights_over_few_pixels_reads_them_once() -> None:
    """ResNet's last stage: 3x3x512 -> 512 weights (2.4 MB) over 7x7 pixels. All pixels go
    in one block of rows (the weights stream once; the panels split over the threads
    instead), and the answer is the exact reference's; a conv with small weights keeps
    its blocks of rows."""
    _need_kernel(numba=True)
    c = co = 512
    x = _codes((1, c, 7, 7), np.uint8)
    w = _codes((co, c, 3, 3), np.int8)
    xz, yz = np.array(3, np.uint8), np.array(0, np.uint8)
    xs, ys = np.array(0.02, np.float32), np.array(40.0, np.float32)
    ws = RNG.uniform(0.001, 0.01, co).astype(np.float32)
    geo = (3, 3, 1, 1, 1, 1, 1, 1, 1, 1)
    plan = conv_qint8.plan(w, ws, None, xs, xz, ys, yz, None, geo)
    assert plan is not None
    lay = conv_qint8._layout(plan, (1, 7, 7, c), True)
    assert lay is not None and lay.row_blocks == 1
    want = _reference(x, xz, w, np.zeros(co, np.int8), None, xs, ws, ys, yz, geo)
    np.testing.assert_array_equal(_run_nchw(plan, x, True), want)
    small = conv_qint8.plan(w[:64, :64], ws[:64], None, xs, xz, ys, yz, None, geo)
    assert small is not None
    lay = conv_qint8._layout(small, (1, 56, 56, 64), True)
    assert lay is not None and lay.row_blocks > 1


@pytest.mark.compiles
def test_five_wide_depthwise_windows_are_exact() -> None:
    """EfficientNet's 5x5 depthwise convs (and a 3x5 window) channels-last, where a row of
    five taps is one expression per channel vector: the exact reference's answers, at the
    largest sums (codes at their limits), strides 1 and 2, zero points at both ends."""
    _need_kernel(numba=True)
    for case, (c, h, kh, s) in enumerate([(40, 9, 5, 1), (24, 12, 5, 2), (17, 7, 3, 1)]):
        xdt, wdt = (np.uint8, np.int8)[case % 2], (np.int8, np.uint8)[case % 2]
        x = _codes((2, c, h, h + 1), xdt)
        w = _codes((c, 1, kh, 5), wdt)
        x[0] = np.iinfo(xdt).max
        w[0] = np.iinfo(wdt).min
        xz = np.array((np.iinfo(xdt).min, np.iinfo(xdt).max)[case % 2], xdt)
        yz = np.array(5, np.uint8)
        wz = np.full(c, 0 if wdt == np.int8 else 128).astype(wdt)
        b = RNG.integers(-50000, 50000, c).astype(np.int32)
        xs, ys = np.array(0.02, np.float32), np.array(RNG.uniform(0.05, 2.0), np.float32)
        ws = RNG.uniform(0.001, 0.01, c).astype(np.float32)
        geo = (kh, 5, s, s, 1, 1, kh // 2, 2, kh // 2, 2)
        plan = conv_qdepthwise.plan_depthwise(w, ws, wz, xs, xz, ys, yz, b, geo)
        assert plan is not None
        want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
        np.testing.assert_array_equal(_run_nchw(plan, x, True), want, err_msg=f"case {case}")
