"""The memory planner: offsets never overlap for buffers live at once, in-place reuse, alias
lifetimes, and the arena against its lower bound on real models.

Property tests run on ``tests.support.random_graphs`` and are derandomized (same examples
every run).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tfrt_py
from tests.support.classic_cnns import CLASSIC_CNNS, LIGHT_DIR
from tests.support.jit_paths import compiled_only
from tests.support.models import build
from tests.support.random_graphs import PROPERTY, random_graph
from tfrt_py.executors.plan import ALIGN, Buffer, lower_bound, plan_offsets
from tfrt_py.ir import GraphBuilder

F32 = np.float32
# -- the offset assignment ----------------------------------------------------------------------


def _assert_no_live_overlap(buffers: list[Buffer]) -> None:
    for a, b in itertools.combinations(buffers, 2):
        if a.overlaps_in_time(b):
            assert not a.overlaps_in_memory(b), f"{a} and {b} overlap while both live"
    for b in buffers:
        assert b.offset % ALIGN == 0


def test_offsets_reuse_dead_buffers() -> None:
    bufs = [Buffer(100, 0, 1), Buffer(100, 1, 2), Buffer(100, 2, 3)]
    arena = plan_offsets(bufs)
    assert arena == 2 * 128  # a chain needs two buffers, ping-pong
    assert bufs[0].offset == bufs[2].offset
    _assert_no_live_overlap(bufs)
    assert lower_bound(bufs) == 200


def test_best_fit_picks_the_smallest_gap() -> None:
    # Placed largest first: L1@0, S1@1024, L2@1536, S2@2048, L3@2304. When S1 and S2 die,
    # they leave a 512-byte hole and a 256-byte hole between long-lived buffers.
    l1, s1, l2, s2, l3 = (
        Buffer(1024, 0, 9), Buffer(512, 0, 2), Buffer(512, 0, 9), Buffer(256, 0, 2),
        Buffer(256, 0, 9),
    )  # fmt: skip
    late = Buffer(256, 5, 6)
    plan_offsets([l1, s1, l2, s2, l3, late])
    assert (s1.offset, s2.offset) == (1024, 2048)
    assert late.offset == s2.offset  # best fit: the 256-byte hole, not the first (512) one


@PROPERTY
@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 20), st.integers(0, 6)),
        min_size=1,
        max_size=40,
    )
)
def test_offsets_property(spec: list[tuple[int, int, int]]) -> None:
    bufs = [Buffer(n, first, first + span) for n, first, span in spec]
    arena = plan_offsets(bufs)
    _assert_no_live_overlap(bufs)
    assert arena >= lower_bound(bufs)
    assert all(b.offset + b.nbytes <= arena for b in bufs)


def _reference_best_fit(order: list[Buffer]) -> list[int]:
    """The best fit as first written: every placed buffer scanned for each new one."""
    placed: list[Buffer] = []
    offsets = []
    for b in order:
        size = -(-b.nbytes // ALIGN) * ALIGN
        live = sorted((p for p in placed if p.overlaps_in_time(b)), key=lambda p: p.offset)
        best, best_gap, end = -1, -1, 0
        for p in live:
            gap = p.offset - end
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = end, gap
            end = max(end, p.offset + -(-p.nbytes // ALIGN) * ALIGN)
        b.offset = best if best >= 0 else end
        placed.append(b)
        offsets.append(b.offset)
    return offsets


@PROPERTY
@given(
    st.lists(
        st.tuples(st.integers(1, 5000), st.integers(0, 300), st.integers(0, 80)),
        min_size=1,
        max_size=60,
    )
)
def test_the_indexed_best_fit_places_as_the_full_scan(spec: list[tuple[int, int, int]]) -> None:
    """The greedy finds the buffers overlapping in time by a vector scan, or for many
    buffers through an index of step blocks (a Python scan of every placed buffer was
    quadratic: 80 s at 25k nodes); the same offsets as the first best fit either way."""
    from tfrt_py.executors.plan import _place, _place_indexed

    want = _reference_best_fit([Buffer(n, first, first + span) for n, first, span in spec])
    for place in (_place, _place_indexed):
        bufs = [Buffer(n, first, first + span) for n, first, span in spec]
        place(bufs)
        assert [b.offset for b in bufs] == want


@PROPERTY
@given(
    st.lists(
        st.tuples(st.sampled_from([0, 64, 100, 4096]), st.integers(0, 60), st.integers(0, 30)),
        min_size=1,
        max_size=60,
    )
)
def test_the_breadth_order_is_the_step_by_step_order(spec: list[tuple[int, int, int]]) -> None:
    """The busiest-step-first order from segments of steps (a vector product) is the order
    the step-by-step walk gives, ties included (sizes repeat here)."""
    from tfrt_py.executors.plan import _by_breadth, _by_breadth_steps

    bufs = [Buffer(n, first, first + span) for n, first, span in spec]
    assert [id(b) for b in _by_breadth(bufs)] == [id(b) for b in _by_breadth_steps(bufs)]


@PROPERTY
@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 40), st.integers(0, 12)),
        min_size=1,
        max_size=60,
    )
)
def test_the_sweep_places_validly(spec: list[tuple[int, int, int]]) -> None:
    """Above ``GREEDY_MAX_PAIRS`` pairs live at once, one sweep places the buffers."""
    from tfrt_py.executors import plan

    bufs = [Buffer(n, first, first + span) for n, first, span in spec]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "GREEDY_MAX_PAIRS", -1)
        arena = plan_offsets(bufs)
    _assert_no_live_overlap(bufs)
    assert arena >= lower_bound(bufs)
    assert all(b.offset + b.nbytes <= arena for b in bufs)


def test_the_sweep_reuses_what_dead_buffers_free() -> None:
    from tfrt_py.executors import plan

    chain = [Buffer(100, k, k + 1) for k in range(50)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "GREEDY_MAX_PAIRS", -1)
        assert plan_offsets(chain) == 2 * 128  # ping-pong, as the greedy's
    _assert_no_live_overlap(chain)


# -- plans of real programs ---------------------------------------------------------------------


@PROPERTY
@given(random_graph())
def test_planned_random_graphs_match_and_never_overlap(case: Any) -> None:
    graph, feeds = case
    model = tfrt_py.load(graph)
    plain = tfrt_py.load(graph, optimize=False)
    expected = plain.run(feeds)  # first call: the probe, no plan involved
    shapes = {k: v.shape for k, v in feeds.items()}
    plan = model.memory_plan(shapes)
    _assert_no_live_overlap(plan.buffers)
    assert plan.arena_bytes >= plan.lower_bound_bytes
    for _ in range(2):  # planned calls, twice: arena reuse between calls
        got = model.run(feeds)
        assert list(got) == list(expected)
        for k in expected:
            np.testing.assert_allclose(got[k], expected[k], rtol=1e-5, atol=1e-6)
    unplanned = plain.run(feeds)
    got2 = plain.run(feeds)  # the unoptimized model's planned path too
    for k in expected:
        np.testing.assert_allclose(got2[k], unplanned[k], rtol=1e-6, atol=1e-7)


def test_inplace_chain_uses_two_buffers() -> None:
    b = GraphBuilder("chain")
    x = b.input("x", F32, (4, 64))
    h = b.op("MatMul", x, b.const(np.eye(64, dtype=F32)))
    for op in ("Relu", "Neg", "Abs", "Sigmoid", "Tanh"):
        h = b.op(op, h)
    b.output(b.op("MatMul", h, b.const(np.eye(64, dtype=F32))), "y")
    model = tfrt_py.load(b.build(), optimize=False)
    plan = model.memory_plan({"x": (4, 64)})
    assert plan.n_inplace == 5
    assert plan.arena_bytes == plan.lower_bound_bytes == 4 * 64 * 4


@compiled_only
def test_a_kernel_written_in_place_gets_its_input_as_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arena hands an in-place kernel the very view object of its input (same offset,
    shape and dtype: one view), so ``out is x`` -- no address test per call."""
    from tfrt_py.kernels.reduce import softmax

    seen: list[bool] = []
    real = softmax._jit_out

    def spy(x: np.ndarray, out: Any, short: bool) -> Any:
        seen.append(out is x)
        return real(x, out, short)

    monkeypatch.setattr(softmax, "_jit_out", spy)
    b = GraphBuilder("inplace")
    x = b.input("x", F32, (4, 200))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.eye(200, dtype=F32))))
    b.output(b.op("MatMul", b.op("Softmax", h), b.const(np.eye(200, dtype=F32))), "y")
    model = tfrt_py.load(b.build(), executor="sync", optimize=False)
    x_val = np.random.default_rng(0).standard_normal((4, 200)).astype(F32)
    want = np.exp(np.maximum(x_val, 0))
    want /= want.sum(axis=1, keepdims=True)
    for _ in range(3):
        np.testing.assert_allclose(model.run({"x": x_val})["y"], want, rtol=1e-5)
    assert model.memory_plan({"x": (4, 200)}).n_inplace >= 1
    assert seen and seen[-1] is True


