"""What a model can make us compute at load: a bound checked before each kernel runs.

Load time runs kernels on constants (constant folding) and on zero feeds (the shape
probes of the ``shapes`` pass and the native tier). A few hundred bytes of model can ask
those kernels for gigabytes -- ``ConstantOfShape`` of a constant ``[60000, 60000]``, an
``Expand``/``Tile`` to a huge shape, a ``Range`` of 10^12 steps, a broadcasting ``Add`` of
``[n, 1]`` and ``[1, n]``, declared input dims in the millions -- so every load-time
evaluation first predicts the node's output size from its input arrays (and its static
output type) and skips the node (folding) or the probe (probing) when it exceeds
``LOAD_MAX_BYTES``. The call itself then computes it, under the caller's deadline.

Pure functions; thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..executors.program import Program
from ..ir import Node, TensorType
from ..kernels.common import load_run
from .rewrite import op_names

__all__ = ["LOAD_MAX_BYTES", "guarded_env", "predicted_nbytes", "zero_feeds"]

#: No single value computed at load may exceed this (256 MiB); nor may a probe's feeds.
LOAD_MAX_BYTES = 256 << 20

_ELEMENTWISE_BROADCAST = frozenset(
    op_names(
        """
        Add Sub Mul Div Pow Mod Max Min Mean Sum Where Equal Less Greater LessOrEqual
        GreaterOrEqual And Or Xor BitShift BitwiseAnd BitwiseOr BitwiseXor PRelu
        """
    )
)


def _ints(x: Any) -> list[int] | None:
    if not isinstance(x, (np.ndarray, np.generic)) or x.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _shape(x: Any) -> tuple[int, ...] | None:
    return tuple(x.shape) if isinstance(x, (np.ndarray, np.generic)) else None


def _elements(node: Node, args: Sequence[Any]) -> float | None:
    """Output elements predicted from the inputs (an upper bound), or None: not predicted."""
    op = node.op_type
    a = list(args) + [None] * 4
    if op == "ConstantOfShape":
        dims = _ints(a[0])
        return None if dims is None else float(math.prod(max(d, 0) for d in dims))
    if op == "Expand":
        dims, s = _ints(a[1]), _shape(a[0])
        if dims is None or s is None:
            return None
        n = max(len(dims), len(s))
        full = [1] * (n - len(dims)) + dims
        src = [1] * (n - len(s)) + list(s)
        return float(math.prod(max(p, q, 0) for p, q in zip(full, src)))
    if op == "Tile":
        reps, s = _ints(a[1]), _shape(a[0])
        if reps is None or s is None or len(reps) != len(s):
            return None
        return float(math.prod(max(r, 0) * d for r, d in zip(reps, s)))
    if op == "Range":
        try:
            start, limit, delta = (float(np.asarray(x)) for x in a[:3])
        except (TypeError, ValueError):
            return None
        if delta == 0 or not all(map(math.isfinite, (start, limit, delta))):
            return None
        return max(0.0, math.ceil((limit - start) / delta))
    if op in _ELEMENTWISE_BROADCAST or op in ("MatMul", "Gemm"):
        maybe = [_shape(x) for x in args if x is not None]
        shapes = [s for s in maybe if s is not None]
        if len(shapes) != len(maybe) or not shapes:
            return None
        if op in ("MatMul", "Gemm"):  # an outer product is the worst case: m x n
            if len(shapes) < 2:
                return None
            rows = float(math.prod(shapes[0][:-1] or (1,)))
            return rows * float(math.prod(shapes[1][-1:] or (1,)))
        n = max(len(s) for s in shapes)
        padded = [[1] * (n - len(s)) + list(s) for s in shapes]
        return float(math.prod(max(col) for col in zip(*padded)))
    return None


def predicted_nbytes(node: Node, args: Sequence[Any]) -> float:
    """The largest output size (bytes) the node's static types or its inputs predict; 0
    when nothing predicts one."""
    best = 0.0
    for v in node.outputs:
        t = None if v is None else v.type
        if isinstance(t, TensorType) and t.shape is not None and t.is_static:
            item = t.dtype.itemsize if t.dtype is not None and t.dtype.kind != "O" else 8
            dims = [int(d) for d in t.shape if isinstance(d, int)]
            best = max(best, float(math.prod(dims)) * item)
    elems = _elements(node, args)
    if elems is not None:
        best = max(best, elems * 8)  # the widest common dtype
    return best


def zero_feeds(specs: Sequence[tuple[tuple[int, ...], np.dtype]],
               attend: bool = False) -> list[np.ndarray] | None:  # fmt: skip
    """Zero arrays of these (shape, dtype), or None when together they would exceed
    ``LOAD_MAX_BYTES`` (checked before anything is allocated). ``attend``: integer and
    bool inputs hold ones instead (a mask that attends, ids in range: what the shape
    model's probes feed; a decoder's ``seqlens_k`` made of an all-zero mask is -1)."""
    total = sum(math.prod(max(d, 0) for d in shape) * dt.itemsize for shape, dt in specs)
    if total > LOAD_MAX_BYTES:
        return None
    return [np.ones(shape, dt) if attend and dt.kind in "biu" else np.zeros(shape, dt)
            for shape, dt in specs]  # fmt: skip


def guarded_env(program: Program, feeds: Sequence[np.ndarray]) -> list[Any] | None:
    """Run ``program`` on ``feeds`` keeping every value (like ``plan_probe.run_env``),
    or None when any node's predicted output exceeds ``LOAD_MAX_BYTES`` (the node does not
    run). The kernels run inside ``kernels.common.load_run``. Kernel errors propagate
    (ExecutionError naming the node)."""
    env = program.env_for(feeds)
    with load_run():
        for i, ins in enumerate(program.instrs):
            if predicted_nbytes(ins.node, [env[s] for s in ins.ins]) > LOAD_MAX_BYTES:
                return None
            program.execute(env, i, i + 1)
    return env
