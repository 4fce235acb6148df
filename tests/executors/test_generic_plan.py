"""One plan for every signature (issue 32): a model with dynamic dims whose shapes the load-
time shape model describes gets one layout and one generated program for every batch,
sequence and past length; a new signature runs no probe, makes no plan and generates no
code; the first signature of each dim bucket is checked against a plain run, and a model
whose formulas fail that check falls back to plans per signature, still right."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.paths import DATA as TEST_DATA
from tests.support.spies import record_calls
from tfrt_py.compiler.shape_model import fit_shape_model
from tfrt_py.errors import ExecutionError, InputError
from tfrt_py.executors import interpreter as interp_mod
from tfrt_py.executors import plan_generic
from tfrt_py.executors.dims import MAX_DIM, DimVars, Fitted, ShapeModel, bucket_of
from tfrt_py.executors.program import Program
from tfrt_py.ir import GraphBuilder

F32 = np.float32
DATA = TEST_DATA / "transformers"


def _attention_graph() -> object:
    """A one-head self-attention block over (batch, seq, 16) with a residual and a mask
    added from a (batch, seq) input: products, a transpose, a softmax, broadcasting."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("attn")
    x = b.input("x", F32, ("batch", "seq", 16))
    m = b.input("mask", F32, ("batch", "seq"))
    q = b.op("MatMul", x, b.const(rng.standard_normal((16, 16)).astype(F32) / 4))
    k = b.op("MatMul", x, b.const(rng.standard_normal((16, 16)).astype(F32) / 4))
    v = b.op("MatMul", x, b.const(rng.standard_normal((16, 16)).astype(F32) / 4))
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 2, 1]))
    keep = b.op("Sub", b.const(np.ones((), F32)), m)
    bias = b.op(
        "Unsqueeze", b.op("Mul", keep, b.const(np.array(-1e4, F32))), b.const(np.array([1]))
    )
    p = b.op("Softmax", b.op("Add", s, bias), axis=-1)
    y = b.op("Add", b.op("MatMul", p, v), x)
    b.output(b.op("Relu", y), "y")
    return b.build()


