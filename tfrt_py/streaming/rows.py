"""Row-read weights: a streamed table read only by ``Gather`` along its first axis.

A decoder's token embedding (``vocab x hidden``: a sixth of GPT-2-small's weights) is read
by one Gather per step, which needs as many rows as the step has tokens. Streaming it
whole into the arena every step would read megabytes for a few kilobytes. So a streamed
weight whose every reader is a top-level ``Gather`` with the weight as its data and
``axis`` 0 (``row_read_weights``) never enters the arena: its Gather runs as a stage of its
own (``Stage.gather``), and ``read_rows`` reads the rows its indices name from the weight
file, on the computing thread, when that stage computes.

Reads: the distinct rows, sorted, merged into spans where the gap between two needed rows
is at most ``GAP_BYTES`` (one read instead of a seek each), each span read in pieces of at
most ``CHUNK`` bytes into a scratch buffer; so a prompt that names most of the table reads
it sequentially, and memory beyond the result stays under ``CHUNK``. The file is opened
with ``external.open_external`` (the load's checks again) and its pages are dropped from
the page cache after each piece, as the transfer kernel does. An index outside
``[-rows, rows)`` is an ExecutionError naming the Gather, as the Gather kernel's.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ExecutionError
from ..frontends.onnx.external import open_external
from ..frontends.onnx.external_ref import ExternalRef
from ..ir import Graph, Node, Value
from ..records import record

__all__ = [
    "MIN_ROW_READ_BYTES",
    "RowGather",
    "pread_full",
    "read_rows",
    "row_read_weights",
]

#: Smaller tables stream into the arena as any weight (a stage of their own costs more).
MIN_ROW_READ_BYTES = 1 << 20
#: Needed rows closer than this many bytes apart are read in one span.
GAP_BYTES = 256 << 10
#: The most bytes a span reads at once (the scratch buffer's size at most).
CHUNK = 8 << 20

_DONTNEED: int | None = getattr(os, "POSIX_FADV_DONTNEED", None)


@record(frozen=True)
class RowGather:
    """One Gather that reads rows of a row-read weight: the node, the weight's file
    reference, its indices (a value of an earlier stage or a feed) and its output."""

    node: Node
    ref: ExternalRef
    indices: Value
    output: Value


def row_read_weights(
    graph: Graph, refs: dict[int, ExternalRef], captured: set[int]
) -> dict[int, ExternalRef]:
    """The streamed weights (ids in ``refs``) of at least ``MIN_ROW_READ_BYTES`` whose
    readers are all top-level Gathers of rows (the weight as input 0, axis 0), which are
    neither graph outputs nor in ``captured`` (read by a nested graph)."""
    readers: dict[int, list[tuple[Node, int]]] = {}
    for node in graph.nodes:
        for slot, v in enumerate(node.inputs):
            if v is not None and id(v) in refs:
                readers.setdefault(id(v), []).append((node, slot))
    outputs = {id(v) for v in graph.outputs}
    out: dict[int, ExternalRef] = {}
    for i, uses in readers.items():
        ref = refs[i]
        if ref.nbytes < MIN_ROW_READ_BYTES or i in outputs or i in captured:
            continue
        if len(ref.shape) >= 1 and ref.shape[0] > 0 and all(_gathers_rows(n, s) for n, s in uses):
            out[i] = ref
    return out


def _gathers_rows(node: Node, slot: int) -> bool:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or slot != 0:
        return False
    axis = node.attrs.get("axis", 0)
    return isinstance(axis, int) and axis == 0 and len(node.inputs) == 2


def read_rows(g: RowGather, indices: np.ndarray, drop_cache: bool) -> tuple[np.ndarray, int]:
    """``Gather(weight, indices, axis=0)`` from the weight file: (the result, bytes read).
    Runs on the computing thread; opens and closes the file itself."""
    ref, node = g.ref, g.node
    try:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got {idx.dtype}")
        n = ref.shape[0]
        flat = idx.reshape(-1).astype(np.int64, copy=False)
        if flat.size and (int(flat.min()) < -n or int(flat.max()) >= n):
            bad = flat[(flat < -n) | (flat >= n)][0]
            raise IndexError(f"index {int(bad)} is out of bounds for axis 0 with size {n}")
        flat = np.where(flat < 0, flat + n, flat)
        uniq, inverse = np.unique(flat, return_inverse=True)
        row = ref.nbytes // n
        rows = np.empty((len(uniq), row), np.uint8)
        got = _read_spans(ref, uniq, row, rows, drop_cache) if len(uniq) else 0
    except Exception as e:  # reported as the Gather's failure
        raise ExecutionError(node.name, node.op_type, e) from e
    out = rows[inverse.reshape(-1)].view(ref.dtype)
    return out.reshape(idx.shape + tuple(ref.shape[1:])), got


def _read_spans(
    ref: ExternalRef, uniq: np.ndarray, row: int, rows: np.ndarray, drop_cache: bool
) -> int:
    """Read rows ``uniq`` (sorted, distinct) into ``rows``; the bytes read."""
    gap = max(1, GAP_BYTES // max(row, 1))
    breaks = np.flatnonzero(np.diff(uniq) > gap) + 1
    per_chunk = max(1, CHUNK // max(row, 1))
    scratch = np.empty(min(per_chunk, int(uniq[-1] - uniq[0]) + 1) * row, np.uint8)
    fd, _ = open_external(ref.base_dir, ref.location, ref.name)
    total = 0
    try:
        for part in np.split(np.arange(len(uniq)), breaks):
            first, last = int(uniq[part[0]]), int(uniq[part[-1]])
            for lo in range(first, last + 1, per_chunk):
                hi = min(lo + per_chunk, last + 1)
                buf = scratch[: (hi - lo) * row]
                pread_full(fd, buf.data, ref.offset + lo * row, ref.name)
                if drop_cache and _DONTNEED is not None:
                    os.posix_fadvise(fd, ref.offset + lo * row, len(buf), _DONTNEED)
                total += len(buf)
                sel = part[(uniq[part] >= lo) & (uniq[part] < hi)]
                rows[sel] = buf.reshape(hi - lo, row)[uniq[sel] - lo]
    finally:
        os.close(fd)
    return total


def pread_full(fd: int, dst: memoryview, offset: int, name: str) -> None:
    """Read exactly ``len(dst)`` bytes at ``offset`` (short reads retried)."""
    pos, n = 0, len(dst)
    while pos < n:
        got = os.preadv(fd, [dst[pos:]], offset + pos)
        if got <= 0:
            raise OSError(
                f"tensor {name!r}: weight file ended after {pos} of {n} bytes at offset "
                f"{offset} (was it truncated after load?)"
            )
        pos += got
