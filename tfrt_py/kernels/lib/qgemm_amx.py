"""The integer products on AMX tiles (Intel AMX-INT8: Sapphire Rapids and later), for
weights packed for the ``vnni512`` path (issue 36).

``symbol(form)`` is ``qgemm_packed``'s build of ``form``, argument for argument and bit for
bit: ``int32`` (``qgemm_packed.SYMBOL``: the sums, whole panels), ``requant``
(``SYMBOL_REQUANT``: QLinearConv's and QLinearMatMul's bytes) and ``scaled``
(``SYMBOL_SCALED``: MatMulIntegerToFloat's floats). ``tdpbusd`` multiplies a 16-row tile of
A's codes (64 a row) by a tile of 16 groups of 4 codes of 16 columns -- which is what a
``vnni512`` panel holds in each half of its 128-byte rows, so the packed weights are read
in place -- into 16 x 16 int32 sums: 1,024 products a cycle, four times a core's two
``vpdpbusd`` units. Blocks of 32 rows (then one of 16) by a panel (32 columns) keep four
(two) such sums in tiles over k; the ``int32`` build stores them to the output, the others
to a 4 KB scratch on the stack, from which the vector build's epilogue makes the bytes or
floats (the same steps, so the same bits). The rows past the last block of 16, and every
product whose k groups are not a multiple of 16 (the tiles' depth), go to the vector build
(called by name).

``qgemm_packed`` builds the process's integer kernels once (under its ``Once``) and calls
``install``, which builds these (machine code kept in the private cache) where the host's
LLVM reports ``amx-int8`` and ``amx-tile``, the path is ``vnni512``, Linux grants the
process the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; children
inherit it) and ``$TFRT_PY_AMX`` is not ``0``; the symbols numba code calls are then these
builds, else the vector ones. ``available()``/``why()`` say which. The kernels are
stateless and safe from any thread (each thread's tile state is its own; a function
configures the tiles it uses and releases them before it returns).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from functools import partial
from typing import Any

from ...concurrency.llvm_jit import add_symbol, compile_ir_cached

__all__ = ["ENV_AMX", "FORMS", "SYMBOL", "address", "available", "install", "symbol", "why"]

SYMBOL = "tfrt_py_qgemm_amx"
#: ``TFRT_PY_AMX=0``: the integer products keep the ``vnni512`` kernel on AMX hosts.
ENV_AMX = "TFRT_PY_AMX"

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


#: The three builds, as ``qgemm_packed``'s: (their arguments after the first nine, the
#: output's element type, whether the epilogue reads the sums from the scratch)
FORMS: dict[str, tuple[str, str]] = {
    "int32": ("", "i32"),
    "requant": ("ptr %bias, ptr %scale, ptr %params, i64 %n", "i8"),
    "scaled": ("ptr %colsum, ptr %wz, ptr %rows, ptr %scale, ptr %bias, ptr %as, i64 %zp, "
               "i64 %n", "float"),
}  # fmt: skip
_HEAD = ("ptr %a, i64 %lda, ptr %w, ptr %y, i64 %ldy, i64 %m, i64 %kg, i64 %panels, "
         "i64 %layout")  # fmt: skip


def symbol(form: str) -> str:
    """The AMX build of ``form``'s symbol."""
    return f"{SYMBOL}_{form}"


