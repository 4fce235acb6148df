"""Float32 depthwise convs with "same" padding (3x3, 5x5 and 7x7 at stride 1, 3x3 and 5x5
at stride 2) on ``depthwise_ir``'s kernel: the numba side that runs it over a plan's
images and channel blocks, serially or in a ``prange`` loop on native threads.

The kernel reads each channel where it lies, blocks of output rows at once, and stores
with the residual and ReLU, Clip, HardSwish or HardSigmoid;
other activations run here over each plane afterwards (``_act_row``, while it is in
cache). One Zen 4 thread, AVX-512, µs, single-node models, against the numba loops
(``conv_depthwise_same``, ``conv_depthwise3``): 3x3 576x14x14 58 -> 35, 960x7x7 45 -> 27,
32x112x112 146 -> 104; 5x5 576x7x7 53 -> 47, 672x14x14 160 -> 104; 5x5/2 288x14x14 67 ->
30, 3x3/2 576x14x14 70 -> 48 (stride 2 since read in place: 96x112x112 3x3/2 455 -> 234
on one Intel AVX-512 thread). Outputs up to 8 wide take the kernel's 8-float build where
the main one is 16 wide (``depthwise_ir.narrow_function``).
``conv_depthwise.plan_depthwise`` takes it where ``fits`` says so (first choice); same
signatures as ``conv_depthwise_same``'s kernels, with ``tab`` = ``table(...)`` (kind, top
and left padding, 1 for the narrow build) and ``xp`` one thread's scratch of
``scratch_len(...)`` floats. Sums run in another order than im2col + GEMM: results differ
by rounding only. Thread-safe: no state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...concurrency import native_threads
from ...concurrency.env_switch import switched_off
from ..common import ShapeMemo, scratch
from ..lib import depthwise_ir
from ..lib.activations import PARAMS_LEN
from ..lib.jit import ENV_JIT, Jitted, frozen, inline
from .conv_common import ConvNode, conv_geometry, into_out, raw_call_operands
from .conv_direct import Epilogue, _act_row, _numpy_act

__all__ = [
    "GRID", "GRID_PAR", "fits", "raw_depthwise_fn", "run_raw", "scratch_len", "store_code",
    "table",
]  # fmt: skip

#: numba, set by ``Jitted(parallel=True)`` before the parallel loop compiles.
numba: Any = None
#: the kernel's ExternalFunctions (its narrow build, else the kernel again), set by
#: ``_prepare`` before the loops compile
_dw_grid: Any = None
_dw_narrow: Any = None


def fits(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    dilations: tuple[int, ...],
) -> int:
    """The kernel's ``kind`` for this conv, or -1: 2-D, one channel per group and one
    filter per channel, a K x K kernel of ``depthwise_ir.KINDS`` at its stride, dilation 1,
    K // 2 of padding on every side."""
    if len(x_shape) != 4 or w_shape[1] != 1 or w_shape[0] != x_shape[1]:
        return -1
    k = int(w_shape[2])
    p = k // 2
    if w_shape[3] != k or tuple(dilations) != (1, 1) or tuple(pads) != (p, p, p, p):
        return -1
    if len(strides) != 2 or strides[0] != strides[1]:
        return -1
    return depthwise_ir.kind_of(k, int(strides[0]))


def _narrow(out_shape: tuple[int, ...]) -> bool:
    """Whether the 8-float build serves this conv (any kind): output rows of at most
    ``depthwise_ir.NARROW_MAX_WIDTH``, where it is built."""
    return (out_shape[3] <= depthwise_ir.NARROW_MAX_WIDTH
            and depthwise_ir.narrow_function() is not None)  # fmt: skip


