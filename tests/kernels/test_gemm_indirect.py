"""The indirect conv product (``kernels/lib/gemm_indirect``) on every path the host has,
against an im2row product in float64: rows gathered at offsets, taps, padded filters,
split calls, each epilogue, the rows form and (AVX-512) the NCHW stores, fast and slow
tiles; nothing written outside what a call owns."""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import numpy as np
import pytest

from tfrt_py.kernels.lib import gemm_indirect, gemm_packed
from tfrt_py.kernels.lib.gemm_indirect import (
    FLAG_BIAS,
    FLAG_CLIP,
    FLAG_NCHW,
    FLAG_RELU,
    FLAG_RESIDUAL,
)

pytestmark = pytest.mark.skipif(
    gemm_indirect.kernel() is None, reason="needs numba and an AVX2/FMA (or aarch64) host"
)

F32 = np.float32
PATHS = {"avx512": gemm_packed.P32, "avx2": gemm_packed.P16}
_ENGINES: list[Any] = []


def _path_kernel(path: str) -> tuple[Any, str]:
    """``path``'s kernel in an engine of its own (a ctypes function) and its assembly."""
    import llvmlite.binding as llvm

    from tfrt_py.concurrency.llvm_jit import compile_ir

    if path not in gemm_packed.host_paths():
        pytest.skip(f"this host has no {path} path (it has {', '.join(gemm_packed.host_paths())})")
    text = gemm_indirect._IndirectGemmIR(PATHS[path]).text()
    engine = compile_ir(text, host_cpu=True, opt=3)
    _ENGINES.append(engine)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    sig = [ptr, ptr, i64, ptr, i64, ptr, i64, ptr, i64, i64, i64, ptr, i64, i64, ptr, i64, i64,
           ptr, ptr]  # fmt: skip
    fn = ctypes.CFUNCTYPE(i64, *sig)(engine.get_function_address(gemm_indirect.SYMBOL))
    target = llvm.Target.from_triple(llvm.get_process_triple())
    tm = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    return fn, tm.emit_assembly(llvm.parse_assembly(text))


#: each path's assembly, once its kernel is built (``path_kernel``)
_ASM: dict[str, str] = {}


@pytest.fixture(scope="module", params=sorted(PATHS))
def path_kernel(request: pytest.FixtureRequest) -> tuple[str, Any]:
    fn, asm = _path_kernel(request.param)
    _ASM[request.param] = asm
    if request.param == "avx512":  # zmm products, and the transposes of the NCHW stores
        assert "zmm" in asm and "vfmadd" in asm
        assert "vpermt2ps" in asm or "vpermi2ps" in asm
    return request.param, fn


