"""Native lowerings of the classic-ML ops (ai.onnx.ml) and the default-domain ops their
pipelines use (ArgMax, Cast to integers).

A model's numbers become data, never code: forests, support vectors and coefficients are
packed constants (``cx.put_const``) handed to the hand-written numba kernels of
``kern_trees`` / ``kern_svm`` / ``kern_post`` as slices (``cx.const_slice``), so the
generated code is the same few lines whatever the number of trees, and its compile time
does not grow with them. Attributes are parsed by the same functions the NumPy kernels use
(``kernels.ml``); strings in them (modes, post transforms, kernel types) select among our
own codes and are never pasted. String class labels stay outside numba: the kernels write
label indices and the entry maps them (``cx.label_table``); ZipMap outputs are built by the
entry from the scores (``cx.finishers``).

Each lowering handles its input as rows (``as_2d``: the first dim, or one row for 1-D) and
loops over them, so in the tier's row mode (one row per iteration) it is one kernel call.
Load time only; pure functions of the node and the context.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from ...ir import Node
from ...kernels.base import KernelContext
from ...kernels.lib import linear_rows_ir
from ...kernels.ml.common import attr_floats, attr_ints, attr_strings, post_transform
from ...kernels.ml.linear import class_labels
from ...kernels.ml.tree_ops import aggregate_name, parse_spec_v3, parse_spec_v5
from . import rows
from .emit import elementwise, tname
from .loops import Ref
from .ml_pack import AGG_CODES, FOREST_ROW, FOREST_ROWS, KERNEL_CODES, POST_CODES, pack_forest
from .records import Registry
from .source import literal

__all__ = ["KERNEL_IMPORTS", "kernel_version", "register_lowerings"]

ML = "ai.onnx.ml"
F4, F8, I8 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)

#: The import lines a module calling these kernels needs (our own module names).
KERNEL_IMPORTS = (
    "from tfrt_py.native.kernels.post import argmax, matvec, normalize_row, post",
    "from tfrt_py.native.kernels.svm import linear_cls_row, linear_cls_rows, linear_reg_rows",
    "from tfrt_py.native.kernels.svm import svm_cls_row, svm_reg_row",
    "from tfrt_py.native.kernels.trees import forest_leq, forest_lt, forest_mixed",
    "from tfrt_py.native.kernels.trees import forest_rows_leq, forest_rows_lt, forest_rows_mixed",
    "from tfrt_py.native.kernels.trees import tree_cls_finish, tree_reg_finish",
)


def _no(cx: Any, reason: str) -> NoReturn:
    """Decline the node (``cx.decline`` raises Declined)."""
    cx.decline(reason)
    raise AssertionError(reason)  # not reached


#: The import line of the IR kernel's rows (``_linear_rows``): importing it builds the kernel.
LINEAR_IR_IMPORT = "from tfrt_py.native.kernels.linear_ir import linear_cls_rows_ir"

#: The sources of the machine code generated modules link (package-relative): the native
#: kernels and what they compile from elsewhere (the BLAS and packed-gemm bindings, the
#: tree classifier's base-value rule).
_NATIVE_KERNELS = ("post", "svm", "trees", "blas", "fastmath", "rowdot", "nbits", "nbits_int8",
                   "linear_ir", "qdynamic")  # fmt: skip
KERNEL_SOURCES = (
    *(f"native/kernels/{name}.py" for name in _NATIVE_KERNELS),
    "kernels/lib/blas.py",
    "kernels/lib/dotrows_ir.py",
    "kernels/lib/gemm_packed.py",
    "kernels/lib/linear_rows_ir.py",
    "kernels/lib/qgemm_packed.py",
    "kernels/lib/qnbits_ir.py",
    "kernels/lib/rowreduce_ir.py",
    "kernels/lib/rowvec_ir.py",
    "kernels/ml/tree_ops.py",
)


@functools.cache
def kernel_version() -> int:
    """A number that changes with ``KERNEL_SOURCES``: generated modules state it, so
    numba's cache of a module (which holds the kernels' machine code) is not reused after
    the kernels change."""
    h = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for rel in KERNEL_SOURCES:
        with open(os.path.join(root, *rel.split("/")), "rb") as f:
            h.update(f.read())
    return int(h.hexdigest()[:12], 16)


def _rows(cx: Any, x: Ref) -> tuple[int, int]:
    """(rows, features) of an ONNX-ML feature input (``common.as_2d``)."""
    if len(x.shape) <= 1:
        return 1, x.size
    f = math.prod(x.shape[1:])
    return x.shape[0], f


def _per_row(cx: Any, rows: int, body: Any) -> list[str]:
    """``body(m)`` (m: the row expression) once per row; no loop for one row."""
    if rows == 1:
        return list(body("0"))
    m = f"{cx.tag}m"
    return [f"for {m} in range({literal(rows)}):", *("    " + ln for ln in body(m))]


def _at(r: Ref, m: str, stride: int) -> str:
    """Row ``m``'s offset in ``r`` as a kernel argument (``_off``)."""
    return _off(r.off if m == "0" else f"{r.off} + {m} * {literal(stride)}")


