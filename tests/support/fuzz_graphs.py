"""Random ONNX graphs for tests/test_fuzz.py, drawn by hypothesis: ``random_models`` makes a
``RandomModel`` (model, feeds, notes) from a vocabulary of ops (elementwise unary and binary
with broadcasting, MatMul/Gemm, Reshape/Transpose/Concat/Slice/Gather/Squeeze, reductions,
Softmax, Where/Cast, If) with random shapes, dtypes and opsets; with ``break_prob`` some are
deliberately broken (``BREAKAGES``) for the load-error tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from .models.builders import BOOL, FLOAT, INT64, tensor_info

F32, F64, I64, I32, BOOL_ = (
    np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.bool_)
)
_ONNX_TYPE = {F32: FLOAT, F64: TensorProto.DOUBLE, I64: INT64, I32: TensorProto.INT32, BOOL_: BOOL}
IR_VERSION = {11: 6, 13: 7, 17: 8, 18: 8}

UNARY_FLOAT = (
    "Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Floor", "Ceil",
    "Reciprocal", "Erf", "Sign", "Round", "Softplus", "Softsign", "Sin", "Cos", "Atan",
    "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Celu", "ThresholdedRelu",
    "Clip", "IsNaN", "IsInf", "Identity",
)  # fmt: skip
UNARY_INT = ("Neg", "Abs", "Sign", "Identity")
BINARY_NUM = ("Add", "Sub", "Mul", "Max", "Min")
BINARY_FLOAT = ("Div", "Pow", "PRelu", "Mod")
COMPARE = ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual")
BINARY_BOOL = ("And", "Or", "Xor")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
          "ReduceLogSumExp", "ReduceSumSquare", "ReduceL1")  # fmt: skip
FLOAT_ATTRS = {"LeakyRelu": "alpha", "Elu": "alpha", "Celu": "alpha", "ThresholdedRelu": "alpha"}


def random_array(rng: np.random.Generator, dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Feeds and constants: normal floats, small ints (-5..5), fair bools."""
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(-5, 6, size=shape).astype(dt)