def test_views_keep_their_buffer_alive() -> None:
    """Reshape returns a view of its input's arena buffer; that buffer must not be reused
    while the view is still read."""
    b = GraphBuilder("alias")
    x = b.input("x", F32, (2, 8))
    h = b.op("Relu", b.op("MatMul", x, b.const(np.eye(8, dtype=F32))))  # arena buffer
    view = b.op("Reshape", h, b.const(np.array([4, 4], np.int64)))  # a view of it
    junk = b.op("Tanh", b.op("Neg", b.op("Abs", x)))  # would reuse h's buffer if dead
    junk2 = b.op("Reshape", b.op("Sigmoid", junk), b.const(np.array([4, 4], np.int64)))
    b.output(b.op("Add", view, junk2), "y")
    graph = b.build()
    x_val = np.random.default_rng(0).standard_normal((2, 8)).astype(F32)
    expected = tfrt_py.load(graph, optimize=False).run({"x": x_val})["y"]
    model = tfrt_py.load(graph)
    for _ in range(3):
        np.testing.assert_allclose(model.run({"x": x_val})["y"], expected, rtol=1e-6)


def test_transformer_block_arena_near_lower_bound() -> None:
    case = build("transformer_erf")
    model = tfrt_py.load(case.model, executor="sync")
    for batch in (1, 4):
        plan = model.memory_plan({"x": (batch, 8, 16)})
        _assert_no_live_overlap(plan.buffers)
        assert plan.arena_bytes <= 1.10 * plan.lower_bound_bytes, plan.summary()


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSIC_CNNS)
def test_classic_cnn_arena_near_lower_bound(name: str) -> None:
    model = tfrt_py.load(str(LIGHT_DIR / f"light_{name}.onnx"), executor="sync")
    shape = tuple(d if isinstance(d, int) else 1 for d in model.inputs[0].shape or ())
    plan = model.memory_plan({model.inputs[0].name: shape})
    _assert_no_live_overlap(plan.buffers)
    assert plan.arena_bytes <= 1.10 * plan.lower_bound_bytes, plan.summary()


