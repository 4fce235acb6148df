"""Kernels (image): Resize (opsets 10, 11, 13, 18, 19) and Upsample (1, 7, 9; mapped onto Resize).

Inputs by opset: Resize-10 ``(X, scales)``; Resize-11+ ``(X, roi, scales, sizes)`` (from 13
roi and scales are optional; an empty tensor counts as omitted); Upsample-9
``(X, scales)``; Upsample-7 a ``scales`` attribute; Upsample-1 ``height_scale`` /
``width_scale`` attributes. Exactly one of scales/sizes decides the output shape:
``floor(in * scale)`` or ``sizes`` (adjusted by ``keep_aspect_ratio_policy``, opset 18+);
``axes`` (18+) names the axes they apply to. Resize-10 and Upsample use asymmetric
coordinates with ORT's "simple" nearest rounding (floor when upsampling, ceil when
downsampling). All modes, coordinate transformations, nearest modes, ``antialias``,
``exclude_outside``, ``cubic_coeff_a`` and ``extrapolation_value`` are supported.

Semantics follow the ONNX reference implementation (which produced the node cases); like it
and onnxruntime, the output size from ``scales`` ignores ``roi``.

At load, constant scales/sizes/roi are read; per input shape the per-axis tables
(``resize_plan``) are computed once and cached (runtime scales/sizes are part of the cache
key). A call is then: nearest -> one ``np.take`` per resized axis (integer upsampling is a
strided/broadcast copy); linear/cubic -> per resized axis, shrinking axes first, a GEMM
with the [in, out] weights for the innermost axis (banded blocks when it is long), a small
batched matmul or gathered taps for outer axes. Math is in float32 (float64 for float64 and
wide-int inputs); the output keeps X's dtype, integers rounded and saturated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ShapeMemo, attr_str
from ..registry import KernelRegistry
from .resize_plan import AxisPlan, Params, output_geometry, plan_axis

__all__ = ["register_kernels"]

Runner = Callable[[np.ndarray], np.ndarray]
_CACHE_LIMIT = 64


def _compute_dtype(dt: np.dtype) -> np.dtype:
    if dt == np.float64 or (dt.kind in "iu" and dt.itemsize >= 4):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


#: The innermost axis is one GEMM with the dense [in, out] weights up to this input length;
#: beyond, a GEMM per block of outputs with just the inputs the block reads (banded).
_DENSE_LAST_MAX_IN = 128
_BAND_BLOCK = 64
#: Other axes use a dense matrix product up to this input length, else gathered taps.
_DENSE_MID_MAX_IN = 32


def _banded_last_axis(ap: AxisPlan, cdt: np.dtype) -> Runner:
    """Resample the innermost axis by blocks of outputs: each block is a small GEMM with
    the weight rows of just the inputs it reads (the weights are banded)."""
    assert ap.taps is not None
    idx, w = ap.taps
    dense = ap.dense()
    out_len = ap.out_len
    blocks = []
    for j0 in range(0, out_len, _BAND_BLOCK):
        j1 = min(j0 + _BAND_BLOCK, out_len)
        used = idx[j0:j1][w[j0:j1] != 0]
        i0, i1 = (int(used.min()), int(used.max()) + 1) if used.size else (0, 1)
        wb = np.ascontiguousarray(dense[j0:j1, i0:i1].T.astype(cdt))
        blocks.append((j0, j1, i0, i1, wb))

    def banded(x: np.ndarray) -> np.ndarray:
        x2 = x.reshape(-1, x.shape[-1])
        y = np.empty((x2.shape[0], out_len), dtype=cdt)
        for j0, j1, i0, i1, wb in blocks:
            np.matmul(x2[:, i0:i1], wb, out=y[:, j0:j1])
        return y.reshape((*x.shape[:-1], out_len))

    return banded


def _interp_step(ap: AxisPlan, nd: int, cdt: np.dtype, ev: float) -> Runner:
    """The function resampling axis ``ap.axis`` of a ``cdt`` array of rank ``nd``."""
    assert ap.taps is not None
    k, out_len = ap.axis, ap.out_len
    idx, w = ap.taps
    step: Runner
    if k == nd - 1 and ap.in_len <= _DENSE_LAST_MAX_IN:
        wt = np.ascontiguousarray(ap.dense().T.astype(cdt))

        def last_axis(x: np.ndarray) -> np.ndarray:
            lead = x.shape[:-1]
            return (x.reshape(-1, x.shape[-1]) @ wt).reshape((*lead, out_len))

        step = last_axis
    elif k == nd - 1:
        step = _banded_last_axis(ap, cdt)
    elif k == nd - 2 and ap.in_len <= _DENSE_MID_MAX_IN:
        wd = ap.dense().astype(cdt)

        def second_last_axis(x: np.ndarray) -> np.ndarray:
            return np.matmul(wd, x)

        step = second_last_axis
    else:
        sh = [1] * nd
        sh[k] = out_len
        cols = [
            (np.ascontiguousarray(idx[:, t]), w[:, t].astype(cdt).reshape(sh))
            for t in range(idx.shape[1])
            if t == 0 or np.any(w[:, t])
        ]

        def taps(x: np.ndarray) -> np.ndarray:
            acc: np.ndarray | None = None
            for i, wc in cols:
                g = np.take(x, i, axis=k)
                g *= wc
                if acc is None:
                    acc = g
                else:
                    acc += g
            assert acc is not None
            return acc

        step = taps
    if ap.extrapolated is None:
        return step
    sl: list[Any] = [slice(None)] * nd
    sl[k] = ap.extrapolated
    where = tuple(sl)

    def extrapolate(x: np.ndarray) -> np.ndarray:
        y = step(x)
        y[where] = ev
        return y

    return extrapolate


def _repeat_runner(
    reps: dict[int, int], shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> Runner:
    """Nearest integer upsampling (axis ``a`` repeated ``reps[a]`` times) as copies: the
    innermost axis by strided writes, the others by one broadcast copy."""
    last = len(shape) - 1
    f_last = reps.get(last, 0)
    cur = list(shape)
    if f_last:
        cur[last] *= f_last
    vshape: list[int] = []
    bshape: list[int] = []
    for a, d in enumerate(cur):
        if a in reps and a != last:
            vshape += [d, 1]
            bshape += [d, reps[a]]
        else:
            vshape.append(d)
            bshape.append(d)
    vs, bs, cs = tuple(vshape), tuple(bshape), tuple(cur)
    others = any(a != last for a in reps)

    def repeat(x: np.ndarray) -> np.ndarray:
        if f_last:
            t = np.empty((*x.shape, f_last), dtype=x.dtype)
            for j in range(f_last):
                t[..., j] = x
            x = t.reshape(cs)
        if others:
            return np.broadcast_to(x.reshape(vs), bs).reshape(out_shape)
        return x

    return repeat


def _nearest_runner(steps: list[AxisPlan], shape: tuple[int, ...], ev: float) -> Runner:
    nd = len(shape)
    out_shape = list(shape)
    for s in steps:
        out_shape[s.axis] = s.out_len
    # Integer upsampling with index == repeat(arange(in), s): a broadcast copy.
    reps: dict[int, int] = {}
    for s in steps:
        n_in = shape[s.axis]
        f = s.out_len // n_in if n_in else 0
        if (
            f >= 1
            and f * n_in == s.out_len
            and s.extrapolated is None
            and s.index is not None
            and np.array_equal(s.index, np.repeat(np.arange(n_in), f))
        ):
            reps[s.axis] = f
    if len(reps) == len(steps):
        return _repeat_runner(reps, shape, tuple(out_shape))

    # One np.take per axis (whole-row copies for outer axes) beats one multi-axis fancy
    # index several times; shrinking axes go first.
    order = sorted(steps, key=lambda s: s.out_len / max(shape[s.axis], 1))
    takes = [(s.axis, s.index) for s in order if s.index is not None]

    def gather(x: np.ndarray) -> np.ndarray:
        for a, ix in takes:
            x = np.take(x, ix, axis=a)
        return x

    run: Runner = gather
    masks = [s for s in steps if s.extrapolated is not None]
    if not masks:
        return run
    full = np.zeros(out_shape, dtype=bool)
    for s in masks:
        sh = [1] * nd
        sh[s.axis] = s.out_len
        full |= np.asarray(s.extrapolated).reshape(sh)

    def gather_extrapolate(x: np.ndarray) -> np.ndarray:
        y = run(x)
        np.copyto(y, ev, where=full, casting="unsafe")
        return y

    return gather_extrapolate


def _make_runner(
    p: Params,
    shape: tuple[int, ...],
    dt: np.dtype,
    scales: tuple[float, ...] | None,
    sizes: tuple[int, ...] | None,
    roi: tuple[Any, ...] | None,
) -> Runner:
    """The function resizing inputs of this shape and dtype."""
    nd = len(shape)
    axes = [a % nd for a in p.axes] if p.axes is not None else list(range(nd))
    scale, out = output_geometry(shape, scales, sizes, axes, p.policy)
    cdt = _compute_dtype(dt)
    steps = []
    for j, a in enumerate(axes):
        r = None
        if roi is not None and p.ctm == "tf_crop_and_resize" and len(roi) == 2 * len(axes):
            r = (roi[j], roi[len(axes) + j])
        ap = plan_axis(p, a, shape[a], out[a], scale[a], r)
        if ap is not None:
            steps.append(ap)
    ev = p.extrapolation_value
    if not steps:
        return lambda x: x
    if p.mode == "nearest":
        return _nearest_runner(steps, shape, ev)
    # Separable: shrink first so later axes touch less data.
    steps.sort(key=lambda s: s.out_len / max(s.in_len, 1))
    fns = [_interp_step(s, nd, cdt, ev) for s in steps]

    def interpolate(x: np.ndarray) -> np.ndarray:
        y = x if x.dtype == cdt else x.astype(cdt)
        for f in fns:
            y = f(y)
        if y.dtype == dt:
            return y
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return np.clip(np.rint(y), info.min, info.max).astype(dt)
        return y.astype(dt)

    return interpolate


def _opt(a: Any) -> np.ndarray | None:
    """An optional runtime input: None when omitted or empty."""
    if a is None:
        return None
    a = np.asarray(a)
    return a if a.size else None


def _params(ctx: KernelContext, legacy: bool) -> Params:
    mode = attr_str(ctx, "mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"mode={mode!r}")
    if legacy:
        if mode == "cubic":
            raise ctx.unsupported("mode='cubic' needs Resize-11+")
        return Params(mode, "asymmetric", "simple", -0.75, False, 0.0, False, "stretch", None)
    ctm = attr_str(ctx, "coordinate_transformation_mode", "half_pixel")
    nearest_mode = attr_str(ctx, "nearest_mode", "round_prefer_floor")
    policy = attr_str(ctx, "keep_aspect_ratio_policy", "stretch")
    axes = ctx.attr("axes", None)
    known_ctm = (
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_crop_and_resize",
    )
    if ctm not in known_ctm:
        raise ctx.unsupported(f"coordinate_transformation_mode={ctm!r}")
    if nearest_mode not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise ctx.unsupported(f"nearest_mode={nearest_mode!r}")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy={policy!r}")
    return Params(
        mode=mode,
        ctm=ctm,
        nearest_mode=nearest_mode,
        cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
        antialias=bool(ctx.attr("antialias", 0)) and mode != "nearest",
        policy=policy,
        axes=None if axes is None else tuple(int(a) for a in axes),
    )


def _tuple(a: np.ndarray | None, kind: type | None) -> tuple[Any, ...] | None:
    """``a`` as a hashable tuple of ``kind`` (numpy scalars when ``kind`` is None)."""
    if a is None:
        return None
    return tuple(a.reshape(-1)) if kind is None else tuple(kind(v) for v in a.reshape(-1))


def _resize_fn(
    p: Params,
    get: Callable[[tuple[Any, ...]], tuple[Any, Any, Any]],
    static: tuple[Any, Any, Any] | None,
    static_shape: tuple[int, ...] | None,
    static_dtype: np.dtype | None,
) -> Callable[..., np.ndarray]:
    """A compute function ``resize(x, *rest)``; ``get(rest)`` gives (scales, sizes, roi)
    when they are not load-time constants (``static``)."""
    cache: ShapeMemo[Any, Runner] = ShapeMemo(_CACHE_LIMIT)
    if static is not None and static_shape is not None and static_dtype is not None:
        key0 = (static_shape, static_dtype.num)
        cache[key0] = _make_runner(p, static_shape, static_dtype, *static)

    def resize(x: np.ndarray, *rest: Any) -> np.ndarray:
        args = static if static is not None else get(rest)
        key = (x.shape, x.dtype.num) if static is not None else (x.shape, x.dtype.num, args)
        run = cache.get(key)
        if run is None:
            if args[0] is None and args[1] is None:
                raise ValueError("Resize: one of 'scales' and 'sizes' must be given")
            run = _make_runner(p, x.shape, x.dtype, *args)
            cache.put(key, run)
        return run(x)

    return resize


def _static_shape(ctx: KernelContext) -> tuple[int, ...] | None:
    t = ctx.input_type(0)
    if t is None or t.shape is None or not t.is_static:
        return None
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def _resize(ctx: KernelContext) -> ComputeFn:
    """Resize: ``fn(X, roi=None, scales=None, sizes=None) -> Y`` (Resize-10: ``(X, scales)``)."""
    legacy = ctx.opset < 11
    p = _params(ctx, legacy)
    shape = _static_shape(ctx)
    dtype = ctx.input_dtype(0)
    static: tuple[Any, Any, Any] | None
    if legacy:
        sc = ctx.const_input(1)
        static = None if sc is None else (_tuple(_opt(sc), float), None, None)

        def get10(rest: tuple[Any, ...]) -> tuple[Any, Any, Any]:
            return (_tuple(_opt(rest[0]), float), None, None)

        return _resize_fn(p, get10, static, shape, dtype)

    consts = [ctx.const_input(i) for i in (1, 2, 3)]
    all_const = all(c is not None or not ctx.has_input(i) for c, i in zip(consts, (1, 2, 3)))
    static = None
    if all_const:  # (scales, sizes, roi); scales win when both are given
        roi, sc, sz = (_opt(c) for c in consts)
        static = (_tuple(sc, float), None if sc is not None else _tuple(sz, int), _tuple(roi, None))

    def get11(rest: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        rest = rest + (None,) * (3 - len(rest))
        roi, sc, sz = (_opt(v) for v in rest[:3])
        return (_tuple(sc, float), None if sc is not None else _tuple(sz, int), _tuple(roi, None))

    return _resize_fn(p, get11, static, shape, dtype)


def _upsample(ctx: KernelContext) -> ComputeFn:
    """Upsample: ``fn(X, scales=None) -> Y`` (scales an attribute before opset 9)."""
    p = _params(ctx, legacy=True)
    shape = _static_shape(ctx)
    dtype = ctx.input_dtype(0)
    static: tuple[Any, Any, Any] | None
    if ctx.opset >= 9:
        sc = ctx.const_input(1)
        static = None if sc is None else (_tuple(_opt(sc), float), None, None)
    elif ctx.opset >= 7:
        static = (tuple(float(s) for s in ctx.attr("scales")), None, None)
    else:
        hs, ws = float(ctx.attr("height_scale")), float(ctx.attr("width_scale"))
        static = ((1.0, 1.0, hs, ws), None, None)

    def get(rest: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        return (_tuple(_opt(rest[0]), float), None, None)

    return _resize_fn(p, get, static, shape, dtype)


def register_kernels(registry: KernelRegistry) -> None:
    """Register Resize and Upsample."""
    registry.add("Resize", _resize, since=10)
    registry.add("Upsample", _upsample, since=1)
