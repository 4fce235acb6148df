"""One native function for every input signature of a *box* of dim values (load time or
the compile worker; pure, thread-safe).

Signature mode lowers one module per input signature (``graph.lower(shapes=...)``), with
every dim a number in the code. Traffic whose lengths change on every call (text, a
decoder's growing past, a dynamic batcher's batch sizes) then rarely repeats a signature,
and little of it ever runs native code. ``lower_box`` makes one module that serves every
signature whose dim variables (``executors.dims.DimVars``: batch, sequence, past, ...)
lie in a box, each variable in a range ``(lo, hi]`` (``box_of``: 2..16, then powers of
eight; a top the model cannot run at is lowered by bisection, ``_fitting``).

How. Inside a box the lowering changes nothing but integers: loop extents, strides,
offsets, sizes. So the module is lowered at sample points of the box (``samples``) with
one layout (``graph.Room``): arena buffers placed and constants packed where the box's top
signature has them, and the choices between two correct forms of code
(``NodeContext.choose``: BLAS or loops, ...) made as the top made them. The texts between
their numbers must then be equal, and every integer that differs between them is fitted
as a polynomial in the variables with integer coefficients (``monomial_exponents``: each
variable squared at most, degree three at most: sizes such as batch x heads x length x
length), which must give the integer exactly at every sample. The module is the top
sample's source with those integers replaced by their polynomials over ``dv0``, ``dv1``
..., which the function reads from its feeds' shapes and checks against the box, and with
every element index read as ``np.uint64`` (``_unsigned_indices``). Anything else declines
(``Declined``: a lowering that differs at some sample, a constant that is not a prefix of
the top's, a number that is not such a polynomial), and the tier lowers that box's
signatures one by one, as before.

Why it holds between samples. A variable's samples are all its values when the box holds
at most ``AXIS_ALL`` of them; else the two lowest and two highest values and a run of
``AXIS_ALL`` consecutive values: every residue modulo 16 (a choice made on ``n % 4``, a
vector width, a panel width differs between samples), and both ends of the range (a
choice made on a threshold that is not replayed differs between its ends). A shape that
is a floor division or a clamp of a variable fits no polynomial at that many points.
Arena buffers: a buffer's size at every point of the box (its fitted polynomial,
evaluated at each point) must be at most its size at the top, where it was placed; the
places do not overlap there, so they do not anywhere in the box.

The source keeps the rule of ``source.py``: it is our template with our numbers and our
identifiers; ``audit`` checks it again.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from ...concurrency import compiled_gate
from ...executors.dims import DimVars, genai_tied
from ...executors.program import Program
from ...ir import Graph
from .budget import budget, check
from .graph import Lowered, Room, folded_values, lower, probe
from .source import ConstantsDiffer, Declined, audit, literal

__all__ = [
    "ARENA_CHECK_POINTS",
    "AXIS_ALL",
    "MAX_DIM",
    "MAX_FREE",
    "Box",
    "box_of",
    "describe_box",
    "input_shapes",
    "lower_box",
    "monomial_exponents",
    "native_dim_vars",
    "samples",
]

#: A variable whose range holds at most this many values is sampled at every one.
AXIS_ALL = 16
#: At most this many variables may vary inside one box (the samples grow as a grid).
MAX_FREE = 2
#: Boxes reach no further (the arena check evaluates sizes at every point in int64).
MAX_DIM = 1 << 16
#: The most points of a box at which the arena check evaluates a buffer's size.
ARENA_CHECK_POINTS = 1 << 16
#: Folded values of at most this many elements that change inside a box are written by
#: code (``_sized_by_dims``).
SPELLED_MAX = 16
#: A box: per variable, (lo, hi): the values lo < v <= hi.
Box = tuple[tuple[int, int], ...]
_VAR = "dv"
#: The numbers of generated source (``source.literal``'s forms), split out: the text
#: between them must be the same at every sample.
_NUMBER = re.compile(r"(\(-\d+\)|(?<![\w.])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?(?![\w.]))")
#: An integer among them: ``literal`` writes a negative one parenthesized.
_INT = re.compile(r"\d+|\(-\d+\)")
_VAR_NAME = re.compile(rf"\b{_VAR}\d")


def box_of(vals: Sequence[int]) -> Box:
    """The box of these variable values: 0 and 1 alone (a dim of 1 broadcasts, and the
    lowering drops it), then (1, 16], and above 16 the powers of eight: (16, 128],
    (128, 1024], ... Few boxes, few compiles: a decoder's growing past needs two up to
    128 tokens, three up to 1024 (each function's arena is sized for its box's top)."""
    out = []
    for v in vals:
        v = int(v)
        if v <= 1:
            out.append((v - 1, v))
            continue
        hi = 16
        while hi < v:
            hi *= 8
        out.append((1 if hi == 16 else hi // 8, hi))
    return tuple(out)


def _axis(lo: int, hi: int) -> list[int]:
    """One variable's sample values in (lo, hi] (module docstring)."""
    if hi - lo <= AXIS_ALL:
        return list(range(lo + 1, hi + 1))
    return sorted({lo + 1, lo + 2, *range(lo + 1, lo + 1 + AXIS_ALL), hi - 1, hi})


