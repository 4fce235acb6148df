"""Load-time helpers shared by several kernel families.

Attribute and constant-input readers, the dtypes kernels compute in, ``ones_vector``
(a cached constant used per call for BLAS row sums) and ``scratch`` (per-thread buffers
for temporaries that never escape a call). A family's own helpers stay in the
family (``nn/conv_common.py``, ``nn/rnn_common.py``, ``ml/common.py``); what two families
share lives here, so that no family imports another.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from ..ir.dtypes import ElemType
from .base import KernelContext

__all__ = [
    "ShapeMemo",
    "attr_str",
    "compute_dtype",
    "const_ints",
    "float_dtype",
    "in_load_run",
    "input_rank",
    "load_run",
    "ones_vector",
    "scratch",
    "stash_dtype",
    "to_ints",
]


_LOAD_RUN = threading.local()


@contextlib.contextmanager
def load_run() -> Iterator[None]:
    """Marks this thread's kernel calls as a load-time run (the shape probes on zero feeds):
    kernels skip one-time work that real calls size (a Linear's packing of a big weight
    waits for a real product of two rows)."""
    before = getattr(_LOAD_RUN, "on", False)
    _LOAD_RUN.on = True
    try:
        yield
    finally:
        _LOAD_RUN.on = before


def in_load_run() -> bool:
    """Whether this thread is inside ``load_run``."""
    return getattr(_LOAD_RUN, "on", False)


def attr_str(ctx: KernelContext, name: str, default: str) -> str:
    """A string attribute as ``str`` (the frontend may hand over ``bytes``)."""
    v: Any = ctx.attr(name, default)
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8")
    return str(v)


def to_ints(a: Any) -> tuple[int, ...]:
    """An int list/array (any int or float dtype, any rank) as a tuple of Python ints."""
    if isinstance(a, np.ndarray):
        return tuple(int(v) for v in a.reshape(-1).tolist())
    if isinstance(a, (list, tuple)):
        return tuple(int(v) for v in a)
    return (int(a),)


def const_ints(ctx: KernelContext, i: int) -> tuple[int, ...] | None:
    """Input ``i`` as a tuple of ints when it is a load-time constant, else None (also when
    it is omitted)."""
    c = ctx.const_input(i)
    return None if c is None else to_ints(c)


def input_rank(ctx: KernelContext, i: int = 0) -> int | None:
    """The static rank of input ``i`` when known."""
    t = ctx.input_type(i)
    return None if t is None else t.rank


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype to compute in: float16 and the ml_dtypes small floats (bfloat16, float8*,
    NumPy kind 'V') widen to float32, which has BLAS and exact float16 products."""
    if dt == np.float16 or (dt.kind == "V" and dt.itemsize <= 2):
        return np.dtype(np.float32)
    return dt


def float_compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a float-only kernel computes in (attention, recurrent cells): float64
    stays, every other type -- float16, bfloat16, float8, integers -- computes in float32."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def float_dtype(dt: np.dtype) -> np.dtype:
    """``dt`` when it is a float type, else float64 (the type integer math is done in)."""
    return dt if dt.kind == "f" else np.dtype(np.float64)


#: The element types a ``stash_type`` attribute may name; bfloat16 statistics are kept in
#: float32.
_STASH = frozenset({ElemType.FLOAT, ElemType.FLOAT16, ElemType.DOUBLE, ElemType.BFLOAT16})


def stash_dtype(ctx: KernelContext) -> np.dtype:
    """The NumPy dtype of a normalization's ``stash_type`` attribute (bfloat16 -> float32)."""
    code = int(ctx.attr("stash_type", ElemType.FLOAT))
    if code not in _STASH:
        raise ctx.unsupported(f"stash_type={code} is not supported")
    if code == ElemType.BFLOAT16:
        return np.dtype(np.float32)
    return ctx.elem_dtype(code, "stash_type")


