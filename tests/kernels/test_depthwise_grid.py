"""``depthwise_ir``'s depthwise kernel called directly: every kind against a float64 NumPy
reference on planes from 1x1 to wider than two vectors (whole and partial vectors in the
loads and the stores), odd and even sizes, more padding at the bottom and
right than "same", the residual and the clamp, infinities and NaNs beside the padding;
the scratch and the output never written past their ends; short scratch, unknown kinds
and negative sizes refused with nothing written; and the AVX2 build (8-float vectors,
shifts by shuffles) in a fresh process where the host has that path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support.forced_isa import run_on_path
from tests.support.jit_paths import need_lanes
from tfrt_py.kernels.lib import depthwise_ir

_CALLS: dict[bool, Any] = {}


def _call(narrow: bool = False) -> Any:
    """A numba wrapper over the kernel (``narrow``: its 8-float build beside a 16-float
    one) taking arrays; skips where it is not built."""
    fn = depthwise_ir.function()
    if fn is None:
        pytest.skip(
            "no depthwise grid kernel here (the portable path, TFRT_PY_PACKED_GEMM=0, "
            "or no llvmlite JIT)"
        )
    if narrow:
        fn = depthwise_ir.narrow_function()
        if fn is None:
            pytest.skip("no narrow build here: the kernel is 8 floats wide already")
    for kind in range(len(depthwise_ir.KINDS)):  # every kind and epilogue (built lazily)
        for code in depthwise_ir.CODES:
            assert depthwise_ir.ready(kind, code, narrow)
    if narrow not in _CALLS:
        import numba

        @numba.njit(nogil=True)
        def call(kind, x, w, b, res, y, xp, n, lo, hi, flags, c, h, wd, oh, ow, pt, pl):
            return fn(kind, x.ctypes.data, w.ctypes.data, b.ctypes.data, res.ctypes.data,
                      y.ctypes.data, xp.ctypes.data, n, lo, hi, flags, c, h, wd, oh, ow, pt,
                      pl)  # fmt: skip

        _CALLS[narrow] = call
    return _CALLS[narrow]


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, k: int, s: int, oh: int, ow: int,
               pt: int, pl: int) -> np.ndarray:  # fmt: skip
    """float64 sums over a zero-padded copy wide enough for every output's taps."""
    c, h, wd = x.shape
    hp, wp = max((oh - 1) * s + k, pt + h), max((ow - 1) * s + k, pl + wd)
    xp = np.zeros((c, hp, wp))
    xp[:, pt : pt + h, pl : pl + wd] = x
    out = np.zeros((c, oh, ow)) + b[:, None, None]
    for i in range(k):
        for j in range(k):
            tap = xp[:, i : i + (oh - 1) * s + 1 : s, j : j + (ow - 1) * s + 1 : s]
            out += tap * w[:, i * k + j, None, None]
    return out


