"""The native tier's boxes of dims (issue 32, item 2; ``native/lower/generic.py``): one
compiled function serves every signature whose dims lie in a box, and a box whose code is
not one function of the dims declines to one function per signature."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tfrt_py
from tfrt_py.executors.dims import DimVars
from tfrt_py.ir import Graph, GraphBuilder
from tfrt_py.native.lower import generic
from tfrt_py.native.lower.generic import AXIS_ALL, box_of, monomial_exponents, samples
from tfrt_py.native.lower.source import Declined

F32 = np.float32
RNG = np.random.default_rng(32)


def _attention_like() -> Graph:
    """Scores over the sequence (B, S, S), a softmax over them, their product with the
    values, a LayerNorm-like mean over the features: what a text model does with S."""
    b = GraphBuilder("att")
    x = b.input("x", F32, ("B", "S", 8))
    q = b.op("MatMul", x, b.const(RNG.standard_normal((8, 8)).astype(F32)))
    s = b.op("MatMul", q, b.op("Relu", b.op("Transpose", x, perm=[0, 2, 1])))
    p = b.op("Softmax", b.op("Tanh", s), axis=-1)  # (a Tanh: no attention fusion)
    y = b.op("MatMul", p, x)
    b.output(b.op("ReduceMax", y, axes=[-1], keepdims=0), "m")
    b.output(b.op("Softmax", y, axis=1), "y")  # over the sequence: a strided axis
    return b.build()


def _check(native: tfrt_py.Model, sync: tfrt_py.Model, feeds: dict[str, np.ndarray]) -> None:
    got, want = native.run(feeds), sync.run(feeds)
    for k in want:
        assert got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-6, err_msg=k)


@pytest.mark.compiles
def test_one_function_serves_every_signature_of_a_box() -> None:
    g = _attention_like()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    tier = native.native
    assert tier.form == "signature"
    for _ in range(30):
        b, s = int(RNG.integers(1, 4)), int(RNG.integers(17, 129))
        _check(native, sync, {"x": RNG.standard_normal((b, s, 8)).astype(F32)})
    # batch 1, and batch 2..16, each with sequence 17..128: two functions, not one per pair
    assert set(tier.sigs) == {("box", ((0, 1), (16, 128))), ("box", ((1, 16), (16, 128)))}
    assert all(j.lowered is not None and j.lowered.mode == "box" for j in tier.sigs.values())
    assert len(tier._natives) == 2
    text = native.describe()
    assert "B=1, S in 17..128" in text and "B in 2..16, S in 17..128" in text


@pytest.mark.compiles
def test_a_box_function_refuses_shapes_outside_its_box() -> None:
    """Called straight with a signature of another box, the function raises (it checks
    its dims against the box before it touches an element), and the tier still answers
    that signature correctly through its own box."""
    g = _attention_like()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    _check(native, sync, {"x": RNG.standard_normal((1, 12, 8)).astype(F32)})
    job = native.native.job((1, 12, 8))
    assert job is not None and job.compiled is not None and job.lowered is not None
    with pytest.raises(ValueError, match="wrong shape"):
        job.compiled.fn(np.zeros((1, 17, 8), F32), *job.lowered.params)
    _check(native, sync, {"x": RNG.standard_normal((1, 17, 8)).astype(F32)})
    assert len(native.native.sigs) == 2


def _causal_mask_from_shape() -> Graph:
    """A (S, S) mask made from the feed's shape (Trilu of ConstantOfShape): folded into a
    constant per signature, whose layout is no prefix of the largest's."""
    b = GraphBuilder("causal")
    x = b.input("x", F32, (1, "S"))
    n = b.op("Gather", b.op("Shape", x), b.const(np.array([1], np.int64)), axis=0)
    square = b.op("Concat", n, n, axis=0)
    ones = b.op("ConstantOfShape", square, value=np.array([1.0], F32))
    mask = b.op("Trilu", ones, upper=0)
    b.output(b.op("MatMul", x, mask), "y")
    return b.build()


