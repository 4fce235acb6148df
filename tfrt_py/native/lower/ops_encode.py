"""Lowerings of the categorical encoders: ``ai.onnx.ml::OneHotEncoder`` on integer
categories, and ``tfrt_py.fused::StringIds`` (``compiler/encode_strings.py``), which
needs no code: it reads a string input the entry has already mapped to ids
(``graph.encoded_inputs``), so its output is that input's memory.

OneHotEncoder: per element, a 1 in the column of the category equal to it (compared as
int64, as the kernel does) and 0 elsewhere; an element equal to no category gives a row
of zeros, or with ``zeros=0`` raises in the generated code (a fixed message), and the
tier then runs the interpreter, which raises the kernel's error. Integer inputs only
(a float's cast to int64 is the kernel's to make); categories without repeats (the
kernel's lookup keeps the last of equal keys).

Load time; pure functions of the node and the context.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from ...ir import Node
from ...kernels.base import KernelContext
from ...kernels.fused.domain import DOMAIN
from ...kernels.ml.common import attr_ints, attr_strings
from . import rows
from .emit import copy_strided
from .loops import strides
from .records import Registry
from .source import literal

__all__ = ["register_lowerings"]

_ML = "ai.onnx.ml"
_F4, _I8 = np.dtype(np.float32), np.dtype(np.int64)
_RAISE = "raise ValueError('OneHotEncoder value not a category')"


def _no(cx: Any, reason: str) -> NoReturn:
    cx.decline(reason)
    raise AssertionError(reason)  # not reached


def _string_ids(cx: Any, node: Node) -> list[str]:
    x = cx.ref(node.inputs[0])
    y = node.outputs[0]
    if x.dtype != _I8 or y is None:
        _no(cx, "StringIds of a value the entry does not encode")
    if id(y) in cx.outputs:
        return copy_strided(cx.out(y), x, strides(x.shape))
    cx.refs[id(y)] = x
    return []


def _one_hot_encoder(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    cats = attr_ints(ctx, "cats_int64s")
    if attr_strings(ctx, "cats_strings") or cats is None or not len(cats):
        _no(cx, "OneHotEncoder on string categories")
    assert cats is not None
    if len(np.unique(cats)) != len(cats):
        _no(cx, "OneHotEncoder with repeated categories")
    x = cx.ref(node.inputs[0])
    y = cx.out(node.outputs[0])
    n = len(cats)
    if x.dtype.kind not in "iu" or y.dtype != _F4 or y.size != x.size * n:
        _no(cx, f"OneHotEncoder of {x.dtype}")
    k = cx.const_slice(cats.astype(np.int64))
    g, strict = cx.tag, int(ctx.attr("zeros", 1)) == 0
    at = f"{y.buf}[{y.off} + {g}i * {literal(n)} + {g}j]"
    lines = [
        f"for {g}i in range({literal(x.size)}):",
        f"    {g}v = np.int64({x.buf}[{x.off} + {g}i])",
        f"    {g}hit = False",
        f"    for {g}j in range({literal(n)}):",
        f"        if {k}[{g}j] == {g}v:",
        f"            {at} = f4(1.0)",
        f"            {g}hit = True",
        "        else:",
        f"            {at} = f4(0.0)",
    ]
    if strict:
        lines += [f"    if not {g}hit:", f"        {_RAISE}"]
    return lines


def register_lowerings(reg: Registry) -> None:
    """StringIds and OneHotEncoder, each row by itself."""
    reg.add(DOMAIN, "StringIds", _string_ids, rows=rows.any_rows, weight=0)
    reg.add(_ML, "OneHotEncoder", _one_hot_encoder, rows=rows.only_first)
