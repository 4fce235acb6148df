"""Float32 stem convolutions: few input channels, a 3x3 window at stride 2 (the first conv
of MobileNet, EfficientNet, RegNet, ShuffleNet, SqueezeNet, MobileViT), an LLVM IR kernel
under ``nn/conv_stem``.

``stem(x, w, b, y, lohi, c, h, wd, oh, ow, pt, pl, m, r0, r1)``: one image. ``x``
is its ``c`` planes of ``h`` x ``wd``; ``y`` its ``m`` output planes of ``oh`` x ``ow``,
of which output rows ``[r0, r1)`` are written: ``y[f, r, j]`` = clamp(``b[f]`` + the sum
over channels and taps of ``w`` times ``x[ci, 2r - pt + i, 2j - pl + k]``, taps outside
the plane read as 0) to ``[lohi[0], lohi[1]]`` (NaN kept: -inf and inf for none, 0 and
inf for ReLU), then where ``lohi[2]`` is not 0 HardSwish's ``v * clip(v / 6 + 0.5, 0,
1)`` (MobileNetV3's stem: a pass over the rows saved). ``w`` is ``pack(weights, n)``'s,
``b`` ``pack_bias``'s (filters in groups of ``n``, zeros past ``m``). Returns 0.

Why: these convs have K = 27 products per output, too few for a packed product's
tile to pay its loads and stores, so they went through im2col (27 rows as long as the
output) and the packed gemm: ~75 µs of one thread's copies and ~6 µs a filter for a
224x224 image. Here each vector of ``n`` outputs of a row keeps ``n`` filters'
accumulators in registers; every tap is two loads of the input row and a shuffle of their
even lanes (stride 2 without a strided read or a copy), then one fused multiply-add a
filter with the weight broadcast from memory. Rows and columns outside the plane are
masked loads reading 0, in blocks that need them; the rest take plain loads.

``kernel()`` is the numba ExternalFunction (pointers as integers), None where there is no
llvmlite JIT, no AVX2, ``$TFRT_PY_ISA=portable`` or the packed kernels are switched off.
Vectors of 16 outputs with AVX-512F (``$TFRT_PY_ISA`` permitting), 8 with AVX2. Built
once per process under a lock (its machine code cached as the packed gemms'); stateless;
any thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...concurrency import compiled_gate
from ...concurrency.env_switch import switched_off
from ...concurrency.once import Once
from .gemm_packed import ENV_PACKED_GEMM, carried_loop, counted_loop, splat, wide_vectors
from .ir_kernels import FloatVectors, build_module
from .pool_ir import lanes, register_lanes

__all__ = ["MAX_CHANNELS", "SYMBOL", "build", "describe", "kernel", "pack", "pack_bias",
           "takes"]  # fmt: skip

SYMBOL = "tfrt_py_stem_f32"
#: The window: 3x3 at stride 2 both ways. (A 7x7 build ran ResNet's stem at 2.2 ms on one
#: thread against the packed route's 1.8: 147 taps of one product a filter each keep the
#: loads' share; not built.)
KH = KW = 3
#: Convs with more input channels keep the packed routes (their products are long enough).
MAX_CHANNELS = 4


def takes(kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...],
          pads_begin: tuple[int, ...]) -> bool:  # fmt: skip
    """Whether the window is the kernel's (3x3, stride 2, undilated) with leading pads
    within it."""
    return (tuple(kernel) == (KH, KW) and tuple(strides) == (2, 2)
            and tuple(dilations) == (1, 1) and 0 <= pads_begin[0] < KH
            and 0 <= pads_begin[1] < KW)  # fmt: skip


def pack(w: np.ndarray, n: int) -> np.ndarray:
    """(m, c, kh, kw) float weights as the kernel for vectors of ``n`` reads them: groups
    of ``n`` filters, each ``[c][kh][kw][n]`` (zeros past ``m``), float32, flat."""
    m = w.shape[0]
    groups = -(-m // n)
    wp = np.zeros((groups * n, *w.shape[1:]), np.float32)
    wp[:m] = w
    return np.ascontiguousarray(wp.reshape(groups, n, -1).transpose(0, 2, 1)).reshape(-1)


def pack_bias(b: np.ndarray | None, m: int, n: int) -> np.ndarray:
    """The bias (or zeros) padded to the kernel's groups of ``n`` filters, float32."""
    bp = np.zeros(-(-m // n) * n, np.float32)
    if b is not None:
        bp[:m] = b
    return bp


def build(n: int) -> Any:
    """The engine holding the kernel for vectors of ``n`` outputs (16 or 8): for tests
    and benchmarks of a width apart from the process's. Raises what llvmlite raises."""
    return build_module(lambda: _StemIR(n).text(), f"stem_ir|{n}", __file__)


class _StemIR(FloatVectors):
    """The module: ``SYMBOL`` for vectors of ``n`` float32 outputs and groups of ``n``
    filters."""

    def __init__(self, n: int) -> None:
        super().__init__(n, "tfrt_py_stem")
        self.evens = self.ir.Constant(self.vi, list(range(0, 2 * n, 2)))

    def text(self) -> str:
        fp, i64 = self.f32.as_pointer(), self.i64
        fn = self.ir.Function(self.mod, self.ir.FunctionType(i64, [fp] * 5 + [i64] * 10),
                              name=SYMBOL)  # fmt: skip
        self.function(fn, KH, KW)
        text = str(self.mod)
        return wide_vectors(text, [SYMBOL]) if self.n * 32 > 256 else text

    def splat(self, value: Any) -> Any:
        return splat(self.b, value, self.n)

    def function(self, fn: Any, kh: int, kw: int) -> None:
        ir, n = self.ir, self.n
        for a in fn.args[:5]:
            a.add_attribute("noalias")
        self.b = b = ir.IRBuilder(fn.append_basic_block("entry"))
        c = self.c
        x, w, bias, y, lohi, ch, h, wd, oh, ow, pt, pl, m, r0, r1 = fn.args
        lo, hi = self.splat(b.load(lohi)), self.splat(b.load(b.gep(lohi, [c(1)])))
        hard_swish = b.fcmp_unordered("une", b.load(b.gep(lohi, [c(2)])), ir.Constant(self.f32, 0))
        sixth = ir.Constant(self.vf, [1.0 / 6.0] * n)
        half, one = ir.Constant(self.vf, [0.5] * n), ir.Constant(self.vf, [1.0] * n)
        in_plane, out_plane = b.mul(h, wd), b.mul(oh, ow)
        groups = b.udiv(b.add(m, c(n - 1)), c(n))
        w_group = b.mul(ch, c(kh * kw * n))  # packed weights a group of filters takes
        last = b.sub(h, c(1))
        four = ir.Constant(self.i32, 4)
        ow32 = self.splat(b.trunc(ow, self.i32))

        def row(r: Any) -> None:
            top = b.sub(b.mul(r, c(2)), pt)
            oks, rows_ok, offs = [], ir.Constant(self.i1, 1), []
            for i in range(kh):
                k = b.add(top, c(i))
                ok = b.and_(b.icmp_signed(">=", k, c(0)), b.icmp_signed("<=", k, last))
                oks.append(ok)
                rows_ok = b.and_(rows_ok, ok)
                kc = b.select(b.icmp_signed("<", k, c(0)), c(0), k)  # clamped: a row to point
                kc = b.select(b.icmp_signed(">", kc, last), last, kc)  # at (masked off)
                offs.append(b.mul(kc, wd))
            y_row = b.mul(r, ow)

            def group(g: Any) -> None:
                wg = b.gep(w, [b.mul(g, w_group)])
                bg = b.gep(bias, [b.mul(g, c(n))])
                gm = b.sub(m, b.mul(g, c(n)))  # filters of this group (n or fewer)
                yg = b.gep(y, [b.add(b.mul(b.mul(g, c(n)), out_plane), y_row)])

                def block(j0: Any) -> None:
                    s0 = b.sub(b.mul(j0, c(2)), pl)
                    end = b.add(s0, c(kw - 1 + 2 * n))  # past the last column a tap loads
                    fits = b.and_(b.icmp_signed(">=", s0, c(0)), b.icmp_signed("<=", end, wd))
                    fits = b.and_(fits, b.icmp_signed("<=", b.add(j0, c(n)), ow))
                    fits = b.and_(fits, rows_ok)
                    fast, slow, join = (b.function.append_basic_block() for _ in range(3))
                    b.cbranch(fits, fast, slow)
                    got = []
                    for blk, masked in ((fast, False), (slow, True)):
                        b.position_at_end(blk)
                        geo = (ch, in_plane, offs, oks, s0, wd, kh, kw)
                        got.append((self.accumulate(x, wg, bg, geo, masked), b.block))
                        b.branch(join)
                    b.position_at_end(join)
                    accs = []
                    for k in range(n):  # every phi first: the stores below split the block
                        v = b.phi(self.vf)
                        for vs, blk in got:
                            v.add_incoming(vs[k], blk)
                        accs.append(v)
                    lane = b.add(self.splat(b.trunc(j0, self.i32)), self.iota)
                    keep = b.icmp_signed("<", lane, ow32)

                    # plain stores where the block's vector lies inside the row: AVX2's
                    # masked store (``vmaskmovps``) costs ~4 ns on Zen 3
                    whole = b.icmp_signed("<=", b.add(j0, c(n)), ow)

                    def stores(hs: bool, plain: bool) -> None:  # the epilogue
                        for k, v in enumerate(accs):
                            v = b.select(b.fcmp_ordered("<", v, lo), lo, v)
                            v = b.select(b.fcmp_ordered(">", v, hi), hi, v)
                            if hs:  # v clip(v / 6 + 0.5, 0, 1)
                                t = b.fadd(b.fmul(v, sixth), half)
                                t = b.select(b.fcmp_ordered("<", t, self.zero), self.zero, t)
                                t = b.select(b.fcmp_ordered(">", t, one), one, t)
                                v = b.fmul(v, t)
                            with b.if_then(b.icmp_signed("<", c(k), gm)):
                                at = b.gep(yg, [b.add(b.mul(c(k), out_plane), j0)])
                                ptr = b.bitcast(at, self.vf.as_pointer())
                                if plain:
                                    b.store(v, ptr, align=4)
                                else:
                                    b.call(self.mstore, [v, ptr, four, keep])

                    with b.if_else(hard_swish) as (then, otherwise):
                        for hs, arm in ((True, then), (False, otherwise)):
                            with arm, b.if_else(whole) as (plain, part):
                                with plain:
                                    stores(hs, True)
                                with part:
                                    stores(hs, False)

                counted_loop(b, c(0), ow, n, block, whole=False)

            counted_loop(b, c(0), groups, 1, group, whole=False)

        counted_loop(b, r0, r1, 1, row, whole=False)
        b.ret(c(0))

    def accumulate(self, x: Any, wg: Any, bg: Any, geo: tuple[Any, ...], masked: bool) -> list[Any]:
        """The ``n`` filters' accumulators of one output block: the bias, then every
        channel's taps (a channel loop carrying them); ``masked``: loads masked to the
        row's columns and to the rows inside the plane (``geo``'s ``oks``)."""
        b, ir, n, c = self.b, self.ir, self.n, self.c
        ch, in_plane, offs, oks, s0, wd, kh, kw = geo
        vp = self.vf.as_pointer()
        four = ir.Constant(self.i32, 4)
        init = [self.splat(b.load(b.gep(bg, [c(k)]))) for k in range(n)]
        wd32 = self.splat(b.trunc(wd, self.i32))
        zero_i = ir.Constant(self.vi, [0] * n)

        def inside(at: Any, ok: Any) -> Any:  # lanes of a load from column ``at`` in the row
            lane = b.add(self.splat(b.trunc(at, self.i32)), self.iota)
            m = b.and_(b.icmp_signed(">=", lane, zero_i), b.icmp_signed("<", lane, wd32))
            return b.and_(m, self.splat(ok))

        def channel(ci: Any, accs: list[Any]) -> list[Any]:
            xc = b.gep(x, [b.mul(ci, in_plane)])
            wc = b.gep(wg, [b.mul(ci, c(kh * kw * n))])
            accs = list(accs)
            for i in range(kh):
                rp = b.gep(xc, [offs[i]])
                for j in range(kw):
                    halves = []  # the tap's 2n columns; its n outputs read the even ones
                    for half in range(2):
                        col = b.add(s0, c(j + half * n))
                        p = b.bitcast(b.gep(rp, [col]), vp)
                        if masked:
                            mask = inside(col, oks[i])
                            halves.append(b.call(self.mload, [p, four, mask, self.zero]))
                        else:
                            halves.append(b.load(p, align=4))
                    tap = b.shuffle_vector(halves[0], halves[1], self.evens)
                    for k in range(n):
                        wv = self.splat(b.load(b.gep(wc, [c((i * kw + j) * n + k)])))
                        accs[k] = b.call(self.fma, [wv, tap, accs[k]])
            return accs

        return carried_loop(b, c(0), ch, 1, init, channel)


def _signatures(t: Any) -> list[tuple[str, Any]]:
    p, i = t.uintp, t.int64
    return [(SYMBOL, t.int64(p, p, p, p, p, *[i] * 10))]


#: (why, (stem,) ExternalFunctions or None, engine or None), decided on first use
_DECIDED: Once[tuple[str, Any, Any]] = Once(lambda: register_lanes(build, _signatures, "float32"))


def kernel() -> Any:
    """The stem kernel's ExternalFunction (module docstring), None where it is off."""
    if switched_off(ENV_PACKED_GEMM) or compiled_gate.held():
        return None
    fns = _DECIDED.get()[1]
    return None if fns is None else fns[0]


def host_width() -> int:
    """The outputs (and filters) a vector of this process's kernel holds; 0 without one."""
    return lanes()


def describe() -> str:
    """How the kernel was decided ("" before it was)."""
    got = _DECIDED.peek()
    return got[0] if got else ""