def _shrinking_buffer() -> Graph:
    """A buffer that shrinks as the dim grows: ``z[:, S:]`` of a fixed-size feed."""
    b = GraphBuilder("shrink")
    x = b.input("x", F32, (1, "S"))
    z = b.input("z", F32, (1, 40))
    start = b.op("Gather", b.op("Shape", x), b.const(np.array([1], np.int64)), axis=0)
    tail = b.op("Slice", b.op("Relu", z), start, b.const(np.array([40], np.int64)),
                b.const(np.array([1], np.int64)))  # fmt: skip
    b.output(b.op("Concat", b.op("Relu", x), b.op("Tanh", tail), axis=1), "y")
    return b.build()


@pytest.mark.parametrize(
    ("build", "why"),
    [
        # (the mask differs inside the box: as constants, or on a host whose panel width
        # divides the top's width only, as the product's form; kept as code it declines)
        (_causal_mask_from_shape, "kept as code: Trilu"),
        (_shrinking_buffer, "arena buffer is bigger"),
    ],
    ids=["constant", "arena"],
)
@pytest.mark.compiles
def test_a_box_that_is_not_one_function_declines_to_signatures(build: object, why: str) -> None:
    g = build()  # type: ignore[operator]
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    tier = native.native
    for s in (2, 13, 2, 16):
        feeds = {"x": RNG.standard_normal((1, s)).astype(F32)}
        if len(g.inputs) > 1:
            feeds["z"] = RNG.standard_normal((1, 40)).astype(F32)
        _check(native, sync, feeds)
    box = ("box", ((1, 16),))
    assert tier.sigs[box].state == "failed" and why in (tier.sigs[box].error or "")
    # its signatures then compiled one by one, and served natively
    assert {(1, 2), (1, 13), (1, 16)} <= {k if len(g.inputs) == 1 else k[0]
                                          for k in tier.sigs if k != box}  # fmt: skip
    assert "declined" in native.describe()


def _relative_positions() -> Graph:
    """What a T5 computes from its length alone: Range over S, the (S, S) table of
    distances, clipped at S - 1 (a scalar of the shape, read as data), a ConstantOfShape
    fill, all int64 until a Cast: folded per signature, a table that is no prefix of the
    largest one's."""
    b = GraphBuilder("relative")
    x = b.input("x", F32, (1, "S"))
    i64 = lambda *v: b.const(np.array(v, np.int64))  # noqa: E731
    n = b.op("Gather", b.op("Shape", x), i64(1), axis=0)
    r = b.op("Range", b.op("Squeeze", n, i64(0)), b.op("Squeeze", b.op("Mul", n, i64(2)), i64(0)),
             b.const(np.array(1, np.int64)))  # fmt: skip
    rel = b.op("Sub", b.op("Unsqueeze", r, i64(0)), b.op("Unsqueeze", r, i64(1)))
    far = b.op("Min", b.op("Abs", rel), b.op("Sub", n, i64(3)))
    fill = b.op("ConstantOfShape", b.op("Concat", n, n, axis=0), value=np.array([2], np.int64))
    table = b.op("Cast", b.op("Add", b.op("Neg", far), fill), to=1)
    b.output(b.op("MatMul", x, table), "y")
    return b.build()


def test_length_arithmetic_becomes_code_in_a_box() -> None:
    """A box whose folded position tables change with the length is lowered again with
    them as code (Range, integer arithmetic, ConstantOfShape, a scalar of the shape
    written by code): one function for the box, not one per length (it declined to
    signatures before)."""
    g = _relative_positions()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    for s in (2, 13, 16, 5, 9):
        _check(native, sync, {"x": RNG.standard_normal((1, s)).astype(F32)})
    box = ("box", ((1, 16),))
    job = native.native.sigs[box]
    assert job.state == "ready", job.error
    assert job.lowered is not None and job.lowered.mode == "box"
    assert set(native.native.sigs) == {box}  # no signature compiled alone


