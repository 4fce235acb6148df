"""Rows mode's three entry functions in a generated module (``rows_functions``), and
the small text helpers ``graph.py`` shares with it. Load time; pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from .context import NodeContext
from .emit import tname
from .source import literal

__all__ = ["NP_TYPES", "TILE_ROWS", "rows_functions", "tuple_text"]

#: Rows mode also lowers the graph for this many rows at once when a product there is big
#: enough for BLAS (``emit.BLAS_MIN_MACS``): whole tiles run that body, the rest row by
#: row. 64 rows reach ~95% of a long gemm's rate for the small layers rows mode serves.
TILE_ROWS = 64
#: The generated module's dtype aliases -> numba's type names.
NP_TYPES = {"f4": "float32", "f8": "float64", "i8": "int64", "i4": "int32", "b1": "boolean"}


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

    def offsets(rw: str) -> list[str]:
        lines = [f"        xv{k} = x{k}[{rw} * {literal(math.prod(specs[k][0]))}:]"
                 for k in range(n_in) if batched[k]]  # fmt: skip
        return lines + [f"        rv{k} = r{k}[{rw} * {literal(math.prod(shape))}:]"
                        for k, (shape, _) in enumerate(out_specs)]  # fmt: skip

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