def _concat_graph(batch: int, reread: bool, axis: int = 1) -> Any:
    """Two MatMul+Relu branches (arena values) joined by a Concat, then a Neg."""
    b = GraphBuilder("join")
    x = b.input("x", F32, (batch, 3, 8))
    rng = np.random.default_rng(1)
    w1 = b.const(rng.standard_normal((8, 8)).astype(F32))
    w2 = b.const(rng.standard_normal((8, 8)).astype(F32))
    h1 = b.op("Relu", b.op("MatMul", x, w1))
    h2 = b.op("Sigmoid", b.op("MatMul", x, w2))
    joined = b.op("Concat", h1, h2, axis=axis)
    y = b.op("Neg", joined)
    if reread:  # h1 read after the Concat too: it cannot be a slice of it
        y = b.op("Add", y, b.op("Concat", h1, h1, axis=axis))
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize(
    ("batch", "reread", "axis", "joined"),
    [
        (1, False, 1, 1),  # one image's channels: the branches write into the Concat
        (1, False, 2, 0),  # the last axis of a (1, 3, ...) array: slices not contiguous
        (2, False, 1, 0),  # two images: each branch's slice is not contiguous
        (1, True, 1, 0),  # a branch read again later; Concat(h1, h1) twice the same
    ],
)
def test_concat_inputs_written_into_its_output(
    batch: int, reread: bool, axis: int, joined: int
) -> None:
    graph = _concat_graph(batch, reread, axis)
    x = np.random.default_rng(0).standard_normal((batch, 3, 8)).astype(F32)
    want = tfrt_py.load(graph, optimize=False).run({"x": x})["y"]  # the probe: no plan
    model = tfrt_py.load(graph, executor="sync")
    for _ in range(3):  # planned calls reuse the arena
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-6)
    plan = model.memory_plan({"x": (batch, 3, 8)})
    assert plan.n_joined == joined, plan.summary()
    _assert_no_live_overlap(plan.buffers)