def table(kind: int, k: int, out_shape: tuple[int, ...]) -> np.ndarray:
    """``tab``: (kind, top padding, left padding, 1 for the narrow build) as int64."""
    return np.array([kind, k // 2, k // 2, int(_narrow(out_shape))], np.int64)


def scratch_len(x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> int:
    """One thread's scratch in floats for a conv on these shapes (any kind)."""
    vw = 8 if _narrow(out_shape) else depthwise_ir.vector_width()
    return depthwise_ir.scratch_len(x_shape[2], x_shape[3], vw)


def run_raw(raw: depthwise_ir.Raw, kind: int, x: np.ndarray, w: np.ndarray, out: np.ndarray,
            bias: np.ndarray | None = None, res: np.ndarray | None = None,
            lo: float = -np.inf, hi: float = np.inf, flags: int = 0) -> bool:  # fmt: skip
    """``out`` = the depthwise conv of ``kind`` of ``x`` by ``w`` with the kernel's store
    (``bias``, ``res`` added, then the clamp to [``lo``, ``hi``] or ``flags``'
    HardSwish/HardSigmoid: ``depthwise_ir``) on its ctypes build (``depthwise_ir.raw()``):
    one call for the batch (its loop over images) on the caller's thread, the GIL released
    in it. For the NumPy
    paths (``raw_depthwise_fn``: a cold start's stand-ins, which must not import numba).
    ``x`` (N, C, H, W), ``w`` (C, K*K), ``bias`` (C) or None, ``res`` and ``out`` (N, C,
    OH, OW) or None: float32, C-contiguous; K // 2 padding on every side (``fits``). Uses
    scratch slot 0. False (``out`` then undefined) where the kernel refused the call (or
    has not built the kind's functions for this epilogue yet: ``depthwise_ir.ready``)."""
    n, c, h, wd = x.shape
    oh, ow = out.shape[2], out.shape[3]
    k = depthwise_ir.KINDS[kind][0]
    if raw.narrow is not None and ow <= depthwise_ir.NARROW_MAX_WIDTH:
        fn, vw = raw.narrow, 8
    else:
        fn, vw = raw.fn, raw.vw
    xp_len = depthwise_ir.scratch_len(h, wd, vw)
    xp = scratch(0, (xp_len,), np.dtype(np.float32))
    ba = (_zero_bias(c) if bias is None else bias).ctypes.data
    step_x, step_y = c * h * wd, c * oh * ow  # floats
    x0, y0, wa, xa = x.ctypes.data, out.ctypes.data, w.ctypes.data, xp.ctypes.data
    r0 = y0 if res is None else res.ctypes.data
    flags |= 0 if res is None else depthwise_ir.FLAG_RESIDUAL
    status = fn(kind, x0, wa, ba, r0, y0, xa, xp_len, lo, hi, flags, c, h, wd, oh, ow, k // 2,
                k // 2, n, step_x, step_y, step_y)  # fmt: skip
    if status == depthwise_ir.STATUS_NOT_BUILT and fn is raw.narrow:
        # the narrow build lacks this kind's functions: the main build (its scratch fits)
        xp_len = depthwise_ir.scratch_len(h, wd, raw.vw)
        xa = scratch(0, (xp_len,), np.dtype(np.float32)).ctypes.data
        status = raw.fn(kind, x0, wa, ba, r0, y0, xa, xp_len, lo, hi, flags, c, h, wd, oh, ow,
                        k // 2, k // 2, n, step_x, step_y, step_y)  # fmt: skip
    return not status


def raw_depthwise_fn(node: ConvNode) -> Callable[..., np.ndarray | None] | None:
    """``fn(x, b, r, out)``: a float32 2-D depthwise conv with constant weights and its
    epilogue on the kernel's ctypes build (``run_raw``) once something in this process
    built it (``depthwise_ir.raw()``: a cold start's warm-up, first, for its NumPy
    stand-ins), bias, residual and ReLU/Clip/HardSwish/HardSigmoid in the kernel's store
    and other activations after (``_numpy_act``); None where the conv is not one the
    kernel serves, or ``$TFRT_PY_JIT`` is ``0``. ``fn`` returns None before the kernel is
    built and for shapes it does not serve (``fits``); the caller then takes NumPy's
    path. Notes the conv (``depthwise_ir.WANTED``). Any thread."""
    sp, group, w_const, b_c, cdt, epi = node
    if (w_const is None or w_const.ndim != 4 or cdt != np.float32 or group < 2
            or w_const.shape[0] != group or w_const.shape[1] != 1
            or depthwise_ir.kind_of(w_const.shape[2], 1) < 0 or switched_off(ENV_JIT)):  # fmt: skip
        return None
    w2 = np.ascontiguousarray(w_const.reshape(group, -1), dtype=np.float32)
    w4_shape = tuple(w_const.shape)
    lo, hi, flags = _store_act(epi)
    epi_after = epi._replace(act="") if flags >= 0 else epi
    flags = max(flags, 0)
    plans: ShapeMemo[tuple[int, ...], Any] = ShapeMemo()
    strides = sp.resolve(w4_shape[2:])[1]
    if len(strides) == 2 and strides[0] == strides[1]:
        depthwise_ir.want(depthwise_ir.kind_of(w4_shape[2], int(strides[0])), flags)

    def plan_for(shape: tuple[int, ...]) -> Any:
        if len(shape) != 4 or shape[1] != group:
            return False
        kernel, strides, dil, pads = sp.resolve(w4_shape[2:])
        begin, end, out_sp = conv_geometry(shape[2:], kernel, strides, dil, pads, sp.auto_pad)
        kind = fits(shape, w4_shape, strides, (*begin, *end), dil)
        return False if kind < 0 or min(out_sp) < 1 else (kind, (shape[0], group, *out_sp))

    def raw_depthwise(x: np.ndarray, b: Any, r: Any, out: Any) -> np.ndarray | None:
        raw = depthwise_ir.raw()
        if raw is None or x.dtype != np.float32:
            return None
        got = plans.decided(x.shape, plan_for, x.shape)
        if got is None:
            return None
        kind, out_shape = got
        operands = raw_call_operands(x, b, r, out, out_shape, b_c, cdt, group)
        if operands is None:
            return None  # the kernel reads one a channel: NumPy's path says what is wrong
        ops, bb = operands
        if not run_raw(raw, kind, ops.x, w2, ops.y, bb, ops.r, lo, hi, flags):
            return None
        _numpy_act(ops.y, epi_after)
        return into_out(ops.y, out)

    return raw_depthwise


def store_code(epi: Epilogue) -> int:
    """The kernel's epilogue code (``depthwise_ir.CODES``) for ``epi``'s activation on the
    compiled path (``_grid_act``): HardSwish's or HardSigmoid's flag, else 0 (the clamp,
    with other activations after it)."""
    return max(_store_act(epi)[2], 0)


def _store_act(epi: Epilogue) -> tuple[float, float, int]:
    """(lo, hi, flags) of the kernel's store for ``epi``'s activation; flags -1 where the
    kernel cannot apply it (then ``_numpy_act`` does, after a store that clamps nothing)."""
    inf = float("inf")
    if not epi.act:
        return -inf, inf, 0
    if epi.act == "Relu":
        return 0.0, inf, 0
    if epi.act == "Clip":
        return float(epi.alpha), float(epi.beta), 0
    if epi.act == "HardSwish":
        return 1.0 / 6.0, 0.5, depthwise_ir.FLAG_HARD_SWISH
    if epi.act == "HardSigmoid":
        return float(epi.alpha), float(epi.beta), depthwise_ir.FLAG_HARD_SIGMOID
    return -inf, inf, -1


_ZEROS: list[np.ndarray] = [np.zeros(0, np.float32)]


def _zero_bias(c: int) -> np.ndarray:
    """At least ``c`` float32 zeros (one array, grown, never written)."""
    z = _ZEROS[0]
    if z.shape[0] < c:
        z = _ZEROS[0] = np.zeros(max(c, 2 * z.shape[0]), np.float32)
    return z


@inline
def _grid_act(act: int, p: Any) -> tuple[Any, Any, int, bool]:  # pragma: no cover - numba only
    """(lo, hi, flags, after) for the kernel: ReLU (act 1) and Clip (2) as its clamp,
    HardSwish (3) and HardSigmoid (4) as its ``FLAG_HARD_*`` with their alpha and beta,
    no-op bounds for the others, which ``_act_row`` applies after (``after``)."""
    inf = p[6]
    if act == 1:
        return p[2], inf, 0, False
    if act == 2:
        return p[0], p[1], 0, False
    if act == 3:
        return p[4], p[5], 2, False  # depthwise_ir.FLAG_HARD_SWISH
    if act == 4:
        return p[0], p[1], 4, False  # depthwise_ir.FLAG_HARD_SIGMOID
    return -inf, inf, 0, act != 0


@inline
def _grid_block(  # pragma: no cover - numba only
    x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
    n0: int, n1: int, g0: int, g1: int,
) -> None:  # fmt: skip
    """out[n, g] = act(conv(x[n, g], w[g]) + b[g] (+ res[n, g])) for images ``[n0, n1)``
    and channels ``[g0, g1)``: one kernel call an image."""
    c_in, h, wd = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    kk = w.shape[2] * w.shape[3]
    lo, hi, flags, after = _grid_act(act, p)
    has_res = res.shape[0] > 0
    if has_res:
        flags |= 1
    four = np.uint64(4)
    for n in range(n0, n1):
        at_x = np.uint64((n * c_in + g0) * h * wd) * four
        at_y = np.uint64((n * c_in + g0) * oh * ow) * four
        r = res.ctypes.data + at_y if has_res else out.ctypes.data + at_y
        at_w, at_b = w.ctypes.data + np.uint64(g0 * kk) * four, b.ctypes.data + np.uint64(g0) * four
        if tab[3]:
            _dw_narrow(tab[0], x.ctypes.data + at_x, at_w, at_b, r, out.ctypes.data + at_y,
                       xp.ctypes.data, xp.shape[0], lo, hi, flags, g1 - g0, h, wd, oh, ow,
                       tab[1], tab[2])  # fmt: skip
        else:
            _dw_grid(tab[0], x.ctypes.data + at_x, at_w, at_b, r, out.ctypes.data + at_y,
                     xp.ctypes.data, xp.shape[0], lo, hi, flags, g1 - g0, h, wd, oh, ow, tab[1],
                     tab[2])  # fmt: skip
        if after:
            ya = out[n].reshape(c_in * oh * ow)
            for g in range(g0, g1):
                _act_row(ya[g * oh * ow : (g + 1) * oh * ow], -p[2], act, p)


def _grid(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any, xp: Any,
          acc: Any, n0: int, n1: int, g0: int, g1: int) -> None:  # pragma: no cover  # fmt: skip
    """``_grid_block`` (``conv_depthwise_same``'s signature; ``acc`` unused)."""
    _grid_block(x, w, b, res, out, tab, act, p, xp, n0, n1, g0, g1)


def _grid_par(x: Any, w: Any, b: Any, res: Any, out: Any, tab: Any, act: int, p: Any,
              buf: Any, xp_len: int, blocks: Any) -> None:  # pragma: no cover  # fmt: skip
    """``_grid_block`` over ``blocks`` (rows n0, n1, g0, g1) in a ``prange`` loop on native
    threads, block ``q`` with ``buf[q]`` as its scratch."""
    for q in numba.prange(blocks.shape[0]):
        _grid_block(x, w, b, res, out, tab, act, p, buf[q, :xp_len],
                    blocks[q, 0], blocks[q, 1], blocks[q, 2], blocks[q, 3])  # fmt: skip


def _operands() -> tuple[Any, ...]:
    """A 3x4 plane of two channels and a 3x3 kernel at stride 2, as a model passes them (float32,
    weights and bias read-only), with its output, table and scratch length."""
    t = np.float32
    x, w, b = np.zeros((1, 2, 3, 4), t), frozen(np.zeros((2, 1, 3, 3), t)), frozen(np.zeros(2, t))
    out = np.zeros((1, 2, 2, 2), t)
    kind = depthwise_ir.kind_of(3, 2)
    return (
        x,
        w,
        b,
        np.zeros((0, 0, 0, 0), t),
        out,
        table(kind, 3, out.shape),
        scratch_len(x.shape, out.shape),
    )


def _warm(fn: Any) -> None:
    x, w, b, res, out, tab, n = _operands()
    fn(x, w, b, res, out, tab, 0, np.zeros(PARAMS_LEN, np.float32), np.zeros(n, np.float32),
       np.zeros(0, np.float32), 0, 1, 0, 2)  # fmt: skip


def _warm_par(fn: Any) -> None:
    x, w, b, res, out, tab, n = _operands()
    blocks = native_threads.plane_blocks(1, 2, 2)
    fn(x, w, b, res, out, tab, 0, np.zeros(PARAMS_LEN, np.float32),
       np.zeros((blocks.shape[0], n), np.float32), n, blocks)  # fmt: skip


def _prepare(module_globals: dict[str, Any]) -> bool:
    # False: no vector path or no llvmlite JIT here (the callers keep their numba loops)
    fn = depthwise_ir.function()
    if fn is None:
        return False
    module_globals["_dw_grid"] = fn
    module_globals["_dw_narrow"] = depthwise_ir.narrow_function() or fn
    return True


_HELPERS = (_act_row, _grid_act, _grid_block)
GRID = Jitted(_grid, _warm, helpers=_HELPERS, prepare=_prepare)
GRID_PAR = Jitted(_grid_par, _warm_par, helpers=_HELPERS, parallel=True, prepare=_prepare)
