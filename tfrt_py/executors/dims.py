"""Shapes as functions of a model's dynamic dims, so one plan serves every length.

A model's inputs declare dims that are ints (static) or symbols (``batch``,
``sequence_length``, ``past_sequence_length + sequence_length``). ``DimVars`` turns them into
a few integer *variables* and says how each input dim follows from them: a symbol is a
variable (the same name is the same variable: FeedChecker enforces it), a sum or difference
of symbols and integers is a linear combination of variables, and an unnamed dim is a
variable of its own. Symbol strings are model text: they are parsed here into numbers and
indices and never reach generated code.

A ``ShapeModel`` (fitted at load by ``compiler.shape_model`` from probe runs, verified
there at other points and here per dim bucket) holds, for every value the sync
interpreter plans, each dim of its shape as a multilinear polynomial in the variables,
and for small shape-arithmetic values (a Reshape's target) each element likewise. A new
input signature then costs one matrix product, never a probe run of the program.

Immutable after load; thread-safe. Read on a call's slow path (a signature not seen
before), never on the hot path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import field
from typing import Any

import numpy as np

from ..records import record

__all__ = ["MAX_DIM", "DimVars", "ShapeModel", "bucket_of", "genai_tied", "monomials"]

#: No dim or shape-arithmetic value a model computes may exceed this (float64 evaluation
#: is exact below 2**53; a bigger figure is no real tensor).
MAX_DIM = 1 << 50
_TERM = re.compile(r"\s*([+-])?\s*([A-Za-z_][A-Za-z0-9_.:/]*|\d+)\s*")
#: Longer symbol strings are not parsed (each is an opaque variable of its own).
_MAX_SYMBOL = 200


def _parse(sym: str) -> list[tuple[int, str]] | None:
    """``"a + b - 1"`` -> [(1, "a"), (1, "b"), (-1, "1")]; None when it is not a sum of
    identifiers and integers."""
    if len(sym) > _MAX_SYMBOL:
        return None
    terms: list[tuple[int, str]] = []
    pos = 0
    while pos < len(sym):
        m = _TERM.match(sym, pos)
        if m is None or m.end() == pos:
            return None
        sign, tok = m.group(1), m.group(2)
        if terms and sign is None:
            return None  # two terms without an operator between them
        terms.append((-1 if sign == "-" else 1, tok))
        pos = m.end()
    return terms or None


#: onnxruntime-genai's model builder names its decoders' dims so: the mask's length is the
#: past's plus the new tokens' (its GroupQueryAttention raises otherwise)
_GENAI_TOTAL = ("total_sequence_length", "past_sequence_length", "sequence_length")


def genai_tied(shapes: Sequence[Sequence[Any] | None]) -> list[Any]:
    """``shapes`` with onnxruntime-genai's ``total_sequence_length`` written as
    ``past_sequence_length + sequence_length`` where the inputs name all three (else as
    they are): one variable fewer, and the relation ``DimVars.values`` then checks (a call
    that breaks it gets None: it is served without the formulas)."""
    named = {d for shape in shapes if shape for d in shape if isinstance(d, str)}
    total, past, seq = _GENAI_TOTAL
    if not all(n in named for n in _GENAI_TOTAL):
        return list(shapes)
    tied = f"{past} + {seq}"
    return [None if shape is None else [tied if d == total else d for d in shape]
            for shape in shapes]  # fmt: skip


@record(frozen=True)
class DimVars:
    """The variables of a model's input dims and how every dynamic input dim follows
    from them. ``dims[k][a]``: None (static) or (coefficients over the variables,
    constant) for input ``k``'s axis ``a``; ``reads[j]``: the (input, axis) holding
    variable ``j`` alone. ``names`` are for ``describe()`` only."""

    names: tuple[str, ...]
    dims: tuple[tuple[tuple[tuple[int, ...], int] | None, ...], ...]
    reads: tuple[tuple[int, int], ...]
    # made by __post_init__ from ``dims``: what ``values`` checks in one integer product
    _ranks: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ruled: list[tuple[int, int]] = field(init=False, repr=False, compare=False)
    _coef: np.ndarray = field(init=False, repr=False, compare=False)
    _const: np.ndarray = field(init=False, repr=False, compare=False)

    @staticmethod
    def of(shapes: Sequence[Sequence[Any] | None]) -> DimVars | None:
        """The variables of inputs declared with these shapes (ints, symbol strings,
        None for unnamed dims); None when an input's rank is unknown."""
        if any(shape is None for shape in shapes):
            return None
        # 1. each dynamic dim: a plain symbol, or a sum of symbols and integers
        terms: dict[tuple[int, int], list[tuple[int, str]]] = {}
        plain: set[str] = set()
        for k, shape in enumerate(shapes):
            for a, d in enumerate(shape or ()):
                if isinstance(d, int):
                    continue
                name = d if isinstance(d, str) and d else f"?{k}.{a}"
                parsed = _parse(name) if name is d else None
                if parsed is None or (len(parsed) == 1 and parsed[0][0] > 0):
                    parsed = [(1, name)]
                    plain.add(name)
                terms[(k, a)] = parsed
        # 2. a sum naming a symbol that never stands alone cannot be solved from the feeds:
        # it is a variable of its own
        for pos, ts in terms.items():
            is_sum = len(ts) > 1 or ts[0][0] < 0
            if is_sum and any(not t.isdigit() and t not in plain for _, t in ts):
                k, a = pos
                name = str(shapes[k][a])  # type: ignore[index]
                terms[pos] = [(1, name)]
                plain.add(name)
        names = sorted(plain, key=lambda n: min(p for p, ts in terms.items()
                                                if ts == [(1, n)]))  # fmt: skip
        index = {n: j for j, n in enumerate(names)}
        dims: list[tuple[tuple[tuple[int, ...], int] | None, ...]] = []
        reads: dict[int, tuple[int, int]] = {}
        for k, shape in enumerate(shapes):
            row: list[tuple[tuple[int, ...], int] | None] = []
            for a, _ in enumerate(shape or ()):
                got = terms.get((k, a))
                if got is None:
                    row.append(None)
                    continue
                ts = got
                coef = [0] * len(names)
                const = 0
                for sign, t in ts:
                    if t.isdigit():
                        const += sign * int(t)
                    else:
                        coef[index[t]] += sign
                if ts == [(1, ts[0][1])] and not ts[0][1].isdigit():
                    reads.setdefault(index[ts[0][1]], (k, a))
                row.append((tuple(coef), const))
            dims.append(tuple(row))
        return DimVars(tuple(names), tuple(dims), tuple(reads[j] for j in range(len(names))))

    @property
    def n(self) -> int:
        return len(self.names)

    def __post_init__(self) -> None:
        # the relations as one integer product: the ruled dims' (input, axis), their
        # coefficients over the variables and their constants
        at = [(k, a) for k, row in enumerate(self.dims) for a, r in enumerate(row) if r]
        rules = [r for row in self.dims for r in row if r]
        coef = np.array([r[0] for r in rules], np.int64).reshape(len(rules), len(self.names))
        object.__setattr__(self, "_ranks", tuple(len(row) for row in self.dims))
        object.__setattr__(self, "_ruled", at)
        object.__setattr__(self, "_coef", coef)
        object.__setattr__(self, "_const", np.array([r[1] for r in rules], np.int64))

    def values(self, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
        """The variables' values for inputs of these shapes, or None when the shapes break
        a declared relation (a mask longer than past + sequence) or a rank."""
        for shape, rank in zip(shapes, self._ranks):
            if len(shape) != rank:
                return None
        vals = tuple(int(shapes[k][a]) for k, a in self.reads)
        if not self._ruled:
            return vals
        if max(vals, default=0) < 1 << 31:  # products in int64 cannot overflow
            want = self._coef @ np.array(vals, np.int64) + self._const
            got = [shapes[k][a] for k, a in self._ruled]
            return vals if want.tolist() == got else None
        for shape, row in zip(shapes, self.dims):  # exact Python integers
            for d, rule in zip(shape, row):
                if rule is not None:
                    coef, const = rule
                    if d != sum(c * v for c, v in zip(coef, vals)) + const:
                        return None
        return vals


def monomials(vals: Sequence[int]) -> np.ndarray:
    """The 2**n products of the variables' subsets (bit j of the index: variable j in
    it), as float64: the basis every multilinear polynomial is a row over."""
    out = [1.0]
    for v in vals:
        f = float(v)
        out += [m * f for m in out]
    return np.array(out, np.float64)


def bucket_of(vals: Sequence[int]) -> tuple[int, ...]:
    """Each variable's bucket: the power of two at or above it (0 stays 0)."""
    return tuple(0 if v <= 0 else 1 << (int(v) - 1).bit_length() for v in vals)


@record(frozen=True)
class Fitted:
    """A slot's fitted formula: its rows in ``ShapeModel.coef`` (``start``, ``n``), and
    for a value formula its shape and dtype."""

    start: int
    n: int
    shape: tuple[int, ...] = ()
    dtype: Any = None


@record
class ShapeModel:
    """Every fitted slot's shape (``shapes``) and every fitted shape-arithmetic value
    (``values``) as rows of ``coef`` over ``monomials(vars)``. ``depends[slot]``: the
    bit set of variables the slot's shape depends on."""

    vars: DimVars
    coef: np.ndarray
    shapes: dict[int, Fitted]
    values: dict[int, Fitted]
    depends: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # rows that must come out whole numbers: dims, and integer or bool values (a float
        # value, such as a scale of 1/sqrt(d) or a mask's -3.4e38, is kept as computed)
        whole = np.zeros(self.coef.shape[0], bool)
        for f in self.shapes.values():
            whole[f.start : f.start + f.n] = True
        for f in self.values.values():
            if np.dtype(f.dtype).kind in "biu":
                whole[f.start : f.start + f.n] = True
        self._whole = whole
        # whole rows with integer coefficients are exact integers at integer variables
        # (while below 2**53: ``evaluate`` bounds them first); only the others are rounded
        integral = np.all(self.coef == np.rint(self.coef), axis=1)
        self._round = whole & ~integral
        self._round_any = bool(self._round.any())
        self._abs_rows = float(np.abs(self.coef[whole & integral]).sum(axis=1).max(initial=0.0))
        self._coef_t = np.ascontiguousarray(self.coef.T)  # raw = monomials @ coef.T
        #: values no variable changes, made once
        self._constant: dict[int, np.ndarray] = {}
        for s, f in self.values.items():
            rows = self.coef[f.start : f.start + f.n]
            if not rows[:, 1:].any():
                v = np.rint(rows[:, 0]) if np.dtype(f.dtype).kind in "biu" else rows[:, 0]
                self._constant[s] = v.astype(f.dtype).reshape(f.shape)

    def evaluate(self, vals: Sequence[int]) -> np.ndarray | None:
        """Every row at these variable values (float64; dims and integer values rounded),
        or None when a dim or integer value is not a whole number in range: the formulas
        do not hold there."""
        if not self.coef.size:
            return np.zeros(0, np.float64)
        raw = monomials(vals) @ self._coef_t
        if self._abs_rows * math.prod(max(int(v), 1) for v in vals) >= MAX_DIM:
            whole_rows = self._whole  # the bound too loose: check every whole row
        elif self._round_any:
            whole_rows = self._round  # the integral rows are exact and in range
        else:
            return raw
        whole = raw[whole_rows]
        got = np.rint(whole)
        if not np.all(np.abs(whole - got) < 1e-6) or not np.all(np.abs(got) < MAX_DIM):
            return None
        raw[whole_rows] = got
        return raw

    def shape(self, slot: int, rows: np.ndarray) -> tuple[int, ...] | None:
        f = self.shapes[slot]
        dims = tuple(int(d) for d in rows[f.start : f.start + f.n])
        return None if any(d < 0 for d in dims) else dims

    def constant(self, slot: int) -> np.ndarray | None:
        """The slot's value when no variable changes it (made once, shared), else None."""
        return self._constant.get(slot)

    def value(self, slot: int, rows: np.ndarray) -> np.ndarray:
        """The slot's value at these rows (one that depends on no variable is made once
        and shared: baked values are read-only to the program)."""
        got = self._constant.get(slot)
        if got is not None:
            return got
        f = self.values[slot]
        return rows[f.start : f.start + f.n].astype(f.dtype).reshape(f.shape)

    def symbolic(self, slot: int) -> tuple[int | None, ...] | None:
        """The slot's shape with every dim that depends on a variable as None (what the
        generated code may assume of it), or None when the slot is not fitted."""
        f = self.shapes.get(slot)
        if f is None:
            return None
        rows = self.coef[f.start : f.start + f.n]
        out: list[int | None] = []
        for r in rows:
            out.append(round(float(r[0])) if not np.any(r[1:]) else None)
        return tuple(out)

    def same_shape(self, a: int, b: int) -> bool:
        """Whether two fitted slots have the same shape at every variable value."""
        fa, fb = self.shapes.get(a), self.shapes.get(b)
        if fa is None or fb is None or fa.n != fb.n:
            return False
        return bool(np.array_equal(self.coef[fa.start : fa.start + fa.n],
                                   self.coef[fb.start : fb.start + fb.n]))  # fmt: skip

    def size_rows(self, slot: int, rows: np.ndarray) -> int:
        f = self.shapes[slot]
        return math.prod(int(d) for d in rows[f.start : f.start + f.n])