def _off(expr: str) -> str:
    """An element offset passed to a kernel, typed int64: numba compiles a kernel once per
    distinct literal argument (``Literal[int]``), so twenty trees' accumulators at twenty
    arena offsets were forty compiles of ~1.6 s (an AdaBoost's box: 64 s)."""
    return f"i8({expr})"


def _labels_of(cx: Any, ctx: KernelContext, ints_attr: str) -> tuple[np.ndarray, bool]:
    """(int64 label values the kernel writes, whether they index string labels)."""
    strs = attr_strings(ctx, "classlabels_strings")
    if strs:
        return np.arange(len(strs), dtype=np.int64), True
    ints = attr_ints(ctx, ints_attr)
    if ints is None or not len(ints):
        _no(cx, "no class labels")
    return ints, False


def _label_out(cx: Any, node: Node, strs: bool, n: int) -> Ref:
    """The label output (int64; label indices for string labels, mapped by the entry)."""
    v = node.outputs[0]
    if v is None:
        return cx.new_buffer((n,), I8)
    if strs:
        strs_attr = KernelContext(node).attr("classlabels_strings")
        names = [s.decode("utf-8", "surrogateescape") if isinstance(s, bytes) else s
                 for s in strs_attr]  # fmt: skip
        return cx.out_labels(v, (n,), np.array(names, dtype=object))
    return cx.out(v)


def _x(cx: Any, node: Node, dtypes: tuple[np.dtype, ...] = (F4,)) -> Ref:
    x = cx.ref(node.inputs[0])
    if x.dtype not in dtypes:
        _no(cx, f"input dtype {x.dtype} (native ML kernels take {', '.join(map(str, dtypes))})")
    return x


def _code(cx: Any, name: str) -> int:
    code = POST_CODES.get(name)
    if code is None:
        _no(cx, f"post transform {name}")
    return code


def _tree_common(cx: Any, node: Node, spec: Any) -> tuple[Ref, int, int, list[str], Any]:
    x = _x(cx, node, (F4, F8))
    rows, f = _rows(cx, x)
    try:
        packed = pack_forest(spec, x.dtype)
    except ValueError as e:
        _no(cx, str(e))
    if packed.max_feature >= f:
        _no(cx, f"the trees use feature {packed.max_feature} of {f}")
    p = packed
    if f < 1:
        _no(cx, "no features")
    nodes = cx.const_slice(p.nodes)
    ft = "np.float32" if p.nodes.dtype == np.int32 else "np.float64"
    names = [nodes, f"{nodes}.view({ft})"]
    names += [cx.const_slice(a) for a in (p.roots, p.depth, p.lptr, p.ltgt, p.lval)]
    names.append(literal(p.n_internal))
    return x, rows, f, names, packed


#: Rows one many-row forest walk covers (its accumulators hold this many rows).
FOREST_BLOCK = 64


def _forest(cx: Any, x: Ref, rows: int, f: int, names: list[str], kind: int, c: int,
            agg: int, finish: Callable[[Ref, str, Ref, str, str], str]) -> list[str]:  # fmt: skip
    """The walk and, per row ``m``, ``finish(acc, its offset, has, its offset, m)``. One
    row walks its trees in lanes (``FOREST_ROW``); more (rows mode's tiles, a static batch)
    walk each tree for a block of rows at once (``FOREST_ROWS``: 2.1x faster a row on a
    20-tree forest of depth 3), then finish row by row. Both add each row's weights in tree
    order."""
    nodes, thr, roots, depth, lptr, ltgt, lval, n = names
    block = min(rows, FOREST_BLOCK)
    acc, has = cx.new_buffer((block * c,), x.dtype), cx.new_buffer((block * c,), np.dtype(bool))
    tables = f"{nodes}, {thr}, {roots}, {depth}, {n}, {lptr}, {ltgt}, {lval}"
    tail = f"{acc.buf}, {_off(acc.off)}, {has.buf}, {_off(has.off)}, {literal(c)}, {literal(agg)}"
    if rows == 1:
        return [f"{FOREST_ROW[kind]}({x.buf}, {_at(x, '0', f)}, {tables}, {tail})",
                finish(acc, acc.off, has, has.off, "0")]  # fmt: skip
    q, nq, m = f"{cx.tag}q", f"{cx.tag}n", f"{cx.tag}m"
    return [
        f"for {q} in range(0, {literal(rows)}, {literal(block)}):",
        f"    {nq} = min({literal(block)}, {literal(rows)} - {q})",
        f"    {FOREST_ROWS[kind]}({x.buf}, {_at(x, q, f)}, {_off(literal(f))}, {_off(nq)}, "
        f"{tables}, {tail})",
        f"    for {m} in range({nq}):",
        "        " + finish(acc, f"{acc.off} + {m} * {literal(c)}", has,
                            f"{has.off} + {m} * {literal(c)}", f"({q} + {m})"),
    ]  # fmt: skip