def _sums(t: str, halves: int) -> list[str]:
    """Block ``t``'s sums over k: ``halves`` tiles of 16 rows by the panel's two halves."""
    lines = [f"{t}.k.head:", f"  %kc.{t} = phi i64 [0, %{t}.start], [%kc1.{t}, %{t}.k.body]"]
    for r in range(halves):
        for h in range(2):
            lines.append(f"  %c{r}{h}.{t} = phi x86_amx [%zero.{t}, %{t}.start], "
                         f"[%d{r}{h}.{t}, %{t}.k.body]")  # fmt: skip
    lines += [f"  %kmore.{t} = icmp ult i64 %kc.{t}, %kchunks",
              f"  br i1 %kmore.{t}, label %{t}.k.body, label %{t}.k.done",
              f"{t}.k.body:",
              f"  %ko.{t} = shl i64 %kc.{t}, 6",
              f"  %wo.{t} = shl i64 %kc.{t}, 11",
              f"  %wp.{t} = getelementptr i8, ptr %wpanel.{t}, i64 %wo.{t}",
              f"  %wq.{t} = getelementptr i8, ptr %wp.{t}, i64 64"]  # fmt: skip
    for h, at in enumerate(("wp", "wq")):
        lines.append(f"  %b{h}.{t} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, "
                     f"i16 64, ptr %{at}.{t}, i64 128)")  # fmt: skip
    for r in range(halves):
        lines += [f"  %ap{r}.{t} = getelementptr i8, ptr %arow{r}.{t}, i64 %ko.{t}",
                  f"  %a{r}.{t} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                  f"ptr %ap{r}.{t}, i64 %lda)"]  # fmt: skip
        for h in range(2):
            lines.append(f"  %d{r}{h}.{t} = call x86_amx @llvm.x86.tdpbusd.internal(i16 16, "
                         f"i16 64, i16 64, x86_amx %c{r}{h}.{t}, x86_amx %a{r}.{t}, "
                         f"x86_amx %b{h}.{t})")  # fmt: skip
    lines += [f"  %kc1.{t} = add i64 %kc.{t}, 1", f"  br label %{t}.k.head", f"{t}.k.done:"]
    return lines


def _store_tiles(t: str, halves: int, form: str) -> list[str]:
    """The tiles to the scratch (32 int32 a row), or for ``int32`` to the output."""
    lines = []
    for r in range(halves):
        for h in range(2):
            x = f"{r}{h}.{t}"
            if form == "int32":
                lines += [f"  %orow{x} = add i64 %m0.{t}, {16 * r}",
                          f"  %oo{x} = mul i64 %orow{x}, %ldy",
                          f"  %oc{x} = add i64 %pcol.{t}, {16 * h}",
                          f"  %oa{x} = add i64 %oo{x}, %oc{x}",
                          f"  %sp{x} = getelementptr i32, ptr %y, i64 %oa{x}",
                          f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, "
                          f"ptr %sp{x}, i64 %ldy4, x86_amx %c{x})"]  # fmt: skip
            else:
                lines += [f"  %sp{x} = getelementptr i8, ptr %scratch, i64 "
                          f"{(r * 16 * 32 + h * 16) * 4}",
                          f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, "
                          f"ptr %sp{x}, i64 128, x86_amx %c{x})"]  # fmt: skip
    return lines


def _columns(e: str, col: str, form: str) -> list[str]:
    """The epilogue's per-column vectors of 16 from ``col``."""
    if form == "requant":
        return [f"  %bp.{e} = getelementptr i32, ptr %bias, i64 {col}",
                f"  %bv.{e} = load <16 x i32>, ptr %bp.{e}, align 4",
                f"  %scp.{e} = getelementptr float, ptr %scale, i64 {col}",
                f"  %sc.{e} = load <16 x float>, ptr %scp.{e}, align 4"]  # fmt: skip
    return [f"  %csp.{e} = getelementptr i32, ptr %colsum, i64 {col}",
            f"  %cs.{e} = load <16 x i32>, ptr %csp.{e}, align 4",
            f"  %corr.{e} = mul <16 x i32> %cs.{e}, %azp",
            f"  %wzp.{e} = getelementptr i32, ptr %wz, i64 {col}",
            f"  %wzv.{e} = load <16 x i32>, ptr %wzp.{e}, align 4",
            f"  %scp.{e} = getelementptr float, ptr %scale, i64 {col}",
            f"  %scv.{e} = load <16 x float>, ptr %scp.{e}, align 4",
            f"  %sc.{e} = fmul <16 x float> %scv.{e}, %ascale",
            f"  %bp.{e} = getelementptr float, ptr %bias, i64 {col}",
            f"  %bv.{e} = load <16 x float>, ptr %bp.{e}, align 4"]  # fmt: skip