def test_a_value_folded_only_at_the_small_end_of_a_box_becomes_code() -> None:
    """Shape arithmetic is folded up to ``SHAPE_VALUE_MAX`` elements: a (S, 128) fill is
    code at the box's top (S = 1024) and was a constant at its small end, which packed a
    bigger constant than the top's plan had room for (BERT's token-type embeddings at
    batch 2..16 x sequence 17..128 declined to signatures so). Now one function."""
    b = GraphBuilder("fill")
    x = b.input("x", F32, (1, "S"))
    n = b.op("Gather", b.op("Shape", x), b.const(np.array([1], np.int64)), axis=0)
    width = b.const(np.array([128], np.int64))
    ones = b.op("ConstantOfShape", b.op("Concat", n, width, axis=0), value=np.array([1.0], F32))
    b.output(b.op("MatMul", b.op("Tanh", x), ones), "y")
    g = b.build()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    for s in (1000, 129, 700):
        _check(native, sync, {"x": RNG.standard_normal((1, s)).astype(F32)})
    box = ("box", ((128, 1024),))
    assert set(native.native.sigs) == {box}
    assert native.native.sigs[box].state == "ready", native.native.sigs[box].error


def test_a_strided_lane_reduction_reads_the_right_elements() -> None:
    """A softmax over a strided axis whose length is a multiple of 4: the reduction's
    four lanes read ``x[(j + k) * stride]`` (they read ``x[j + k * stride]``: wrong
    answers, before and after boxes, at static shapes too)."""
    for shape in ((8, 4), (12, 3)):
        b = GraphBuilder("strided")
        x = b.input("x", F32, shape)
        b.output(b.op("Softmax", x, axis=0), "y")
        g = b.build()
        native = tfrt_py.load(g, executor="native", native="eager")
        sync = tfrt_py.load(g, executor="sync")
        assert native.native.form == "static"
        _check(native, sync, {"x": RNG.standard_normal(shape).astype(F32)})


def test_a_reduction_whose_axes_the_opset_ignores_declines() -> None:
    """ReduceMax with an axes *input* before opset 18: the kernel ignores it and reduces
    everything; the lowering read it and wrote a (2, 3) result into the () output, past
    its end (a heap corruption). It now declines: the model runs on the interpreter."""
    from tfrt_py.native.lower.graph import lower
    from tfrt_py.native.lower.source import Declined

    b = GraphBuilder("axes_input")
    x = b.input("x", F32, (2, 3, 4))
    b.output(b.op("ReduceMax", x, b.const(np.array([-1], np.int64)), keepdims=0), "m")
    g = b.build()
    sync = tfrt_py.load(g, executor="sync")
    assert sync.run({"x": np.ones((2, 3, 4), F32)})["m"].shape == ()
    prepared = sync.prepared
    with pytest.raises(Declined, match="does not give"):
        lower(prepared.graph, prepared.program)


def test_boxes_and_their_samples() -> None:
    assert box_of((0, 1, 2, 16, 17, 128, 129, 1024, 1025)) == (
        (-1, 0), (0, 1), (1, 16), (1, 16), (16, 128), (16, 128), (128, 1024), (128, 1024),
        (1024, 8192))  # fmt: skip
    wide = (64, 128)
    vals = sorted({p[0] for p in samples((wide,))})
    assert {65, 66, 127, 128} <= set(vals)
    assert {v % 16 for v in vals} == set(range(16))  # every residue: n % 4 choices differ
    assert samples(((1, 16),))[0] == (16,)  # the top first: the arena is laid out there
    assert len(samples(((1, 16),))) == 15 <= AXIS_ALL  # a narrow box: every value
    grid = samples(((1, 16), (64, 128)))
    assert {(2, 65), (16, 128), (2, 128), (16, 65)} <= set(grid)
    assert (0, 0) in monomial_exponents(((1, 16), (64, 128)))
    assert (1, 2) in monomial_exponents(((1, 16), (64, 128)))  # batch x length x length
    assert all(sum(e) <= 3 for e in monomial_exponents(((1, 16), (64, 128))))
    with pytest.raises(tfrt_py.errors.TfrtError, match="dims vary"):
        samples(((1, 16), (16, 128), (128, 1024)))