class Conv:
    """A conv's operands as the kernel takes them (channels-last padded input, offsets,
    packed filters) and its float64 answer per (image, filter, pixel)."""

    def __init__(self, rng: np.random.Generator, nr: int, n: int, c: int, hw: tuple[int, int],
                 m: int, k: tuple[int, int], stride: int, dil: int, pad: int) -> None:  # fmt: skip
        (h, w), (kh, kw) = hw, k
        hp, wp = h + 2 * pad, w + 2 * pad
        self.oh = (hp - (kh - 1) * dil - 1) // stride + 1
        self.ow = (wp - (kw - 1) * dil - 1) // stride + 1
        self.p, self.n, self.m, self.c = self.oh * self.ow, n, m, c
        xt = np.zeros((n, hp, wp, c), F32)
        xt[:, pad : pad + h, pad : pad + w] = rng.standard_normal((n, h, w, c))
        self.xt = xt
        oy, ox = np.divmod(np.arange(self.p), self.ow)
        first = (oy * stride * wp + ox * stride) * c
        self.rowoff = (np.arange(n)[:, None] * hp * wp * c + first).reshape(-1).astype(np.int64)
        self.toff = np.array([(i * dil * wp + j * dil) * c for i in range(kh) for j in range(kw)],
                             np.int64)  # fmt: skip
        wk = rng.standard_normal((kh * kw * c, m)).astype(F32)
        self.padded = -(-m // nr) * nr
        wfull = np.concatenate([wk, np.zeros((wk.shape[0], self.padded - m), F32)], axis=1)
        self.wp = gemm_packed.pack(wfull, PATHS["avx512" if nr == 32 else "avx2"])
        taps = [xt[:, i * dil : i * dil + (self.oh - 1) * stride + 1 : stride,
                   j * dil : j * dil + (self.ow - 1) * stride + 1 : stride, :]
                for i in range(kh) for j in range(kw)]  # fmt: skip
        cols = np.stack(taps, 3).reshape(n * self.p, -1).astype(np.float64)
        self.rows = cols @ wk  # (n*p, m)

    def nchw(self) -> np.ndarray:
        return self.rows.reshape(self.n, self.p, self.m).transpose(0, 2, 1)


def _p(a: np.ndarray, off: int = 0) -> int:
    return a.ctypes.data + a.itemsize * off


GEOMETRIES = [
    # (images, channels, (H, W), filters, kernel, stride, dilation, pad)
    (1, 16, (7, 7), 64, (3, 3), 1, 1, 1),  # 49 pixels: whole tiles and a row left
    (2, 8, (6, 5), 40, (3, 3), 1, 1, 1),  # tiles across images; filters past a panel
    (3, 5, (9, 8), 24, (3, 3), 2, 1, 1),  # stride 2, K odd, a partial panel only
    (1, 3, (12, 12), 96, (5, 3), 1, 2, 2),  # dilation, a 5x3 kernel, 3 channels a tap
    (1, 32, (8, 8), 33, (1, 1), 1, 1, 0),  # one tap
    # panels of 144 KB, a block each: whole tiles prefetch the next panel (the last its own)
    (1, 128, (5, 5), 70, (3, 3), 1, 1, 1),
    # 576 pixels, 289 and 287 a call: more whole tiles than PREFETCH_TILES, no prefetches
    (1, 4, (24, 24), 40, (3, 3), 1, 1, 1),
]


@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("flags", [0, FLAG_BIAS | FLAG_RELU], ids=["plain", "bias-relu"])
def test_rows_form_matches_the_im2row_product(path_kernel: tuple[str, Any], geo: Any,
                                              flags: int) -> None:  # fmt: skip
    """Rows at ``ldy``, split in two calls at a row that is not a tile's edge; the
    padded filters' columns are written (zero products), nothing past a row."""
    path, fn = path_kernel
    nr = PATHS[path].nr
    cv = Conv(np.random.default_rng(7), nr, *geo)
    rows = cv.n * cv.p
    ldy = cv.padded + 5
    y = np.full(rows * ldy, np.nan, F32)
    bias = np.random.default_rng(8).standard_normal(cv.padded).astype(F32)
    lohi = np.zeros(2, F32)
    cut = rows // 2 + 1
    for r0, r1 in ((0, cut), (cut, rows)):
        status = fn(_p(cv.xt), _p(cv.rowoff, r0), len(cv.toff), _p(cv.toff), cv.c, _p(cv.wp),
                    len(cv.toff) * cv.c, _p(y, r0 * ldy), ldy, r1 - r0, cv.padded // nr,
                    _p(bias), flags, nr, _p(cv.rowoff), 0, 0, _p(y), _p(lohi))  # fmt: skip
        assert status == 0
    got = y.reshape(rows, ldy)
    want = cv.rows + (bias[: cv.m] if flags & FLAG_BIAS else 0)
    if flags & FLAG_RELU:
        want = np.where(want < 0, 0, want)
    np.testing.assert_allclose(got[:, : cv.m], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(got[:, cv.padded :]).all()


@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize(
    "flags",
    [0, FLAG_BIAS, FLAG_BIAS | FLAG_RELU, FLAG_RESIDUAL | FLAG_RELU,
     FLAG_BIAS | FLAG_RESIDUAL | FLAG_CLIP],
    ids=["plain", "bias", "bias-relu", "res-relu", "bias-res-clip"],
)  # fmt: skip
def test_nchw_stores_match_the_im2row_product(path_kernel: tuple[str, Any], geo: Any,
                                              flags: int) -> None:  # fmt: skip
    """Each output at ``yoff[m] + f*ldf`` with the epilogue (bias, residual, ReLU or the
    clip), a NaN input through to the outputs that read it; calls split at a tile's edge
    and not; filters past ``nf`` (the panels' padding) and the planes past them never
    written. A build without the stores refuses the flag and writes nothing."""
    path, fn = path_kernel
    nr = PATHS[path].nr
    cv = Conv(np.random.default_rng(9), nr, *geo)
    cv.xt.reshape(-1)[cv.rowoff[min(3, len(cv.rowoff) - 1)] + cv.toff[-1]] = np.nan
    cv = _with_nan_reference(cv)
    rng = np.random.default_rng(10)
    planes = cv.m + 2  # two planes past the filters: never written
    y = np.full((cv.n, planes, cv.p), np.nan, F32)
    res = rng.standard_normal((cv.n, planes, cv.p)).astype(F32)
    bias = rng.standard_normal(cv.m).astype(F32)
    lohi = np.array([-0.5, 0.75], F32)
    yoff = (np.arange(cv.n)[:, None] * planes * cv.p + np.arange(cv.p)).reshape(-1)
    yoff = yoff.astype(np.int64)
    rows = cv.n * cv.p
    cuts = sorted({0, min(8, rows), min(rows // 2 + 3, rows), rows})  # a tile's edge and not
    for r0, r1 in itertools.pairwise(cuts):
        status = fn(_p(cv.xt), _p(cv.rowoff, r0), len(cv.toff), _p(cv.toff), cv.c, _p(cv.wp),
                    len(cv.toff) * cv.c, _p(y), 0, r1 - r0, cv.padded // nr, _p(bias),
                    flags | FLAG_NCHW, nr, _p(yoff, r0), cv.p, cv.m, _p(res),
                    _p(lohi))  # fmt: skip
        if path != "avx512":
            assert status == 2 and np.isnan(y).all()
            return
        assert status == 0
    want = cv.nchw()
    if flags & FLAG_BIAS:
        want = want + bias[None, :, None]
    if flags & FLAG_RESIDUAL:
        want = want + res[:, : cv.m]
    if flags & FLAG_RELU:
        want = np.where(want < 0, 0, want)
    if flags & FLAG_CLIP:
        want = np.where(want < lohi[0], lohi[0], np.where(want > lohi[1], lohi[1], want))
    np.testing.assert_allclose(y[:, : cv.m], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(want).any()
    assert np.isnan(y[:, cv.m :]).all()


def _with_nan_reference(cv: Conv) -> Conv:
    """``cv`` with its float64 answer computed again from its (now NaN-holding) input."""
    taps = len(cv.toff)
    flat = cv.xt.reshape(-1).astype(np.float64)
    idx = cv.rowoff[:, None, None] + cv.toff[None, :, None] + np.arange(cv.c)[None, None, :]
    cols = flat[idx].reshape(len(cv.rowoff), taps * cv.c)
    wk = cv.wp.transpose(1, 0, 2).reshape(taps * cv.c, -1)[:, : cv.m]
    with np.errstate(invalid="ignore"):
        cv.rows = cols @ wk.astype(np.float64)
    return cv


def _loops_by_products(asm: str) -> list[list[str]]:
    """The assembly's basic blocks, those with the most fused multiply-adds first."""
    blocks: list[list[str]] = [[]]
    for line in asm.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            blocks.append([])
        else:
            blocks[-1].append(line)
    return sorted(blocks, key=lambda blk: -sum("vfmadd" in ln for ln in blk))


def test_whole_tiles_prefetch_and_keep_their_sums_in_registers(
    path_kernel: tuple[str, Any],
) -> None:
    """The two loops of whole tiles (``mr`` rows, one panel: the most multiply-adds of
    the build), one with the prefetches of the next panel (``PREFETCH_TILES``) and one
    without, each keep every accumulator in a register: no vector register is stored to
    or loaded from the stack in them (LLVM spilled them, 0.55x, in a first form whose
    prefetch pointer was fixed-point at a pace computed at run time, and does in
    ``gemm_packed``'s own 8-row loop with these prefetches: 44 spills and reloads)."""
    path, _ = path_kernel
    assert gemm_indirect._IndirectGemmIR.PREFETCH_TILES > 0
    reg = "%zmm" if path == "avx512" else "%ymm"
    top = _loops_by_products(_ASM[path])[:2]
    assert len({sum("vfmadd" in ln for ln in blk) for blk in top}) == 1  # the same tile
    assert [any("prefetcht1" in ln for ln in blk) for blk in top].count(True) == 1
    for blk in top:
        assert not [ln for ln in blk if reg in ln and "(%rsp)" in ln]


def test_whole_nchw_tiles_fetch_their_outputs_before_their_k_loops(
    path_kernel: tuple[str, Any],
) -> None:
    """The AVX-512 build (the NCHW stores) fetches, before each whole tile's k loop, a
    line a filter of the output for writing and of the residual for reading, and the copy
    into the padded image fetches the next row of what it reads: at a batch those lines
    are out of L2 and the epilogue waited on each (module doc of ``gemm_indirect``). The
    other paths store rows and fetch no outputs."""
    path, _ = path_kernel
    asm = _ASM[path]
    nr = PATHS[path].nr
    if path != "avx512":
        assert "prefetchw" not in asm
        return
    # two whole-tile loops (with and without the panel's prefetches), each tile a line a
    # filter of y (for writing) and of res (for reading)
    assert asm.count("prefetchw") == 2 * nr
    tile_reads = 2 * nr + 2  # + the panel's two lines a k loop iteration
    assert asm.count("prefetcht1") >= tile_reads + 8  # + the copy's 8 rows a block


def test_the_process_kernel_is_the_chosen_path() -> None:
    """``kernel()`` runs the process's build; ``nchw_stores()`` says whether it has the
    NCHW stores (the 8 x 32 AVX-512 tile), and a wrong panel width is refused."""
    shape = gemm_packed.tile()
    assert shape is not None
    assert gemm_indirect.nchw_stores() == (shape.vw == 16)
    cv = Conv(np.random.default_rng(3), shape.nr, 1, 8, (5, 5), 16, (3, 3), 1, 1, 1)
    y = np.zeros((cv.p, cv.padded), F32)
    zb = np.zeros(cv.padded, F32)
    none = np.zeros(1, np.int64)
    fn = gemm_indirect.kernel()
    fn(cv.xt.reshape(-1), cv.rowoff, cv.toff, cv.c, cv.wp, y, cv.padded, cv.p,
       cv.padded // shape.nr, zb, 0, shape.nr, none, 0, 0, y, zb)  # fmt: skip
    np.testing.assert_allclose(y[:, : cv.m], cv.rows, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="panel width"):
        fn(cv.xt.reshape(-1), cv.rowoff, cv.toff, cv.c, cv.wp, y, cv.padded, cv.p,
           cv.padded // shape.nr, zb, 0, shape.nr // 2, none, 0, 0, y, zb)  # fmt: skip


def _module_function(path: str, symbol: str, argtypes: tuple[Any, ...]) -> Any:
    """``symbol`` of ``path``'s module in an engine of its own (a ctypes function returning
    an int64); skips where the host lacks the path."""
    from tfrt_py.concurrency.llvm_jit import compile_ir

    if path not in gemm_packed.host_paths():
        pytest.skip(f"this host has no {path} path")
    engine = compile_ir(gemm_indirect._IndirectGemmIR(PATHS[path]).text(), host_cpu=True, opt=3)
    _ENGINES.append(engine)
    return ctypes.CFUNCTYPE(ctypes.c_int64, *argtypes)(engine.get_function_address(symbol))


@pytest.fixture(scope="module", params=sorted(PATHS))
def nhwc_kernel(request: pytest.FixtureRequest) -> Any:
    """``SYMBOL_NHWC`` of each path the host has (ctypes)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    args = (ptr, i64, i64, i64, ptr, i64, i64, i64, i64, i64, i64, i64)
    return _module_function(request.param, gemm_indirect.SYMBOL_NHWC, args)


@pytest.mark.parametrize(
    ("c", "hw", "pads"),
    [(64, (9, 16), (1, 1, 1, 1)), (3, (11, 37), (3, 3, 2, 0)), (13, (5, 7), (0, 2, 1, 3)),
     (8, (1, 1), (2, 0, 0, 2)), (17, (4, 33), (0, 0, 0, 0))],
)  # fmt: skip
def test_the_nhwc_copy_pads_and_transposes(nhwc_kernel: Any, c: int, hw: tuple[int, int],
                                           pads: tuple[int, int, int, int]) -> None:  # fmt: skip
    """``xt`` (Hp, Wp, C) = ``x`` (C, H, W) channels-last at (pt, pl), zeros in every pad,
    in calls over row ranges (a call per range, as ``conv_packed``'s parts): every element
    written, channels past a block of 8 and pixels past a block of 16 included, nothing
    past the image's rows."""
    (h, w), (pt, pl, pb, pr) = hw, pads
    x = np.random.default_rng(c).standard_normal((c, h, w)).astype(F32)
    hp, wp = h + pt + pb, w + pl + pr
    xt = np.full(hp * wp * c + 16, np.nan, F32)
    want = np.zeros((hp, wp, c), F32)
    want[pt : pt + h, pl : pl + w] = x.transpose(1, 2, 0)
    cuts = sorted({0, min(2, hp), hp})
    for r0, r1 in itertools.pairwise(cuts):
        assert nhwc_kernel(_p(x), c, h, w, _p(xt), hp, wp, pt, pl, r0, r1, 1) == 0
    np.testing.assert_array_equal(xt[: hp * wp * c].reshape(hp, wp, c), want)
    assert np.isnan(xt[hp * wp * c :]).all()
    # three images in one call, each at its place, nothing past the last
    xs = np.random.default_rng(c + 1).standard_normal((3, c, h, w)).astype(F32)
    xts = np.full(3 * hp * wp * c + 16, np.nan, F32)
    assert nhwc_kernel(_p(xs), c, h, w, _p(xts), hp, wp, pt, pl, 0, hp, 3) == 0
    for q in range(3):
        want[pt : pt + h, pl : pl + w] = xs[q].transpose(1, 2, 0)
        got = xts[q * hp * wp * c : (q + 1) * hp * wp * c].reshape(hp, wp, c)
        np.testing.assert_array_equal(got, want)
    assert np.isnan(xts[3 * hp * wp * c :]).all()


@pytest.fixture(scope="module", params=sorted(PATHS))
def rows_nchw_kernel(request: pytest.FixtureRequest) -> Any:
    """``SYMBOL_ROWS_NCHW`` of each path the host has (ctypes)."""
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    return _module_function(request.param, gemm_indirect.SYMBOL_ROWS_NCHW,
                            (ptr, i64, ptr, i64, i64, i64, ptr, ptr, f32, f32, i64))  # fmt: skip


@pytest.mark.parametrize(("rows", "cols", "flags", "lo", "hi"), [
    (49, 160, FLAG_BIAS, 0.0, np.inf), (196, 96, FLAG_BIAS | FLAG_RESIDUAL, -0.5, 0.75),
    (16, 16, 0, -np.inf, np.inf), (7, 40, FLAG_RESIDUAL, 0.0, 6.0), (9, 13, FLAG_BIAS, -1, 1),
])  # fmt: skip
def test_rows_put_back_as_nchw_runs(rows_nchw_kernel: Any, rows: int, cols: int, flags: int,
                                    lo: float, hi: float) -> None:  # fmt: skip
    """``y[f, r]`` = clamp((``yt[r, f]`` + bias[f]) + res[f, r]) for r < rows, f < cols,
    the whole 8 x 16 blocks and the rows and filters past them; NaN kept, infinities
    clamped, -0.0 kept without a bias; nothing written past the plane's pixels."""
    rng = np.random.default_rng(rows * 1000 + cols)
    ld, npx = cols + 5, rows + 3  # yt's row length and y's plane: both longer than used
    yt = rng.standard_normal((rows, ld)).astype(F32)
    yt[0, 0], yt[rows - 1, cols - 1], yt[rows // 2, 0] = np.nan, np.inf, -0.0
    bias = rng.standard_normal(cols).astype(F32)
    res = rng.standard_normal((cols, npx)).astype(F32)
    y = np.full((cols, npx), 9.0, F32)
    st = rows_nchw_kernel(_p(yt), ld, _p(y), npx, rows, cols, _p(bias), _p(res),
                          lo, hi, flags)  # fmt: skip
    assert st == 0
    want = yt[:, :cols].T.copy()
    if flags & FLAG_BIAS:
        want = want + bias[:, None]
    if flags & FLAG_RESIDUAL:
        want = want + res[:, :rows]
    with np.errstate(invalid="ignore"):
        want = np.where(want < lo, F32(lo), np.where(want > hi, F32(hi), want))
    np.testing.assert_array_equal(y[:, :rows], want)
    if not flags & FLAG_BIAS and not flags & FLAG_RESIDUAL and lo < 0:
        assert np.signbit(y[0, rows // 2])  # -0.0 stays -0.0
    assert (y[:, rows:] == 9.0).all()