@dataclass
class V:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass
class GraphGen:
    """Builds a random, (meant to be) valid ONNX graph, tracking every value's dtype and
    shape so each op gets operands it accepts. ``draw`` is hypothesis's."""

    draw: Any
    opset: int
    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    pool: list[V] = field(default_factory=list)
    n: int = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def pick(self, pred: Callable[[V], bool] = lambda v: True) -> V | None:
        cands = [v for v in self.pool if pred(v)]
        if not cands:
            return None
        # Prefer recent values: deeper graphs.
        i = self.draw(
            st.integers(0, len(cands) - 1) | st.integers(max(0, len(cands) - 3), len(cands) - 1)
        )
        return cands[i]

    def const(self, arr: np.ndarray, keep: bool = False) -> V:
        v = V(self.name("c"), arr.dtype, arr.shape)
        self.inits.append(numpy_helper.from_array(arr, v.name))
        if keep:
            self.pool.append(v)
        return v

    def ints(self, values: list[int]) -> V:
        return self.const(np.array(values, np.int64))

    def emit(
        self, op: str, ins: list[V | None], dtype: np.dtype, shape: tuple[int, ...], **attrs: Any
    ) -> V:
        out = V(self.name(op.lower()), dtype, tuple(int(d) for d in shape))
        node = helper.make_node(
            op, [v.name if v else "" for v in ins], [out.name], name=out.name, **attrs
        )
        self.nodes.append(node)
        self.pool.append(out)
        return out

    def random_value(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return random_array(self.rng, dtype, shape)

    # -- operand shapes ----------------------------------------------------------------------

    def broadcast_partner(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: leading dims dropped or added, some dims 1."""
        draw = self.draw
        s = list(shape)
        kind = draw(st.sampled_from(["same", "drop", "ones", "grow"]))
        if kind == "drop" and s:
            s = s[draw(st.integers(0, len(s))) :]
        elif kind == "ones":
            s = [1 if draw(st.booleans()) else d for d in s]
        elif kind == "grow" and len(s) < 4:
            s = [draw(st.integers(1, 3))] + [d if draw(st.booleans()) else 1 for d in s]
        return tuple(s)

    # -- ops ---------------------------------------------------------------------------------

    def step(self) -> None:
        draw = self.draw
        kind = draw(st.sampled_from([
            "unary", "unary", "binary", "binary", "binary", "compare", "matmul", "gemm",
            "reshape", "transpose", "concat", "slice", "gather", "squeeze", "expand", "flatten",
            "reduce", "argmax", "softmax", "where", "cast", "if", "tile", "not",
        ]))  # fmt: skip
        getattr(self, f"op_{kind}")()

    def op_unary(self) -> None:
        x = self.pick(lambda v: v.dtype != BOOL_)
        if x is None:
            return
        if x.dtype.kind == "f":
            op = self.draw(st.sampled_from(UNARY_FLOAT))
        else:
            op = self.draw(st.sampled_from(UNARY_INT))
        too_new = {"HardSwish": 14, "Celu": 12}
        if (op == "Celu" and x.dtype != F32) or self.opset < too_new.get(op, 0):
            op = "Relu"
        attrs: dict[str, Any] = {}
        ins: list[V | None] = [x]
        if op in FLOAT_ATTRS and self.draw(st.booleans()):
            # Celu divides by alpha: tfrt_py refuses alpha=0 at load (a clear error)
            alphas = [0.1, 0.5, 1.0, 2.0] + ([] if op == "Celu" else [0.0])
            attrs[FLOAT_ATTRS[op]] = self.draw(st.sampled_from(alphas))
        if op == "HardSigmoid" and self.draw(st.booleans()):
            attrs["alpha"], attrs["beta"] = 0.3, 0.4
        if op == "Clip":
            lo = self.draw(st.sampled_from([None, -1.0, 0.0, 0.5]))
            hi = self.draw(st.sampled_from([None, 1.0, 0.5, -0.5]))
            ins = [
                x,
                None if lo is None else self.const(np.array(lo, x.dtype)),
                None if hi is None else self.const(np.array(hi, x.dtype)),
            ]
            while ins and ins[-1] is None:
                ins.pop()
        dtype = BOOL_ if op in ("IsNaN", "IsInf") else x.dtype
        self.emit(op, ins, dtype, x.shape, **attrs)

    def _partner(self, x: V, dtype: np.dtype | None = None) -> V:
        dtype = dtype or x.dtype
        if self.draw(st.booleans()):
            other = self.pick(
                lambda v: v.dtype == dtype and v is not x and _broadcastable(v.shape, x.shape)
            )
            if other is not None:
                return other
        shape = self.broadcast_partner(x.shape)
        return self.const(self.random_value(dtype, shape))

    def op_binary(self) -> None:
        x = self.pick(lambda v: v.dtype != BOOL_)
        if x is None:
            return
        ops = BINARY_NUM + (BINARY_FLOAT if x.dtype.kind == "f" else ())
        op = self.draw(st.sampled_from(ops))
        if op in ("Max", "Min") and x.dtype.kind != "f" and self.opset < 12:
            op = "Add"  # integer Max/Min are opset 12+
        attrs: dict[str, Any] = {"fmod": 1} if op == "Mod" else {}
        if op == "PRelu":  # the slope broadcasts to x (unidirectional)
            slope = self.const(self.random_value(x.dtype, _unidirectional(self, x.shape)))
            self.emit(op, [x, slope], x.dtype, x.shape)
            return
        y = self._partner(x)
        a, b = (x, y) if self.draw(st.booleans()) else (y, x)
        self.emit(op, [a, b], x.dtype, np.broadcast_shapes(a.shape, b.shape), **attrs)

    def op_compare(self) -> None:
        x = self.pick()
        if x is None:
            return
        if x.dtype == BOOL_:
            op = self.draw(st.sampled_from((*BINARY_BOOL, "Equal")))
        else:
            op = self.draw(st.sampled_from(COMPARE))
            if self.opset < 12:
                op = op.replace("OrEqual", "")  # GreaterOrEqual/LessOrEqual are opset 12+
        y = self._partner(x)
        self.emit(op, [x, y], BOOL_, np.broadcast_shapes(x.shape, y.shape))

    def op_not(self) -> None:
        x = self.pick(lambda v: v.dtype == BOOL_)
        if x is not None:
            self.emit("Not", [x], BOOL_, x.shape)

    def op_matmul(self) -> None:
        x = self.pick(lambda v: v.dtype in (F32, F64) and len(v.shape) >= 1)
        if x is None:
            return
        draw = self.draw
        n = draw(st.integers(1, 4))
        if len(x.shape) >= 2 and draw(st.booleans()):  # const @ x
            m = draw(st.integers(1, 4))
            lead = draw(st.sampled_from([(), (1,), tuple(x.shape[:-2])]))
            w = self.const(self.random_value(x.dtype, (*lead, m, x.shape[-2])))
            out = np.matmul(np.zeros(w.shape), np.zeros(x.shape)).shape
            self.emit("MatMul", [w, x], x.dtype, out)
            return
        k = x.shape[-1]
        lead = draw(st.sampled_from([(), (1,), (2,)])) if len(x.shape) == 2 else ()
        w = self.const(self.random_value(x.dtype, (*lead, k, n)))
        out = np.matmul(np.zeros(x.shape), np.zeros(w.shape)).shape
        self.emit("MatMul", [x, w], x.dtype, out)

    def op_gemm(self) -> None:
        x = self.pick(lambda v: v.dtype in (F32, F64) and len(v.shape) == 2)
        if x is None:
            return
        draw = self.draw
        trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
        m, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
        n = draw(st.integers(1, 4))
        b = self.const(self.random_value(x.dtype, (n, k) if trans_b else (k, n)))
        ins: list[V | None] = [x, b]
        c_shape = draw(st.sampled_from([None, (n,), (1, n), (m, n), (m, 1), ()]))
        if c_shape is not None:
            ins.append(self.const(self.random_value(x.dtype, c_shape)))
        attrs: dict[str, Any] = {"transA": int(trans_a), "transB": int(trans_b)}
        if draw(st.booleans()):
            attrs["alpha"], attrs["beta"] = 0.5, 2.0
        self.emit("Gemm", ins, x.dtype, (m, n), **attrs)

    def op_reshape(self) -> None:
        x = self.pick()
        if x is None:
            return
        total = int(np.prod(x.shape, dtype=np.int64))
        if total == 0:
            return  # a literal 0 would mean "copy the input's dim" (allowzero is opset 14+)
        dims: list[int] = []
        rest = total
        for _ in range(self.draw(st.integers(0, 3))):
            d = self.draw(st.sampled_from([d for d in (1, 2, 3, 4) if rest % d == 0] or [1]))
            dims.append(d)
            rest //= d
        dims.append(rest)
        self.draw(st.randoms()).shuffle(dims)
        spec = list(dims)
        if self.draw(st.booleans()):
            spec[self.draw(st.integers(0, len(spec) - 1))] = -1
        for i, d in enumerate(spec):
            if i < len(x.shape) and x.shape[i] == d and self.draw(st.booleans()):
                spec[i] = 0  # copy the input's dim
        self.emit("Reshape", [x, self.ints(spec)], x.dtype, tuple(dims))

    def op_transpose(self) -> None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return
        perm = self.draw(st.permutations(range(len(x.shape))))
        if self.draw(st.booleans()):
            self.emit("Transpose", [x], x.dtype, tuple(x.shape[::-1]))
        else:
            self.emit("Transpose", [x], x.dtype, tuple(x.shape[p] for p in perm), perm=list(perm))

    def op_concat(self) -> None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return
        r = len(x.shape)
        axis = self.draw(st.integers(-r, r - 1))
        ax = axis % r
        parts = [x]
        for _ in range(self.draw(st.integers(1, 2))):
            same = self.pick(
                lambda v: (
                    v.dtype == x.dtype
                    and len(v.shape) == r
                    and all(a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != ax)
                )
            )
            if same is None or self.draw(st.booleans()):
                shape = list(x.shape)
                shape[ax] = self.draw(st.integers(0, 3))
                same = self.const(self.random_value(x.dtype, tuple(shape)))
            parts.append(same)
        shape = list(x.shape)
        shape[ax] = sum(p.shape[ax] for p in parts)
        self.emit("Concat", list(parts), x.dtype, tuple(shape), axis=axis)

    def op_slice(self) -> None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return
        draw = self.draw
        r = len(x.shape)
        axes = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
        starts, ends, steps, sl = [], [], [], [slice(None)] * r
        for a in axes:
            step = draw(st.sampled_from([1, 1, 2, -1, -2]))
            big = st.sampled_from([2**63 - 1, -(2**63)])
            start = draw(st.integers(-5, 5) | big)
            # onnxruntime 1.31 takes end INT64_MAX with a negative step as "to the start"
            # (the spec clamps it to dim-1: nothing), and onnx's reference, the tie-breaker,
            # fails on some of the empty tensors that follow: not drawn.
            end = draw(st.integers(-5, 5) | (big if step > 0 else st.just(-(2**63))))
            starts.append(start)
            ends.append(end)
            steps.append(step)
            sl[a] = _onnx_slice(start, end, step, x.shape[a])
        shape = np.zeros(x.shape)[tuple(sl)].shape
        neg_axes = [a - r if draw(st.booleans()) else a for a in axes]
        ins: list[V | None] = [x, self.ints(starts), self.ints(ends)]
        if draw(st.booleans()) or steps != [1] * len(steps):
            ins += [self.ints(neg_axes), self.ints(steps)]
        elif sorted(axes) == list(range(len(axes))) and axes == sorted(axes):
            pass  # axes default to 0..len(starts)-1
        else:
            ins.append(self.ints(neg_axes))
        self.emit("Slice", ins, x.dtype, shape)

    def op_gather(self) -> None:
        x = self.pick(lambda v: len(v.shape) >= 1 and min(v.shape) > 0)
        if x is None:
            return
        r = len(x.shape)
        axis = self.draw(st.integers(-r, r - 1))
        dim = x.shape[axis % r]
        ishape = self.draw(st.sampled_from([(), (2,), (2, 2), (3,)]))
        idx = self.rng.integers(-dim, dim, size=ishape).astype(np.int64)
        shape = x.shape[: axis % r] + ishape + x.shape[axis % r + 1 :]
        self.emit("Gather", [x, self.const(idx)], x.dtype, shape, axis=axis)

    def op_squeeze(self) -> None:
        x = self.pick()
        if x is None:
            return
        r = len(x.shape)
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if ones and self.draw(st.booleans()):
            axes = self.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
            ins, attrs = self.axes_arg(x, axes)
            self.emit("Squeeze", ins, x.dtype, shape, **attrs)
            return
        if r >= 4:
            return
        a = self.draw(st.integers(-(r + 1), r))
        dims = list(x.shape)
        dims.insert(a % (r + 1), 1)
        ins, attrs = self.axes_arg(x, [a])
        self.emit("Unsqueeze", ins, x.dtype, tuple(dims), **attrs)

    def axes_arg(self, x: V, axes: list[int]) -> tuple[list[V | None], dict[str, Any]]:
        """Squeeze/Unsqueeze ``axes``: an input from opset 13, an attribute before."""
        if self.opset >= 13:
            return [x, self.ints(axes)], {}
        return [x], {"axes": axes}

    def op_expand(self) -> None:
        x = self.pick(lambda v: len(v.shape) <= 3)
        if x is None:
            return
        target = [d if d != 1 or not self.draw(st.booleans()) else self.draw(st.integers(1, 3))
                  for d in x.shape]  # fmt: skip
        if self.draw(st.booleans()):
            target = [self.draw(st.integers(1, 3)), *target]
        if self.draw(st.booleans()) and target:
            target[-1] = 1  # Expand broadcasts both ways: a 1 keeps the input's dim
        out = np.broadcast_shapes(x.shape, tuple(target))
        self.emit("Expand", [x, self.ints(target)], x.dtype, out)

    def op_tile(self) -> None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return
        reps = [self.draw(st.integers(0, 2)) for _ in x.shape]
        self.emit(
            "Tile", [x, self.ints(reps)], x.dtype, tuple(d * k for d, k in zip(x.shape, reps))
        )

    def op_flatten(self) -> None:
        x = self.pick()
        if x is None:
            return
        r = len(x.shape)
        axis = self.draw(st.integers(-r, r))
        a = axis + r if axis < 0 else axis
        shape = (
            int(np.prod(x.shape[:a], dtype=np.int64)),
            int(np.prod(x.shape[a:], dtype=np.int64)),
        )
        self.emit("Flatten", [x], x.dtype, shape, axis=axis)

    def op_reduce(self) -> None:
        x = self.pick(lambda v: v.dtype != BOOL_)
        if x is None:
            return
        draw = self.draw
        ops = REDUCE if x.dtype.kind == "f" else ("ReduceSum", "ReduceMax", "ReduceMin")
        op = draw(st.sampled_from(ops))
        r = len(x.shape)
        keepdims = draw(st.integers(0, 1))
        axes = (
            draw(st.none() | st.lists(st.integers(0, r - 1), max_size=r, unique=True))
            if r
            else None
        )
        reduced = set(range(r)) if not axes else set(axes)
        if op == "ReduceMean" and any(x.shape[i] == 0 for i in reduced):
            return  # the mean of an empty set is undefined (the spec's words)
        shape = tuple(
            1 if i in reduced else d for i, d in enumerate(x.shape) if keepdims or i not in reduced
        )
        attrs: dict[str, Any] = {"keepdims": keepdims}
        ins: list[V | None] = [x]
        signed = [a - r if draw(st.booleans()) else a for a in axes or []]
        as_input = self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13)
        if axes:
            if as_input:
                ins.append(self.ints(signed))
            else:
                attrs["axes"] = signed
        self.emit(op, ins, x.dtype, shape, **attrs)

    def op_argmax(self) -> None:
        x = self.pick(lambda v: v.dtype != BOOL_ and len(v.shape) >= 1 and 0 not in v.shape)
        if x is None:
            return
        r = len(x.shape)
        axis = self.draw(st.integers(-r, r - 1))
        keepdims = self.draw(st.integers(0, 1))
        shape = tuple(
            1 if i == axis % r else d for i, d in enumerate(x.shape) if keepdims or i != axis % r
        )
        op = self.draw(st.sampled_from(["ArgMax", "ArgMin"]))
        x = self.no_nan(x)  # NumPy (and onnx's reference) pick a NaN, onnxruntime does not
        attrs = {"axis": axis, "keepdims": keepdims}
        if self.opset >= 12:
            attrs["select_last_index"] = self.draw(st.integers(0, 1))
        self.emit(op, [x], I64, shape, **attrs)

    def op_softmax(self) -> None:
        x = self.pick(lambda v: v.dtype in (F32, F64) and len(v.shape) >= 1)
        if x is None:
            return
        r = len(x.shape)
        op = self.draw(st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]))
        if op == "Hardmax":
            x = self.no_nan(x)  # NumPy (and onnx's reference) pick a NaN, onnxruntime does not
        self.emit(op, [x], x.dtype, x.shape, axis=self.draw(st.integers(-r, r - 1)))

    def op_where(self) -> None:
        x = self.pick(lambda v: v.dtype != BOOL_)
        if x is None:
            return
        y = self._partner(x)
        xy = np.broadcast_shapes(x.shape, y.shape)
        cond = self.pick(lambda v: v.dtype == BOOL_ and _broadcastable(v.shape, xy))
        if cond is None:
            cond = self.const(self.random_value(BOOL_, self.broadcast_partner(xy)))
        shape = np.broadcast_shapes(cond.shape, xy)
        self.emit("Where", [cond, x, y], x.dtype, shape)

    def op_cast(self) -> None:
        x = self.pick()
        if x is None:
            return
        to = self.draw(st.sampled_from([F32, F64, I64, I32, BOOL_]))
        if x.dtype.kind == "f" and to.kind == "i":
            # float -> int is undefined for NaN and out-of-range values: clean them first
            x = self.no_nan(x)
            lo, hi = self.const(np.array(-1000, x.dtype)), self.const(np.array(1000, x.dtype))
            x = self.emit("Clip", [x, lo, hi], x.dtype, x.shape)
        self.emit("Cast", [x], to, x.shape, to=_ONNX_TYPE[to])

    def no_nan(self, x: V) -> V:
        """``Where(IsNaN(x), 0, x)``: for ops whose NaN behaviour the spec leaves open."""
        if x.dtype.kind != "f":
            return x
        nan = self.emit("IsNaN", [x], BOOL_, x.shape)
        zero = self.const(np.zeros((), x.dtype))
        return self.emit("Where", [nan, zero, x], x.dtype, x.shape)

    def op_if(self) -> None:
        x = self.pick(lambda v: v.dtype == F32)
        if x is None:
            return
        total = self.emit("ReduceSum", [x], F32, (), keepdims=0)
        cond = self.emit("Greater", [total, self.const(np.zeros((), np.float32))], BOOL_, ())
        branches = []
        for label in ("then", "else"):
            op = self.draw(st.sampled_from(["Relu", "Neg", "Tanh", "Abs", "Exp"]))
            out = self.name(f"{label}_out")
            body = helper.make_graph(
                [helper.make_node(op, [x.name], [out])],
                self.name(f"{label}_branch"),
                [],
                [tensor_info(out, FLOAT, list(x.shape))],
            )
            branches.append(body)
        self.emit("If", [cond], F32, x.shape, then_branch=branches[0], else_branch=branches[1])


def _onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """The Python slice ONNX's Slice takes: ends clamped per the spec, which differs from
    Python's for a negative step and a start below the range (ONNX clamps it to 0)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _unidirectional(g: GraphGen, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts *to* ``shape``."""
    s = list(shape)[g.draw(st.integers(0, len(shape))) :]
    return tuple(1 if g.draw(st.booleans()) else d for d in s)


@dataclass
class RandomModel:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    broken: str | None  # what was broken on purpose, or None


BREAKAGES = (
    "undefined_input", "undefined_output", "duplicate_output", "unknown_op", "shape_mismatch",
    "dtype_mismatch", "out_of_order", "bad_perm", "bad_axis",
)  # fmt: skip


@st.composite
def random_models(draw: st.DrawFn, break_prob: float = 0.0) -> RandomModel:
    opset = draw(st.sampled_from([11, 13, 17, 17, 18]))
    g = GraphGen(draw, opset, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    inputs, feeds = [], {}
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from([F32, F32, F32, F64, I64, I32, BOOL_]))
        shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 1, 2, 3, 0]), max_size=3)))
        if 0 in shape and draw(st.booleans()):
            shape = tuple(d or 1 for d in shape)
        v = V(f"in{i}", dtype, shape)
        g.pool.append(v)
        inputs.append(tensor_info(v.name, _ONNX_TYPE[dtype], list(shape)))
        feeds[v.name] = g.random_value(dtype, shape)
    for _ in range(draw(st.integers(2, 14))):
        g.step()
    produced = [v for v in g.pool if not v.name.startswith("in")]
    if not produced:
        g.emit("Identity", [g.pool[0]], g.pool[0].dtype, g.pool[0].shape)
        produced = g.pool[-1:]
    used = {n for node in g.nodes for n in node.input}
    outs = [v for v in produced if v.name not in used]
    outs += draw(st.lists(st.sampled_from(produced), max_size=2))
    outs = list({v.name: v for v in outs}.values())
    broken = None
    if break_prob and draw(st.floats(0, 1)) < break_prob:
        broken = draw(st.sampled_from(BREAKAGES))
        _break(g, broken, outs)
    graph = helper.make_graph(
        g.nodes,
        "random",
        inputs,
        [tensor_info(v.name, _ONNX_TYPE[v.dtype], list(v.shape)) for v in outs],
        initializer=g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION[opset]
    )
    return RandomModel(model, feeds, broken)