def _row(e: str, form: str) -> list[str]:
    """One row's vector of sums ``%acc.<e>`` (row ``%row.<e>``) made into the output at
    ``%yo2.<e>`` (elements), as the vector build's store makes it."""
    if form == "requant":  # (acc + bias) * scale, clamped, rounded half to even, + zp
        return [f"  %v.{e} = add <16 x i32> %acc.{e}, %bv.{e}",
                f"  %f0.{e} = sitofp <16 x i32> %v.{e} to <16 x float>",
                f"  %f1.{e} = fmul <16 x float> %f0.{e}, %sc.{e}",
                f"  %lt.{e} = fcmp olt <16 x float> %f1.{e}, %lo",
                f"  %f2.{e} = select <16 x i1> %lt.{e}, <16 x float> %lo, <16 x float> %f1.{e}",
                f"  %gt.{e} = fcmp ogt <16 x float> %f2.{e}, %hi",
                f"  %f3.{e} = select <16 x i1> %gt.{e}, <16 x float> %hi, <16 x float> %f2.{e}",
                f"  %f4.{e} = fadd <16 x float> %f3.{e}, %magic",
                f"  %f5.{e} = fsub <16 x float> %f4.{e}, %magic",
                f"  %f.{e} = fadd <16 x float> %f5.{e}, %qzp",
                f"  %qi.{e} = fptosi <16 x float> %f.{e} to <16 x i32>",
                f"  %q.{e} = trunc <16 x i32> %qi.{e} to <16 x i8>",
                f"  %yp.{e} = getelementptr i8, ptr %y, i64 %yo2.{e}",
                f"  store <16 x i8> %q.{e}, ptr %yp.{e}, align 1"]  # fmt: skip
    return [f"  %rtp.{e} = getelementptr i32, ptr %rows, i64 %row.{e}",
            f"  %rt.{e} = load i32, ptr %rtp.{e}, align 4",
            f"  %rti.{e} = insertelement <16 x i32> poison, i32 %rt.{e}, i32 0",
            f"  %rtv.{e} = shufflevector <16 x i32> %rti.{e}, <16 x i32> poison, "
            f"<16 x i32> zeroinitializer",
            f"  %v1.{e} = sub <16 x i32> %acc.{e}, %corr.{e}",
            f"  %wt.{e} = mul <16 x i32> %wzv.{e}, %rtv.{e}",
            f"  %v.{e} = sub <16 x i32> %v1.{e}, %wt.{e}",
            f"  %f0.{e} = sitofp <16 x i32> %v.{e} to <16 x float>",
            f"  %f1.{e} = fmul <16 x float> %f0.{e}, %sc.{e}",
            f"  %f.{e} = fadd <16 x float> %f1.{e}, %bv.{e}",
            f"  %yp.{e} = getelementptr float, ptr %y, i64 %yo2.{e}",
            f"  store <16 x float> %f.{e}, ptr %yp.{e}, align 4"]  # fmt: skip


def _epilogue(t: str, rows: int, form: str) -> list[str]:
    """Per half of the panel (16 columns) whose first column is before ``n``: each of the
    block's rows from the scratch into the output."""
    lines = []
    for h in range(2):
        e = f"{t}.e{h}"
        if form == "int32":  # stored by the tiles
            lines += [f"  br label %{e}.done", f"{e}.done:"]
            continue
        lines += [f"  %col{h}.{t} = add i64 %pcol.{t}, {16 * h}",
                  f"  %use{h}.{t} = icmp slt i64 %col{h}.{t}, %n",
                  f"  br i1 %use{h}.{t}, label %{e}.pre, label %{e}.done",
                  f"{e}.pre:",
                  *_columns(e, f"%col{h}.{t}", form),
                  f"  br label %{e}.head",
                  f"{e}.head:",
                  f"  %r.{e} = phi i64 [0, %{e}.pre], [%r1.{e}, %{e}.body]",
                  f"  %rm.{e} = icmp ult i64 %r.{e}, {rows}",
                  f"  br i1 %rm.{e}, label %{e}.body, label %{e}.done",
                  f"{e}.body:",
                  f"  %so.{e} = mul i64 %r.{e}, 32",
                  f"  %so2.{e} = add i64 %so.{e}, {16 * h}",
                  f"  %accp.{e} = getelementptr i32, ptr %scratch, i64 %so2.{e}",
                  f"  %acc.{e} = load <16 x i32>, ptr %accp.{e}, align 64",
                  f"  %row.{e} = add i64 %m0.{t}, %r.{e}",
                  f"  %yo.{e} = mul i64 %row.{e}, %ldy",
                  f"  %yo2.{e} = add i64 %yo.{e}, %col{h}.{t}",
                  *_row(e, form),
                  f"  %r1.{e} = add i64 %r.{e}, 1",
                  f"  br label %{e}.head",
                  f"{e}.done:"]  # fmt: skip
    return lines