def check_random(seed: int, rounds: int, narrow: bool = False) -> int:
    """Random geometries of every kind against ``_reference`` (``narrow``: on the 8-float
    build beside a 16-float kernel): returns the cases run."""
    call, vw = _call(narrow), 8 if narrow else depthwise_ir.vector_width()
    rng = np.random.default_rng(seed)
    ran = 0
    for _ in range(rounds):
        for kind, (k, s) in enumerate(depthwise_ir.KINDS):
            c = int(rng.integers(1, 6))
            h, wd = (int(v) for v in rng.integers(1, 3 * vw + 3, 2))
            p = k // 2
            extra_b, extra_r = (int(v) for v in rng.integers(0, 3, 2))  # more than "same"
            oh = (h + 2 * p + extra_b - k) // s + 1
            ow = (wd + 2 * p + extra_r - k) // s + 1
            x = rng.standard_normal((c, h, wd)).astype(np.float32)
            x[0, 0, 0] = np.inf
            x[c - 1, h - 1, wd - 1] = -np.inf if rng.random() < 0.5 else np.nan
            w = rng.standard_normal((c, k * k)).astype(np.float32)
            b = rng.standard_normal(c).astype(np.float32)
            res = rng.standard_normal((c, oh, ow)).astype(np.float32)
            residual = bool(rng.random() < 0.5)
            mode = int(rng.integers(0, 4))  # none, a clamp, HardSwish, HardSigmoid
            bounds = [(-np.inf, np.inf), (-0.5, 0.75), (1 / 6, 0.5), (0.2, 0.5)][mode]
            lo, hi = np.float32(bounds[0]), np.float32(bounds[1])
            flags = int(residual) | [0, 0, depthwise_ir.FLAG_HARD_SWISH,
                                     depthwise_ir.FLAG_HARD_SIGMOID][mode]  # fmt: skip
            # the plans' scratch (small planes copied padded) or the least (read in place)
            n = (depthwise_ir.scratch_len(h, wd, vw) if rng.random() < 0.5
                 else depthwise_ir.min_scratch_len(wd, vw))  # fmt: skip
            xp = np.full(n + 2 * vw, 7.0, np.float32)
            y = np.full(c * oh * ow + 2 * vw, 5.0, np.float32)
            st = call(kind, x, w, b, res, y, xp, n, lo, hi, flags, c, h, wd, oh, ow, p, p)
            assert st == 0
            assert (xp[n:] == 7.0).all() and (y[c * oh * ow :] == 5.0).all()
            with np.errstate(invalid="ignore"):
                want = _reference(x, w, b, k, s, oh, ow, p, p) + (res if residual else 0)
                if mode < 2:
                    want = np.where(want < lo, lo, np.where(want > hi, hi, want))
                else:
                    t = np.clip(want * float(lo) + float(hi), 0, 1)
                    want = want * t if mode == 2 else t
            got = y[: c * oh * ow].reshape(c, oh, ow)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"k{k} s{s} {c}x{h}x{wd} -> {oh}x{ow}")  # fmt: skip
            ran += 1
    return ran


@pytest.mark.compiles
def test_every_kind_matches_the_reference_on_random_geometries() -> None:
    assert check_random(0, 12) == 12 * len(depthwise_ir.KINDS)


def test_the_narrow_build_matches_the_reference() -> None:
    """The 8-float build the plans take for outputs up to ``NARROW_MAX_WIDTH`` wide on
    AVX-512 hosts, every kind."""
    assert check_random(2, 8, narrow=True) == 8 * len(depthwise_ir.KINDS)


def test_narrow_planes_take_the_narrow_build() -> None:
    """Outputs 7 wide (stride 1 over 7x7, stride 2 over 14x14) ask for the narrow build
    where there is one, 14 wide ones never."""
    from tfrt_py.kernels.nn import conv_depthwise_grid as cg

    _call()
    narrow = depthwise_ir.narrow_function() is not None
    k5 = depthwise_ir.kind_of(5, 1)
    assert cg.table(k5, 5, (1, 8, 7, 7))[3] == int(narrow)
    assert cg.table(k5, 5, (1, 8, 14, 14))[3] == 0
    assert cg.table(depthwise_ir.kind_of(3, 2), 3, (1, 8, 7, 7))[3] == int(narrow)
    assert cg.table(depthwise_ir.kind_of(5, 2), 5, (1, 8, 14, 14))[3] == 0


@pytest.mark.parametrize(("k", "s", "c", "h", "wd"), [(5, 1, 96, 7, 7), (7, 1, 8, 14, 14),
                         (3, 2, 24, 56, 56), (5, 2, 40, 28, 28), (3, 2, 24, 112, 112),
                         (5, 1, 24, 112, 112)])  # fmt: skip