def _feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), F32)
    mask[0, seq - seq // 4 :] = 0
    return {"x": rng.standard_normal((batch, seq, 16)).astype(F32), "mask": mask}


def _plain_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per run of the program outside a plan: a per-signature probe
    (``run_env``) or a bucket's check (``Program.run_shapes``)."""
    runs = record_calls(monkeypatch, interp_mod, "run_env", lambda *a: 1)
    monkeypatch.setattr(Program, "run_shapes", _counted(Program.run_shapes, runs))
    return runs


def _counted(fn: Any, runs: list[int]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return fn(*args, **kwargs)

    return wrapper


def _reference(graph: object, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return tfrt_py.load(graph, executor="async").run(feeds)


def test_one_plan_serves_every_length_and_batch() -> None:
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync")
    rt = model.runtime
    assert rt._generic is not None, rt.generic_note  # type: ignore[attr-defined]
    for batch, seq in [(1, 5), (1, 9), (3, 9), (2, 17), (1, 1), (4, 33), (1, 9), (2, 6)]:
        feeds = _feeds(batch, seq, seed=seq)
        got, want = model.run(feeds), _reference(g, feeds)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    assert rt.plans() == []  # type: ignore[attr-defined]  # no plan per signature was made
    text = model.describe()
    assert "one plan for every signature of the dims (batch, seq)" in text
    assert "7 made" in text  # seven distinct signatures, each an instance of the one plan


def test_a_new_signature_runs_no_probe_and_generates_no_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After its bucket was checked, a new length costs the formulas only: the program is
    not run the plain way and no code is generated."""
    model = tfrt_py.load(_attention_graph(), executor="sync")
    model.run(_feeds(1, 9))  # bucket (1, 16): checked by one plain run
    plain_runs = _plain_runs(monkeypatch)
    generated = record_calls(monkeypatch, interp_mod, "generate", lambda *a: 1)
    for seq in range(9, 17):  # every other length of the bucket
        feeds = _feeds(1, seq, seed=seq)
        got = model.run(feeds)
        np.testing.assert_allclose(got["y"], _reference(_attention_graph(), feeds)["y"],
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
    assert plain_runs == [] and generated == []
    model.run(_feeds(1, 40))  # a new bucket (1, 64): its first signature is checked
    assert plain_runs == [1]


def test_the_transformer_zoo_bert_matches_onnxruntime_at_every_length() -> None:
    path = str(DATA / "bert.onnx")
    model = tfrt_py.load(path, executor="sync")
    assert model.runtime._generic is not None, model.runtime.generic_note  # type: ignore[attr-defined]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq in [(1, 8), (1, 13), (2, 13), (1, 31), (3, 7), (1, 64), (1, 13)]:
        ids = rng.integers(0, 100, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[0, seq // 2 :] = 0
        feeds = {"input_ids": ids, "attention_mask": mask}
        got = model.run(feeds)["last_hidden_state"]
        (want,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _t5_feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq - seq // 3 :] = 0
    return {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
            "attention_mask": mask}  # fmt: skip


_T5_WARNINGS = (  # T5's position buckets take log(0) and cast its -inf, as exported
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
)


@_T5_WARNINGS[0]
@_T5_WARNINGS[1]
def test_baked_values_are_shared_by_signatures_with_the_same_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """T5's relative-position table is baked per signature and depends on the length
    alone: new batches at a known length reuse it, and the instances no longer each hold
    a copy (a T5 at random shapes evicted instances by bytes and made them again)."""
    path = str(DATA / "t5-encoder.onnx")
    model = tfrt_py.load(path, executor="sync")
    generic = model.runtime._generic  # type: ignore[attr-defined]
    assert generic is not None and generic._bake_run, model.runtime.generic_note  # type: ignore[attr-defined]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)

    def check(batch: int, seq: int) -> None:
        feeds = _t5_feeds(rng, batch, seq)
        (want,) = sess.run(None, feeds)
        got = model.run(feeds)["last_hidden_state"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    for batch in (1, 2, 3, 4, 5):
        check(batch, 9)
        check(batch, 20)
    by_part: dict[int, list[int]] = {}
    for key, ran in generic._ran.items():
        by_part.setdefault(key[0], []).append(sum(v.nbytes for v in ran))
    table = max(by_part, key=lambda n: max(by_part[n]))  # the part with the biggest results
    assert len(by_part[table]) == 2  # one per length, whatever the batch
    assert max(inst.held for inst in generic.insts.values()) < max(by_part[table])


@_T5_WARNINGS[0]
@_T5_WARNINGS[1]
def test_shared_baked_values_and_instances_are_forgotten_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan_generic, "MAX_INSTANCE_BYTES", 1)  # every new table overflows
    path = str(DATA / "t5-encoder.onnx")
    model = tfrt_py.load(path, executor="sync")
    generic = model.runtime._generic  # type: ignore[attr-defined]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, seq in [(1, 9), (2, 9), (1, 20), (2, 20), (1, 9), (3, 33)]:
        feeds = _t5_feeds(rng, batch, seq)
        (want,) = sess.run(None, feeds)
        np.testing.assert_allclose(model.run(feeds)["last_hidden_state"], want,
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        assert len(generic._ran) <= 1 and len(generic.insts) <= 2


def _clamped_graph() -> object:
    """y = x[:, :min(seq, 6)] * 2: the output's length is min(seq, 6), which is seq at
    every probe point (2, 3, 4, 5) and not beyond: a formula that fails its check later."""
    b = GraphBuilder("clamp")
    x = b.input("x", F32, (1, "seq"))
    s = b.op("Slice", x, b.const(np.array([0])), b.const(np.array([6])), b.const(np.array([1])))
    b.output(b.op("Mul", s, b.const(np.array(2.0, F32))), "y")
    return b.build()


def test_formulas_that_fail_their_check_retire_the_plan_and_answers_stay_right() -> None:
    model = tfrt_py.load(_clamped_graph(), executor="sync")
    rt = model.runtime
    assert rt._generic is not None  # type: ignore[attr-defined]
    x3 = np.arange(3, dtype=F32)[None]
    np.testing.assert_array_equal(model.run({"x": x3})["y"], x3 * 2)
    x9 = np.arange(9, dtype=F32)[None]
    np.testing.assert_array_equal(model.run({"x": x9})["y"], x9[:, :6] * 2)  # new bucket
    assert rt._generic is None  # type: ignore[attr-defined]
    assert "retired at a call: the shape of node" in model.describe()
    for n in (9, 3, 12, 1):  # plans per signature from now on, every answer right
        x = np.arange(n, dtype=F32)[None]
        np.testing.assert_array_equal(model.run({"x": x})["y"], x[:, :6] * 2)


def test_a_buckets_check_keeps_shapes_not_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call of a bucket frees each activation after its last reader and keeps
    its shape (on a big batch, keeping them all touched hundreds of MB of fresh pages):
    the check still sees every shape, and the values its formulas give."""
    from tfrt_py.executors.program import Shaped

    envs = record_calls(monkeypatch, plan_generic.GenericPlan, "verify", lambda _s, _i, e: e)
    model = tfrt_py.load(_attention_graph(), executor="sync")
    rt = model.runtime
    generic = rt._generic  # type: ignore[attr-defined]
    feeds = _feeds(2, 9)
    np.testing.assert_allclose(
        model.run(feeds)["y"], _reference(_attention_graph(), feeds)["y"], rtol=1e-5, atol=1e-5
    )
    (env,) = envs
    assert generic.verified  # the check passed
    shaped = [s for s in generic.model.shapes if isinstance(env[s], Shaped)]
    assert shaped  # activations were let go, their shapes kept
    assert {env[s].shape for s in shaped} >= {(2, 9, 16), (2, 9, 9)}  # projections, scores
    assert not any(isinstance(env[s], Shaped) for s in generic.model.values)
    for s in rt._program.output_slots:  # type: ignore[attr-defined]
        assert isinstance(env[s], np.ndarray)


def test_memory_plan_is_the_buckets_and_fits_every_signature_in_it() -> None:
    model = tfrt_py.load(_attention_graph(), executor="sync")
    a = model.memory_plan({"x": (2, 9, 16), "mask": (2, 9)})
    b = model.memory_plan({"x": (2, 16, 16), "mask": (2, 16)})
    assert a.arena_bytes == b.arena_bytes  # one bucket (2, 16): one placement
    assert b.lower_bound_bytes <= b.arena_bytes and a.lower_bound_bytes < b.lower_bound_bytes
    for plan in (a, b):  # no two buffers live at once overlap in memory
        for i, p in enumerate(plan.buffers):
            for q in plan.buffers[i + 1 :]:
                assert not (p.overlaps_in_time(q) and p.overlaps_in_memory(q))


def test_threads_with_different_lengths_at_once_get_their_own_answers() -> None:
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync")
    cases = [_feeds(1 + i % 3, 3 + 5 * i, seed=i) for i in range(8)]
    wants = [_reference(g, f)["y"] for f in cases]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for r in range(30):
                i = (k + r) % len(cases)
                np.testing.assert_allclose(model.run(cases[i])["y"], wants[i], rtol=1e-5,
                                           atol=1e-5)  # fmt: skip
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_new_signature_of_a_checked_bucket_stays_on_the_fast_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new length in a checked bucket is adopted by the generated entry itself (the
    instance made and published there): the slow path -- the feeds checked again, the
    answer finished apart -- is not taken. Feeds whose shapes break a static dim, a rank
    or the symbols' relations still get the slow path's InputError, also in a checked
    bucket, and the model keeps answering."""
    slow = record_calls(monkeypatch, interp_mod.SyncInterpreter, "_slow", lambda *a: 1)
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync")
    model.run(_feeds(1, 9))  # bucket (1, 16): checked by the slow path
    assert len(slow) == 1
    for seq in range(10, 17):
        feeds = _feeds(1, seq, seed=seq)
        np.testing.assert_allclose(model.run(feeds)["y"], _reference(g, feeds)["y"],
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
    assert len(slow) == 1
    bad = [
        {"x": np.ones((1, 12, 15), F32), "mask": np.ones((1, 12), F32)},  # static 16
        {"x": np.ones((1, 12, 16, 1), F32), "mask": np.ones((1, 12), F32)},  # rank
        {"x": np.ones((1, 12, 16), F32), "mask": np.ones((1, 13), F32)},  # seq differs
    ]
    for feeds in bad:
        with pytest.raises(InputError):
            model.run(feeds)
    assert len(slow) == 1 + len(bad)
    feeds = _feeds(1, 14, seed=2)
    np.testing.assert_allclose(model.run(feeds)["y"], _reference(g, feeds)["y"],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_caller_buffers_deadlines_and_bad_feeds_on_the_generic_plan() -> None:
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync", timeout=30)
    feeds = _feeds(2, 11)
    want = _reference(g, feeds)["y"]
    out = np.empty_like(want)
    got = model.run(feeds, outputs={"y": out})  # run_call: the deadline's entry
    assert got["y"] is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="buffer is"):
        model.run(feeds, outputs={"y": np.empty((2, 10, 16), F32)})
    with pytest.raises(InputError, match="'seq'"):  # lengths that disagree between inputs
        model.run({"x": feeds["x"], "mask": np.ones((2, 12), F32)})
    np.testing.assert_allclose(model.run(feeds)["y"], want, rtol=1e-5, atol=1e-5)


def test_instances_are_bounded_and_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_generic, "MAX_INSTANCES", 3)
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync")
    for seq in list(range(2, 12)) * 2:
        feeds = _feeds(1, seq, seed=seq)
        np.testing.assert_allclose(model.run(feeds)["y"], _reference(g, feeds)["y"],
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
    assert len(model.runtime._generic.insts) <= 3  # type: ignore[attr-defined]


def test_a_full_instance_table_forgets_its_older_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the table is full the oldest signatures go, the newest stay served (a full
    clear made every signature of current traffic new again)."""
    monkeypatch.setattr(plan_generic, "MAX_INSTANCES", 4)
    g = _attention_graph()
    model = tfrt_py.load(g, executor="sync")
    generic = model.runtime._generic  # type: ignore[attr-defined]
    for seq in range(2, 7):  # five signatures through a table of four
        model.run(_feeds(1, seq, seed=seq))
    kept = sorted(shape[0][1] for shape in generic.insts)  # the x feeds' seq
    assert kept == [4, 5, 6], kept
    made = generic.made
    model.run(_feeds(1, 5, seed=1))  # still served: no instance made again
    assert generic.made == made


def test_a_kernel_error_on_the_generic_plan_names_the_node() -> None:
    b = GraphBuilder("gather")
    x = b.input("x", F32, ("n", 4))
    i = b.input("i", np.int64, ("n",))
    b.output(b.op("Gather", x, i, axis=0), "y")
    model = tfrt_py.load(b.build(), executor="sync")
    xv = np.ones((3, 4), F32)
    np.testing.assert_array_equal(model.run({"x": xv, "i": np.array([0, 2, 1])})["y"], xv)
    with pytest.raises(ExecutionError, match="Gather"):
        model.run({"x": xv, "i": np.array([0, 7, 1])})
    np.testing.assert_array_equal(model.run({"x": xv, "i": np.array([2, 2, 2])})["y"], xv)


def test_dim_variables_follow_the_declared_symbols() -> None:
    dv = DimVars.of([("batch", "seq"), ("batch", 4, "past", 8), ("batch", "past + seq"), (None,)])
    assert dv is not None
    assert dv.names == ("batch", "seq", "past", "?3.0")
    assert dv.values([(2, 3), (2, 4, 5, 8), (2, 8), (7,)]) == (2, 3, 5, 7)
    assert dv.values([(2, 3), (2, 4, 5, 8), (2, 9), (7,)]) is None  # past + seq broken
    # a sum naming a symbol that never stands alone is a variable of its own
    dv2 = DimVars.of([("n", "total + 1")])
    assert dv2 is not None and dv2.names == ("n", "total + 1")
    assert bucket_of((0, 1, 3, 16, 17)) == (0, 1, 4, 16, 32)


def test_models_the_shape_model_cannot_fit_plan_per_signature() -> None:
    b = GraphBuilder("many")
    xs = [b.input(f"x{k}", F32, (f"d{k}",)) for k in range(5)]  # five variables: too many
    b.output(b.op("Concat", *xs, axis=0), "y")
    g = b.build()
    model = tfrt_py.load(g, executor="sync")
    assert model.runtime._generic is None  # type: ignore[attr-defined]
    assert "generic plan: not used: 5 dim variables" in model.describe()
    feeds = {f"x{k}": np.full(k + 1, k, F32) for k in range(5)}
    np.testing.assert_array_equal(model.run(feeds)["y"], np.concatenate(list(feeds.values())))
    fit = fit_shape_model(model.prepared.program, set(), set())
    assert fit.model is None and "5 dim variables" in fit.reason


def test_probes_that_measure_too_much_work_stop_the_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector resizes every image to a fixed size, so each probe is a whole inference
    (FCOS-R50's six: 2.8 s at every load): the first probe's measured work decides, the fit
    stops there, and the model plans per signature, still right."""
    from tfrt_py.compiler import shape_model

    fit = fit_shape_model(tfrt_py.load(_attention_graph(), executor="sync").prepared.program,
                          set(), set())  # fmt: skip
    assert fit.model is not None, fit.reason
    monkeypatch.setattr(shape_model, "FIT_MAX_FLOPS", 1e3)  # the attention's probes: ~1e4
    probes = record_calls(monkeypatch, shape_model, "_probe")
    model = tfrt_py.load(_attention_graph(), executor="sync")
    assert len(probes) == 1 and model.runtime._generic is None  # type: ignore[attr-defined]
    assert "its probes (measured:" in model.describe()
    feeds = _feeds(2, 7)
    np.testing.assert_allclose(model.run(feeds)["y"], _reference(_attention_graph(), feeds)["y"],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_float_shape_arithmetic_is_served_by_the_generic_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shape arithmetic that yields floats -- a scale of half the batch, a mask value of
    -3.4e38 -- is a formula too: a new signature is still served without a plain run
    (the evaluation once refused every signature of such a model: its values are neither
    whole numbers nor below the dims' bound)."""
    b = GraphBuilder("floats")
    x = b.input("x", F32, ("n", 4))
    n = b.op("Cast", b.op("Gather", b.op("Shape", x), b.const(np.array([0]))), to=1)
    half = b.op("Mul", n, b.const(np.array([0.5], F32)))
    floor = b.op("Add", n, b.const(np.array([-3.4e38], F32)))
    b.output(b.op("Max", b.op("Mul", x, half), floor), "y")
    model = tfrt_py.load(b.build(), executor="sync")
    rt = model.runtime
    model.run({"x": np.ones((5, 4), F32)})  # bucket (8,): checked
    plain = _plain_runs(monkeypatch)
    for rows in (6, 7, 8, 5):
        xv = np.arange(rows * 4, dtype=F32).reshape(rows, 4)
        np.testing.assert_allclose(model.run({"x": xv})["y"], xv * rows / 2, rtol=1e-6)
    assert plain == [] and rt._generic is not None  # type: ignore[attr-defined]
    assert rt._generic.made >= 4  # type: ignore[attr-defined]


def test_a_float_ratio_of_dims_is_computed_not_fitted() -> None:
    """A detector scales its boxes by ``float(height) / 320``: a float the formula's float64
    coefficients only approximate (at 480 the fitted value rounded to another float32 and
    retired the generic plan). Float values are run per signature, integers fitted: the
    plan serves every size, each exactly as NumPy's float32 division gives."""
    b = GraphBuilder("ratio")
    x = b.input("x", F32, (1, "h"))
    h = b.op("Cast", b.op("Gather", b.op("Shape", x), b.const(np.array([1]))), to=1)
    b.output(b.op("Mul", x, b.op("Div", h, b.const(np.array([320.0], F32)))), "y")
    model = tfrt_py.load(b.build(), executor="sync")
    rt = model.runtime
    for width in (320, 480, 600, 333, 517, 1000, 7, 481):
        got = model.run({"x": np.ones((1, width), F32)})["y"]
        np.testing.assert_array_equal(got, np.full((1, width), F32(width) / F32(320)))
    assert rt._generic is not None, rt.generic_note  # type: ignore[attr-defined]
    assert rt.plans() == []  # type: ignore[attr-defined]


def test_dim_relations_hold_exactly_at_huge_dims() -> None:
    """The relations are checked in one int64 product while the dims are small; a dim of
    2**31 or more (a zero-size feed may carry one) takes exact Python integers, so no
    wrap-around can make a broken relation look kept."""
    dv = DimVars.of([("a", "b"), ("a + b",), ("a - b",)])
    assert dv is not None
    assert dv.values([(3, 2), (5,), (1,)]) == (3, 2)
    assert dv.values([(3, 2), (6,), (1,)]) is None
    big = 1 << 62
    assert dv.values([(big, big - 1), (2 * big - 1,), (1,)]) == (big, big - 1)
    # in int64, big + big wraps to -2**63: the relation "a + b" must still be broken here
    assert dv.values([(big, big), (-(1 << 63),), (0,)]) is None
    assert dv.values([(3, 2, 1), (5,), (1,)]) is None  # a rank broken


def test_the_evaluation_rounds_only_what_may_be_fractional() -> None:
    """Rows with integer coefficients are whole at every signature and are not rounded
    (while a bound keeps them below ``MAX_DIM``); a row with a fractional coefficient
    (half a dim) must still come out whole, and a dim past the bound is refused."""
    dv = DimVars.of([("n",)])
    assert dv is not None
    coef = np.array([[3.0, 2.0], [0.0, 0.5]])  # 2n + 3 and n / 2
    whole = ShapeModel(dv, coef, {7: Fitted(0, 1)}, {8: Fitted(1, 1, (1,), np.int64)})
    np.testing.assert_array_equal(whole.evaluate((6,)), [15.0, 3.0])
    assert whole.evaluate((7,)) is None  # 3.5 is no integer value
    exact = ShapeModel(dv, coef[:1], {7: Fitted(0, 1)}, {})
    np.testing.assert_array_equal(exact.evaluate((7,)), [17.0])
    assert exact.evaluate((MAX_DIM // 2,)) is None  # 2n + 3 past the dims' bound
