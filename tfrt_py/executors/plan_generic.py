"""One memory plan and one generated program for every input signature of a model whose
shapes a ``ShapeModel`` describes (``compiler.shape_model`` fits it at load).

The layout (which values live in the arena, which kernels run in place, which Concats are
elided, which shape arithmetic is baked) is made once, at load, and holds at every
signature: the layout builder only takes decisions the model proves for all dims. What
differs between signatures lives in an *instance*, made on the first call with a new key
(the feeds' shapes) from the model's formulas, with no run of the program:

* the variables' values, the baked values and the fresh outputs' shapes (``consts``, in
  ``plan_codegen.instance_slots`` order), and each arena value's (offset, shape, dtype);
* offsets from the plan of the signature's *dim bucket* (every variable rounded up to a
  power of two): the buffers sized at the bucket's largest dims and placed once per
  bucket with the planner's best fit, so they fit every signature of the bucket (a
  signature whose buffers do not -- a size that shrinks as a dim grows -- gets offsets of
  its own).

Arenas (``Arena``) are shared by every signature: a call pops one, takes the views it made
before for the call's key (or makes them), runs, and pushes it back; an arena grows when
a bigger bucket needs more bytes. So memory follows the concurrency and the largest bucket
seen, not the number of signatures.

Verification: the first signature of each bucket is run the plain way by the interpreter
(``Program.run_shapes``: every shape kept, and the values the formulas give; the other
activations freed after their last reader) and every fitted shape and value is compared
with the instance's (``verify``); a mismatch retires the generic plan (the interpreter then plans
per signature, as it does for models without a shape model) and ``describe()`` says why.

Thread-safety: instances and bucket plans are made outside any lock and published with one
dict store; two threads making the same one both succeed and one is kept. ``insts`` holds
only instances whose bucket was verified: the generated fast entry serves those alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .dims import ShapeModel, bucket_of
from .plan import ALIGN, Buffer, MemoryPlan, lower_bound, plan_offsets
from .plan_build import Layout
from .plan_codegen import instance_slots
from .program import Program

__all__ = ["MAX_INSTANCES", "Arena", "GenericPlan", "Instance"]

#: Instances kept (when full, the older half is forgotten: a new signature costs a few
#: hundred microseconds).
MAX_INSTANCES = 4096
#: Bytes of baked values the kept instances may hold together (position tables per length).
MAX_INSTANCE_BYTES = 64 << 20
#: Views an arena keeps per signature key before it forgets them all.
MAX_ARENA_VIEWS = 1024


class Instance:
    """One signature of a generic plan: see the module docstring. Immutable."""

    __slots__ = ("bucket", "consts", "held", "key", "nbytes", "offsets", "rows", "vals", "views")

    def __init__(self, key: Any, vals: tuple[int, ...], bucket: tuple[int, ...],
                 consts: tuple[Any, ...], views: tuple[tuple[int, tuple[int, ...], Any], ...],
                 nbytes: int, rows: np.ndarray, offsets: list[int], held: int) -> None:  # fmt: skip
        #: bytes of baked values this instance alone holds (shared ones: ``GenericPlan``'s)
        self.held = held
        self.key = key
        self.vals = vals
        self.bucket = bucket
        self.consts = consts
        self.views = views
        self.nbytes = nbytes
        self.rows = rows
        self.offsets = offsets


def _array_bytes(values: Sequence[Any]) -> int:
    return sum(v.nbytes for v in values if isinstance(v, np.ndarray))


class Arena:
    """One arena shared by every signature: ``views[key]`` is the tuple of views a call
    with that key unpacks. Owned by one call at a time (the plan's free list)."""

    __slots__ = ("base", "nbytes", "views")

    def __init__(self) -> None:
        self.base = np.empty(0, np.uint8)
        self.nbytes = 0
        self.views: dict[Any, tuple[np.ndarray, ...]] = {}

    def views_for(self, inst: Instance) -> tuple[np.ndarray, ...]:
        """The views of ``inst`` over this arena (grown first when too small), kept for
        the next call with its key. Values laid out alike get one view object, so a kernel
        run in place sees ``out is x``."""
        if inst.nbytes > self.nbytes:
            raw = np.empty(inst.nbytes + ALIGN, np.uint8)
            start = (-raw.ctypes.data) % ALIGN
            self.base = raw[start : start + inst.nbytes]
            self.nbytes = inst.nbytes
            self.views = {}
        base = self.base
        made: dict[tuple[Any, ...], np.ndarray] = {}
        out = []
        ndarray = np.ndarray
        for view in inst.views:
            v = made.get(view)
            if v is None:
                off, shape, dt = view
                v = made[view] = ndarray(shape, dt, base, off)  # a view of base, at off
            out.append(v)
        views = tuple(out)
        if len(self.views) >= MAX_ARENA_VIEWS:
            self.views = {}
        self.views[inst.key] = views
        return views


class _BakePart(NamedTuple):
    """Baked instructions that share no slot with the others' (``_independent_parts``):
    the instructions (program order), the positions in ``_bake_values`` of the formula
    values they read, the feeds they read (by shape), and the baked slots they write."""

    run: list[int]
    formulas: list[int]
    feeds: list[int]
    baked: list[int]


def _independent_parts(
    program: Program, run: list[int], formula_slots: list[int], baked: list[int]
) -> list[_BakePart]:
    """``run`` split into parts that read and write none of each other's slots, so each
    one's results depend on its own inputs alone."""
    parent = list(range(len(run)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    writer: dict[int, int] = {}
    for k, i in enumerate(run):
        for s in program.instrs[i].ins:
            if s in writer:
                parent[root(k)] = root(writer[s])
        for s in program.instrs[i].outs:
            if s > 1:
                writer[s] = k
    groups: dict[int, list[int]] = {}
    for k in range(len(run)):
        groups.setdefault(root(k), []).append(k)
    position = {s: k for k, s in enumerate(formula_slots)}
    feeds = {s: k for k, s in enumerate(program.input_slots)}
    parts = []
    for members in groups.values():
        ins = {s for k in members for s in program.instrs[run[k]].ins}
        outs = {s for k in members for s in program.instrs[run[k]].outs}
        parts.append(_BakePart(
            [run[k] for k in members],
            sorted(position[s] for s in ins if s in position),
            sorted(feeds[s] for s in ins if s in feeds),
            [s for s in baked if s in outs],
        ))  # fmt: skip
    return parts


class GenericPlan:
    """The per-signature side of one generic layout (see the module docstring)."""

    def __init__(self, program: Program, layout: Layout, model: ShapeModel) -> None:
        self.program = program
        self.layout = layout
        self.model = model
        #: The slots whose values ``verify`` compares (of the others it reads shapes).
        self.checked_values = frozenset(model.values)
        #: verified instances by key: the generated fast entry's table
        self.insts: dict[Any, Instance] = {}
        self._held = 0  # bytes of baked values in the kept instances
        self.verified: set[tuple[int, ...]] = set()
        self._buckets: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, int]] = {}
        self._baked, self._fresh = instance_slots(program, layout)
        self._bake_plan(program, layout, model)
        self._index_slots(layout, model)
        self._dtypes = {s: dt for s, (_, dt) in layout.shapes.items()}
        self._index_values(model)
        self._input_shapes = [
            tuple(d if isinstance(d, int) else None for d in (v.type.shape or ()))  # type: ignore[union-attr]
            for v in program.graph.inputs
        ]
        self._ranks = [len(s) for s in self._input_shapes]
        #: (input, axis, size) of every static input dim: what ``adopt`` checks
        self._static = [(k, a, d) for k, s in enumerate(self._input_shapes)
                        for a, d in enumerate(s) if d is not None]  # fmt: skip
        #: figures for describe(): instances made, bucket plans made
        self.made = 0

    # -- what the generated code assumes --------------------------------------------------
    def symbolic(self, slot: int) -> tuple[int | None, ...] | None:
        return self.model.symbolic(slot)

    def input_shape(self, k: int) -> tuple[int | None, ...] | None:
        return self._input_shapes[k]

    # -- instances -----------------------------------------------------------------------
    def adopt(self, key: tuple[tuple[int, ...], ...], args: Sequence[Any]) -> Instance | None:
        """The generated fast entry's new signature: ``args`` are the feeds in input order,
        each already an ndarray of its input's dtype (the entry checked), ``key`` their
        shapes. Checks what ``FeedChecker`` would check of the shapes (ranks, static dims;
        the symbols' relations are ``DimVars.values``'), makes the instance and publishes
        it when its bucket is verified; None otherwise (the slow path then checks the
        feeds, runs the call and verifies the bucket). Any thread."""
        for shape, rank in zip(key, self._ranks):
            if len(shape) != rank:
                return None
        for k, a, d in self._static:
            if key[k][a] != d:
                return None
        vals = self.model.vars.values(key)
        if vals is None or bucket_of(vals) not in self.verified:
            return None
        inst = self._make(key, vals, args)
        if inst is not None:
            self.publish(inst)
        return inst

    def instance(self, args: Sequence[Any]) -> Instance | None:
        """The instance for these validated feeds: the published one, or one made now
        (not published: ``publish`` after its bucket is verified); None when the model's
        formulas do not hold for these shapes (a declared relation broken, a negative or
        fractional dim): the interpreter then runs the call the plain way."""
        key = tuple(a.shape for a in args)
        inst = self.insts.get(key)
        if inst is not None:
            return inst
        vals = self.model.vars.values(key)
        return None if vals is None else self._make(key, vals, args)

    def _make(self, key: Any, vals: tuple[int, ...], args: Sequence[Any]) -> Instance | None:
        """``instance``'s work for feeds ``args`` of shapes ``key`` whose variables are
        ``vals``."""
        rows = self.model.evaluate(vals)
        if rows is None:
            return None
        got_shapes = self._shapes_at(rows)
        if got_shapes is None:
            return None
        shape_of, nb = got_shapes
        sizes = nb[self._owner_at]
        bucket = bucket_of(vals)
        got = self._bucket(bucket)
        if got is not None and bool((sizes <= got[1]).all()):
            offsets, nbytes = got[0], got[2]
        else:
            offsets, nbytes = self._place(sizes)
        # each view at its buffer's offset plus the bytes of the join members before it
        ahead = np.cumsum(nb[self._before_flat]) if len(self._before_flat) else nb[:0]
        ahead = np.concatenate(([0], ahead))
        offs = offsets[self._view_bufs] + ahead[self._before_ends] - ahead[self._before_starts]
        views = zip(offs.tolist(), [shape_of[k] for k in self._view_formulas], self._view_dts)
        try:
            consts, held = self._baked_values(args, rows)
        except Exception:  # noqa: BLE001 - the plain run raises the model's own error
            return None
        consts += [shape_of[k] for k in self._fresh_at]
        self.made += 1
        return Instance(key, vals, bucket, tuple(consts), tuple(views), max(nbytes, 1), rows,
                        offsets.tolist(), held)  # fmt: skip

    def _index_slots(self, layout: Layout, model: ShapeModel) -> None:
        """What ``_shapes_at`` and ``instance`` gather. The planned slots (by their position
        in ``layout.shapes``, their *index*) share few distinct shape formulas (a layer's
        values repeat the previous layer's): each distinct formula is evaluated once, its
        dims as rows of the model followed by a 1 (so a product per formula is one
        ``reduceat``, scalars included). Also the buffers' owners, the fresh outputs and,
        per view, its buffer and the members of a join laid out before it (whose bytes
        offset it)."""
        index = {s: k for k, s in enumerate(layout.shapes)}
        distinct: dict[bytes, int] = {}
        of_slot: list[int] = []
        spans: list[tuple[int, int]] = []
        idx: list[int] = []
        one = model.coef.shape[0]  # the row appended to every evaluation: 1.0
        starts: list[int] = []
        for s in layout.shapes:
            f = model.shapes[s]
            key = bytes([f.n]) + model.coef[f.start : f.start + f.n].tobytes()
            u = distinct.get(key)
            if u is None:
                u = distinct[key] = len(spans)
                starts.append(len(idx))
                spans.append((len(idx), len(idx) + f.n))
                idx.extend(range(f.start, f.start + f.n))
                idx.append(one)
            of_slot.append(u)
        self._dim_spans = spans  # per formula: (from, to) in ``_dim_rows``
        self._dim_rows = np.array(idx, np.intp)
        self._prod_starts = np.array(starts, np.intp)
        self._formula_of = np.array(of_slot, np.intp)  # per index: its formula
        self._itemsizes = np.array([dt.itemsize for _, dt in layout.shapes.values()], np.float64)
        self._owner_at = np.array([index[s] for s in layout.owners], np.intp)
        self._fresh_at = [of_slot[index[s]] for s in self._fresh]
        before: dict[int, list[int]] = {}
        for members in layout.members.values():
            for k, m in enumerate(members):
                before[m] = [index[x] for x in members[:k]]
        # per view: its formula, its buffer, and the span of ``_before_flat`` listing the
        # join members laid out before it in that buffer
        flat: list[int] = []
        starts, ends = [], []
        for s, _, _, _ in layout.views:
            starts.append(len(flat))
            flat.extend(before.get(s, []))
            ends.append(len(flat))
        self._view_formulas = [of_slot[index[s]] for s, _, _, _ in layout.views]
        self._view_bufs = np.array([layout.buffer_index[s] for s, _, _, _ in layout.views],
                                   np.intp)  # fmt: skip
        self._view_dts = [dt for _, _, _, dt in layout.views]
        self._before_flat = np.array(flat, np.intp)
        self._before_starts = np.array(starts, np.intp)
        self._before_ends = np.array(ends, np.intp)

    def _shapes_at(self, rows: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray] | None:
        """At these rows: every distinct shape (by formula) and every planned slot's bytes
        (by index, int64): one gather, one product and one conversion for all of them; None
        when a dim is negative."""
        dims = np.append(rows, 1.0)[self._dim_rows]
        if dims.size and dims.min() < 0:
            return None
        flat = dims.astype(np.int64).tolist()
        shapes = [tuple(flat[a:b]) for a, b in self._dim_spans]
        if not len(self._prod_starts):
            return shapes, np.zeros(0, np.int64)
        counts = np.multiply.reduceat(dims, self._prod_starts)[self._formula_of]
        return shapes, (counts * self._itemsizes).astype(np.int64)

    def _index_values(self, model: ShapeModel) -> None:
        """How ``_formula_values`` makes each formula value an instance needs: a constant
        one (no variable changes it) as it is, else a slice of the gather-and-cast of the
        rows of every value of its dtype (one per dtype)."""
        gathers: dict[str, list[int]] = {}
        self._value_plan: dict[int, Any] = {}
        for s, f in model.values.items():
            const = model.constant(s)
            if const is not None:
                self._value_plan[s] = const
                continue
            dt = np.dtype(f.dtype).str
            idx = gathers.setdefault(dt, [])
            k = list(gathers).index(dt)
            self._value_plan[s] = (k, f.shape, len(idx) * np.dtype(dt).itemsize)
            idx.extend(range(f.start, f.start + f.n))
        self._casts = [(np.array(idx, np.intp), np.dtype(dt)) for dt, idx in gathers.items()]
        self._cast_dtypes = [dt for _, dt in self._casts]

    def _formula_values(self, slots: list[int], rows: np.ndarray) -> list[Any]:
        """``model.value(s, rows)`` for each slot of ``slots`` (read-only to the program:
        slices of one gather-and-cast of ``rows`` per dtype)."""
        cast = [rows[idx].astype(dt) for idx, dt in self._casts]
        dts = self._cast_dtypes
        ndarray = np.ndarray
        out = []
        for s in slots:
            how = self._value_plan[s]
            if isinstance(how, ndarray):
                out.append(how)
            else:
                k, shape, offset = how
                out.append(ndarray(shape, dts[k], cast[k], offset))  # a view of the cast
        return out

    def _bake_plan(self, program: Program, layout: Layout, model: ShapeModel) -> None:
        """Which baked instructions an instance runs (those the formulas do not give) and
        which formula values it needs: the ones the program reads and the ones those
        instructions read."""
        run = []
        for i in sorted(layout.baked):
            outs = [s for s in program.instrs[i].outs if s > 1]
            if not all(s in model.values for s in outs):
                run.append(i)
        self._bake_run = run
        run_ins = {s for i in run for s in program.instrs[i].ins}
        need = set(self._baked) | run_ins
        self._bake_values = sorted(s for s in need if s in model.values)
        self._bake_parts = _independent_parts(program, run, self._bake_values, self._baked)
        #: each part's results, by its inputs (``_bake_parts``), shared by the instances
        self._ran: dict[Any, list[Any]] = {}
        self._ran_held = 0

    def _baked_values(self, args: Sequence[Any], rows: np.ndarray) -> tuple[list[Any], int]:
        """The baked slots' values for this signature, and the bytes of those this instance
        alone holds: from the model's formulas where it has them, else by running their
        instructions (a position table's rows, a mask's pattern: a few small kernels) on
        these feeds -- each independent part once per distinct input (``_ran``: a T5's
        position table depends on the length alone, not on the batch)."""
        program = self.program
        if not self._bake_run:
            vals = self._formula_values(self._baked, rows)
            return vals, _array_bytes(vals)
        formulas = self._formula_values(self._bake_values, rows)
        got = dict(zip(self._bake_values, formulas))
        shared: set[int] = set()
        for n, part in enumerate(self._bake_parts):
            key = (
                n,
                tuple((formulas[k].dtype.str, formulas[k].shape, formulas[k].tobytes())
                      for k in part.formulas),
                tuple(args[k].shape for k in part.feeds),
            )  # fmt: skip
            ran = self._ran.get(key)
            if ran is None:
                env = program.env_for(args)
                for s, v in got.items():
                    env[s] = v
                program.execute_each(env, part.run)
                ran = [env[s] for s in part.baked]
                self._keep_ran(key, ran)
            got.update(zip(part.baked, ran))
            shared.update(part.baked)
        vals = [got[s] for s in self._baked]
        return vals, _array_bytes([v for s, v in zip(self._baked, vals) if s not in shared])

    def _keep_ran(self, key: Any, ran: list[Any]) -> None:
        """Share ``ran`` with later instances. Beyond ``MAX_INSTANCE_BYTES`` the shared
        results and the instances (which hold them) are forgotten together, so memory
        stays bounded (the generated code holds ``insts``: cleared in place)."""
        size = _array_bytes(ran)
        if self._ran_held + size > MAX_INSTANCE_BYTES:
            self._ran = {}
            self._ran_held = 0
            self.insts.clear()
            self._held = 0
        self._ran[key] = ran
        self._ran_held += size

    def publish(self, inst: Instance) -> None:
        """Serve ``inst``'s key from the fast entry (its bucket is verified)."""
        size = inst.held
        if len(self.insts) >= MAX_INSTANCES or self._held + size > MAX_INSTANCE_BYTES:
            self._evict_older_half()
        self._held += size
        self.insts[inst.key] = inst

    def _evict_older_half(self) -> None:
        """Forget the older half of the instances (first published first; they are cheap
        to make again), so the signatures of current traffic stay served; the generated
        code holds this very dict, so it is changed in place. Runs on a calling thread: a
        key another thread removes first is skipped."""
        old = list(self.insts)[: max(1, len(self.insts) // 2)]
        for key in old:
            gone = self.insts.pop(key, None)
            if gone is not None:
                self._held -= gone.held
        if not self.insts:
            self._held = 0

    def _nbytes(self, s: int, shape_of: dict[int, tuple[int, ...]]) -> int:
        return math.prod(shape_of[s]) * self._dtypes[s].itemsize

    def _bucket(self, bucket: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(offsets per buffer, bytes per buffer, arena bytes) at the bucket's largest
        dims (int64 arrays); None when the formulas do not hold there."""
        got = self._buckets.get(bucket)
        if got is None:
            rows = self.model.evaluate(bucket)
            got_shapes = None if rows is None else self._shapes_at(rows)
            if got_shapes is None:
                return None
            sizes = got_shapes[1][self._owner_at]
            offsets, nbytes = self._place(sizes)
            got = self._buckets[bucket] = (offsets, sizes, nbytes)
        return got

    def _place(self, sizes: np.ndarray) -> tuple[np.ndarray, int]:
        bufs = [Buffer(n, b.first, b.last, b.values) for n, b in
                zip(sizes.tolist(), self.layout.plan.buffers)]  # fmt: skip
        arena = plan_offsets(bufs)
        return np.array([b.offset for b in bufs], np.int64), arena

    # -- verification --------------------------------------------------------------------
    def verify(self, inst: Instance, env: list[Any]) -> str:
        """ "" when every fitted shape and value agrees with ``env`` (a run of this
        instance's feeds keeping every shape and the ``checked_values``:
        ``Program.run_shapes``), else what disagreed; a success verifies the instance's
        bucket."""
        model = self.model
        for s in model.shapes:
            x = env[s]
            if x is None:
                continue
            want = model.shape(s, inst.rows)
            if tuple(np.shape(x)) != want:
                node = self._node(s)
                return f"the shape of {node} is {tuple(np.shape(x))}, the formula gave {want}"
        for s in model.values:
            x = env[s]
            if x is None:
                continue
            want_v = model.value(s, inst.rows)
            if np.shape(x) != want_v.shape or not np.array_equal(np.asarray(x), want_v):
                return f"the value of {self._node(s)} differs from the formula's"
        self.verified.add(inst.bucket)
        return ""

    def _node(self, slot: int) -> str:
        for ins in self.program.instrs:
            if slot in ins.outs:
                return f"node {ins.node.name!r} ({ins.node.op_type})"
        return f"slot {slot}"

    # -- arenas and reports --------------------------------------------------------------
    @staticmethod
    def new_arena() -> Arena:
        return Arena()

    def memory_plan(self, inst: Instance) -> MemoryPlan:
        """The plan a call with ``inst``'s signature runs on: its buffers at their sizes
        for this signature, placed as its bucket places them."""
        shape_of = {s: self.model.shape(s, inst.rows) for s in self.layout.shapes}
        bufs = []
        for k, (b, s) in enumerate(zip(self.layout.plan.buffers, self.layout.owners)):
            n = self._nbytes(s, shape_of)  # type: ignore[arg-type]
            nb = Buffer(n, b.first, b.last, list(b.values))
            nb.offset = inst.offsets[k]
            bufs.append(nb)
        base = self.layout.plan
        sig = tuple((a, d) for a, d in zip(self._key_shapes(inst), self._input_dtypes()))
        return MemoryPlan(sig, inst.nbytes, lower_bound(bufs), bufs, n_inplace=base.n_inplace,
                          n_fresh=base.n_fresh, n_unplanned=base.n_unplanned,
                          n_joined=base.n_joined)  # fmt: skip

    @staticmethod
    def _key_shapes(inst: Instance) -> list[tuple[int, ...]]:
        return list(inst.key)

    def _input_dtypes(self) -> list[Any]:
        return [np.dtype(v.type.dtype) for v in self.program.graph.inputs]  # type: ignore[union-attr]

    def describe_lines(self) -> list[str]:
        names = ", ".join(self.model.vars.names)
        plan = self.layout.plan
        lines = [
            f"  memory: one plan for every signature of the dims ({names}): "
            f"{len(plan.buffers)} buffers, {plan.n_inplace} in place, {plan.n_fresh} fresh "
            f"outputs, {plan.n_unplanned} unplanned values, {plan.n_joined} Concats written "
            f"in place, {len(self.layout.baked)} shape computations baked per signature",
            f"    signatures served: {self.made} made, {len(self.insts)} kept; dim buckets "
            f"placed: {len(self._buckets)}, verified: {len(self.verified)}",
        ]
        for bucket, (_, _, nbytes) in sorted(self._buckets.items())[:8]:
            dims = ", ".join(f"{n} <= {b}" for n, b in zip(self.model.vars.names, bucket))
            lines.append(f"    bucket ({dims}): arena {nbytes:,} B")
        return lines
