"""The kernel of ``TextVectorize``, the fused op of ``compiler/fuse_text.py``, in the private
domain ``tfrt_py.fused``: what skl2onnx writes for a CountVectorizer or TfidfVectorizer --
``[StringNormalizer] -> Tokenizer -> [Flatten] -> TfIdfVectorizer`` on a string pool -- as
one node, and with it, where they follow, ``[Mul by a constant] -> [Normalizer L1/L2] ->
LinearClassifier | LinearRegressor`` (the linear model of the pipeline) and a Normalizer
of the classifier's scores.

A leading ``Reshape`` to ``[-1]`` (skl2onnx's, of the ``[N, 1]`` input) is a stage too.
Attribute ``stages``: each fused node as ``(op_type, domain, opset, name, attrs)`` with
its attributes as sorted ``(key, value)`` pairs, in graph order; ``scale``: a fused Mul's
constant broadcast to the vectorizer's width (float32). The node's outputs are the last
stage's.

Fast paths, for a ``[C]`` input of ``str`` elements, at least one:

* the front: each string once -- its case change, its tokens (the Tokenizer's own
  splitter), the n-gram columns of those tokens (the TfIdfVectorizer's own table) -- into
  the counts, without the padded matrix of token strings between the nodes;
* with a linear model: the counts stay sparse. Each row's distinct columns and counts,
  their weights and the Mul's scale, the row's norm over them, then the products with the
  model's coefficients of those columns only (float64 sums), and the model's own kernel
  (built with identity coefficients, its intercepts, post transform and labels) on those
  scores: no ``[C, width]`` matrix at all. Within float32 rounding of the unfused nodes.
  A batch's tokens go from the scanned bytes to their n-grams' columns and rows in one
  compiled pass (``_Front.columns``: ``text_grams_jit``, hash tables of the pool's ASCII
  tokens and of its n-grams as token ids). One row takes ``text_jit``'s compiled pass
  from its columns to its scores, and under a SOFTMAX classifier with integer labels (and
  an L1 Normalizer of its scores, skl2onnx's) on to its probabilities and label
  (``_CompiledRow``); without numba, Python's floats (``_Sparse.one_row``,
  ``_SoftmaxRow``).

The front's output is exactly the unfused nodes' because the fast path is only taken where
padding and row markers cannot count: a normalizer without stop words (which would drop
elements), a Flatten at axis 1 (a no-op on ``[C, T]``), a pad value and markers in no
n-gram of the pool. The sparse path also needs every weight, scale and coefficient finite
(a dense zero times an infinity is NaN). Anything else -- another rank, an empty input,
elements that are not ``str`` -- runs the stages' own kernels one after the other.

Load-time state only (read-only after); any thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from functools import partial
from itertools import chain, repeat
from typing import Any

import numpy as np

from ...ir import Node, Value
from ..base import ComputeFn, Cost, KernelContext
from ..contrib.regex import ascii_run_class
from ..contrib.tokenizer import splitter
from ..misc.strings import TfIdfTable, normalizer_parts
from ..ml.common import attr_floats
from ..registry import KernelRegistry
from . import text_grams_jit, text_jit
from .domain import DOMAIN
from .text_grams_jit import GramTable

__all__ = ["FRONT", "HEADS", "SMALL", "Stage", "register_kernels"]

#: One fused node: ``(op_type, domain, opset, name, sorted attribute pairs)``.
Stage = tuple[str, str, int, str, tuple[tuple[str, Any], ...]]
#: A token's column in the pool, or None (``dict.get``: also takes a default).
Get = Callable[..., Any]

#: The front's op types, and the linear models a sparse path ends in.
FRONT = ("StringNormalizer", "Tokenizer", "Flatten", "TfIdfVectorizer")
HEADS = ("LinearClassifier", "LinearRegressor")
_MARKERS = ("\x02", "\x03")  # the Tokenizer's row markers (``mark=1``)
_SEP = "\x00"  # joins a call's strings for one scan (``_Front.rows``)
_NUL_OR_SPACE = frozenset(b"\x00 \t\n\r\x0b\x0c")  # bytes.split's whitespace, and NUL
_F64 = np.float64
#: A call of one row of up to this many tokens takes ``_Sparse.one_row``.
SMALL = 4096


def stage_ctx(ctx: KernelContext, stage: Stage, attrs: dict[str, Any] | None = None
               ) -> KernelContext:  # fmt: skip
    op, domain, opset, name, pairs = stage
    node = Node(op, [ctx.node.inputs[0]], [Value("_")], attrs or dict(pairs), name=name,
                domain=domain, opset=opset)  # fmt: skip
    return KernelContext(node)


class _Front:
    """The fused front of one node: ``rows(items)`` -> (each element's tokens, a unigram
    table, and ``get``, token -> column or None; or each element's n-gram columns and
    None). Raises TypeError for an element that is not a ``str``.

    Where the token pattern is ``C+`` for an ASCII character class ``C`` without NUL or
    whitespace (``regex.ascii_run_class``; skl2onnx writes ``[a-zA-Z0-9_]+``) and the
    table holds unigrams only, the tokens are the runs of ``C`` found without the regex
    engine: the elements joined with NUL (none may hold one), the case change, UTF-8,
    every byte outside ``C`` but NUL made a space (``bytes.translate``: a non-ASCII
    character's bytes are all >= 0x80, so outside ``C``), then split at NUL and at spaces
    -- the same tokens, as bytes, looked up in the pool's ASCII unigrams."""

    def __init__(self, change: Any, split: Callable[[str], list[str]], table: TfIdfTable) -> None:
        self.change, self.split, self.table = change, split, table
        self.str_get = table.unigrams.get
        self.byte_table: bytes | None = None  # the scan, where ``rows`` takes it
        self.scan: bytes | None = None  # the scan, where ``columns`` takes it
        self.grams: GramTable | None = None
        rx = getattr(split, "__self__", None)
        cls = ascii_run_class(rx) if isinstance(rx, re.Pattern) else None
        if cls is not None and not cls & _NUL_OR_SPACE:
            self.scan = bytes(c if c in cls or c == 0 else 0x20 for c in range(256))
            self.grams = GramTable(table)
            if table.unigrams_only:
                self.byte_table = self.scan
                ascii_cols = {k.encode(): v for k, v in table.unigrams.items() if k.isascii()}
                self.byte_get = ascii_cols.get

    def columns(self, items: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
        """Each found n-gram's column and row, in ``row_columns``' order, rows in order
        (``_Sparse.scores_at``'s input), by ``text_grams_jit``'s compiled pass over the
        scanned bytes; None where that pass is not there (numba off, the pattern no ASCII
        run) or an element holds NUL. Raises TypeError as ``rows`` does for elements that
        are not str."""
        fn = text_grams_jit.columns() if self.grams is not None else None
        if fn is None:
            return None
        text = _SEP.join(items)
        if text.count(_SEP) != len(items) - 1:
            return None
        if self.change is not None:
            text = self.change(text)
        data = np.frombuffer(text.encode("utf-8", "surrogatepass").translate(self.scan),
                             np.uint8)  # fmt: skip
        g = self.grams
        assert g is not None
        n_tokens = data.size // 2 + 1  # tokens are runs between separators
        v = g.vocab
        ids, starts = np.empty(n_tokens, np.int64), np.empty(len(items) + 1, np.int64)
        cap = n_tokens * g.per_token  # enough without skips; with them, what was counted
        while True:
            cols, rows = np.empty(cap, np.intp), np.empty(cap, np.intp)
            k = fn(data, len(items), v.blob, v.offs, v.slots, g.ucol, g.gkeys, g.glen, g.gcol,
                   g.gslots, g.meta, ids, starts, cols, rows)  # fmt: skip
            if k <= cap:
                return cols[:k], rows[:k]
            cap = k

    def tokens(self, items: list[Any]) -> list[list[Any]]:
        change, split = self.change, self.split
        if change is not None:  # str.lower and str.upper refuse anything but a str
            return list(map(split, map(change, items)))
        if not all(type(s) is str for s in items):
            raise TypeError("not all elements are str")
        return list(map(split, items))

    def rows(self, items: list[Any]) -> tuple[list[list[Any]], Get | None]:
        if self.byte_table is not None:
            text = _SEP.join(items)
            if text.count(_SEP) == len(items) - 1:
                if self.change is not None:
                    text = self.change(text)
                data = text.encode("utf-8", "surrogatepass").translate(self.byte_table)
                return list(map(bytes.split, data.split(b"\x00"))), self.byte_get
        if self.table.unigrams_only:
            return self.tokens(items), self.str_get
        return list(map(self.table.row_columns, self.tokens(items))), None


def _front(ctxs: dict[str, KernelContext]) -> _Front | None:
    """The fast front of the stages ``ctxs``, or None where it would not give the unfused
    output (see the module docstring)."""
    change = None
    if "StringNormalizer" in ctxs:
        change, stops, _ = normalizer_parts(ctxs["StringNormalizer"])
        if stops:
            return None
    if "Flatten" in ctxs and int(ctxs["Flatten"].attr("axis", 1)) != 1:
        return None
    split, mark, pad = splitter(ctxs["Tokenizer"])
    table = TfIdfTable(ctxs["TfIdfVectorizer"])
    if pad in table.pool or (mark and any(m in table.pool for m in _MARKERS)):
        return None
    return _Front(change, split, table)


class _Sparse:
    """The linear model over the sparse counts (see the module docstring). ``scores(rows)``
    -> float32 ``[len(rows), outputs]`` before the intercepts.

    A column's value is ``count * scale`` (``scale``: the IDF weight where the mode uses
    it, times the Mul's), or ``scale`` where the mode is IDF (presence); its share of the
    scores is that value times the column's coefficients, so ``w_scaled`` (coefficients
    times scale) summed over a row's tokens with repeats is the row's scores for counts,
    divided by the row's norm. An L1 norm is the tokens' ``|scale|`` summed; L2 and
    presence need each column once (``np.unique``, or a dict for a few tokens)."""

    def __init__(self, table: TfIdfTable, scale: np.ndarray | None, norm: str,
                 coefs: np.ndarray) -> None:  # fmt: skip
        self.table, self.norm, self.width = table, norm, table.out_size
        col_scale = np.ones(self.width, _F64)
        if table.mode != "TF" and table.weights is not None:
            col_scale *= table.weights
        if scale is not None:
            col_scale *= scale
        self.col_scale, self.abs_scale = col_scale, np.abs(col_scale)
        self.col_scale_list: list[float] = col_scale.tolist()
        self.abs_scale_list: list[float] = self.abs_scale.tolist()
        self.w_t = np.ascontiguousarray(coefs.T, dtype=_F64)  # (width, outputs)
        self.w_scaled = np.ascontiguousarray(coefs.T * col_scale[:, None], dtype=_F64)
        self.presence = table.mode == "IDF"  # a column counts once, whatever its count
        self.distinct = self.presence or norm == "L2"
        self.outputs = coefs.shape[0]

    def _columns(self, rows: list[list[Any]], get: Get | None) -> tuple[np.ndarray, np.ndarray]:
        """(each counted column, its row), flat, in row order."""
        n = len(rows)
        lens = np.fromiter(map(len, rows), np.intp, n)
        flat = list(chain.from_iterable(rows))
        if get is not None:
            cols = np.fromiter(map(get, flat, repeat(-1)), np.intp, len(flat))
        else:
            cols = np.fromiter(flat, np.intp, len(flat))
        row = np.repeat(np.arange(n, dtype=np.intp), lens)
        keep = cols >= 0
        return cols[keep], row[keep]

    def scores(self, rows: list[list[Any]], get: Get | None) -> np.ndarray:
        if len(rows) == 1 and len(rows[0]) <= SMALL:
            return self.one_row(rows[0], get).astype(np.float32)
        return self.scores_at(*self._columns(rows, get), len(rows))

    def scores_at(self, cols: np.ndarray, row: np.ndarray, n: int) -> np.ndarray:
        """``scores`` of ``n`` rows from each counted column and its row (row order)."""
        out = np.zeros((n, self.outputs), np.float32)
        if not cols.size:
            return out
        counts = None
        if self.distinct:
            keys, counts = np.unique(row * self.width + cols, return_counts=True)
            row, cols = np.divmod(keys, self.width)
        v = self.w_scaled[cols]
        if counts is not None and not self.presence:
            v *= counts[:, None]
        if self.norm:
            if self.norm == "L1":
                d = np.bincount(row, self.abs_scale[cols], minlength=n)
            else:
                x = self.col_scale[cols]
                if counts is not None and not self.presence:
                    x = x * counts
                d = np.sqrt(np.bincount(row, x * x, minlength=n))
            d[d == 0] = 1
            v /= d[row, None]
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        out[row[starts]] = np.add.reduceat(v, starts, axis=0)
        return out

    def one_row(self, row: list[Any], get: Get | None) -> np.ndarray:
        """``scores`` of one row of a few tokens, float64 ``(1, outputs)``: Python's floats
        where NumPy's calls would cost more than their work (``math.hypot`` is the L2
        norm)."""
        cols = row if get is None else [c for c in map(get, row) if c is not None]
        if not cols:
            return np.zeros((1, self.outputs), _F64)
        if not self.distinct:  # counts: the scaled coefficients summed over the tokens
            y: np.ndarray = np.add.reduce(self.w_scaled.take(cols, axis=0), axis=0, keepdims=True)
            if self.norm == "L1":
                d = sum(map(self.abs_scale_list.__getitem__, cols))
                if d:
                    y /= d
            return y
        agg = dict.fromkeys(cols, 0)
        for c in cols:
            agg[c] += 1
        cols, cs = list(agg), self.col_scale_list
        vals = [cs[c] for c in cols] if self.presence else [k * cs[c] for c, k in agg.items()]
        d = 0.0
        if self.norm == "L2":
            d = math.hypot(*vals)
        elif self.norm == "L1":
            d = sum(map(abs, vals))
        if d:
            vals = [v / d for v in vals]
        return np.dot(vals, self.w_t.take(cols, axis=0)).reshape(1, -1)


class _SoftmaxRow:
    """One row's LinearClassifier with a SOFTMAX (and integer labels), and an L1 Normalizer
    of its scores after it or none, in Python's floats: ``(scores float64 (1, C) before
    the intercepts) -> (label, probabilities)``, what the two kernels give within float32
    rounding (the label is the first of the highest scores, as theirs) at a third of their
    calls' cost."""

    def __init__(self, intercepts: np.ndarray, labels: np.ndarray) -> None:
        self.b = intercepts.astype(_F64).tolist()
        self.labels = labels.tolist()

    def __call__(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.row(y[0].tolist())

    def row(self, scores: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """``__call__`` of the one row's scores as a list."""
        s = [v + b for v, b in zip(scores, self.b)]
        top = max(s)
        e = [math.exp(v - top) for v in s]
        total = sum(e)  # >= 1: the top's own term
        # the L1 Normalizer after it divides by a sum that is 1 within float64 rounding
        return (np.array([self.labels[s.index(top)]], np.int64),
                np.array([[v / total for v in e]], np.float32))  # fmt: skip


class _CompiledRow:
    """``_Sparse.one_row`` (and ``_SoftmaxRow`` after it, where there is one) as one call of
    ``text_jit``'s compiled pass: ``(tokens, get) -> (label, probabilities)`` with the
    softmax head, else the float32 ``(1, outputs)`` scores before the intercepts."""

    def __init__(self, fn: Any, sparse: _Sparse, quick: _SoftmaxRow | None) -> None:
        self.fn, self.outputs = fn, sparse.outputs
        self.w = sparse.w_t if sparse.distinct else sparse.w_scaled
        self.col_scale = sparse.col_scale if sparse.distinct else sparse.abs_scale
        norm = {"": 0, "L1": 1, "L2": 2}[sparse.norm]
        self.meta = np.array([sparse.distinct, sparse.presence, norm, quick is not None],
                             np.int64)  # fmt: skip
        self.b = np.asarray(quick.b if quick is not None else np.zeros(self.outputs), _F64)
        self.labels = quick.labels if quick is not None else None

    @classmethod
    def make(cls, sparse: _Sparse, quick: _SoftmaxRow | None) -> _CompiledRow | None:
        fn = text_jit.row_pass()
        return None if fn is None else cls(fn, sparse, quick)

    def __call__(self, row: list[Any], get: Get | None) -> Any:
        cols = row if get is None else [c for c in map(get, row) if c is not None]
        out = np.empty(self.outputs, _F64)
        best = self.fn(np.array(cols, np.int64), self.col_scale, self.w, self.meta, self.b, out)
        scores = out.astype(np.float32).reshape(1, -1)
        if self.labels is None:
            return scores
        return np.array([self.labels[best]], np.int64), scores


def softmax_row(head: Stage, post: Stage | None, n_cls: int) -> _SoftmaxRow | None:
    """The fast one-row head where ``head`` and ``post`` are what it computes."""
    attrs = dict(head[4])
    post_norm = dict(post[4]).get("norm", "MAX") if post is not None else None
    labels = attrs.get("classlabels_ints")
    intercepts = attrs.get("intercepts")
    if (head[0] != "LinearClassifier" or attrs.get("post_transform", "NONE") != "SOFTMAX"
            or post_norm not in (None, "L1") or attrs.get("classlabels_strings")
            or not labels or len(labels) != n_cls or n_cls < 2
            or intercepts is None or len(intercepts) != n_cls):  # fmt: skip
        return None
    inter = np.asarray(intercepts, np.float32)
    if not np.isfinite(inter).all():
        return None
    return _SoftmaxRow(inter, np.asarray(labels, np.int64))


def head_coefficients(ctx: KernelContext, head: Stage, width: int) -> np.ndarray | None:
    """A linear model's coefficients as float64 ``(outputs, width)``, or None where they
    are missing or are no whole rows of ``width``."""
    coefs = attr_floats(stage_ctx(ctx, head), "coefficients", _F64)
    if coefs is None or not coefs.size or coefs.size % width:
        return None
    return coefs.reshape(-1, width)


def head_on_scores(registry: KernelRegistry, ctx: KernelContext, head: Stage,
                   outputs: int) -> ComputeFn:  # fmt: skip
    """The linear model's own kernel for scores already multiplied by its coefficients:
    built with identity coefficients, and its intercepts, post transform and labels."""
    attrs = dict(head[4])
    attrs.pop("coefficients_as_tensor", None)
    attrs["coefficients"] = np.eye(outputs, dtype=np.float32).reshape(-1).tolist()
    return registry.lookup(head[1], head[0], head[2], head[3]).build(stage_ctx(ctx, head, attrs))


def _sparse_head(registry: KernelRegistry, ctx: KernelContext, stages: Sequence[Stage],
                 table: TfIdfTable) -> tuple[_Sparse, ComputeFn] | None:  # fmt: skip
    """(the sparse scores, the head's kernel on them), or None where the sparse path would
    not stay within float32 rounding of the dense one (see the module docstring)."""
    ops = [s[0] for s in stages]
    head = stages[-1]
    if head[0] not in HEADS:
        return None
    norm = ""
    if "Normalizer" in ops:
        norm = str(dict(stages[ops.index("Normalizer")][4]).get("norm", "MAX"))
        if norm not in ("L1", "L2"):
            return None
    scale = ctx.attr("scale", None)
    coefs = head_coefficients(ctx, head, table.out_size)
    if coefs is None:
        return None
    finite = [coefs] + [a for a in (scale, table.weights) if a is not None]
    if not all(np.isfinite(a).all() for a in finite):
        return None
    on_scores = head_on_scores(registry, ctx, head, len(coefs))
    sparse = _Sparse(table, None if scale is None else np.asarray(scale, _F64), norm, coefs)
    return sparse, on_scores


def _text_vectorize(registry: KernelRegistry) -> Callable[[KernelContext], ComputeFn]:
    def build(ctx: KernelContext) -> ComputeFn:
        stages: Sequence[Stage] = list(ctx.attr("stages"))
        ops = [s[0] for s in stages]
        if "Tokenizer" not in ops or "TfIdfVectorizer" not in ops:
            raise ctx.unsupported("TextVectorize fuses a Tokenizer and a TfIdfVectorizer")
        scale = ctx.attr("scale", None)
        fns: list[Callable[[Any], Any]] = []
        for s in stages:
            if s[0] == "Reshape":  # the pass fuses a Reshape to [-1] only
                fns.append(np.ravel)
            elif s[0] == "Mul":
                if scale is None:
                    raise ctx.unsupported("a fused Mul needs its scale")
                fns.append(partial(np.multiply, np.asarray(scale, np.float32)))
            else:
                fns.append(registry.lookup(s[1], s[0], s[2], s[3]).build(stage_ctx(ctx, s)))
        front = {s[0]: stage_ctx(ctx, s) for s in stages if s[0] in FRONT}
        n_front = max(ops.index(op) for op in front) + 1
        fast = _front(front)

        # a Normalizer after the linear model normalizes its scores (its second output)
        head_at = next((i for i, op in enumerate(ops) if op in HEADS), len(ops))
        post = fns[head_at + 1] if head_at + 1 < len(ops) else None
        fns_to_head = fns[: head_at + 1]

        def stages_one_by_one(X: np.ndarray, start: int = 0) -> Any:
            y = X
            for fn in fns_to_head[start:]:
                y = fn(y)
            return y if post is None else (y[0], post(y[1]))

        ravel = ops[0] == "Reshape"
        stages_after_ravel = partial(stages_one_by_one, start=1 if ravel else 0)

        if fast is None:
            return stages_one_by_one
        table = fast.table
        rest = fns_to_head[n_front:]
        head = _sparse_head(registry, ctx, stages[: head_at + 1], table) if rest else None
        quick = None
        compiled = None
        if head is not None:
            post_stage = stages[head_at + 1] if post is not None else None
            quick = softmax_row(stages[head_at], post_stage, head[0].outputs)
            compiled = _CompiledRow.make(head[0], quick)

        def text_vectorize(X: np.ndarray) -> Any:
            if ravel:
                X = X.reshape(-1)
            if X.ndim != 1 or X.size == 0:
                return stages_after_ravel(X)
            items = X.tolist()
            try:
                # one row of unigrams: the scan's dict lookups cost less than the call
                batch = len(items) > 1 or not table.unigrams_only
                found = fast.columns(items) if head is not None and batch else None
                if found is None:
                    rows, get = fast.rows(items)
                elif len(items) == 1:  # its columns on to the one-row paths below
                    rows, get, found = [found[0].tolist()], None, None
            except TypeError:  # bytes or other objects: the Tokenizer decodes them
                return stages_after_ravel(X)
            if found is not None:
                assert head is not None
                sparse, on_scores = head
                y = on_scores(sparse.scores_at(*found, len(items)))
            elif head is not None:
                sparse, on_scores = head
                if len(rows) == 1 and len(rows[0]) <= SMALL:
                    if compiled is not None:
                        got = compiled(rows[0], get)
                        if quick is not None:
                            return got
                        y = on_scores(got)
                        return y if post is None else (y[0], post(y[1]))
                    if quick is not None:
                        return quick(sparse.one_row(rows[0], get))
                y = on_scores(sparse.scores(rows, get))
            else:
                y = table.counts(rows) if get is None else table.count_tokens(rows, get)
                y = table.weigh(y)
                for fn in rest:
                    y = fn(y)
            return y if post is None else (y[0], post(y[1]))

        return text_vectorize

    return build


def _cost(ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> Cost:
    n = float(np.prod(ins[0])) if ins else 0.0
    y = float(np.prod(outs[0])) if outs else 0.0
    return Cost(100.0 * n, 100.0 * n + 4.0 * y)


def register_kernels(registry: KernelRegistry) -> None:
    """Register ``TextVectorize`` into ``registry`` (its stages are built from it)."""
    registry.add("TextVectorize", _text_vectorize(registry), domain=DOMAIN, cost=_cost)
