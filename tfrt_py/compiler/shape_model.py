"""Fit the shape model at load: every planned value's shape as a function of the dims.

The sync interpreter plans once per model, not once per input signature, when every
value's shape (and every small shape-arithmetic value: a Reshape's target, a Slice's end)
is a known function of the model's dim variables (``executors.dims.DimVars``: batch,
sequence, past, ...). This pass finds those functions by running the program on small
feeds at the corners of a grid -- each variable at two values, so ``2**n`` probes for
``n`` variables -- and interpolating: through ``2**n`` corner values there is exactly one
multilinear polynomial (``a + b*B + c*L + d*B*L`` for two variables), and products of
dims, sums (past + sequence) and constants are all of that form. Two more probes at other
values must then agree exactly, or the value is left unfitted (the interpreter does not
plan it: its kernel allocates, or it is computed every call). Integer division, clamps and
the like (a strided Conv over a dynamic image size) fail that check. At run time the
interpreter checks the formulas once more against a real run at the first call of every
new dim bucket (``executors/plan_generic.py``).

Probes feed ones to integer and bool inputs (a mask that attends, ids in range) and zeros to
float inputs; they run only for pure programs (no custom or async kernels) with at most
``MAX_VARS`` variables, stop after the first when it measured more than its share of
``FIT_MAX_FLOPS`` (a detector's probes are whole inferences), and are bounded like every
load-time evaluation (``load_limits.guarded_env``). Runs once per load on the loading
thread.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

import numpy as np

from ..errors import ExecutionError
from ..executors.dims import DimVars, Fitted, ShapeModel, genai_tied, monomials
from ..executors.plan_build import BAKE_MAX_BYTES
from ..executors.plan_probe import value_slots
from ..executors.program import Program
from ..ir import TensorType
from ..records import record
from .cost import cost_of_shapes
from .load_limits import guarded_env

__all__ = [
    "CHECK_POINTS",
    "FIT_MAX_FLOPS",
    "GRID",
    "MAX_VARS",
    "Fit",
    "fit_shape_model",
    "probe_scale",
]

#: More variables than this: 2**n probes cost too much at load; plans stay per signature.
MAX_VARS = 4
#: Each variable's two grid values.
GRID = (2, 3)
#: The probes may do at most this much work together (the first one's FLOPs, measured,
#: times their number): a detector resizes every image to ~320-800 pixels, so each probe
#: is a whole inference (FCOS-R50's six: 2.8 s at every load, for a plan that saves less);
#: a BERT-large's probes (a few tokens each) stay under it.
FIT_MAX_FLOPS = 3e10


def _check_point(j: int, which: int) -> int:
    """Variable ``j``'s value in check probe ``which``: distinct, off the grid, small."""
    return (5 + 2 * j) if which == 0 else (4 + 3 * j)


CHECK_POINTS = 2


@record
class Fit:
    """The fitted model (None: plans stay per signature, ``reason`` says why), the probe
    environment at the first check point (the plan's structure is read from it) and the
    variable values it ran at."""

    model: ShapeModel | None
    reason: str
    env: list[Any] | None = None
    at: tuple[int, ...] = ()


def _feeds(program: Program, dv: DimVars, vals: tuple[int, ...]) -> list[np.ndarray] | None:
    feeds = []
    for v, row in zip(program.graph.inputs, dv.dims):
        t = v.type
        assert isinstance(t, TensorType) and t.shape is not None and t.dtype is not None
        shape = []
        for d, rule in zip(t.shape, row):
            if rule is None:
                shape.append(int(d))  # type: ignore[arg-type]
            else:
                coef, const = rule
                shape.append(sum(c * x for c, x in zip(coef, vals)) + const)
        if min(shape, default=1) < 0:
            return None
        dt = np.dtype(t.dtype)
        fill = 0 if dt.kind in "fc" else 1
        if math.prod(shape) * dt.itemsize > 1 << 24:
            return None
        feeds.append(np.full(shape, fill, dt))
    return feeds


