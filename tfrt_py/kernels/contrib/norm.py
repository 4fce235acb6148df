"""Kernels (contrib): the fused normalizations onnxruntime's transformer optimizer writes --
SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization
(com.microsoft) and SimplifiedLayerNormalization (onnxruntime's RMS norm, registered by it in
the ai.onnx domain, opset 1 on).

* SkipLayerNormalization-1: ``s = input + skip (+ bias)``, then LayerNorm over the last
  axis with ``gamma`` (and ``beta``). ``skip`` is input's shape, or ``(1, S, H)`` /
  ``(S, H)`` broadcast over the batch. Outputs ``(output, mean?, inv_std_var?,
  input_skip_bias_sum?)``; mean and inv_std_var are float32 of shape ``input.shape[:-1]
  + (1,)``; input_skip_bias_sum is ``s``.
* SkipSimplifiedLayerNormalization-1: the same with RMS normalization (no mean, no
  beta): ``s / sqrt(mean(s^2) + eps) * gamma``; its optional ``mean`` output is zeros,
  as onnxruntime writes it.
* EmbedLayerNormalization-1: ``word[input_ids] + position[position_ids or 0..S-1]
  (+ segment[segment_ids])``, LayerNorm, and ``mask_index`` int32 ``(B,)``: the number of
  ones in each row of ``mask`` (zeros without a mask). Optional ``embedding_sum`` is the
  sum before normalization. Ids out of an embedding's range are a ``ValueError`` naming
  the input (onnxruntime: "input index out of range").

* SimplifiedLayerNormalization-1 (ai.onnx): ``X / sqrt(mean(X^2) + eps) * scale`` over axes
  ``axis..``; optional ``inv_std_var`` (``stash_type`` dtype, float32 by default) of shape
  ``X.shape[:axis] + (1,) * ...``. epsilon defaults to 1e-5 here (onnxruntime's schema).

Statistics are computed in float32 (float64 for float64 inputs) with two passes;
``epsilon`` defaults to 1e-12 as in onnxruntime's schema.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..base import ComputeFn, KernelContext
from ..common import ones_vector, stash_dtype
from ..lib.norm_jit import embed_norm_rows_f32, skip_norm_rows_f32
from ..lib.norm_jit import layer_norm_rows as compiled_rows
from ..lib.norm_jit import rms_norm_rows as compiled_rms
from ..registry import KernelRegistry
from .activation import MS_DOMAIN

__all__ = ["register_kernels"]

_EPS = 1e-12


def _stats_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _row_mean(x2: np.ndarray) -> np.ndarray:
    """Row means of a 2-D float32/float64 array as ``(rows, 1)`` (one BLAS call)."""
    cols = x2.shape[1]
    if cols == 0:
        return np.zeros((x2.shape[0], 1), dtype=x2.dtype)
    m = np.dot(x2, ones_vector(cols, x2.dtype.char)).reshape(-1, 1)
    m *= 1.0 / cols
    return m


Compiled = dict[np.dtype, Any]
_UNSET = object()


def compiled_for(simplified: bool) -> Compiled:
    """A kernel's own table of the compiled row kernels (``kernels/lib/norm_jit``: RMS rows
    when ``simplified``) per stats dtype, filled at the first call of each dtype (None
    where numba is missing or ``$TFRT_PY_JIT=0``), so later calls do not read the
    environment."""
    return {}


def _compiled(
    s2: np.ndarray, gamma: Any, beta: Any, eps: float, simplified: bool, fns: Compiled
) -> np.ndarray | None:
    """The LayerNorm (``simplified``: RMS norm, no beta) of ``s2``'s rows by the compiled
    kernels ``fns`` into a new array, or None when they do not apply (numba missing,
    parameters that are not one value per column of ``s2``'s dtype)."""
    fn = fns.get(s2.dtype, _UNSET)
    if fn is _UNSET:
        fn = fns[s2.dtype] = (compiled_rms if simplified else compiled_rows)(s2.dtype)
    cols = s2.shape[1]
    if fn is None or not s2.flags.c_contiguous or s2.size == 0:
        return None
    g = gamma.reshape(-1) if isinstance(gamma, np.ndarray) else None
    b = np.zeros(0, s2.dtype) if beta is None or simplified else beta
    b = b.reshape(-1) if isinstance(b, np.ndarray) else None
    if g is None or b is None or g.dtype != s2.dtype or b.dtype != s2.dtype:
        return None
    if g.shape[0] != cols or b.shape[0] not in (0, cols):
        return None
    y2 = np.empty_like(s2)
    if simplified:
        fn(s2, g, eps, y2)
    else:
        fn(s2, g, b, eps, y2)
    return y2


def layer_norm_rows(
    s2: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float, simplified: bool,
    stats: bool = True, fns: Compiled | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:  # fmt: skip
    """Normalize each row of the 2-D stats-dtype array ``s2`` (a fresh array the caller
    gives up: it is overwritten). Returns ``(y2, mean (rows, 1) or None, inv_std (rows,
    1))``; ``y2`` is ``s2``'s buffer. Without ``stats`` (the caller reads neither) the
    compiled rows ``fns`` (``compiled_for``) run when they apply, and mean and inv_std are
    None."""
    if not stats and fns is not None:
        y2 = _compiled(s2, gamma, beta, eps, simplified, fns)
        if y2 is not None:
            return y2, None, None
    cols = max(s2.shape[1], 1)
    mean = None
    if not simplified:
        mean = _row_mean(s2)
        s2 -= mean
    var = np.einsum("ij,ij->i", s2, s2).reshape(-1, 1)
    var *= 1.0 / cols
    var += eps
    np.sqrt(var, out=var)
    inv = np.reciprocal(var, out=var)
    s2 *= inv
    s2 *= gamma
    if beta is not None:
        s2 += beta
    return s2, mean, inv


_F32 = np.dtype(np.float32)
_NONE_F32 = np.zeros(0, np.float32)
_NO_ROWS: dict[int, np.ndarray] = {}


def _no_rows(h: int) -> np.ndarray:
    """A (0, h) float32 array: "no input_skip_bias_sum" for the compiled skip norm."""
    arr = _NO_ROWS.get(h)
    if arr is None:
        if len(_NO_ROWS) >= 64:  # ever new hidden sizes: start again
            _NO_ROWS.clear()
        arr = _NO_ROWS[h] = np.zeros((0, h), np.float32)
    return arr


class _LastCall:
    """``fn(*args)`` remembered for the last arguments: arrays compared by identity, other
    values by equality. The fused norms' fast paths ask it for their constants' checks
    and contiguous forms: a model passes its constants, the same objects at every call,
    so ``fn`` runs once. One slot, replaced whole (concurrent callers see one entry)."""

    __slots__ = ("fn", "last")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.last: tuple[tuple[Any, ...], Any] | None = None

    def __call__(self, *args: Any) -> Any:
        last = self.last
        if last is not None and all(
            a is b or (not isinstance(a, np.ndarray) and a == b) for a, b in zip(last[0], args)
        ):
            return last[1]
        result = self.fn(*args)
        self.last = (args, result)
        return result


def _skip_params(gamma: Any, beta: Any, bias: Any, h: int) -> tuple[Any, Any, Any] | None:
    """gamma, beta and bias as the compiled skip norm takes them (1-D float32 of the hidden
    size ``h``; length 0: none), or None when one does not fit."""
    out = []
    for arr, required in ((gamma, True), (beta, False), (bias, False)):
        if arr is None and not required:
            out.append(_NONE_F32)
        elif isinstance(arr, np.ndarray) and arr.dtype == _F32 and arr.size == h:
            out.append(np.ascontiguousarray(arr.reshape(h)))
        else:
            return None
    return out[0], out[1], out[2]


def _skip_layer_norm_builder(simplified: bool) -> Any:
    """The builder of SkipLayerNormalization (``simplified``: SkipSimplified...)."""

    def build(ctx: KernelContext) -> ComputeFn:
        eps = float(ctx.attr("epsilon", _EPS))
        bias_at = 3 if simplified else 4  # Skip*Simplified* has no beta input
        want = [ctx.has_output(i) for i in range(4)]
        n_out = ctx.n_outputs
        fns = compiled_for(simplified)
        # float32 without the statistics outputs: one compiled pass (add and norm)
        fast = None if want[1] or want[2] else skip_norm_rows_f32()
        params = _LastCall(_skip_params)

        def skip_layer_norm(
            input: np.ndarray, skip: np.ndarray, gamma: np.ndarray, *rest: Any
        ) -> Any:
            beta = None if simplified or not rest else rest[0]
            bias = rest[bias_at - 3] if len(rest) > bias_at - 3 else None
            if (
                fast is not None and input.dtype == np.float32 and input.size
                and skip.shape == input.shape and input.flags.c_contiguous
                and skip.flags.c_contiguous
            ):  # fmt: skip
                h = input.shape[-1]
                p = params(gamma, beta, bias, h)
                if p is not None:
                    y = np.empty_like(input)
                    total = np.empty_like(input) if want[3] else None
                    fast(input.reshape(-1, h), skip.reshape(-1, h), p[2], p[0], p[1], eps,
                         y.reshape(-1, h), _no_rows(h) if total is None else
                         total.reshape(-1, h), simplified)  # fmt: skip
                    if n_out == 1:
                        return y
                    return (y, None, None, total) + (None,) * (n_out - 4)
            sdt = _stats_dtype(input.dtype)
            s = np.add(input, skip, dtype=sdt)
            if bias is not None:
                s += bias
            total = s.astype(input.dtype) if want[3] else None
            h = input.shape[-1]
            y2, mean, inv = layer_norm_rows(
                s.reshape(-1, h), gamma, beta, eps, simplified, want[1] or want[2], fns
            )
            y = y2.reshape(input.shape)
            if y.dtype != input.dtype:
                y = y.astype(input.dtype)
            if n_out == 1:
                return y
            st = (*input.shape[:-1], 1)
            outs: list[Any] = [y, None, None, total]
            if want[1]:
                outs[1] = np.zeros(st, np.float32) if mean is None else mean.reshape(st)
                outs[1] = outs[1].astype(np.float32, copy=False)
            if want[2] and inv is not None:
                outs[2] = inv.astype(np.float32).reshape(st)
            return tuple(outs[:n_out]) + (None,) * (n_out - 4)

        return skip_layer_norm

    return build


def _simplified_layer_normalization(ctx: KernelContext) -> ComputeFn:
    """SimplifiedLayerNormalization-1: ``fn(X, scale) -> Y`` or ``(Y, inv_std_var)``."""
    axis = int(ctx.attr("axis", -1))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = stash_dtype(ctx)
    if stash.char not in "fd":
        raise ctx.unsupported(f"stash_type {stash} (float32 or float64 only)")
    n_out = ctx.n_outputs
    want_inv = ctx.has_output(1)
    fns = compiled_for(True)

    def simplified_layer_normalization(X: np.ndarray, scale: np.ndarray) -> Any:
        a = axis + X.ndim if axis < 0 else axis
        if not 0 <= a < X.ndim:
            raise ValueError(f"SimplifiedLayerNormalization: axis {axis} for rank {X.ndim}")
        cols = math.prod(X.shape[a:])
        s2 = X.reshape(-1, cols).astype(stash)  # a copy: normalized in place
        stats = n_out > 1 and want_inv
        y2, _, inv = layer_norm_rows(s2, scale.reshape(-1), None, eps, True, stats, fns)
        y = y2.reshape(X.shape).astype(X.dtype, copy=False)
        if n_out == 1:
            return y
        st = X.shape[:a] + (1,) * (X.ndim - a)
        return (y, inv.reshape(st) if want_inv and inv is not None else None) + (None,) * (
            n_out - 2
        )

    return simplified_layer_normalization


def _take(table: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    """``table[ids]``, refusing ids outside ``[0, len(table))`` (no negative wrap)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise ValueError(f"EmbedLayerNormalization: {what} out of range [0, {table.shape[0]})")
    return np.take(table, ids, axis=0)


def _embed_layer_normalization(ctx: KernelContext) -> ComputeFn:
    """EmbedLayerNormalization-1: ``(input_ids, segment_ids?, word_embedding,
    position_embedding, segment_embedding?, gamma, beta, mask?, position_ids?) ->
    (output, mask_index?, embedding_sum?)``."""
    eps = float(ctx.attr("epsilon", _EPS))
    if ctx.has_input(1) != ctx.has_input(4):
        raise ctx.unsupported("segment_ids and segment_embedding must be given together")
    want_mask_index = ctx.has_output(1)
    want_sum = ctx.has_output(2)
    n_out = ctx.n_outputs
    fns = compiled_for(False)
    embed_fast = _embed_fast_pass(eps, want_sum)

    def embed_layer_normalization(
        input_ids: np.ndarray,
        segment_ids: np.ndarray | None,
        word_embedding: np.ndarray,
        position_embedding: np.ndarray,
        segment_embedding: np.ndarray | None,
        gamma: np.ndarray,
        beta: np.ndarray,
        mask: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
    ) -> Any:
        if input_ids.ndim != 2:
            raise ValueError("EmbedLayerNormalization: input_ids must be 2-D (batch, sequence)")
        b, s = input_ids.shape
        h = word_embedding.shape[1]
        if embed_fast is not None and input_ids.size:
            got = embed_fast(input_ids, segment_ids, word_embedding, position_embedding,
                             segment_embedding, gamma, beta, position_ids)  # fmt: skip
            if got is not None:
                if n_out == 1:
                    return got[0]
                index = _mask_index(mask, b) if want_mask_index else None
                return (got[0], index, got[1])[:n_out] + (None,) * (n_out - 3)
        sdt = _stats_dtype(word_embedding.dtype)
        e = _take(word_embedding, input_ids, "input_ids").astype(sdt, copy=False)
        if position_ids is None:
            if s > position_embedding.shape[0]:
                raise ValueError(
                    f"EmbedLayerNormalization: sequence length {s} exceeds the "
                    f"{position_embedding.shape[0]} positions of position_embedding"
                )
            e += position_embedding[:s]
        else:
            e += _take(position_embedding, position_ids, "position_ids")
        if segment_ids is not None and segment_embedding is not None:
            e += _take(segment_embedding, segment_ids, "segment_ids")
        total = e.astype(word_embedding.dtype) if want_sum else None
        y2, _, _ = layer_norm_rows(e.reshape(-1, h), gamma, beta, eps, False, False, fns)
        y = y2.reshape(b, s, h).astype(word_embedding.dtype, copy=False)
        if n_out == 1:
            return y
        mask_index = _mask_index(mask, b) if want_mask_index else None
        return (y, mask_index, total)[:n_out] + (None,) * (n_out - 3)

    return embed_layer_normalization


def _embed_fast_pass(eps: float, want_sum: bool) -> Any:
    """EmbedLayerNormalization's compiled pass, ``(ids, segment_ids, word, position, segment,
    gamma, beta, position_ids) -> (output, embedding_sum?)``, None where the inputs do not
    fit it (float32 tables, 1-D gamma/beta, 2-D integer ids); None itself without numba."""
    fast = embed_norm_rows_f32()
    if fast is None:
        return None
    tables = _LastCall(_embed_params)

    def embed_fast(ids: np.ndarray, seg_ids: Any, word: np.ndarray, pos: np.ndarray,
                   seg: Any, gamma: Any, beta: Any,
                   pos_ids: Any) -> tuple[np.ndarray, np.ndarray | None] | None:  # fmt: skip
        b, s = ids.shape
        h = word.shape[1]
        params = tables(word, pos, seg, gamma, beta)
        if params is None:
            return None
        none = _no_ids(ids.dtype)
        id_arrays = [
            ids,
            seg_ids if seg is not None else none,
            none if pos_ids is None else pos_ids,
        ]
        if any(a.dtype.kind not in "iu" or a.ndim != 2 for a in id_arrays):
            return None
        if seg is not None and seg_ids.shape != ids.shape:
            return None
        if pos_ids is not None and (pos_ids.shape[1] != s or pos_ids.shape[0] not in (1, b)):
            return None
        y = np.empty((b, s, h), np.float32)
        total = np.empty_like(y) if want_sum else None
        code = fast(ids, id_arrays[1], id_arrays[2], word, pos, word if seg is None else seg,
                    params[0], params[1], eps, y.reshape(-1, h),
                    _no_rows(h) if total is None else total.reshape(-1, h))  # fmt: skip
        if code == 4:
            raise ValueError(
                f"EmbedLayerNormalization: sequence length {s} exceeds the "
                f"{pos.shape[0]} positions of position_embedding"
            )
        if code:
            what, table = {1: ("input_ids", word), 2: ("segment_ids", seg),
                           3: ("position_ids", pos)}[code]  # fmt: skip
            raise ValueError(f"EmbedLayerNormalization: {what} out of range [0, {table.shape[0]})")
        return y, total

    return embed_fast


def _embed_params(word: Any, pos: Any, seg: Any, gamma: Any,
                  beta: Any) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """gamma and beta as the compiled embed pass takes them, or None when the tables and
    parameters do not fit it (float32, 2-D tables of one width, 1-D parameters of that
    width)."""
    h = word.shape[1] if word.ndim == 2 else -1
    tables = (word, pos) if seg is None else (word, pos, seg)
    if not all(t.dtype == _F32 and t.ndim == 2 and t.shape[1] == h for t in tables):
        return None
    if not all(
        isinstance(p, np.ndarray) and p.dtype == _F32 and p.size == h for p in (gamma, beta)
    ):
        return None
    return np.ascontiguousarray(gamma.reshape(h)), np.ascontiguousarray(beta.reshape(h))


_NO_IDS: dict[np.dtype, np.ndarray] = {}


def _no_ids(dtype: np.dtype) -> np.ndarray:
    """A (0, 0) id array of ``dtype``: "no segment_ids / position_ids" for the pass."""
    arr = _NO_IDS.get(dtype)
    if arr is None:
        arr = _NO_IDS[dtype] = np.zeros((0, 0), dtype)
    return arr


def _mask_index(mask: np.ndarray | None, b: int) -> np.ndarray:
    """EmbedLayerNormalization's mask_index: the ones in each row of ``mask`` (int32)."""
    if mask is None:
        return np.zeros(b, dtype=np.int32)
    return np.count_nonzero(mask == 1, axis=1).astype(np.int32)


def register_kernels(registry: KernelRegistry) -> None:
    """Register SkipLayerNormalization, SkipSimplifiedLayerNormalization,
    EmbedLayerNormalization (com.microsoft) and SimplifiedLayerNormalization (ai.onnx)."""
    registry.add(
        "SkipLayerNormalization", _skip_layer_norm_builder(False), domain=MS_DOMAIN, since=1
    )
    registry.add(
        "SkipSimplifiedLayerNormalization",
        _skip_layer_norm_builder(True),
        domain=MS_DOMAIN,
        since=1,
    )
    registry.add("EmbedLayerNormalization", _embed_layer_normalization, domain=MS_DOMAIN, since=1)
    registry.add("SimplifiedLayerNormalization", _simplified_layer_normalization, since=1)