def test_the_arena_check_stays_bounded_for_a_big_box() -> None:
    """A buffer that shrinks as a dim grows is checked at every point of the box; two dims
    of 1025..8192 are 51 million points, which the check refuses instead of evaluating
    (it built the whole grid: gigabytes, for a request's dims)."""
    box = ((1024, 8192), (1024, 8192))
    points = samples(box)
    exps = monomial_exponents(box)

    class Low:  # what the check reads of a sample's lowering
        def __init__(self, n: int) -> None:
            self.arena = (("f4", n, 0, 1),)

    lows = [Low(1 << 20) for _ in points]  # constant: grows with nothing, passes at once
    generic._check_arena(lows, box, exps, generic._design(points, exps))  # type: ignore[arg-type]
    lows = [Low(40_000 - p[0] - p[1]) for p in points]  # shrinks as the dims grow
    with pytest.raises(Declined, match="too big to check"):
        generic._check_arena(lows, box, exps, generic._design(points, exps))  # type: ignore[arg-type]


def test_a_box_lowering_stops_when_the_process_exits() -> None:
    g = _attention_like()
    prepared = tfrt_py.load(g, executor="sync").prepared
    dims = DimVars.of([v.type.shape for v in prepared.graph.inputs])  # type: ignore[union-attr]
    assert dims is not None
    with pytest.raises(Declined, match="exiting"):
        generic.lower_box(prepared.graph, prepared.program, dims, ((0, 1), (16, 128)),
                          stop=lambda: True)  # fmt: skip


def _grown() -> Graph:
    """A KV cache's step: ``present = Concat(past, Relu(new) * 2)``, ``past`` of any length."""
    b = GraphBuilder("grown")
    past = b.input("past", F32, (1, "P", 4))
    new = b.input("new", F32, (1, 1, 4))
    b.output(b.op("Concat", past, b.op("Mul", b.op("Relu", new), b.const(np.array(2.0, F32))),
                  axis=1), "present")  # fmt: skip
    return b.build()


@pytest.mark.compiles
def test_a_new_signature_in_a_compiled_box_skips_the_checked_path() -> None:
    """Each call a new length (a cache fed back): once its box is compiled and chosen, a
    signature never seen goes from the entry to the box's function (``NativeTier.boxes``)
    without the feed checker or a new table entry, fed-back outputs included (their dtype
    objects are numba's, equal to NumPy's but not the same object); a feed the box's
    function refuses still gets the checker's InputError, and the model stays usable."""
    native = tfrt_py.load(_grown(), executor="native", native="eager")
    tier = native.native
    new = np.array([[[1.0, -2.0, 3.0, -4.0]]], F32)
    past = RNG.standard_normal((1, 17, 4)).astype(F32)
    out = native.run({"past": past, "new": new})["present"]  # compiles the box 17..128
    assert list(tier.boxes) == [((16, 128),)]
    seen = len(tier.table)
    for _ in range(20):
        want = np.concatenate([out, np.maximum(new, 0) * 2], axis=1)
        # an equal dtype that is another object, as a cached numba function's outputs carry
        fed = out.view(pickle.loads(pickle.dumps(np.dtype(F32))))
        out = native.run({"past": fed, "new": new})["present"]
        np.testing.assert_array_equal(out, want)
    assert out.shape == (1, 38, 4) and len(tier.table) == seen
    with pytest.raises(tfrt_py.errors.InputError):
        native.run({"past": out, "new": np.zeros((1, 2, 4), F32)})
    with pytest.raises(tfrt_py.errors.InputError):
        native.run({"past": np.zeros((1, 40, 5), F32), "new": new})
    np.testing.assert_array_equal(native.run({"past": out, "new": new})["present"][:, :38], out)
