"""Rows mode's three entry functions in a generated module (``rows_functions``), and
the small text helpers ``graph.py`` shares with it. Load time; pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from .context import NodeContext
from .emit import tname
from .source import literal

__all__ = ["NP_TYPES", "ROW_VIEW_MIN", "TILE_ROWS", "row_refs", "rows_functions", "tuple_text"]

#: Rows mode also lowers the graph for this many rows at once when a product there is big
#: enough for BLAS (``emit.BLAS_MIN_MACS``): whole tiles run that body, the rest row by
#: row. 64 rows reach ~95% of a long gemm's rate for the small layers rows mode serves.
TILE_ROWS = 64
#: A batched input or output whose row has fewer elements than this is read and written
#: at an offset (``row_refs``), not through a view made on every row: each view costs
#: its reference count's atomic increment and decrement (a 12-node one-hot/scaler/logistic
#: pipeline with six narrow feeds and outputs, 1,000 rows: 80.6 -> 62.6 µs, Zen 5); a
#: wider row keeps its view, whose indices numba knows are non-negative (no wraparound:
#: LLVM vectorizes the loops over it).
ROW_VIEW_MIN = 16
#: The generated module's dtype aliases -> numba's type names.
NP_TYPES = {"f4": "float32", "f8": "float64", "i8": "int64", "i4": "int32", "b1": "boolean",
            "u1": "uint8", "s1": "int8"}  # fmt: skip


def row_refs(prefix: str, k: int, shape: tuple[int, ...], tile: bool) -> tuple[str, str]:
    """(array, element offset) a row's batched input (``prefix`` "x") or output ("r") ``k``
    of ``shape`` (rows first) is read or written at: the view ``xv<k>`` from offset 0, or,
    for a row of fewer than ``ROW_VIEW_MIN`` elements outside a tile, the flat array at
    ``xo<k>`` (``rows_functions`` binds both per row)."""
    if tile or math.prod(shape[1:]) >= ROW_VIEW_MIN:
        return f"{prefix}v{k}", "0"
    return f"{prefix}{k}", f"{prefix}o{k}"


def rows_functions(cx: NodeContext, sig: list[str], psig: list[str], pargs: list[str],
                    ins: list[str], prologue: list[str], setup: list[str], text: str,
                    specs: list[Any], batched: list[bool], out_specs: list[Any],
                    deco: str, tile_text: str | None) -> list[str]:  # fmt: skip
    """Rows mode: ``rows(x.., r.., P.., lo, hi)`` runs rows ``lo:hi`` of flat feeds and
    outputs: whole tiles of ``TILE_ROWS`` through ``tile_text`` (when given), the rest
    through the one-row body; ``run(a.., P..)`` checks, allocates and runs every row;
    ``run_into(a.., o.., P.., lo, hi)`` fills rows of outputs the caller allocated
    (threads split a batch this way)."""
    n_in, n_out = len(specs), len(out_specs)
    first = batched.index(True)
    flat = [f"types.Array(types.{NP_TYPES[tname(dt)]}, 1, 'C', readonly=True)" for _, dt in specs]
    oflat = [f"types.Array(types.{NP_TYPES[tname(dt)]}, 1, 'C')" for _, dt in out_specs]
    ofull = [f"types.Array(types.{NP_TYPES[tname(dt)]}, {len(shape)}, 'C')"
             for shape, dt in out_specs]  # fmt: skip
    xs = [f"x{k}" for k in range(n_in)]
    rs = [f"r{k}" for k in range(n_out)]
    os_ = [f"o{k}" for k in range(n_out)]
    i64 = ["types.int64", "types.int64"]

    def bind(prefix: str, k: int, shape: tuple[int, ...], rw: str) -> str:
        width = literal(math.prod(shape[1:]))
        if prefix == "x" or rw == "tw":
            buf, off = row_refs(prefix, k, shape, rw == "tw")
        else:  # as the row body wrote it (an output's shape may be known only after it)
            buf, off = cx.out_buf.get(k, (f"rv{k}", "0"))
        if off == "0":
            return f"        {buf} = {prefix}{k}[{rw} * {width}:]"
        return f"        {off} = {rw} * {width}"

    def offsets(rw: str) -> list[str]:
        lines = [bind("x", k, specs[k][0], rw) for k in range(n_in) if batched[k]]
        return lines + [bind("r", k, shape, rw) for k, (shape, _) in enumerate(out_specs)]

    loop = []
    start = "lo"
    if tile_text is not None:
        T = literal(TILE_ROWS)
        loop += [f"    tiled = lo + (hi - lo) // {T} * {T}",
                 f"    for tw in range(lo, tiled, {T}):", *offsets("tw")]  # fmt: skip
        loop += ["    " + ln for ln in tile_text.split("\n")]
        start = "tiled"
    loop += [f"    for rw in range({start}, hi):", *offsets("rw")]
    loop += ["    " + ln for ln in text.split("\n")]
    pre = [f"    nb = a{first}.shape[0]", *prologue]
    alloc = []
    for k, (shape, dt) in enumerate(out_specs):
        dims = ", ".join(["nb", *(literal(d) for d in shape[1:])])
        alloc += [f"    o{k} = np.empty(({dims},), {tname(dt)})",
                  f"    r{k} = o{k}.reshape(nb * {literal(math.prod(shape))})"]  # fmt: skip
    call = f"    rows({', '.join(xs + rs + pargs)}, {{lo}}, {{hi}})"
    return [
        f"SIG_ROWS = {tuple_text(flat + oflat + psig + i64)}",
        f"SIG = {tuple_text(sig + psig)}",
        f"SIG_INTO = {tuple_text(sig + ofull + psig + i64)}",
        "",
        "",
        deco.format(sig="SIG_ROWS"),
        f"def rows({', '.join(xs + rs + pargs)}, lo, hi):",
        *setup,
        *loop,
        "",
        "",
        deco.format(sig="SIG"),
        f"def run({', '.join(ins + pargs)}):",
        *pre,
        *alloc,
        call.format(lo="0", hi="nb"),
        f"    return {', '.join(os_)}",
        "",
        "",
        deco.format(sig="SIG_INTO"),
        f"def run_into({', '.join(ins + os_ + pargs)}, lo, hi):",
        *pre,
        *[f"    r{k} = o{k}.reshape(o{k}.size)" for k in range(n_out)],
        call.format(lo="lo", hi="hi"),
        "",
    ]


def tuple_text(items: list[str]) -> str:
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