def _loop(tag: str, rows: int, first: str, past: str, after: str, form: str) -> str:
    """Row blocks of ``rows`` from ``first`` while ``+ rows <= past``, each over every
    panel; then ``br label %after``."""
    t = tag
    head = [
        f"  br label %{t}.rb.head",
        f"{t}.rb.head:",
        f"  %m0.{t} = phi i64 [{first}, %{t}.enter], [%m1.{t}, %{t}.p.done]",
        f"  %mend.{t} = add i64 %m0.{t}, {rows}",
        f"  %rbm.{t} = icmp ule i64 %mend.{t}, {past}",
        f"  br i1 %rbm.{t}, label %{t}.rb.body, label %{after}",
        f"{t}.rb.body:",
    ]
    for r in range(rows // 16):
        head += [f"  %ar{r}.{t} = add i64 %m0.{t}, {16 * r}",
                 f"  %aro{r}.{t} = mul i64 %ar{r}.{t}, %lda",
                 f"  %arow{r}.{t} = getelementptr i8, ptr %a, i64 %aro{r}.{t}"]  # fmt: skip
    head += [
        f"  br label %{t}.p.head",
        f"{t}.p.head:",
        f"  %p.{t} = phi i64 [0, %{t}.rb.body], [%p1.{t}, %{t}.e1.done]",
        f"  %pm.{t} = icmp ult i64 %p.{t}, %panels",
        f"  br i1 %pm.{t}, label %{t}.start, label %{t}.p.done",
        f"{t}.start:",
        f"  %pcol.{t} = shl i64 %p.{t}, 5",
        f"  %wpo.{t} = mul i64 %p.{t}, %panel_bytes",
        f"  %wpanel.{t} = getelementptr i8, ptr %w, i64 %wpo.{t}",
        f"  %zero.{t} = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)",
        f"  br label %{t}.k.head",
    ]
    tail = [f"  %p1.{t} = add i64 %p.{t}, 1", f"  br label %{t}.p.head",
            f"{t}.p.done:", f"  %m1.{t} = add i64 %m0.{t}, {rows}",
            f"  br label %{t}.rb.head"]  # fmt: skip
    body = [*_sums(t, rows // 16), *_store_tiles(t, rows // 16, form),
            *_epilogue(t, rows, form)]  # fmt: skip
    return "\n".join([*head, *body, *tail])


def _splats(form: str) -> str:
    """The epilogue's values splat once: A's scale and zero point (``scaled``), or the
    clamp's limits, the rounding constant and the output's zero point (``requant``)."""

    def splat(name: str, ty: str, value: str) -> list[str]:
        return [f"  %{name}.i = insertelement <16 x {ty}> poison, {ty} {value}, i32 0",
                f"  %{name} = shufflevector <16 x {ty}> %{name}.i, <16 x {ty}> poison, "
                f"<16 x i32> zeroinitializer"]  # fmt: skip

    if form == "scaled":
        lines = ["  %asv = load float, ptr %as, align 4", "  %zp32 = trunc i64 %zp to i32",
                 *splat("ascale", "float", "%asv"), *splat("azp", "i32", "%zp32")]  # fmt: skip
    elif form == "requant":
        lines = []
        for i, name in enumerate(("lo", "hi", "qzp")):
            lines += [f"  %{name}.p = getelementptr float, ptr %params, i64 {i}",
                      f"  %{name}.v = load float, ptr %{name}.p, align 4",
                      *splat(name, "float", f"%{name}.v")]  # fmt: skip
        lines += splat("magic", "float", "12582912.0")
    else:
        lines = ["  %ldy4 = shl i64 %ldy, 2"]
    return "\n".join(lines)


def _ir(layout: int, vectors: str, form: str) -> str:
    """``symbol(form)``: the AMX build of ``form``, calling ``vectors`` (that form's vector
    build, registered) for what tiles do not cover."""
    extra, out = FORMS[form]
    args = f"{_HEAD}, {extra}" if extra else _HEAD
    types = ", ".join(a.split()[0] for a in args.split(", "))
    rest = args.replace("ptr %a,", "ptr %a2,").replace("ptr %y,", "ptr %y2,")
    rest = rest.replace("i64 %m,", "i64 %left,").replace("ptr %rows,", "ptr %r2,")
    return f"""
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbusd.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare i64 @{vectors}({types})

define i64 @{symbol(form)}({args}) {{
entry:
  %scratch = alloca [1024 x i32], align 64
  %badl = icmp ne i64 %layout, {layout}
  br i1 %badl, label %wrong, label %checked
wrong:
  ret i64 1
checked:
  %kt = and i64 %kg, 15
  %ragged = icmp ne i64 %kt, 0
  br i1 %ragged, label %whole_vnni, label %tiles
whole_vnni:
  %rv = tail call i64 @{vectors}({args})
  ret i64 %rv
tiles:
  %kchunks = lshr i64 %kg, 4
  %panel_bytes = shl i64 %kg, 7
{_splats(form)}
  %m32 = and i64 %m, -32
  %m16 = and i64 %m, -16
  br label %b32.enter
b32.enter:
{_loop("b32", 32, "0", "%m32", "b16.enter", form)}
b16.enter:
{_loop("b16", 16, "%m32", "%m16", "rest", form)}
rest:
  %left = sub i64 %m, %m16
  %some = icmp ne i64 %left, 0
  br i1 %some, label %tail, label %done
tail:
  %ao = mul i64 %m16, %lda
  %a2 = getelementptr i8, ptr %a, i64 %ao
  %yo = mul i64 %m16, %ldy
  %y2 = getelementptr {out}, ptr %y, i64 %yo
  {"%r2 = getelementptr i32, ptr %rows, i64 %m16" if form == "scaled" else ""}
  %rs = call i64 @{vectors}({rest})
  ret i64 %rs
done:
  ret i64 0
}}
"""


_STATE: dict[str, Any] = {}  # "why" once decided; "engine", "address" when built


def why() -> str:
    """Why this process does not use the AMX kernel ("" when it does; "not decided yet"
    before the integer kernel's first build)."""
    return str(_STATE.get("why", "not decided yet"))


def available() -> bool:
    """Whether this process's float-storing integer products run on the AMX kernel."""
    return "address" in _STATE


def address(form: str = "scaled") -> int:
    """The address of ``form``'s AMX build (0 where it is not available)."""
    return int(_STATE.get("address", {}).get(form, 0))


def install(path: str, layout: int, vectors: dict[str, str]) -> dict[str, int]:
    """Build the kernels for the integer path ``path`` if this host and process can run them
    (the module docstring) and register each form's symbol (``symbol(form)``): form ->
    address, or {} (``why()`` says why). ``layout``: the ``vnni512`` packing's code, which
    the kernels check as the vector ones do; ``vectors``: form -> the symbol of that path's
    vector build, registered, which the AMX one calls for what tiles do not cover. Called
    once, by ``qgemm_packed``'s build of the process's kernels."""
    _STATE["why"] = _why_not(path)
    if _STATE["why"]:
        return {}
    got = {}
    for form, vec in vectors.items():
        try:
            key = f"{symbol(form)}|{layout}|{vec}"
            engine, _ = compile_ir_cached(partial(_ir, layout, vec, form), key, (__file__,))
        except Exception as e:  # noqa: BLE001 - no AMX JIT here: the vnni512 kernels serve
            _STATE["why"] = f"the AMX kernel did not build: {type(e).__name__}"
            return {}
        got[form] = int(engine.get_function_address(symbol(form)))
        _STATE.setdefault("engines", []).append(engine)
    for form, addr in got.items():
        add_symbol(symbol(form), addr)
    _STATE["address"] = got
    return got


def _why_not(path: str) -> str:
    if os.environ.get(ENV_AMX, "").strip() == "0":
        return f"${ENV_AMX}=0"
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return "Linux x86-64 only"
    if path != "vnni512":
        return f"the integer path is {path}, not vnni512"
    import llvmlite.binding as llvm

    feats = llvm.get_host_cpu_features()
    if not (feats.get("amx-int8") and feats.get("amx-tile")):
        return "the CPU has no AMX-INT8"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        return f"Linux refused the tile state (errno {ctypes.get_errno()})"
    return ""
