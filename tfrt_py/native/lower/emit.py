"""Loop nests the op lowerings share: a fused elementwise map with broadcasting, a
matrix product (axpy loops or BLAS), and a strided copy.

Each function returns lines of generated Python (indented relative to the function
body); ``tag`` makes the scalar temporaries unique per node, so numba never has to unify
variables of different dtypes. Pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .loops import Ref, bcast_strides, coalesce, index, loop_nest, strides
from .scalar import expr
from .source import Declined, literal

__all__ = [
    "BLAS_IMPORT",
    "CHAIN_K",
    "EXP_IMPORT",
    "Step",
    "chains",
    "copy_strided",
    "elementwise",
    "matmul",
    "tname",
]

#: (op_type, attrs, refs): refs index the operands, -1 is the running value.
Step = tuple[str, dict[str, Any], Sequence[int]]

_TNAMES = {"float32": "f4", "float64": "f8", "int64": "i8", "int32": "i4", "bool": "b1",
           "uint8": "u1", "int8": "s1"}  # fmt: skip

#: With ``blas``, a product at least this big (multiply-adds) with more than one row
#: goes to BLAS: a gemm call costs ~0.2 µs, and the loops run a 64x64 @ 64x4 product
#: (16K multiply-adds) at a seventh of its rate (their vectors are only N wide).
BLAS_MIN_MACS = 1 << 12
#: The import line of a module whose code calls ``gemm_f4``/``gemm_f8``.
BLAS_IMPORT = "from tfrt_py.native.kernels.blas import gemm_f4, gemm_f4_ld, gemm_f8"
#: The import line of a module whose code calls ``expf`` or ``expf_neg``.
EXP_IMPORT = "from tfrt_py.native.kernels.fastmath import expf, expf_neg, expf_rn"
#: Float32 products over at most this many terms are one chain of fused multiply-adds from
#: zero in k's order per output, as onnxruntime's sgemm (MLAS) computes them while K fits
#: one of its blocks (128 terms or more): ``matmul``'s loops then take k one at a time
#: (``chain``, for a constant weight), and ``products.packed_product`` takes the packed
#: kernel (the same chain) at any width it pays at. NumPy's gemm and a loop over pairs of
#: k associate otherwise: a last-bit difference that a model subtracting large, nearly
#: equal sums (a GaussianMixture's log-densities) turns into 1e-3 of its probabilities.
CHAIN_K = 128


#: A one-row chained product (``matmul``'s ``chain``) at most this wide keeps its outputs in
#: scalars while k runs, stored once at the end: summed into the output array, each step is
#: a load and a store (LLVM cannot tell the output from the operands), ~100 cycles a row
#: for a 10x3 product (a PassiveAggressive classifier: 24 -> 12 ns a row). The same
#: chain of fused multiply-adds per output either way.
REGISTER_N = 8


def chains(w: Any, k: int) -> bool:
    """Whether ``matmul``'s loops take a product by ``w`` (its constant weight, None when it
    is computed) over ``k`` terms one k a pass (``CHAIN_K``)."""
    return w is not None and str(w.dtype) == "float32" and k <= CHAIN_K


def tname(dtype: Any) -> str:
    """The generated module's alias for a dtype (Declined if it has none: the lowering
    only knows float32/float64/int64/int32/uint8/int8/bool)."""
    t = _TNAMES.get(str(dtype))
    if t is None:
        raise Declined([f"dtype {dtype} has no native form"])
    return t


def elementwise(
    tag: str, out: Ref, operands: Sequence[Ref | None], steps: Sequence[Step], head: int | None
) -> list[str]:
    """``out[i] = steps(...)`` over ``out.shape``; operands broadcast to it. The running
    value starts as operand ``head`` (None: the first step's refs name all it reads)."""
    t = tname(out.dtype)
    present = [(k, r) for k, r in enumerate(operands) if r is not None]
    lists = [strides(out.shape)] + [bcast_strides(r.shape, out.shape) for _, r in present]
    shape, sts = coalesce(out.shape, lists)
    pos = {k: j + 1 for j, (k, _) in enumerate(present)}

    def body(iv: list[str]) -> list[str]:
        lines: list[str] = []
        loaded: dict[int, str] = {}

        def load(k: int) -> str:
            if operands[k] is None:
                return "None"
            if k not in loaded:
                r = operands[k]
                assert r is not None
                loaded[k] = f"{tag}u{k}"
                lines.append(f"{loaded[k]} = {r.buf}[{index(r.off, iv, sts[pos[k]])}]")
            return loaded[k]

        acc = load(head) if head is not None else None
        for op, attrs, refs in steps:
            args = [acc if r < 0 else load(r) for r in refs]
            assert all(a is not None for a in args)
            lines.append(f"{tag}a = {t}({expr(op, args, attrs, t)})")  # type: ignore[arg-type]
            acc = f"{tag}a"
        lines.append(f"{out.buf}[{index(out.off, iv, sts[0])}] = {acc}")
        return lines

    return loop_nest(shape, body)


def _chain_in_registers(tag: str, xs: Callable[[str], str], w: Ref, y: Ref, yrow: str,
                        k_: int, n_: int, wk: int, wj: int, t: str) -> list[str]:  # fmt: skip
    """``matmul``'s one-row chain with each output in a scalar ``{tag}a<j>``."""
    acc = [f"{tag}a{j}" for j in range(n_)]
    lines = [f"{a} = {t}(0.0)" for a in acc]
    lines.append(f"for k in range({literal(k_)}):")
    lines.append(f"    {tag}x0 = {xs('k')}")
    for j, a in enumerate(acc):
        weight = f"{w.buf}[{w.off} + k * {literal(wk)} + {literal(j * wj)}]"
        lines.append(f"    {a} += {tag}x0 * {weight}")
    lines += [f"{y.buf}[{yrow} + {j}] = {a}" for j, a in enumerate(acc)]
    return lines


def copy_strided(out: Ref, src: Ref, src_strides: Sequence[int], base: int = 0) -> list[str]:
    """``out[i] = src[base + sum(i_d * src_strides_d)]`` over ``out.shape``."""
    shape, sts = coalesce(out.shape, [strides(out.shape), src_strides])
    off = src.off if base == 0 else f"{src.off} + {literal(base)}"

    def body(iv: list[str]) -> list[str]:
        return [f"{out.buf}[{index(out.off, iv, sts[0])}] = {src.buf}[{index(off, iv, sts[1])}]"]

    return loop_nest(shape, body)


def matmul(
    tag: str,
    x: Ref,
    w: Ref,
    y: Ref,
    mkn: tuple[int, int, int],
    x_st: tuple[int, int],
    w_st: tuple[int, int],
    *,
    blas: bool,
    chain: bool = False,
) -> list[str]:
    """``y[m, j] = sum_k x[m, k] * w[k, j]`` (element strides ``x_st`` = (m, k), ``w_st``
    = (k, j); ``y`` contiguous [M, N]). Loop order m, k, j with j innermost (LLVM
    vectorizes it without reassociation), k unrolled by 2 -- one k a pass with ``chain``
    (the caller's: a float32 product over at most ``CHAIN_K`` terms of a constant weight,
    whose K no box of dims changes), so each output is onnxruntime's chain of fused
    multiply-adds (the module's contraction fuses each step); with ``blas`` (the caller's
    ``NodeContext.blas_for``: big enough), float products with several rows call NumPy's
    gemm instead (``kern_blas``: the module must
    import ``BLAS_IMPORT``)."""
    m_, k_, n_ = mkn
    M, K, N = (literal(v) for v in (m_, k_, n_))
    t = tname(y.dtype)
    if blas and m_ > 1 and t in ("f4", "f8") and x_st == (k_, 1) and w_st == (n_, 1):
        args = f"{x.buf}, {x.off}, {w.buf}, {w.off}, {y.buf}, {y.off}, {M}, {K}, {N}"
        return [f"gemm_{t}({args})"]
    xm, xk = x_st
    wk, wj = w_st
    mv = ["m"] if m_ > 1 else []
    yrow = index(y.off, mv, [n_])
    xrow = index(x.off, mv, [xm])

    def xs(kexpr: str) -> str:
        return f"{x.buf}[{xrow} + ({kexpr}) * {literal(xk)}]"

    def ws(kexpr: str) -> str:
        j = "j" if wj == 1 else f"j * {literal(wj)}"
        return f"{w.buf}[{w.off} + ({kexpr}) * {literal(wk)} + {j}]"

    if chain and m_ == 1 and n_ <= REGISTER_N:
        return _chain_in_registers(tag, xs, w, y, yrow, k_, n_, wk, wj, t)
    lines = [f"for j in range({N}):", f"    {y.buf}[{yrow} + j] = {t}(0.0)"]
    if chain:
        lines.append(f"for k in range({K}):")
        lines.append(f"    {tag}x0 = {xs('k')}")
        lines.append(f"    for j in range({N}):")
        lines.append(f"        {y.buf}[{yrow} + j] += {tag}x0 * {ws('k')}")
        return [f"for m in range({M}):"] + ["    " + ln for ln in lines] if m_ > 1 else lines
    # Two rows per pass (LLVM vectorizes this form; four rows defeat its cost model), an
    # odd last row on its own: the same text for every K (``generic.py``)
    k2 = f"{K} // 2 * 2"
    lines.append(f"for k in range(0, {k2}, 2):")
    lines.append(f"    {tag}x0 = {xs('k')}")
    lines.append(f"    {tag}x1 = {xs('k + 1')}")
    lines.append(f"    for j in range({N}):")
    lines.append(f"        {y.buf}[{yrow} + j] += {tag}x0 * {ws('k')} + {tag}x1 * {ws('k + 1')}")
    lines.append(f"for k in range({k2}, {K}):")
    lines.append(f"    {tag}x0 = {xs('k')}")
    lines.append(f"    for j in range({N}):")
    lines.append(f"        {y.buf}[{yrow} + j] += {tag}x0 * {ws('k')}")
    if m_ > 1:
        lines = [f"for m in range({M}):"] + ["    " + ln for ln in lines]
    return lines
