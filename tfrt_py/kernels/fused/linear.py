"""``Linear(x, W, bias?, extra...)``: ``act(x @ W + bias)``, the fused product the compiler
makes of MatMul/Gemm, a bias and activations (``compiler/fuse_linear.py``).

``W`` is a constant [K, N] (Gemm's transB and alpha already folded in) and ``bias`` a
constant that broadcasts to the output without growing it. Attribute ``activation`` is a
list of at most one step (``domain.Step``). A rank-2 Linear with a per-column bias and
Relu (or no activation) whose output has at least ``bias_act_jit.MIN_ELEMENTS`` elements
finishes with one compiled pass instead of NumPy's add and maximum (the same values; numba
required). A float32 product runs on the weight packed for ``gemm_packed``
(``linear_par.Serial``; packed at load up to ``PACK_MAX_BYTES``, a bigger one up to
``PACK_LATER_MAX_BYTES`` on its first product of two rows or more): on this thread, split
by columns for at most ``COLS_MAX_ROWS`` rows by a big enough weight (``Serial.split``), by
rows for more (``Serial.split_rows``); one row by a wide matrix is ``gemm.gemv_cols``'.

The kernel supports ``out=`` and offers an inline form (``base.Inline``, ``_LinearInline``):
the same calls as statements of the sync interpreter's generated code, so a planned call
pays no Python frame for the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..base import Cost, Inline, KernelContext, KernelFlags
from ..common import in_load_run, input_rank
from ..lib.gemm import (
    GEMV_SPLIT_MIN_BYTES,
    NATIVE_SPLIT_MIN_MACS,
    SPLIT_MIN_MACS,
    compile_blocks,
    compile_gemv_dots,
    matmul_into,
    wide_gemv,
)
from ..lib.linear_par import (
    COLS_MAX_ROWS,
    PACK_LATER_MAX_BYTES,
    PACK_MAX_BYTES,
    Serial,
    fused_for,
    pack_later,
    serial_for,
)
from ..linalg.bias_act_jit import MIN_ELEMENTS as EPILOGUE_MIN
from ..linalg.bias_act_jit import bias_relu
from ..registry import KernelRegistry
from .domain import DOMAIN, Step
from .steps import build_step, step_code

__all__ = ["register_kernels"]


def _linear(registry: KernelRegistry) -> Any:
    def build(ctx: KernelContext) -> Any:
        w = ctx.const_input(1)
        b = ctx.const_input(2)
        if w is None or w.ndim != 2:
            raise ctx.unsupported("W must be a constant matrix")
        k, n = w.shape  # W keeps the model's layout: see fuse_linear
        steps: list[Step] = list(ctx.attr("activation", []))
        acts = [(s, build_step(ctx, registry, s)) for s in steps]
        extra_idx = [[r for r in s[3] if r >= 0] for s in steps]
        # Rows known at load (static dims): split over the intra-op pool only if that many
        # rows make a product worth it; unknown: let matmul_into decide per call.
        t = ctx.input_type(0)
        shape = t.shape if t is not None else None
        rows = None
        if shape is not None and all(isinstance(d, int) for d in shape[:-1]):
            rows = int(np.prod([int(d) for d in shape[:-1]], dtype=np.int64))  # type: ignore[arg-type]
        if rows in (None, 1):
            wide_gemv(1, k, n, w.itemsize)  # measured here, at load, not in a first call
            compile_gemv_dots(k, n, w.itemsize)
        small = _whole(rows, w)
        mm: Any = _plain_matmul if small else matmul_into
        if not small and w.dtype == np.float32:
            compile_blocks()  # matmul_into may split on it in a call: compiled here
        add = np.add
        epi = _bias_relu_epilogue(w, b, steps, rows)
        flat_b = None if b is None or b.size != n else b.reshape(-1)
        serial, later = None, None
        if not any(extra_idx) and (b is None or flat_b is not None):
            # packed now (a weight of PACK_MAX_BYTES, or a bigger one that rows known at
            # load say will run two rows or more), on the first such product, or never
            big = rows is not None and rows > 1
            serial = serial_for(steps, flat_b, w, PACK_LATER_MAX_BYTES if big else PACK_MAX_BYTES)
            later = pack_later(steps, flat_b, w) if serial is None and rows is None else None
        blocks = None if small else _block_epilogue(w, b, acts, extra_idx, epi)
        if blocks is not None:  # its compiled twin, run inside native row blocks
            blocks.fused = fused_for(steps, None if b is None else b.reshape(-1), w.dtype)
        inline = _LinearInline(mm, w, b, acts, extra_idx, epi, blocks, serial, later)
        if input_rank(ctx) == 2 and not any(extra_idx):
            ctx.offer_inline(inline)
            return _linear_2d(
                mm, w, b, [fn for _, fn in acts], inline=inline, epi=epi, blocks=blocks,
            )  # fmt: skip

        def linear(x: np.ndarray, *rest: Any, out: np.ndarray | None = None) -> np.ndarray:
            serial = inline.serial if inline.later is None else inline.pack_for(x)
            if serial is not None:
                y = serial.packed_product(x, out)
                if y is not None:
                    return y
            if (
                blocks is not None and x.ndim > 2 and k and x.flags.c_contiguous
                and (out is None or out.flags.c_contiguous)
            ):  # fmt: skip
                o2 = None if out is None else out.reshape(-1, n)
                y2 = matmul_into(x.reshape(-1, k), w, o2, blocks)
                return y2.reshape(*x.shape[:-1], n) if out is None else out
            if x.ndim > 2 and k and x.flags.c_contiguous:  # k == 0: reshape(-1, 0) fails
                y2 = mm(x.reshape(-1, k), w, None if out is None else out.reshape(-1, n))
                y = y2.reshape(*x.shape[:-1], n) if out is None else out
            elif x.ndim == 2 and (out is None or out.flags.c_contiguous):
                y = mm(x, w, out)
            else:
                y = np.matmul(x, w, out=out)
            if b is not None:
                add(y, b, out=y)
            for (_, fn), idx in zip(acts, extra_idx):
                fn(y, *[rest[i - 1] for i in idx], out=y)
            return y

        ctx.offer_inline(inline)
        inline.kernel = linear
        return linear

    return build


def _whole(rows: int | None, w: np.ndarray) -> bool:
    """Whether a product of ``rows`` (known at load; None: not) by ``w`` is too small to
    split and runs as one ``np.matmul`` (a one-row product by big weights still splits:
    ``gemm.wide_gemv``)."""
    k, n = w.shape
    return (
        rows is not None
        and rows * k * n < SPLIT_MIN_MACS
        and not wide_gemv(rows, k, n, w.itemsize)
        and not (rows == 1 and _dots_row(w))
    )


def _dots_row(w: np.ndarray) -> bool:
    """Whether a one-row product by ``w`` takes ``gemm.gemv_dots`` (in ``matmul_into``): a
    float weight of ``GEMV_SPLIT_MIN_BYTES`` or more held as the transpose of a
    C-contiguous (N, K) (a Gemm's ``transB``, as torch.onnx writes a Linear)."""
    return (
        w.ndim == 2
        and w.dtype in (np.float32, np.float64)
        and w.nbytes >= GEMV_SPLIT_MIN_BYTES
        and not w.flags.c_contiguous
        and w.T.flags.c_contiguous
    )


def _plain_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.matmul(a, b, out=out)


class _BiasRelu(NamedTuple):
    """The compiled one-pass epilogue (``kernels.linalg.bias_act_jit``) of a Linear whose
    bias is one value per output column and whose activation is Relu or none."""

    fn: Any
    bias: np.ndarray  # (N,) in W's dtype; length 0 for no bias
    relu: bool
    dtype: np.dtype


def _bias_relu_epilogue(
    w: np.ndarray, b: np.ndarray | None, steps: list[Step], rows: int | None
) -> _BiasRelu | None:
    """The epilogue for this Linear, or None (numba missing, another activation, a bias of
    another shape or dtype, nothing to do, or ``rows`` known at load and too few for
    ``EPILOGUE_MIN`` outputs): the NumPy calls then run. Compiled here, at load (in a
    pre-forking server's parent, so the workers share the code), when it may be used."""
    relu = [s[0] for s in steps] == ["Relu"] and tuple(steps[0][3]) == (-1,)
    if (steps and not relu) or (b is None and not relu) or w.dtype not in (np.float32, np.float64):
        return None
    if rows is not None and rows * w.shape[1] < EPILOGUE_MIN:
        return None
    n = w.shape[1]
    if b is None:
        bias = np.zeros(0, w.dtype)
    elif b.dtype == w.dtype and b.size == n and b.shape[-1:] == (n,):
        bias = np.ascontiguousarray(b.reshape(n))
    else:
        return None
    fn = bias_relu()
    return None if fn is None else _BiasRelu(fn, bias, relu, w.dtype)


def _block_epilogue(
    w: np.ndarray, b: np.ndarray | None, acts: list[Any], extra_idx: list[list[int]],
    epi: _BiasRelu | None,
) -> Any:  # fmt: skip
    """``finish(rows)``: the bias and the activations of a Linear applied in place to a
    block of rows of its result (``gemm.matmul_into``'s epilogue: on the thread that
    computed the block, while it is in cache), or None when a step reads another input or
    the bias is not one value per column (it would not slice with the rows). The compiled
    bias+Relu pass (``epi``) runs on blocks big enough for it, as on whole outputs."""
    n = w.shape[1]
    if any(extra_idx) or (b is not None and (b.size != n or b.shape[-1:] != (n,))):
        return None
    if b is None and not acts:
        return None
    bias = None if b is None else b.reshape(n)
    fns = [fn for _, fn in acts]
    add = np.add

    def finish(y: np.ndarray) -> None:
        if epi is not None and y.size >= EPILOGUE_MIN and y.dtype == epi.dtype:
            epi.fn(y, epi.bias, epi.relu)
            return
        if bias is not None:
            add(y, bias, out=y)
        for fn in fns:
            fn(y, out=y)

    return finish


def _linear_2d(mm: Any, w: np.ndarray, b: np.ndarray | None, acts: list[Any], *,
               inline: _LinearInline, epi: _BiasRelu | None, blocks: Any) -> Any:  # fmt: skip
    """The Linear of a rank-2 input whose activations read nothing else: a product, a bias
    add and the activations in place, without the general kernel's branches (one compiled
    pass for bias and Relu when ``epi`` is given and the output is big enough; with
    ``inline``'s packed weight, the products it takes run on it)."""
    add = np.add

    def linear(x: np.ndarray, *_consts: Any, out: np.ndarray | None = None) -> np.ndarray:
        # _consts: W and B as the node's inputs; the kernel holds them since load
        serial = inline.serial if inline.later is None else inline.pack_for(x)
        if serial is not None:
            y = serial.packed_product(x, out)
            if y is not None:
                return y
        if blocks is not None and (out is None or out.flags.c_contiguous):
            return matmul_into(x, w, out, blocks)  # the epilogue per block of rows
        y = mm(x, w, out if out is None or out.flags.c_contiguous else None)
        if out is not None and y is not out:
            out[...] = y
            y = out
        if (
            epi is not None
            and y.size >= EPILOGUE_MIN
            and y.dtype == epi.dtype
            and y.flags.c_contiguous  # not a strided outputs= buffer
        ):
            epi.fn(y, epi.bias, epi.relu)
            return y
        if b is not None:
            add(y, b, out=y)
        for fn in acts:
            fn(y, out=y)
        return y

    inline.kernel = linear
    return linear


class _LinearInline:
    """The Linear's statements for the sync interpreter's generated code (an ``InlineFn``).

    Rank 2 as is; higher ranks (a transformer's (batch, seq, hidden)) as one 2-D product
    over the rows of a C-contiguous output (a strided ``outputs=`` buffer takes
    ``np.matmul`` on the N-D arrays). The plan knows the shapes: a product too small to
    split calls ``np.matmul`` straight. ``kernel`` is the built compute function, which
    the statements call where they do not apply (set by the builder once it exists)."""

    def __init__(self, mm: Any, w: np.ndarray, b: np.ndarray | None, acts: list[Any],
                 extra_idx: list[list[int]], epi: _BiasRelu | None,
                 blocks: Any = None, serial: Serial | None = None,
                 later: Callable[[], Serial | None] | None = None) -> None:  # fmt: skip
        self.mm, self.w, self.b, self.acts, self.extra_idx = mm, w, b, acts, extra_idx
        self.epi, self.blocks, self.serial = epi, blocks, serial
        #: the weight's packing, until a product of two rows or more makes ``serial``
        self.later = later
        self.k, self.n = w.shape
        self.kernel: Any = None

    def pack_for(self, x: np.ndarray) -> Serial | None:
        """``serial``, packed now when ``x`` has two rows or more and it is not yet (not
        in a load-time run: a shape probe's rows say nothing of the calls')."""
        if x.ndim >= 2 and x.size > x.shape[-1] and not in_load_run():
            self.pack()
        return self.serial

    def pack(self) -> None:
        """Make ``serial`` with ``later`` (any thread: two at once may both pack, one result
        is kept; ``serial`` is set before ``later`` is cleared, so a reader that sees no
        ``later`` sees the packed weight)."""
        later = self.later
        if later is not None:
            self.serial = later()
            self.later = None

    def __call__(self, in_shapes: list[Any], out_shape: Any, dtype: Any) -> Inline | None:
        x_shape = in_shapes[0]
        if (
            x_shape is None or out_shape is None or len(x_shape) < 2
            or len(out_shape) != len(x_shape)
        ):  # fmt: skip
            return None
        static = all(isinstance(d, int) for d in (*x_shape, *out_shape))
        if static and math.prod(x_shape[:-1]) > 1 and not in_load_run():
            self.pack()  # (a plan of any rows leaves it to the first call of two rows)
        if self.serial is not None:
            return self._serial(self.serial, x_shape, len(in_shapes), static, dtype)
        if not static:
            return self._unknown_rows(len(x_shape), len(in_shapes))
        return self._static(x_shape, dtype)

    def _static(self, x_shape: Any, dtype: Any) -> Inline:
        """Shapes fixed by the plan: the product (split or not, as its size says), then the
        bias and activations: per block of rows, in one compiled pass, or as NumPy calls."""
        w, b, k, n = self.w, self.b, self.k, self.n
        rows = int(np.prod(x_shape[:-1], dtype=np.int64))
        pick = np.matmul if _whole(rows, w) else self.mm
        env: dict[str, Any] = {"matmul": pick, "w": w}
        if len(x_shape) == 2:
            lines = ["{matmul}({in0}, {w}, {out})"]
            flat = "{out}"
        else:
            env.update(npmatmul=np.matmul, rk=(rows, k), rn=(rows, n))
            lines = [
                "{matmul}({in0}.reshape({rk}), {w}, {out}.reshape({rn})) "
                "if {out}.flags.c_contiguous else {npmatmul}({in0}, {w}, out={out})"
            ]
            flat = "{out}.reshape({rn})"
        if self.blocks is not None and pick is not np.matmul:
            return self._split(len(x_shape), dtype, env)
        steps: list[str] = []
        if b is not None:
            env.update(add=np.add, b=b)
            steps.append("{add}({out}, {b}, out={out})")
        for i, ((s, fn), idx) in enumerate(zip(self.acts, self.extra_idx)):
            args = ["{out}"] + [f"{{in{j}}}" for j in idx]
            steps += step_code(s[0], fn, args, "{out}", dtype, env, f"act{i}")
        epi = self.epi
        if epi is not None and rows * n >= EPILOGUE_MIN and np.dtype(dtype) == epi.dtype:
            # the compiled pass takes C-contiguous outputs; a strided outputs= buffer
            # (run_checked) takes the NumPy steps
            env.update(epi=epi.fn, bias=epi.bias, relu=epi.relu)
            compiled = f"if {{out}}.flags.c_contiguous: {{epi}}({flat}, {{bias}}, {{relu}})"
            return Inline([*lines, compiled, "else: " + "; ".join(steps)], env)
        return Inline(lines + steps, env)

    def _split(self, rank: int, dtype: Any, env: dict[str, Any]) -> Inline:
        """A product worth splitting: each block of rows gets its bias and activations on
        the thread that computed it; a strided outputs= buffer takes NumPy's product and
        the steps after it."""
        env.update(mmi=matmul_into, blocks=self.blocks, npmatmul=np.matmul)
        if rank == 2:
            first = "{mmi}({in0}, {w}, {out}, {blocks})"
        else:
            first = "{mmi}({in0}.reshape({rk}), {w}, {out}.reshape({rn}), {blocks})"
        rest = [] if self.b is None else ["{add}({out}, {b}, out={out})"]
        if self.b is not None:
            env.update(add=np.add, b=self.b)
        for i, (s, fn) in enumerate(self.acts):
            rest += step_code(s[0], fn, ["{out}"], "{out}", dtype, env, f"act{i}")
        return Inline(
            [f"if {{out}}.flags.c_contiguous: {first}",
             "else: {npmatmul}({in0}, {w}, out={out}); " + "; ".join(rest or ["pass"])],
            env,
        )  # fmt: skip

    def _serial(
        self, sr: Serial, x_shape: Any, n_in: int, static: bool, dtype: Any
    ) -> Inline | None:
        """With a packed weight: a product of at most ``COLS_MAX_ROWS`` rows by a weight big
        enough splits by columns (``Serial.split``); a product that stays on one thread
        (``gemm.splits``: under ``NATIVE_SPLIT_MIN_MACS``, not a wide one-row product)
        calls the packed kernel straight from the generated code, bias and activation
        included (the kernel's Python layers cost ~2 µs a call, as much as a small
        product); anything else -- a product that splits, a strided array -- calls the
        kernel."""
        k, n, w = self.k, self.n, self.w
        if np.dtype(dtype) != np.float32 or not k or self.kernel is None:
            return None
        env: dict[str, Any] = {
            "sk": sr.kernel, "pk": sr.packed, "sb": sr.bias, "sact": sr.act,
            "sprm": sr.params, "sfl": sr.flags, "kernel": self.kernel,
            "rk": (-1, k), "rn": (-1, n),
        }  # fmt: skip
        cond = "{in0}.flags.c_contiguous and {out}.flags.c_contiguous"
        if sr.min_rows > 1:  # one row: the kernel's path (gemm.gemv_cols)
            env["one_row"] = n
            cond += " and {out}.size > {one_row}"
        few = ""
        if sr.cols is not None:
            env.update(split=sr.split, few=COLS_MAX_ROWS * n)
            few = cond + " and {out}.size <= {few}"
        if static:
            rows = int(np.prod(x_shape[:-1], dtype=np.int64))
            if rows > COLS_MAX_ROWS:
                few = ""
            if not few and (
                rows * k * n >= NATIVE_SPLIT_MIN_MACS
                or wide_gemv(rows, k, n, w.itemsize)
                or (rows == 1 and _dots_row(w))
            ):
                return None
        else:
            env["small"] = -(-NATIVE_SPLIT_MIN_MACS // k)  # out.size under it: m*k*n < min
            cond += " and {out}.size < {small}"
            if wide_gemv(1, k, n, w.itemsize) or _dots_row(w):  # one row: split, or dots
                env["wide"] = n
                cond += " and {out}.size != {wide}"
        a, o = ("{in0}", "{out}") if len(x_shape) == 2 else (
            "{in0}.reshape({rk})", "{out}.reshape({rn})")  # fmt: skip
        rest = "".join(f", {{in{j}}}" for j in range(1, n_in))
        lines = [
            f"if {cond}: {{sk}}({a}, {{pk}}, {o}, {{sb}}, {{sact}}, {{sprm}}, {{sfl}})",
            f"else: {{kernel}}({{in0}}{rest}, out={{out}})",
        ]
        if few:
            lines = [f"if {few} and {{split}}({a}, {o}): pass", "el" + lines[0], lines[1]]
        return Inline(lines, env)

    def _unknown_rows(self, rank: int, n_in: int) -> Inline | None:
        """A generic plan's Linear (the rows change with the signature): a product too
        small to split runs as ``np.matmul`` then ``finish`` (bias, activations, the
        compiled epilogue when big enough) in line, decided per call from the output's
        size; anything else -- a big product, a strided ``outputs=`` buffer, two rows or
        more by a weight not packed yet (``later``) -- calls the kernel, which splits it
        (and packs the weight)."""
        k, n, w = self.k, self.n, self.w
        if any(self.extra_idx) or not k or self.kernel is None:
            return None
        env: dict[str, Any] = {
            "npmatmul": np.matmul, "w": w, "kernel": self.kernel, "finish": self.finish,
            "small": -(-SPLIT_MIN_MACS // k), "rk": (-1, k), "rn": (-1, n),
        }  # fmt: skip
        a, o = ("{in0}", "{out}") if rank == 2 else ("{in0}.reshape({rk})", "{out}.reshape({rn})")
        if wide_gemv(1, k, n, w.itemsize) or _dots_row(w):  # one row: split, or gemv_dots
            env["wide"] = n
            cond = "{out}.flags.c_contiguous and {out}.size < {small} and {out}.size != {wide}"
        else:
            cond = "{out}.flags.c_contiguous and {out}.size < {small}"
        if self.later is not None:  # two rows or more: the kernel, which packs the weight
            env["one_row"] = n
            cond += " and {out}.size <= {one_row}"
        rest = "".join(f", {{in{j}}}" for j in range(1, n_in))
        return Inline([
            f"if {cond}: {{npmatmul}}({a}, {{w}}, {o}); {{finish}}({{out}})",
            f"else: {{kernel}}({{in0}}{rest}, out={{out}})",
        ], env)  # fmt: skip

    def finish(self, y: np.ndarray) -> None:
        """Bias and activations in place on a C-contiguous product (one compiled pass
        when it is big enough for it)."""
        epi = self.epi
        if epi is not None and y.size >= EPILOGUE_MIN and y.dtype == epi.dtype:
            epi.fn(y.reshape(-1, self.n), epi.bias, epi.relu)
            return
        if self.b is not None:
            np.add(y, self.b, out=y)
        for _, fn in self.acts:
            fn(y, out=y)


def _linear_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    if not ins or not outs or not ins[0]:
        return Cost(0.0, 0.0)
    y = float(np.prod(outs[0]))
    k = ins[0][-1]
    w = float(np.prod(ins[1])) if len(ins) > 1 else 0.0
    return Cost(2.0 * y * k + 4.0 * y, 4.0 * (float(np.prod(ins[0])) + w + y))


def register_kernels(registry: KernelRegistry) -> None:
    """Register Linear into ``registry``; its activation steps are built from ``registry``."""
    registry.add(
        "Linear", _linear(registry), domain=DOMAIN, flags=KernelFlags(supports_out=True),
        cost=_linear_cost,
    )  # fmt: skip
