"""Lowerings of the categorical encoders: ``ai.onnx.ml::OneHotEncoder`` on integer
categories, ``LabelEncoder`` (opset 2 and later) from numbers to numbers, and
``tfrt_py.fused::StringIds`` (``compiler/encode_strings.py``), which needs no code: it
reads a string input the entry has already mapped to ids (``graph.encoded_inputs``), so
its output is that input's memory.

OneHotEncoder: per element, a 1 in the column of the category equal to it (compared as
int64, as the kernel does) and 0 elsewhere; an element equal to no category gives a row
of zeros, or with ``zeros=0`` raises in the generated code (a fixed message), and the
tier then runs the interpreter, which raises the kernel's error. Integer inputs only
(a float's cast to int64 is the kernel's to make); categories without repeats (the
kernel's lookup keeps the last of equal keys).

LabelEncoder: the kernel's own table (``kernels.ml.encode.label_lookup``: keys sorted
without repeats, the last of equal keys winning), a binary search per element over the
input cast to the keys' type (integer inputs for integer keys, floats for float keys:
another cast is the kernel's), NaN mapped as a NaN key says, else the default.

Load time; pure functions of the node and the context.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from ...ir import Node
from ...kernels.base import KernelContext
from ...kernels.fused.domain import DOMAIN
from ...kernels.ml.common import attr_ints, attr_strings
from ...kernels.ml.encode import label_lookup
from . import rows
from .emit import copy_strided, tname
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


def _label_encoder(cx: Any, node: Node) -> list[str]:
    ctx = KernelContext(node)
    if ctx.opset < 2:
        _no(cx, "LabelEncoder-1 (string classes)")
    look = label_lookup(ctx)
    if look.str_keys or look.out_dtype.kind not in "iuf":
        _no(cx, "LabelEncoder with string keys or values")
    x = cx.ref(node.inputs[0])
    y = cx.out(node.outputs[0])
    kd = look.key_dtype
    if x.dtype.kind not in "iuf" or (kd.kind in "iu") != (x.dtype.kind in "iu"):
        _no(cx, f"LabelEncoder of {x.dtype} by {kd} keys")  # the kernel's cast is its own
    if y.dtype != look.out_dtype or y.size != x.size:
        _no(cx, "LabelEncoder output")
    n, g, kt = len(look.keys), cx.tag, tname(kd)
    keys = cx.const_slice(look.keys) if n else "0"
    vals = cx.const_slice(look.values) if n else "0"
    default = literal(np.asarray(look.default).item())
    nan = None if look.nan_value is None else literal(np.asarray(look.nan_value).item())
    yt = tname(y.dtype)
    lines = [
        f"for {g}i in range({literal(x.size)}):",
        f"    {g}v = {kt}({x.buf}[{x.off} + {g}i])",
        f"    {g}r = {yt}({default})",
    ]
    if nan is not None:
        lines += [f"    if {g}v != {g}v:", f"        {g}r = {yt}({nan})"]
    if n:  # the first key not below v (binary search over the sorted keys)
        lines += [
            f"    {g}lo = 0",
            f"    {g}hi = {literal(n)}",
            f"    while {g}lo < {g}hi:",
            f"        {g}mid = ({g}lo + {g}hi) // 2",
            f"        if {keys}[{g}mid] < {g}v:",
            f"            {g}lo = {g}mid + 1",
            "        else:",
            f"            {g}hi = {g}mid",
            f"    if {g}lo < {literal(n)} and {keys}[{g}lo] == {g}v:",
            f"        {g}r = {vals}[{g}lo]",
        ]
    lines.append(f"    {y.buf}[{y.off} + {g}i] = {g}r")
    return lines


def register_lowerings(reg: Registry) -> None:
    """StringIds, OneHotEncoder and LabelEncoder, each row by itself."""
    reg.add(DOMAIN, "StringIds", _string_ids, rows=rows.any_rows, weight=0)
    reg.add(_ML, "OneHotEncoder", _one_hot_encoder, rows=rows.only_first)
    reg.add(_ML, "LabelEncoder", _label_encoder, rows=rows.any_rows)