def _break(g: GraphGen, how: str, outs: list[V]) -> None:
    """Break the graph on purpose, the way a buggy exporter would."""
    nodes = g.nodes
    last = nodes[-1]
    if how == "undefined_input":
        last.input[0] = "never_defined"
    elif how == "undefined_output":
        outs.append(V("never_defined", F32, ()))
    elif how == "duplicate_output" and len(nodes) >= 2:
        last.output[0] = nodes[0].output[0]
    elif how == "unknown_op":
        last.op_type = "NoSuchOp"
    elif how == "shape_mismatch":
        a = g.const(np.zeros((3, 2), np.float32))
        b = g.const(np.zeros((4, 1, 5), np.float32))
        bad = helper.make_node("Add", [a.name, b.name], ["mismatched"], name="mismatched")
        nodes.append(bad)
        outs.append(V("mismatched", F32, (4, 3, 5)))
    elif how == "dtype_mismatch":
        a = g.const(np.zeros((2,), np.float32))
        b = g.const(np.zeros((2,), np.int64))
        nodes.append(helper.make_node("Mul", [a.name, b.name], ["mixed"], name="mixed"))
        outs.append(V("mixed", F32, (2,)))
    elif how == "out_of_order" and len(nodes) >= 2:
        nodes.reverse()
    elif how == "bad_perm":
        x = g.pool[0]
        nodes.append(helper.make_node("Transpose", [x.name], ["badperm"], perm=[5, 0]))
        outs.append(V("badperm", x.dtype, x.shape))
    elif how == "bad_axis":
        x = g.pool[0]
        nodes.append(helper.make_node("Concat", [x.name, x.name], ["badaxis"], axis=7))
        outs.append(V("badaxis", x.dtype, x.shape))