def samples(box: Box) -> list[tuple[int, ...]]:
    """The sample points of ``box`` (variable values, the top point first). Raises
    Declined when more than ``MAX_FREE`` variables vary."""
    free = [j for j, (lo, hi) in enumerate(box) if hi - lo > 1]
    if any(hi > MAX_DIM for _, hi in box):
        raise Declined([f"a dim above {MAX_DIM} (signatures there are lowered one by one)"])
    if len(free) > MAX_FREE:
        raise Declined([f"{len(free)} dims vary in one box (at most {MAX_FREE})"])
    top = tuple(hi for _, hi in box)
    points = {top}
    for j in free:  # each variable along its axis, the others at the top
        for v in _axis(*box[j]):
            points.add((*top[:j], v, *top[j + 1 :]))
    if len(free) > 1:  # a 3 x 3 grid pins the products of variables
        grids = [sorted({box[j][0] + 1, (box[j][0] + box[j][1] + 1) // 2, box[j][1]})
                 for j in free]  # fmt: skip
        for vs in itertools.product(*grids):
            p = list(top)
            for j, v in zip(free, vs):
                p[j] = v
            points.add(tuple(p))
    return [top, *sorted(points - {top})]


def monomial_exponents(box: Box) -> list[tuple[int, ...]]:
    """The monomials fitted over ``box``'s free variables: per variable an exponent below
    the number of its sampled values and at most 2, total degree at most 3."""
    caps = [0 if hi - lo <= 1 else min(2, len(_axis(lo, hi)) - 1) for lo, hi in box]
    out = []
    for e in itertools.product(*(range(c + 1) for c in caps)):
        if sum(e) <= 3:
            out.append(tuple(e))
    return out


def _design(points: Sequence[tuple[int, ...]], exps: Sequence[tuple[int, ...]]) -> list[list[int]]:
    return [[math.prod(v**k for v, k in zip(p, e)) for e in exps] for p in points]


def _fit(columns: np.ndarray, design: list[list[int]]) -> list[list[int]] | None:
    """Integer coefficients (one list per column of ``columns``: values at the points)
    that give every value exactly, or None."""
    x = np.array(design, np.float64)
    coef, *_ = np.linalg.lstsq(x, columns.astype(np.float64), rcond=None)
    c = np.rint(coef)
    if np.abs(c).max(initial=0) >= 1 << 40:
        return None
    ints = c.astype(np.int64)
    xi = np.array(design, object)
    if not np.array_equal(xi @ ints.astype(object), columns.astype(object)):
        return None
    return ints.T.tolist()


def _poly(coef: Sequence[int], exps: Sequence[tuple[int, ...]]) -> str:
    terms = []
    for c, e in zip(coef, exps):
        if c == 0:
            continue
        factors = [f"{_VAR}{j}" for j, k in enumerate(e) for _ in range(k)]
        if not factors:
            terms.append(literal(c))
        elif c == 1:
            terms.append(" * ".join(factors))
        else:
            terms.append(" * ".join([literal(c), *factors]))
    return "(" + (" + ".join(terms) or "0") + ")"


def native_dim_vars(graph: Graph) -> DimVars | None:
    """The dim variables the native tier's boxes range over: ``DimVars.of`` the inputs'
    declared shapes as ``dims.genai_tied`` reads them (onnxruntime-genai's
    ``total_sequence_length`` is past + sequence: declared as a free symbol, a box would
    vary the mask's length apart from the past's, its samples break the decoder, and
    every box declined, each length compiled alone). A call whose shapes break the
    relation matches no box (the interpreter serves it)."""
    return DimVars.of(genai_tied([v.type.shape for v in graph.inputs]))  # type: ignore[union-attr]


def input_shapes(graph: Graph, dims: DimVars, vals: Sequence[int]) -> list[tuple[int, ...]]:
    """Every input's shape at these variable values."""
    shapes = []
    for v, row in zip(graph.inputs, dims.dims):
        declared = v.type.shape  # type: ignore[union-attr]
        assert declared is not None  # DimVars.of had every input's rank
        shape = []
        for d, rule in zip(declared, row):
            if rule is None:
                shape.append(int(d))
            else:
                coef, const = rule
                shape.append(sum(c * x for c, x in zip(coef, vals)) + const)
        shapes.append(tuple(shape))
    return shapes


def lower_box(graph: Graph, program: Program, dims: DimVars, box: Box, *,
              limit: int | None = None,
              stop: Callable[[], bool] | None = None) -> Lowered:  # fmt: skip
    """The module serving every signature in ``box`` (module docstring; ``Lowered.box``
    may end lower, where the model stops running: ``_fitting``); Declined when the
    lowering is not the same function of the dims at every sample. A cold process's
    compiled kernels released meanwhile (``compiled_gate``: the lowering then changes
    between samples) lower the box again. ``stop()`` true between two samples (the
    process is exiting: ``worker.closing``) declines at once: an exit waits for a
    lowering in flight, and a box is ~20 of them."""
    held = compiled_gate.held()
    try:
        return _lower_box(graph, program, dims, _fitting(graph, program, dims, box), limit,
                          stop)  # fmt: skip
    except Declined:
        if compiled_gate.held() == held:
            raise
    return _lower_box(graph, program, dims, _fitting(graph, program, dims, box), limit, stop)


def _fitting(graph: Graph, program: Program, dims: DimVars, box: Box) -> Box:
    """``box``, or with the tops of its varying dims lowered to the largest values the
    model runs at (a BERT's 512 positions in the box 129..1024): each found by bisection
    over probe runs, which fail past it, the other dims at their tops. Unchanged when
    the top runs or no such values exist."""
    free = [j for j, (lo, hi) in enumerate(box) if hi - lo > 1]
    cur = [hi for _, hi in box]
    if _runs(graph, program, dims, cur):
        return box
    for j in free:
        good, bad = box[j][0], cur[j]  # good: runs (or the box's floor)
        while bad - good > 1:
            mid = (good + bad) // 2
            if _runs(graph, program, dims, [*cur[:j], mid, *cur[j + 1 :]]):
                good = mid
            else:
                bad = mid
        if good > box[j][0]:
            cur[j] = good
            break
    if cur == [hi for _, hi in box] or not _runs(graph, program, dims, cur):
        return box  # the box's own lowering says why it fails
    return tuple((lo, c) for (lo, _), c in zip(box, cur))


def _runs(graph: Graph, program: Program, dims: DimVars, vals: Sequence[int]) -> bool:
    try:
        probe(graph, program, input_shapes(graph, dims, vals))
    except Declined:
        return False
    return True


def _lower_box(graph: Graph, program: Program, dims: DimVars, box: Box,
               limit: int | None, stop: Callable[[], bool] | None) -> Lowered:  # fmt: skip
    """The box's module with the shape arithmetic folded; where a folded value is not a
    prefix of the top's (a T5's relative-position buckets, a causal mask built from
    Range: a length x length table), lowered again with every shape value whose size
    changes inside the box kept as code (``_sized_by_dims``)."""
    try:
        return _lower_samples(graph, program, dims, box, limit, stop, frozenset(),
                              frozenset())  # fmt: skip
    except ConstantsDiffer as e:
        folded = list(e.reasons)
    keep, spell = _sized_by_dims(graph, program, dims, box)
    try:
        if keep or spell:
            return _lower_samples(graph, program, dims, box, limit, stop, keep, spell)
    except Declined as e:
        raise Declined([*folded, f"kept as code: {e}"]) from None
    raise Declined(folded)


def _sized_by_dims(graph: Graph, program: Program, dims: DimVars,
                   box: Box) -> tuple[frozenset[int], frozenset[int]]:  # fmt: skip
    """The shape values (``fold.shape_values``) to lower as code: those folded at one end
    of the box and not the other, or with another shape there; and the small ones whose
    elements differ, which code writes where a node reads them (their numbers fitted
    like the rest: a T5's length, read by its bucket arithmetic)."""
    ends = [tuple(hi for _, hi in box), tuple(lo + 1 if hi - lo > 1 else hi for lo, hi in box)]
    top, low = (folded_values(graph, program, input_shapes(graph, dims, e)) for e in ends)
    keep = frozenset(v for v in top.keys() | low.keys()
                     if v not in top or v not in low or top[v].shape != low[v].shape)  # fmt: skip
    spell = frozenset(v for v in top.keys() & low.keys() - keep
                      if top[v].size <= SPELLED_MAX and top[v].dtype.kind in "iuf"
                      and not np.array_equal(top[v], low[v]))  # fmt: skip
    return keep, spell


def _lower_samples(graph: Graph, program: Program, dims: DimVars, box: Box,
                   limit: int | None, stop: Callable[[], bool] | None,
                   keep: frozenset[int], spell: frozenset[int]) -> Lowered:  # fmt: skip
    points = samples(box)
    top = lower(graph, program, shapes=input_shapes(graph, dims, points[0]), limit=limit,
                audited=False, keep=keep, spell=spell)  # fmt: skip
    room = Room(
        tuple(n for _, n, _, _ in top.arena), tuple(n for _, _, n in top.consts), top.choices
    )
    lows = [top]
    for p in points[1:]:
        if stop is not None and stop():
            raise Declined(["the process is exiting"])
        low = lower(graph, program, shapes=input_shapes(graph, dims, p), limit=limit,
                    room=room, audited=False, keep=keep, spell=spell,
                    cache=bool(top.caches))  # fmt: skip
        if [(t, a, b) for t, _, a, b in low.arena] != [(t, a, b) for t, _, a, b in top.arena]:
            raise Declined([f"the arena's buffers change inside the box {box} (at {p})"])
        if not _same_constants(low, top):
            raise ConstantsDiffer([f"a constant of the code changes with the dims inside "
                                    f"the box {box} (at {p})"])  # fmt: skip
        lows.append(low)
    exps = monomial_exponents(box)
    design = _design(points, exps)
    _check_arena(lows, box, exps, design)
    source = _generalize(lows, points, design, exps, box, dims)
    audit(source)
    return Lowered(
        source, top.params, top.input_names, top.output_names, top.n_nodes,
        top.input_dtypes, check(source, limit if limit is not None else budget()),
        mode="box", finishers=top.finishers, out_dtypes=top.out_dtypes, box=box,
        encoders=top.encoders, caches=top.caches,
    )  # fmt: skip


def _same_constants(low: Lowered, top: Lowered) -> bool:
    """Whether each of ``low``'s constants is the start of the top's, at the same place
    (a table of positions or a fill, cut to the signature's length)."""
    if len(low.params) != len(top.params) or [(t, o) for t, o, _ in low.consts] != [
            (t, o) for t, o, _ in top.consts]:  # fmt: skip
        return False
    aliases = sorted({t for t, _, _ in top.consts})
    if len(aliases) != len(top.params):
        return False
    mine, theirs = dict(zip(aliases, low.params)), dict(zip(aliases, top.params))
    return all(mine[t].dtype == theirs[t].dtype and mine[t].size == theirs[t].size
               and np.array_equal(mine[t][o : o + n], theirs[t][o : o + n])
               for t, o, n in low.consts)  # fmt: skip


def _check_arena(lows: list[Lowered], box: Box, exps: list[tuple[int, ...]],
                 design: list[list[int]]) -> None:  # fmt: skip
    """Every buffer at every point of the box is at most its size at the top. A size
    polynomial with no negative coefficient grows with every dim (they are >= 0 in a box):
    its largest value is the top's. The others are evaluated at every point of the box,
    which may hold at most ``ARENA_CHECK_POINTS`` (a bigger one declines: the check's own
    memory stays bounded whatever dims a request brings)."""
    if not lows[0].arena:
        return
    sizes = np.array([[n for _, n, _, _ in low.arena] for low in lows], np.int64)
    fitted = _fit(sizes, design)
    if fitted is None:
        raise Declined([f"an arena buffer's size is not a polynomial of the dims in {box}"])
    coef = np.array(fitted, np.int64)  # buffers x monomials
    falling = np.any(coef < 0, axis=1)
    if not falling.any():
        return
    if math.prod(hi - lo for lo, hi in box) > ARENA_CHECK_POINTS:
        raise Declined([f"the box {box} is too big to check its arena buffers at every point"])
    axes = np.meshgrid(*(np.arange(lo + 1, hi + 1, dtype=np.int64) for lo, hi in box),
                       indexing="ij")  # fmt: skip
    grid = [a.ravel() for a in axes]
    mono = np.ones((len(grid[0]), len(exps)), np.int64)
    for m, e in enumerate(exps):
        for j, k in enumerate(e):
            mono[:, m] *= grid[j] ** k
    at = mono @ coef[falling].T  # points x the buffers that may shrink as a dim grows
    if np.any(at > sizes[0][falling][None, :]) or np.any(at < 0):
        raise Declined([f"an arena buffer is bigger inside the box {box} than at its top"])


def _generalize(lows: list[Lowered], points: list[tuple[int, ...]], design: list[list[int]],
                exps: list[tuple[int, ...]], box: Box, dims: DimVars) -> str:  # fmt: skip
    """The top sample's source with its dim-dependent integers as polynomials."""
    splits = [_NUMBER.split(low.source) for low in lows]
    template = splits[0]

    def changed(k: int) -> Declined:
        return Declined([f"the code's structure changes inside the box {box} (at {points[k]})"])

    for k, s in enumerate(splits):
        if len(s) != len(template):
            raise changed(k)
    varying: list[int] = []
    for i in range(len(template)):
        texts = [s[i] for s in splits]
        if all(t == texts[0] for t in texts):
            continue
        if i % 2 == 0 or not all(_INT.fullmatch(t) for t in texts):  # text, or a float
            raise changed(next(k for k, t in enumerate(texts) if t != texts[0]))
        varying.append(i)
    if _VAR_NAME.search(lows[0].source):
        raise Declined(["internal: the code already uses a dim variable's name"])
    values = np.array([[int(s[i].strip("()")) for s in splits] for i in varying], object)
    coef = _fit(values.T, design) if varying else []
    if coef is None:
        raise Declined([f"a number of the code is not a polynomial of the dims in {box}"])
    parts = list(template)
    for i, c in zip(varying, coef):
        parts[i] = _poly(c, exps)
    lines = "".join(parts).split("\n")
    at = next(k for k, ln in enumerate(lines) if ln.startswith("def run("))
    head = []
    for j, (lo, hi) in enumerate(box):
        k, a = dims.reads[j]
        head += [f"    {_VAR}{j} = a{k}.shape[{literal(a)}]",
                 f"    if {_VAR}{j} <= {literal(lo)} or {_VAR}{j} > {literal(hi)}:",
                 f"        raise ValueError('feed {literal(k)}: wrong shape')"]  # fmt: skip
    return _unsigned_indices("\n".join([*lines[: at + 1], *head, *lines[at + 1 :]]))


class _Unsigned(ast.NodeTransformer):
    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        index, of = node.slice, node.value
        shape = isinstance(of, ast.Attribute) and of.attr == "shape"
        if not (shape or isinstance(index, (ast.Slice, ast.Tuple, ast.Constant))):
            u64 = ast.Attribute(ast.Name("np", ast.Load()), "uint64", ast.Load())
            node.slice = ast.Call(u64, [index], [])
        return node


def _unsigned_indices(source: str) -> str:
    """``source`` with every element index read as ``np.uint64`` (the generated code's
    indices are non-negative by construction). numba wraps a signed index that may be
    negative (``i += n`` when ``i < 0``); LLVM drops that select where it can prove the
    index non-negative, as it can for ``i * 128 + j`` over loops of constant extents, but
    not once an extent or a stride is a dim variable: the select then stayed in the loads
    and kept loops from vectorizing (a box's module ran 1.34x slower than a signature's)."""
    tree = _Unsigned().visit(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(tree))


def describe_box(box: Box, names: Sequence[str]) -> str:
    """``box`` for ``describe()``: each variable's range (names are model text: shown,
    never put into code)."""
    parts = []
    for (lo, hi), n in zip(box, names):
        parts.append(f"{n}={hi}" if hi - lo <= 1 else f"{n} in {lo + 1}..{hi}")
    return ", ".join(parts)