def test_network_shapes(k: int, s: int, c: int, h: int, wd: int) -> None:
    """MobileNet's, EfficientNet's and ConvNeXt's planes, ReLU as the clamp to [0, inf]."""
    call, vw = _call(), depthwise_ir.vector_width()
    rng = np.random.default_rng(k * 100 + h)
    p = k // 2
    oh, ow = (h - 1) // s + 1, (wd - 1) // s + 1
    x = rng.standard_normal((c, h, wd)).astype(np.float32)
    w, b = (
        rng.standard_normal((c, k * k)).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
    )
    y = np.zeros((c, oh, ow), np.float32)
    n = depthwise_ir.scratch_len(h, wd, vw)
    kind = depthwise_ir.kind_of(k, s)
    st = call(kind, x, w, b, y, y, np.zeros(n, np.float32), n, np.float32(0), np.float32(np.inf),
              0, c, h, wd, oh, ow, p, p)  # fmt: skip
    assert st == 0
    want = np.maximum(_reference(x, w, b, k, s, oh, ow, p, p), 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_refusals_write_nothing() -> None:
    """A scratch one float short (status 2), an unknown kind, a negative padding or size
    and both hard activations (status 1): the output and the scratch untouched."""
    call, vw = _call(), depthwise_ir.vector_width()
    x, w = np.ones((2, 9, 9), np.float32), np.ones((2, 25), np.float32)
    b, y = np.zeros(2, np.float32), np.full((2, 5, 5), 3.0, np.float32)
    kind = depthwise_ir.kind_of(5, 2)
    n = depthwise_ir.min_scratch_len(9, vw)
    xp = np.full(n, 4.0, np.float32)
    inf = np.float32(np.inf)
    args = (x, w, b, y, y, xp)
    assert call(kind, *args, n - 1, -inf, inf, 0, 2, 9, 9, 5, 5, 2, 2) == 2
    assert call(len(depthwise_ir.KINDS), *args, n, -inf, inf, 0, 2, 9, 9, 5, 5, 2, 2) == 1
    assert call(-1, *args, n, -inf, inf, 0, 2, 9, 9, 5, 5, 2, 2) == 1
    assert call(kind, *args, n, -inf, inf, 0, 2, 9, 9, 5, 5, -1, 2) == 1
    assert call(kind, *args, n, -inf, inf, 0, 2, 9, -9, 5, 5, 2, 2) == 1
    assert call(kind, *args, n, -inf, inf, 6, 2, 9, 9, 5, 5, 2, 2) == 1
    assert (y == 3.0).all() and (xp == 4.0).all()
    assert call(kind, *args, n, -inf, inf, 0, 2, 9, 9, 5, 5, 2, 2) == 0
    assert (y[:, 1:4, 1:4] == 25.0).all()  # every tap inside the image: 25 ones


@pytest.mark.parametrize("vw", [16, 8], ids=["avx512", "avx2"])
def test_a_kind_runs_once_its_functions_for_the_epilogue_are_built(vw: int) -> None:
    """A build's table starts empty: a call of a kind whose functions are not built is
    status 3 with nothing written; ``add_variant`` builds a kind's two functions (with and
    without the residual) for one epilogue, and only those calls run from then on."""
    import ctypes

    need_lanes(vw)
    symbol = f"tfrt_py_dw_lazy_test_{vw}"
    engine = depthwise_ir.build(vw, symbol)
    i, vp, fl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    fn = ctypes.CFUNCTYPE(i, i, vp, vp, vp, vp, vp, vp, i, fl, fl, *[i] * 8)(
        engine.get_function_address(symbol)
    )
    rng = np.random.default_rng(5)
    c, h, wd, k = 3, 9, 11, 3
    kind = depthwise_ir.kind_of(k, 1)
    x = rng.standard_normal((c, h, wd)).astype(np.float32)
    w, b = rng.standard_normal((c, k * k)).astype(np.float32), np.zeros(c, np.float32)
    res = rng.standard_normal((c, h, wd)).astype(np.float32)
    n = depthwise_ir.scratch_len(h, wd, vw)
    xp = np.zeros(n, np.float32)
    y = np.full((c, h, wd), 5.0, np.float32)

    def call(kind: int, flags: int) -> int:
        return int(fn(kind, x.ctypes.data, w.ctypes.data, b.ctypes.data, res.ctypes.data,
                      y.ctypes.data, xp.ctypes.data, n, -np.inf, np.inf, flags, c, h, wd, h,
                      wd, 1, 1))  # fmt: skip

    assert call(kind, 0) == depthwise_ir.STATUS_NOT_BUILT and (y == 5.0).all()
    depthwise_ir.add_variant(engine, vw, symbol, kind, 0)
    assert call(kind, 0) == 0
    np.testing.assert_allclose(y, _reference(x, w, b, k, 1, h, wd, 1, 1), rtol=1e-4, atol=1e-4)
    assert call(kind, depthwise_ir.FLAG_RESIDUAL) == 0  # the residual's function too
    want = _reference(x, w, b, k, 1, h, wd, 1, 1) + res
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    y[:] = 5.0
    for other_kind, flags in ((depthwise_ir.kind_of(5, 1), 0),
                              (kind, depthwise_ir.FLAG_HARD_SWISH)):  # fmt: skip
        assert call(other_kind, flags) == depthwise_ir.STATUS_NOT_BUILT and (y == 5.0).all()
    assert call(len(depthwise_ir.KINDS), 0) == 1  # an unknown kind is refused as before
    with pytest.raises(ValueError):
        depthwise_ir.add_variant(engine, vw, symbol, kind, 1)  # no such epilogue code


def test_a_load_noting_a_kind_does_not_wait_for_a_build() -> None:
    """``want`` (every depthwise conv's build notes its kind) takes no lock a kind's build
    holds: a load on one thread does not wait behind another thread's plan building a
    kind (tenths of a second)."""
    import threading

    done = threading.Event()

    def note() -> None:
        depthwise_ir.want(0, 0)
        done.set()

    thread = threading.Thread(target=note)
    with depthwise_ir._VARIANT_LOCK:  # a build in flight on another thread
        thread.start()
        noted = done.wait(30)
    thread.join()
    assert noted, "want() waited for the build's lock"


def test_scratch_len_is_what_the_kernel_asks() -> None:
    """``min_scratch_len`` is the kernel's own need (one float less is refused) and reads
    in place; ``scratch_len`` (what the plans hand it) also holds the padded copy of a
    small plane (``PADDED_WIDTHS``): both give the reference's answer."""
    call, vw = _call(), depthwise_ir.vector_width()
    rng = np.random.default_rng(3)
    inf = np.float32(np.inf)
    for kind, (k, s) in enumerate(depthwise_ir.KINDS):
        for h, wd in ((1, 1), (7, 7), (14, 15), (29, 40), (40, 29)):
            p = k // 2
            oh, ow = (h - 1) // s + 1, (wd - 1) // s + 1
            x = rng.standard_normal((1, h, wd)).astype(np.float32)
            w, b = rng.standard_normal((1, k * k)).astype(np.float32), np.zeros(1, np.float32)
            want = _reference(x, w, b, k, s, oh, ow, p, p)
            least, n = depthwise_ir.min_scratch_len(wd, vw), depthwise_ir.scratch_len(h, wd, vw)
            assert n >= least
            for size in (least, n):
                y, xp = np.zeros((1, oh, ow), np.float32), np.zeros(size, np.float32)
                st = call(kind, x, w, b, y, y, xp, size, -inf, inf, 0, 1, h, wd, oh, ow, p, p)
                assert st == 0
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
            xp = np.zeros(least, np.float32)
            assert call(kind, x, w, b, y, y, xp, least - 1, -inf, inf, 0, 1, h, wd, oh, ow, p,
                        p) == 2  # fmt: skip


_AVX2_CHILD = """
from tfrt_py.kernels.lib import depthwise_ir, gemm_packed
assert gemm_packed.path()[0] == "avx2" and depthwise_ir.vector_width() == 8
from tests.kernels.test_depthwise_grid import check_random
print("avx2 grid ok", check_random(1, 8))
"""


def test_the_avx2_build_in_a_fresh_process() -> None:
    """The 8-float build (shifts and even/odd lanes by shuffles, no ``valignd``) on a host's AVX2
    path, forced with ``TFRT_PY_ISA`` (skipped where the host has none, or where this
    process builds no kernel: the child inherits the switches)."""
    _call()
    run_on_path("avx2", _AVX2_CHILD, "avx2 grid ok")