def _tree_classifier(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    labels, strs = _labels_of(cx, ctx, "classlabels_int64s")
    c = len(labels)
    spec = parse_spec_v3(ctx, "class", c)
    if c == 1 and strs:
        _no(cx, "one string class label")
    x, rows, f, names, packed = _tree_common(cx, node, spec)
    tname_, _ = post_transform(ctx)
    code = _code(cx, tname_)
    base = attr_floats(ctx, "base_values", np.float64)
    base = np.zeros(0) if base is None else base
    binary_case = c == 2 and len(np.unique(spec.leaf_target)) == 1
    all_positive = bool((spec.leaf_weight >= 0).all())
    lab = _label_out(cx, node, strs, rows)
    y = cx.out(node.outputs[1]) if len(node.outputs) > 1 and node.outputs[1] is not None else (
        cx.new_buffer((rows, c), F4))  # fmt: skip
    if y.size != rows * c or y.dtype != F4:
        _no(cx, f"scores of shape {y.shape}")
    base_s, base_t = cx.const_slice(base), cx.const_slice(base.astype(x.dtype))
    lab_s = cx.const_slice(labels)
    flags = f"{literal(strs or binary_case)}, {literal(binary_case)}, {literal(all_positive)}"

    def finish(acc: Ref, ao: str, has: Ref, ho: str, m: str) -> str:
        return (f"tree_cls_finish({acc.buf}, {_off(ao)}, {has.buf}, {_off(ho)}, {literal(c)}, "
                f"{base_s}, {base_t}, {lab_s}, {flags}, {literal(code)}, {lab.buf}, "
                f"{_at(lab, m, 1)}, {y.buf}, {_at(y, m, c)})")  # fmt: skip

    return _forest(cx, x, rows, f, names, packed.kind, c, 0, finish)


def _tree_regressor(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    if node.op_type == "TreeEnsemble":
        spec = parse_spec_v5(ctx)
        how = aggregate_name(ctx, int(ctx.attr("aggregate_function", 1)))
        tname_, _ = post_transform(ctx, int(ctx.attr("post_transform", 0)))
        base = None
    else:
        spec = parse_spec_v3(ctx, "target", int(ctx.attr("n_targets", 1)))
        how = aggregate_name(ctx, ctx.attr("aggregate_function", "SUM"))
        tname_, _ = post_transform(ctx)
        base = attr_floats(ctx, "base_values", np.float64)
    c = int(spec.n_targets)
    use_base = base is not None and len(base) == c
    x, rows, f, names, packed = _tree_common(cx, node, spec)
    code = _code(cx, tname_)
    y = cx.out(node.outputs[0])
    want = x.dtype if node.op_type == "TreeEnsemble" else F4
    if y.size != rows * c or y.dtype != want:
        _no(cx, f"output of shape {y.shape}")
    base_t = cx.const_slice(
        (base if use_base and base is not None else np.zeros(c)).astype(x.dtype)
    )
    n_trees = len(packed.roots)

    def finish(acc: Ref, ao: str, has: Ref, ho: str, m: str) -> str:
        return (f"tree_reg_finish({acc.buf}, {_off(ao)}, {has.buf}, {_off(ho)}, {literal(c)}, "
                f"{literal(max(n_trees, 1))}, {literal(how == 'AVERAGE')}, {base_t}, "
                f"{literal(use_base)}, {literal(code)}, {y.buf}, {_at(y, m, c)})")  # fmt: skip

    return _forest(cx, x, rows, f, names, packed.kind, c, AGG_CODES[how], finish)


def _kernel_params(cx: Any, ctx: KernelContext, linear: bool = False) -> tuple[int, str]:
    kind = "LINEAR" if linear else ctx.attr("kernel_type", "LINEAR")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "surrogateescape")
    code = KERNEL_CODES.get(kind)
    if code is None:
        _no(cx, f"kernel_type {kind}")
    params = attr_floats(ctx, "kernel_params", np.float64)
    g, c0, d = ((params.tolist() if params is not None else []) + [0.0] * 3)[:3]
    return code, f"{literal(float(g))}, {literal(float(c0))}, {literal(float(d))}"


def _support_vectors(cx: Any, sv: np.ndarray | None, n_sv: int, f: int, ktype: int) -> str:
    if sv is None or n_sv <= 0 or sv.size != n_sv * f:
        _no(cx, "support_vectors do not match the features")
    return cx.const_slice(np.ascontiguousarray(sv.reshape(n_sv, f).T).astype(F4))


def _svm_classifier(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    labels, strs = _labels_of(cx, ctx, "classlabels_ints")
    k = len(labels)
    coef = attr_floats(ctx, "coefficients", np.float64)
    rho = attr_floats(ctx, "rho", np.float64)
    vpc = attr_ints(ctx, "vectors_per_class")
    if coef is None or rho is None or not len(rho):
        _no(cx, "coefficients and rho are required")
    assert coef is not None and rho is not None
    n_sv = int(vpc.sum()) if vpc is not None else 0
    code = _code(cx, post_transform(ctx)[0])
    x = _x(cx, node)
    rows, f = _rows(cx, x)
    lab = _label_out(cx, node, strs, rows)
    y = cx.out(node.outputs[1])
    lab_s = cx.const_slice(labels)
    all_pos = literal(bool((coef >= 0).all()))
    if n_sv == 0:  # liblinear mode: one coefficient row per class, rho[0] for all
        if len(coef) != k * f:
            _no(cx, "coefficients do not fit the classes and features")
        w = cx.const_slice(coef.reshape(k, f).T.astype(F4))
        b = cx.const_slice(rho[:1].astype(F4))
        if y.size != rows * k:
            _no(cx, f"scores of shape {y.shape}")
        return _linear_rows(cx, rows, x, f, k, k, f"{w}, {b}, {literal(k)}, {lab_s}, False, "
                            f"False, 0, 0, True, {all_pos}, {literal(code)}", lab, y)  # fmt: skip
    assert vpc is not None
    n_pairs = k * (k - 1) // 2
    if len(vpc) != k or len(coef) != (k - 1) * n_sv or len(rho) < n_pairs or (vpc < 0).any():
        _no(cx, "vectors_per_class, coefficients and rho do not fit the classes")
    ktype, kp = _kernel_params(cx, ctx)
    sv = _support_vectors(cx, attr_floats(ctx, "support_vectors", np.float64), n_sv, f, ktype)
    coef2 = coef.reshape(k - 1, n_sv)
    starts = np.concatenate([[0], np.cumsum(vpc)]).astype(np.int64)
    a = np.zeros((n_sv, n_pairs))
    pi: list[int] = []
    pj: list[int] = []
    for i in range(k - 1):
        for j in range(i + 1, k):
            col = len(pi)
            si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
            a[si, col], a[sj, col] = coef2[j - 1, si], coef2[i, sj]
            pi.append(i)
            pj.append(j)
    prob_a = attr_floats(ctx, "prob_a", np.float64)
    prob_b = attr_floats(ctx, "prob_b", np.float64)
    proba = prob_a is not None and len(prob_a) > 0
    if proba and (prob_a is None or prob_b is None or min(len(prob_a), len(prob_b)) < n_pairs):
        _no(cx, "prob_a/prob_b do not fit the classes")
    width = k if proba else (2 if n_pairs == 1 else n_pairs)
    if y.size != rows * width or y.dtype != F4:
        _no(cx, f"scores of shape {y.shape}")
    pa = (prob_a[:n_pairs] if proba and prob_a is not None else np.zeros(0)).astype(F4)
    pb = (prob_b[:n_pairs] if proba and prob_b is not None else np.zeros(0)).astype(F4)
    # per block of four pairs (``kernels.svm._decisions``): the vectors their classes cover
    span = [(min(starts[c] for c in cs), max(starts[c + 1] for c in cs))
            for cs in ({*pi[b:b + 4], *pj[b:b + 4]} for b in range(0, n_pairs, 4))]  # fmt: skip
    blocks = -(-n_pairs // 4)
    padded = np.zeros((n_sv, blocks * 4), F4)
    padded[:, :n_pairs] = a
    a4 = padded.reshape(n_sv, blocks, 4).transpose(1, 0, 2)  # (block, vector, pair in block)
    consts = [cx.const_slice(v) for v in (np.ascontiguousarray(a4).ravel(),
              np.asarray(span, np.int64).ravel(), rho[:n_pairs].astype(F4),
              np.asarray(pi, np.int64), np.asarray(pj, np.int64), pa, pb)]  # fmt: skip
    kb, d = cx.new_buffer((n_sv,), F4), cx.new_buffer((max(n_pairs, 1),), F8)
    sc, votes = cx.new_buffer((2 * k * k + 2 * k,), F4), cx.new_buffer((k,), I8)
    a_s, span_s, rho_s, pi_s, pj_s, pa_s, pb_s = consts
    return _per_row(cx, rows, lambda m: [
        f"svm_cls_row({x.buf}, {_at(x, m, f)}, {literal(f)}, {sv}, {literal(n_sv)}, "
        f"{literal(ktype)}, {kp}, {a_s}, {span_s}, {rho_s}, {pi_s}, {pj_s}, {literal(k)}, "
        f"{lab_s}, "
        f"{literal(proba)}, {pa_s}, {pb_s}, {literal(code)}, {cx.view(kb)}, {cx.view(d)}, "
        f"{cx.view(sc)}, {cx.view(votes)}, {lab.buf}, {_at(lab, m, 1)}, {y.buf}, "
        f"{_at(y, m, width)})"])  # fmt: skip


def _svm_regressor(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    coef = attr_floats(ctx, "coefficients", np.float64)
    rho = attr_floats(ctx, "rho", np.float64)
    if coef is None:
        _no(cx, "coefficients are required")
    assert coef is not None
    n_sv = int(ctx.attr("n_supports", 0))
    r0 = float(np.float32(rho[0] if rho is not None and len(rho) else 0.0))
    code = _code(cx, post_transform(ctx)[0])
    x = _x(cx, node)
    rows, f = _rows(cx, x)
    y = cx.out(node.outputs[0])
    if y.size != rows or y.dtype != F4:
        _no(cx, f"output of shape {y.shape}")
    if n_sv > 0:
        ktype, kp = _kernel_params(cx, ctx)
        sv = _support_vectors(cx, attr_floats(ctx, "support_vectors", np.float64), n_sv, f, ktype)
        w = cx.const_slice(coef.astype(F4))
    else:  # linear: the coefficients are the one "support vector", weight 1
        ktype, kp = _kernel_params(cx, ctx, linear=True)
        n_sv = 1
        sv = _support_vectors(cx, coef, 1, f, ktype)
        w = cx.const_slice(np.ones(1, F4))
    kb = cx.new_buffer((n_sv,), F4)
    one = literal(int(ctx.attr("one_class", 0)) != 0)
    return _per_row(cx, rows, lambda m: [
        f"svm_reg_row({x.buf}, {_at(x, m, f)}, {literal(f)}, {sv}, {literal(n_sv)}, "
        f"{literal(ktype)}, {kp}, {w}, np.float32({literal(r0)}), {one}, {literal(code)}, "
        f"{cx.view(kb)}, {y.buf}, {_at(y, m, 1)})"])  # fmt: skip


def _linear_classifier(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    coef = attr_floats(ctx, "coefficients", np.float64)
    if coef is None:
        _no(cx, "coefficients are required")
    assert coef is not None
    inter = attr_floats(ctx, "intercepts", np.float64)
    labels_arr, is_str = class_labels(ctx)
    if inter is not None and len(inter):
        n = len(inter)
    elif labels_arr is not None and len(labels_arr) and len(coef) % len(labels_arr) == 0:
        n = len(labels_arr)
    else:
        n = 1
    x = _x(cx, node)
    rows, f = _rows(cx, x)
    if len(coef) != n * f:
        _no(cx, "coefficients do not fit the classes and features")
    code = _code(cx, post_transform(ctx)[0])
    n_labels = max(n, 2) if labels_arr is None else len(labels_arr)
    labels = np.arange(n_labels, dtype=np.int64) if labels_arr is None or is_str else labels_arr
    binary = n == 1
    two = n_labels == 2
    if binary and is_str and not two:
        _no(cx, "one coefficient row with string labels other than two")
    if not binary and n_labels < n:
        _no(cx, "fewer labels than classes")
    pos, neg = (int(labels[1]), int(labels[0])) if two else (1, 0)
    lab = _label_out(cx, node, is_str, rows)
    y = cx.out(node.outputs[1])
    width = (2 if two else 1) if binary else n
    if y.size != rows * width or y.dtype != F4:
        _no(cx, f"scores of shape {y.shape}")
    w = cx.const_slice(coef.reshape(n, f).T.astype(F4))
    b = cx.const_slice((inter if inter is not None and len(inter) else np.zeros(n)).astype(F4))
    lab_s = cx.const_slice(labels)
    return _linear_rows(cx, rows, x, f, n, width, f"{w}, {b}, {literal(n)}, {lab_s}, "
                        f"{literal(binary)}, {literal(two)}, {literal(pos)}, {literal(neg)}, "
                        f"False, False, {literal(code)}", lab, y)  # fmt: skip


def _linear_rows(cx: Any, rows: int, x: Ref, f: int, n: int, width: int, params: str,
                 lab: Ref, y: Ref) -> list[str]:  # fmt: skip
    """A LinearClassifier's (or liblinear SVM's) rows. From eight rows on, all of them in
    one call: ``linear_ir.linear_cls_rows_ir`` (the sums by the LLVM IR kernel, vectors of
    rows) where that kernel runs here and the classes are at most
    ``linear_rows_ir.MAX_CLASSES`` (its scratch), else ``linear_cls_rows`` (eight rows'
    sums at once); fewer rows, ``linear_cls_row`` per row. The same bits on every route.
    ``params``: the kernels' arguments from ``w`` to ``code``."""
    if rows >= 8 and n <= linear_rows_ir.MAX_CLASSES and linear_rows_ir.kernel() is not None:
        s = cx.new_buffer((linear_rows_ir.ROWS * n,), F4)
        cx.imports.add(LINEAR_IR_IMPORT)
        return [f"linear_cls_rows_ir({x.buf}, {_off(x.off)}, {literal(rows)}, {literal(f)}, "
                f"{params}, {cx.view(s)}, {lab.buf}, {_off(lab.off)}, {y.buf}, "
                f"{_off(y.off)})"]  # fmt: skip
    s = cx.new_buffer((8 * n if rows >= 8 else n,), F4)
    if rows >= 8:
        return [f"linear_cls_rows({x.buf}, {_off(x.off)}, {literal(rows)}, {literal(f)}, "
                f"{params}, {cx.view(s)}, {lab.buf}, {_off(lab.off)}, {y.buf}, "
                f"{_off(y.off)})"]  # fmt: skip
    return _per_row(cx, rows, lambda m: [
        f"linear_cls_row({x.buf}, {_at(x, m, f)}, {literal(f)}, {params}, {cx.view(s)}, "
        f"{lab.buf}, {_at(lab, m, 1)}, {y.buf}, {_at(y, m, width)})"])  # fmt: skip


def _linear_regressor(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    coef = attr_floats(ctx, "coefficients", np.float64)
    if coef is None:
        _no(cx, "coefficients are required")
    assert coef is not None
    t = int(ctx.attr("targets", 1))
    x = _x(cx, node)
    rows, f = _rows(cx, x)
    if t < 1 or len(coef) != t * f:
        _no(cx, "coefficients do not fit the targets and features")
    inter = attr_floats(ctx, "intercepts", np.float64)
    code = _code(cx, post_transform(ctx)[0])
    y = cx.out(node.outputs[0])
    if y.size != rows * t or y.dtype != F4:
        _no(cx, f"output of shape {y.shape}")
    w = cx.const_slice(coef.reshape(t, f).T.astype(F4))
    b = cx.const_slice((inter if inter is not None and len(inter) else np.zeros(t)).astype(F4))

    if rows >= 4:
        return [f"linear_reg_rows({x.buf}, {_off(x.off)}, {literal(rows)}, {literal(f)}, {w}, "
                f"{b}, {literal(t)}, {literal(code)}, {y.buf}, {_off(y.off)})"]  # fmt: skip

    def body(m: str) -> list[str]:
        yo = _at(y, m, t)
        return [f"matvec({x.buf}, {_at(x, m, f)}, {literal(f)}, {w}, 0, {literal(t)}, "
                f"{y.buf}, {yo})",
                f"for j in range({literal(t)}):", f"    {y.buf}[{yo} + j] += {b}[j]",
                f"post({y.buf}, {yo}, {literal(t)}, {literal(code)})"]  # fmt: skip

    return _per_row(cx, rows, body)


def _scaler(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    x = _x(cx, node)
    y = cx.out(node.outputs[0])
    rows, f = _rows(cx, x)
    off = attr_floats(ctx, "offset", np.float64)
    sc = attr_floats(ctx, "scale", np.float64)
    off = (off if off is not None else np.zeros(1)).astype(F4)
    sc = (sc if sc is not None else np.ones(1)).astype(F4)
    if len(off) not in (1, f) or len(sc) not in (1, f) or y.dtype != F4:
        _no(cx, "offset/scale do not fit the features")
    xs = x.reshaped((rows, f))
    ins: list[Ref | None] = [xs, cx.put_const(off), cx.put_const(sc)]
    steps: list[Any] = [("Sub", {}, (0, 1)), ("Mul", {}, (-1, 2))]
    return elementwise(cx.tag, y.reshaped((rows, f)), ins, steps, None)


def _normalizer(cx: Any, node: Node) -> list[str]:
    norm = KernelContext(node).attr("norm", "MAX")
    norm = norm.decode() if isinstance(norm, bytes) else norm
    kind = {"MAX": 0, "L1": 1, "L2": 2}.get(norm)
    if kind is None:
        _no(cx, "norm")
    x = _x(cx, node, (F4, F8))
    y = cx.out(node.outputs[0])
    rows, f = _rows(cx, x)
    if y.dtype != F4 or y.size != x.size:
        _no(cx, "output shape")
    return _per_row(cx, rows, lambda m: [
        f"normalize_row({x.buf}, {_at(x, m, f)}, {literal(f)}, {literal(kind)}, {y.buf}, "
        f"{_at(y, m, f)})"])  # fmt: skip


def _binarizer(cx: Any, node: Node) -> list[str]:
    thr = float(KernelContext(node).attr("threshold", 0.0))
    x = _x(cx, node, (F4, F8))
    y = cx.out(node.outputs[0])
    t = tname(y.dtype)
    return [f"for i in range({literal(x.size)}):",
            f"    {y.buf}[{y.off} + i] = {t}(1.0) if {x.buf}[{x.off} + i] > {literal(thr)} "
            f"else {t}(0.0)"]  # fmt: skip


def _zipmap(cx: Any, node: Node) -> list[str]:
    """No code: the graph output is the scores, turned into dicts by the entry."""
    ctx = KernelContext(node)
    strs = attr_strings(ctx, "classlabels_strings")
    ints = attr_ints(ctx, "classlabels_int64s")
    labels: list[Any] = list(strs) if strs else (ints.tolist() if ints is not None else [])
    x = cx.ref(node.inputs[0])
    y = node.outputs[0]
    if not labels or y is None or len(x.shape) != 2 or x.shape[1] != len(labels):
        _no(cx, "ZipMap of these scores")
    cx.finish_output(y, x, ("zipmap", labels))
    return []


def _argmax(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if y.dtype != I8 or str(x.dtype) not in ("float32", "float64", "int64", "int32"):
        _no(cx, f"{node.op_type} of {x.dtype}")
    rank = len(x.shape)
    axis = int(node.attrs.get("axis", 0))
    axis += rank if axis < 0 else 0
    last = bool(node.attrs.get("select_last_index", 0))
    outer, n = math.prod(x.shape[:axis]), x.shape[axis]
    inner = math.prod(x.shape[axis + 1 :])
    cmp = (">=" if last else ">") if node.op_type == "ArgMax" else ("<=" if last else "<")
    g = cx.tag
    at = f"{x.buf}[{x.off} + o * {literal(n * inner)} + {{j}} * {literal(inner)} + i]"
    return [
        f"for o in range({literal(outer)}):",
        f"    for i in range({literal(inner)}):",
        f"        {g}b = 0",
        f"        {g}v = {at.format(j='0')}",
        f"        for j in range(1, {literal(n)}):",
        f"            {g}w = {at.format(j='j')}",
        f"            if {g}w {cmp} {g}v:",
        f"                {g}v = {g}w",
        f"                {g}b = j",
        f"        {y.buf}[{y.off} + o * {literal(inner)} + i] = {g}b",
    ]


def _array_feature_extractor(cx: Any, node: Node) -> list[str]:
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    idx = cx.const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if idx is None or tname(x.dtype) == "b1" or not x.shape:
        _no(cx, "indices given at run time")
    f = x.shape[-1]
    ix = [int(i) for i in np.asarray(idx).reshape(-1)]
    if any(i >= f or i < -f for i in ix) or y.dtype != x.dtype:
        _no(cx, "indices out of range")
    k, rows = len(ix), x.size // max(f, 1)
    ixs = cx.const_slice(np.asarray([i % f for i in ix], np.int64))
    return [f"for m in range({literal(rows)}):", f"    for q in range({literal(k)}):",
            f"        {y.buf}[{y.off} + m * {literal(k)} + q] = "
            f"{x.buf}[{x.off} + m * {literal(f)} + {ixs}[q]]"]  # fmt: skip


def _feature_vectorizer(cx: Any, node: Node) -> list[str]:
    dims = attr_ints(KernelContext(node), "inputdimensions")
    y = cx.out(node.outputs[0])
    if dims is None or len(dims) != len(node.inputs) or y.dtype != F4:
        _no(cx, "inputdimensions")
    assert dims is not None
    total = int(sum(int(d) for d in dims))
    rows = y.size // max(total, 1)
    lines = [f"for m in range({literal(rows)}):"]
    start = 0
    for v, d in zip(node.inputs, dims):
        x = cx.ref(v)
        xr, xf = _rows(cx, x)
        if xr != rows or tname(x.dtype) == "b1":
            _no(cx, "FeatureVectorizer inputs differ in rows")
        k = min(int(d), xf)
        dst = f"{y.buf}[{y.off} + m * {literal(total)} + {literal(start)} + c]"
        lines += [f"    for c in range({literal(k)}):",
                  f"        {dst} = f4({x.buf}[{x.off} + m * {literal(xf)} + c])"]  # fmt: skip
        if int(d) > k:
            lines += [f"    for c in range({literal(k)}, {literal(int(d))}):", f"        {dst} = 0"]
        start += int(d)
    return lines


def _imputer(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    fvals = attr_floats(ctx, "imputed_value_floats", np.float64)
    x, y = cx.ref(node.inputs[0]), cx.out(node.outputs[0])
    if fvals is None or not len(fvals) or x.dtype not in (F4, F8) or not x.shape:
        _no(cx, "integer imputation")
    assert fvals is not None
    f = x.shape[-1]
    if len(fvals) not in (1, f):
        _no(cx, "imputed values do not fit the features")
    rep = float(ctx.attr("replaced_value_float", 0.0))
    vals = cx.const_slice(np.broadcast_to(fvals, (f,)).astype(x.dtype))
    v = f"{cx.tag}v"
    hit = f"{v} != {v}" if math.isnan(rep) else f"{v} == {literal(rep)}"
    at = f"m * {literal(f)} + c"
    return [f"for m in range({literal(x.size // max(f, 1))}):",
            f"    for c in range({literal(f)}):", f"        {v} = {x.buf}[{x.off} + {at}]",
            f"        {y.buf}[{y.off} + {at}] = {vals}[c] if {hit} else {v}"]  # fmt: skip


def _all_batched(node: Node, rank: int, batched: list[bool]) -> bool:
    return all(batched)  # FeatureVectorizer: every input is a column block of the row


def register_lowerings(reg: Registry) -> None:
    """The ai.onnx.ml ops lowered here (and ArgMax/ArgMin), with their row rules."""
    per_row = {
        "TreeEnsembleClassifier": _tree_classifier,
        "TreeEnsembleRegressor": _tree_regressor,
        "TreeEnsemble": _tree_regressor,
        "SVMClassifier": _svm_classifier,
        "SVMRegressor": _svm_regressor,
        "LinearClassifier": _linear_classifier,
        "LinearRegressor": _linear_regressor,
        "Scaler": _scaler,
        "Normalizer": _normalizer,
        "Binarizer": _binarizer,
        "ZipMap": _zipmap,
        "ArrayFeatureExtractor": _array_feature_extractor,
        "Imputer": _imputer,
    }
    #: their code for many rows at once beats one row at a time (rows mode's tiles)
    grouped = (
        "SVMClassifier",
        "LinearClassifier",
        "LinearRegressor",
        "TreeEnsembleClassifier",
        "TreeEnsembleRegressor",
        "TreeEnsemble",
        "ZipMap",  # no code: the entry makes its dicts from the scores
    )
    for op, emit in per_row.items():
        reg.add(ML, op, emit, rows=rows.only_first, grouped=op in grouped)
    reg.add(ML, "FeatureVectorizer", _feature_vectorizer, rows=_all_batched)
    reg.add("", "ArgMax", _argmax, rows=rows.axis_not_0(0))
    reg.add("", "ArgMin", _argmax, rows=rows.axis_not_0(0))