def _probe(program: Program, dv: DimVars, vals: tuple[int, ...]) -> list[Any] | None:
    feeds = _feeds(program, dv, vals)
    if feeds is None:
        return None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return guarded_env(program, feeds)


def _env_flops(program: Program, env: list[Any]) -> float:
    """The FLOPs a probe's run did: the cost model on the shapes it had (top level)."""

    def shape(s: int) -> tuple[int, ...]:
        x = env[s]
        return tuple(x.shape) if isinstance(x, (np.ndarray, np.generic)) else ()

    return sum(
        cost_of_shapes(ins.node, [shape(s) for s in ins.ins], [shape(s) for s in ins.outs]).flops
        for ins in program.instrs
    )


def _inputs_ok(program: Program) -> str:
    for v in program.graph.inputs:
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None or t.dtype is None:
            return f"input {v.name!r} has no known rank or dtype"
        if np.dtype(t.dtype).kind not in "biuf":
            return f"input {v.name!r} has dtype {t.dtype}"
    if not all(i.flags.pure and not i.flags.is_async for i in program.instrs):
        return "custom or async kernels (probes would run them)"
    return ""


def _points(n: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The grid probes and the check probes for ``n`` variables."""
    # itertools.product varies the last variable fastest; monomials index variable j by bit j
    grid = list(itertools.product(*[GRID] * n))
    checks = [tuple(_check_point(j, w) for j in range(n)) for w in range(CHECK_POINTS)]
    return grid, checks


def probe_scale(n: int) -> int:
    """The probes' work for ``n`` variables in units of one run with every variable at 1:
    the sum over the probes of the product of their values (a cost linear in each dim)."""
    grid, checks = _points(n)
    return sum(math.prod(p) for p in [*grid, *checks])


def fit_shape_model(
    program: Program,
    determined: set[int],
    computed_once: set[int] | frozenset[int],
    max_probe_flops: float | None = None,
    flops_at_ones: float = 0.0,
) -> Fit:
    """The shape model of ``program``'s top level (see the module docstring). With
    ``max_probe_flops``, refused when the probes would cost more: ``flops_at_ones`` (the
    cost model's estimate with every dim variable at 1) times ``probe_scale``."""
    bad = _inputs_ok(program)
    if bad:
        return Fit(None, bad)
    dv = DimVars.of(genai_tied([v.type.shape for v in program.graph.inputs]))  # type: ignore[union-attr]
    if dv is None:
        return Fit(None, "an input of unknown rank")
    n = dv.n
    if n == 0:
        return Fit(None, "static shapes: one plan")
    if n > MAX_VARS:
        return Fit(None, f"{n} dim variables (at most {MAX_VARS} are fitted)")
    if max_probe_flops is not None and flops_at_ones * probe_scale(n) > max_probe_flops:
        est = flops_at_ones * probe_scale(n) / 1e6
        return Fit(None, f"its probes (est. {est:.0f} MFLOP) cost more than "
                         f"{max_probe_flops / 1e6:.0f} MFLOP here")  # fmt: skip
    grid, checks = _points(n)
    limit = FIT_MAX_FLOPS if max_probe_flops is None else max_probe_flops
    envs: list[list[Any]] = []
    try:
        for vals in [*grid, *checks]:
            env = _probe(program, dv, vals)
            if env is None:
                return Fit(None, f"a probe at dims {vals} would compute too much")
            work = _env_flops(program, env) * (len(grid) + len(checks)) if not envs else 0.0
            if work > limit:
                why = f"its probes (measured: {work / 1e6:.0f} MFLOP; a resize to a fixed size?)"
                return Fit(None, f"{why} cost more than {limit / 1e6:.0f} MFLOP")
            envs.append(env)
    except ExecutionError as e:
        return Fit(None, f"the program fails on probe feeds ({e})")
    samples, spans = _samples(program, envs, determined, computed_once)
    n_grid = len(grid)
    if samples:
        f = np.concatenate(samples)  # (rows, probes)
        inv = np.linalg.inv(np.array([monomials(p) for p in grid]))
        coef = f[:, :n_grid] @ inv.T
        coef[np.abs(coef) < 1e-9] = 0.0
        pred = coef @ np.array([monomials(c) for c in checks]).T
        good_row = np.all(np.abs(pred - f[:, n_grid:]) < 1e-6, axis=1)
    else:
        coef = np.zeros((0, 1 << n))
        good_row = np.zeros(0, bool)
    return Fit(_model(dv, spans, coef, good_row), "", envs[n_grid], checks[0])


#: A candidate's rows in the samples: (slot, "shape" | "value", first row, row count, and
#: for a value its shape and dtype)
_Span = tuple[int, str, int, int, Any]


def _samples(
    program: Program,
    envs: list[list[Any]],
    determined: set[int],
    computed_once: set[int] | frozenset[int],
) -> tuple[list[np.ndarray], list[_Span]]:
    """Every candidate's rows, one row per dim (shapes) or element (values), one column
    per probe in ``envs``: fitted together in one product, checked together."""
    slot_of = value_slots(program)
    samples: list[np.ndarray] = []
    spans: list[_Span] = []
    at = 0
    for ins in program.instrs:
        for val, s in zip(ins.node.outputs, ins.outs):
            if val is None or s < 2 or slot_of.get(id(val)) != s:
                continue
            xs = [e[s] for e in envs]
            if not all(isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "biuf"
                       for x in xs):  # fmt: skip
                continue
            shapes = [np.shape(x) for x in xs]
            rank = len(shapes[0])
            if any(len(sh) != rank for sh in shapes):
                continue
            if id(val) in determined:
                samples.append(np.array(shapes, np.float64).T)
                spans.append((s, "shape", at, rank, None))
                at += rank
            if (
                id(val) in computed_once
                and xs[0].dtype.kind in "biu"  # a float's rounding is not the formula's
                and all(sh == shapes[0] for sh in shapes)
                and xs[0].nbytes <= BAKE_MAX_BYTES
                and xs[0].size
            ):
                flat = np.stack([np.asarray(x, np.float64).reshape(-1) for x in xs], axis=1)
                exact = np.array_equal(flat[:, 0].astype(xs[0].dtype), np.ravel(xs[0]))
                if exact and np.all(np.isfinite(flat)):
                    samples.append(flat)
                    spans.append((s, "value", at, flat.shape[0], (shapes[0], xs[0].dtype)))
                    at += flat.shape[0]
    return samples, spans


def _model(dv: DimVars, spans: list[_Span], coef: np.ndarray, good_row: np.ndarray) -> ShapeModel:
    """The model of the candidates whose every row ``good_row`` passes, with their rows of
    ``coef`` (multilinear coefficients, one column per monomial)."""
    n = dv.n
    keep: list[np.ndarray] = []
    shapes_f: dict[int, Fitted] = {}
    values_f: dict[int, Fitted] = {}
    depends: dict[int, int] = {}
    out_at = 0
    monos = np.arange(1 << n)
    for s, kind, start, cnt, meta in spans:
        if not good_row[start : start + cnt].all():
            continue  # not multilinear in the dims: left to the kernels, per call
        rows_c = coef[start : start + cnt]
        keep.append(rows_c)
        if kind == "shape":
            shapes_f[s] = Fitted(out_at, cnt)
            used = monos[np.any(rows_c != 0, axis=0)]
            depends[s] = int(np.bitwise_or.reduce(used)) if used.size else 0
        else:
            values_f[s] = Fitted(out_at, cnt, tuple(meta[0]), meta[1])
        out_at += cnt
    coef_all = np.concatenate(keep) if keep else np.zeros((0, 1 << n))
    return ShapeModel(dv, coef_all, shapes_f, values_f, depends)