@functools.lru_cache(maxsize=256)
def ones_vector(n: int, char: str) -> np.ndarray:
    """A read-only vector of ``n`` ones of dtype ``char``: ``x2d @ ones`` sums rows with one
    BLAS call, several times faster than ``np.add.reduce(x2d, axis=1)`` for short rows."""
    v = np.ones(n, dtype=char)
    v.flags.writeable = False
    return v


K = TypeVar("K")
V = TypeVar("V")
#: The most plans one kernel keeps by input shape (``ShapeMemo``).
SHAPE_MEMO_CAP = 256


class ShapeMemo(dict[K, V]):
    """A kernel's plans by input shape (or another per-call key), at most ``cap`` of them.

    Look-ups are ``dict``'s own (``get``, ``in``, ``[]``: nothing added on the hot path);
    ``put(key, plan)`` stores and returns ``plan``, first emptying the memo when it holds
    ``cap`` already. A model with free dims fed ever-new shapes -- a stranger's requests --
    then cannot grow a kernel's memo without bound; a workload of a few shapes keeps them
    all. Any thread: the clear and the store are each one atomic dict operation, and a plan
    lost to a clear is made again."""

    __slots__ = ("cap",)

    def __init__(self, cap: int = SHAPE_MEMO_CAP) -> None:
        super().__init__()
        self.cap = cap

    def put(self, key: K, plan: V) -> V:
        if len(self) >= self.cap:
            self.clear()
        self[key] = plan
        return plan

    def made(self, key: K, make: Callable[..., V | None], *args: Any) -> V | None:
        """The plan of ``key``, made by ``make(*args)`` and stored on a miss; None (not
        stored) where ``make`` gives None."""
        plan = self.get(key)
        if plan is None:
            plan = make(*args)
            if plan is not None:
                self.put(key, plan)
        return plan

    def decided(self, key: K, make: Callable[..., Any], *args: Any) -> Any:
        """The plan of ``key``, made by ``make(*args)`` and stored on a miss, a decline
        (``make`` gives None or False) stored too, as False; None where declined."""
        plan = self.get(key)
        if plan is None:
            made: Any = make(*args)
            stored: Any = False if made is None else made
            plan = self.put(key, stored)
        return None if plan is False else plan


_TLS = threading.local()
_SCRATCH_MAX = 1 << 29  # buffers above 512 MiB are not kept


def scratch_rows(slot: int, rows: int, length: int, dtype: np.dtype) -> np.ndarray:
    """``scratch`` of ``rows`` rows, one per block of a parallel loop, each at least
    ``length`` long and a cache line clear of the next (rows 128 bytes apart at least):
    blocks that run on different threads never write one line. Rows ``length`` long
    side by side did: a 960x7x7 depthwise conv at batch 8, four blocks of 65-float rows,
    took 245 µs on two threads, 220 on one (2-core Zen 5 VM); spaced, 118."""
    item = dtype.itemsize
    step = -(-(length * item + 64) // 128) * 128 // item
    return scratch(slot, (rows, step), dtype)


def scratch(slot: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A per-thread scratch array (uninitialised) for temporaries that never escape a call.

    Large fresh allocations cost page faults on every call (the im2col matrix of a big
    conv is ~100 MB); reusing one buffer per slot per thread avoids that. Slot 0 holds
    padded inputs, slot 1 im2col matrices (and conv epilogue temporaries once the conv is
    done with it), slot 2 Softmax's exponentials. A caller must not hold a slot's array
    past its own return, nor use one slot twice at once. Thread-safe: each thread has its
    own.
    """
    n = math.prod(shape) * dtype.itemsize
    bufs: list[np.ndarray | None] | None = getattr(_TLS, "bufs", None)
    if bufs is None:
        bufs = _TLS.bufs = [None, None, None]
    buf = bufs[slot]
    if buf is None or buf.nbytes < n:
        buf = np.empty(max(n, 1), np.uint8)
        if n <= _SCRATCH_MAX:
            bufs[slot] = buf
    return buf[:n].view(dtype).reshape(shape)
