"""Kernels (contrib): onnxruntime's GatherBlockQuantized -- a Gather from block-quantized
data, dequantized (what ``matmul_nbits_quantizer`` writes for an embedding table).

GatherBlockQuantized(data, indices, scales, zero_points?; gather_axis, quantize_axis,
block_size, bits): the slices of ``data`` at ``indices`` along ``gather_axis`` (negative
indices count from the end), each value ``(code - zero_point) * scale`` with the scale and
zero point of its block of ``block_size`` along ``quantize_axis``, in float32, returned in
the scales' type (float32 or float16). ``data`` is either

- uint8 holding ``8 / bits`` codes per byte along its last axis, low bits first (``bits``
  2, 4 or 8), zero points packed the same way and 2**(bits-1) when absent; onnxruntime's
  rules: ``gather_axis`` 0, ``quantize_axis`` the last; or
- int4 / uint4 (``bits`` 4), one code per element (ml_dtypes), any two axes, zero
  points of the same type, 0 when absent.

The same as onnxruntime bit for bit (its products are these float32 ones). The codes are
gathered first and dequantized per call: the packed table is never widened. Load errors
naming the node: ``bits`` or ``block_size`` onnxruntime refuses (a power of two of at
least 16), other data types (its float8 / float4 forms), axes onnxruntime refuses for
uint8, constant scales or zero points whose shapes do not match the data's blocks, zero
points of another type than the data, or a scale that is not finite. An index out of
range is an error of the call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry
from .activation import MS_DOMAIN

__all__ = ["register_kernels"]

_U8 = np.dtype(np.uint8)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_INT4 = ("int4", "uint4")


class _Layout(NamedTuple):
    per: int  # codes per element of data (8 // bits for uint8, else 1)
    gather: int  # the axes, non-negative
    quant: int


def _type_error(data: np.dtype, bits: int) -> str | None:
    """Why onnxruntime refuses data of type ``data`` with ``bits``, or None."""
    if data == _U8:
        return None if bits in (2, 4, 8) else f"bits={bits}: uint8 data holds 2-, 4- or 8-bit codes"
    if data.name in _INT4:
        return None if bits == 4 else f"bits={bits}: {data.name} data holds 4-bit codes"
    return f"data of type {data} is not supported (uint8, int4 or uint4)"


def _layout(data: np.dtype, rank: int, bits: int, gather: int, quant: int) -> _Layout | str:
    """The layout of ``data`` of type ``data`` and rank ``rank``, or why it is refused."""
    bad = _type_error(data, bits)
    if bad:
        return bad
    if not (-rank <= gather < rank and -rank <= quant < rank):
        return f"gather_axis {gather} or quantize_axis {quant} is out of range for rank {rank}"
    g, q = gather % rank, quant % rank
    if data == _U8 and (g != 0 or q != rank - 1 or g == q):
        return f"uint8 data is gathered on axis 0 and quantized on its last (not {g} and {q})"
    return _Layout(8 // bits if data == _U8 else 1, g, q)


def _check_shapes(lay: _Layout, data: tuple[int, ...], block: int, scales: tuple[int, ...],
                  zp: tuple[int, ...] | None) -> str | None:  # fmt: skip
    """Why the scales' or zero points' shape does not fit the data's blocks, or None."""
    want = list(data)
    want[lay.quant] = -(-data[lay.quant] * lay.per // block)
    if tuple(want) != scales:
        return f"scales have shape {scales}, not {tuple(want)} (blocks of {block})"
    if zp is not None:
        want[lay.quant] = -(-want[lay.quant] // lay.per)
        if tuple(want) != zp:
            return f"zero_points have shape {zp}, not {tuple(want)}"
    return None


def _unpack(b: np.ndarray, per: int) -> np.ndarray:
    """The int16 codes of ``b``: ``per`` to a byte along its last axis, low bits first."""
    if per == 1:
        return b.astype(np.int16)
    bits = 8 // per
    shifts = (np.arange(per) * bits).astype(np.uint8)
    codes = (b[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*b.shape[:-1], b.shape[-1] * per).astype(np.int16)


def _gather_block_quantized(ctx: KernelContext) -> ComputeFn:
    bits = int(ctx.attr("bits", 4))
    block = int(ctx.attr("block_size", 128))
    gather_axis = int(ctx.attr("gather_axis", 0))
    quant_axis = int(ctx.attr("quantize_axis", 1))
    if block < 16 or block & (block - 1):
        raise ctx.unsupported(f"block_size={block} must be a power of two of at least 16")
    data0, scales0 = ctx.const_input(0), ctx.const_input(2)
    zp0 = ctx.const_input(3)
    dt0 = data0.dtype if data0 is not None else ctx.input_dtype(0)
    if dt0 is not None and (bad := _type_error(np.dtype(dt0), bits)):
        raise ctx.unsupported(bad)
    sdt = scales0.dtype if scales0 is not None else ctx.input_dtype(2)
    if sdt is not None and np.dtype(sdt) not in _FLOATS:
        raise ctx.unsupported(f"scales of type {sdt}: float32 or float16 are supported")
    zdt = zp0.dtype if zp0 is not None else ctx.input_dtype(3)
    if zdt is not None and dt0 is not None and np.dtype(zdt) != np.dtype(dt0):
        raise ctx.unsupported(f"zero_points are {zdt}, the data {dt0}: they must agree")
    if scales0 is not None and not np.all(np.isfinite(scales0.astype(np.float32))):
        raise ctx.unsupported("a scale is not finite")
    t0 = ctx.input_type(0)
    rank = data0.ndim if data0 is not None else None if t0 is None else t0.rank
    if dt0 is not None and rank is not None:
        lay = _layout(np.dtype(dt0), rank, bits, gather_axis, quant_axis)
        if isinstance(lay, str):
            raise ctx.unsupported(lay)
        if data0 is not None and scales0 is not None and (zp0 is not None or not ctx.has_input(3)):
            zshape = None if zp0 is None else zp0.shape
            if bad := _check_shapes(lay, data0.shape, block, scales0.shape, zshape):
                raise ctx.unsupported(bad)

    def gather_block_quantized(data: np.ndarray, indices: np.ndarray, scales: np.ndarray,
                               zero_points: Any = None) -> np.ndarray:  # fmt: skip
        lay = _layout(data.dtype, data.ndim, bits, gather_axis, quant_axis)
        if isinstance(lay, str):
            raise ValueError(f"GatherBlockQuantized: {lay}")
        if scales.dtype not in _FLOATS:
            raise TypeError(f"GatherBlockQuantized: scales are {scales.dtype}, not float")
        zp = None if zero_points is None else np.asarray(zero_points)
        if zp is not None and zp.dtype != data.dtype:
            raise TypeError(f"GatherBlockQuantized: zero_points are {zp.dtype}, not {data.dtype}")
        bad = _check_shapes(lay, data.shape, block, scales.shape, None if zp is None else zp.shape)
        if bad:
            raise ValueError(f"GatherBlockQuantized: {bad}")
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"GatherBlockQuantized: indices are {idx.dtype}, not integers")
        n = data.shape[lay.gather]
        idx = idx.astype(np.int64)
        if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
            wrong = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
            raise IndexError(f"GatherBlockQuantized: index {wrong} is out of range [{-n}, {n - 1}]")
        idx = np.where(idx < 0, idx + n, idx)
        codes = _unpack(np.take(data, idx, axis=lay.gather), lay.per)
        q = lay.quant if lay.quant < lay.gather else lay.quant + idx.ndim - 1
        length = codes.shape[q]
        at = idx if lay.quant != lay.gather else idx // block
        s = np.take(scales, at, axis=lay.gather).astype(np.float32)
        z: Any = 1 << (bits - 1) if data.dtype == _U8 else 0  # the absent zero point
        if zp is not None:
            z = _unpack(np.take(zp, at, axis=lay.gather), lay.per)
            z = z[..., : s.shape[-1]] if lay.per > 1 else z
        if lay.quant != lay.gather:  # one scale per block: widen along the quantized axis
            keep = np.arange(length)
            s = np.take(np.repeat(s, block, axis=q), keep, axis=q)
            if zp is not None:
                z = np.take(np.repeat(z, block, axis=q), keep, axis=q)
        out = (codes - z).astype(np.float32)
        out *= s
        return out.astype(scales.dtype, copy=False)

    return gather_block_quantized


def register_kernels(registry: KernelRegistry) -> None:
    """Register GatherBlockQuantized."""
    registry.add("GatherBlockQuantized", _gather_block_quantized, domain=MS_DOMAIN, since=1)
