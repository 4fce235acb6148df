"""A KV cache written in place by native code (``native/lower/cache.py``): a decoder step
whose presents are ``Concat(past, new)`` takes each present's buffer and writes only the
new positions there; a past that is the buffer's prefix is not copied; the results are
onnxruntime's whether the buffers are given or not; a buffer that overlaps a feed, is
too short, or holds the past elsewhere than at its start is refused or copied as
``run(outputs=)`` promises; grouped KV heads (each present tiled for its query heads)
read the buffer in place too; a present read by any other op keeps the copying form."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.models.decoder import VOCAB, decoder
from tfrt_py.errors import InputError
from tfrt_py.ir import GraphBuilder
from tfrt_py.native.lower.cache import cache_pairs
from tfrt_py.native.runtime import tier as tier_module

LAYERS, KV, HEAD = 2, 4, 8
CAP = 40  # positions in each cache buffer
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module", params=[KV, 2], ids=["heads", "grouped"])
def onnx_bytes(request: pytest.FixtureRequest) -> bytes:
    """KV heads as many as the query heads, or 2 (each tiled for 2 query heads)."""
    return decoder(layers=LAYERS, kv_heads=request.param, head_dim=HEAD).SerializeToString()


def _kv(model: tfrt_py.Model) -> int:
    return int(model.inputs[-1].shape[1])  # type: ignore[index, arg-type]


@pytest.fixture(scope="module")
def model(onnx_bytes: bytes) -> tfrt_py.Model:
    return tfrt_py.load(onnx_bytes, executor="native", native="eager")


@pytest.fixture(scope="module")
def session(onnx_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])


def _cache_names() -> list[tuple[str, str]]:
    return [(f"past_key_values.{i}.{p}", f"present.{i}.{p}") for i in range(LAYERS)
            for p in ("key", "value")]  # fmt: skip


def _feeds(past: int, kv: int) -> dict[str, Any]:
    f: dict[str, Any] = {
        "input_ids": RNG.integers(0, VOCAB, (1, 1)).astype(np.int64),
        "attention_mask": np.ones((1, past + 1), np.int64),
        "position_ids": np.array([[past]], np.int64),
    }
    for name, _ in _cache_names():
        f[name] = RNG.standard_normal((1, kv, past, HEAD)).astype(np.float32)
    return f


def _in_buffers(feeds: dict[str, Any], past: int, rows: int = 1) -> tuple[
        dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """The feeds with each past the prefix of a buffer of CAP positions and ``rows`` batch
    rows (NaN after the feed's), the output buffers (each present that buffer's first
    past + 1 positions of the feed's rows), and the buffers."""
    fed, outs, bufs = dict(feeds), {}, {}
    for past_name, present in _cache_names():
        b = np.full((rows, feeds[past_name].shape[1], CAP, HEAD), np.nan, np.float32)
        n = len(feeds[past_name])
        b[:n, :, :past] = feeds[past_name]
        fed[past_name] = b[:n, :, :past]
        outs[present] = b[:n, :, : past + 1]
        bufs[present] = b
    return fed, outs, bufs


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets an item for each call of the output-buffer checker (the tier's
    checked path; a step on the cache path never calls it)."""
    checked: list[int] = []
    real = tier_module.check_output_buffers

    def counted(*a: Any, **k: Any) -> Any:
        checked.append(1)
        return real(*a, **k)

    monkeypatch.setattr(tier_module, "check_output_buffers", counted)
    return checked


def _check(got: dict[str, Any], want: list[np.ndarray], session: ort.InferenceSession) -> None:
    for out, w in zip(session.get_outputs(), want):
        np.testing.assert_allclose(np.asarray(got[out.name]), w, rtol=1e-4, atol=1e-5,
                                   err_msg=out.name)  # fmt: skip


def test_the_pairs_are_found_and_another_reader_keeps_the_copy(onnx_bytes: bytes) -> None:
    m = tfrt_py.load(onnx_bytes, executor="native")
    graph = m.native.graph
    pairs = cache_pairs(graph)
    names = [(graph.inputs[k].name, graph.outputs[j].name) for k, j in pairs]
    assert names == _cache_names()
    assert m.runtime.writes_concat_in_place
    b = GraphBuilder("doubled")
    past = b.input("past", np.float32, (1, 2, "P", 4))
    new = b.input("new", np.float32, (1, 2, 1, 4))
    present = b.op("Concat", past, new, axis=2)
    b.output(present, "present")
    b.output(b.op("Mul", present, b.const(np.array(2.0, np.float32))), "doubled")
    other = tfrt_py.load(b.build(), executor="native")
    assert cache_pairs(other.native.graph) == ()  # Mul reads the present as flat data
    assert not other.runtime.writes_concat_in_place


@pytest.mark.compiles
def test_a_step_writes_only_its_new_rows_into_the_buffers(
    model: tfrt_py.Model, session: ort.InferenceSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 20 (the box 17..128): the presents returned are the caller's views, the
    positions after the new one still hold their NaN, the past's are unchanged, and the
    call took the cache path (no output-buffer checker) once compiled."""
    feeds = _feeds(20, _kv(model))
    want = session.run(None, feeds)
    model.run(feeds)  # compiles the box (eager) and decides it
    fed, outs, bufs = _in_buffers(feeds, 20)
    checked = _count_checks(monkeypatch)
    for _ in range(3):  # the same step again: it writes the same new row
        got = model.run(fed, outputs=outs)
    _check(got, want, session)
    assert checked == []
    assert any(j.lowered is not None and j.lowered.caches for j in model.native.sigs.values())
    for past_name, present in _cache_names():
        assert got[present] is outs[present]
        b = bufs[present]
        np.testing.assert_array_equal(b[:, :, :20], feeds[past_name])
        assert np.isnan(b[:, :, 21:]).all()


@pytest.mark.compiles
def test_a_step_with_its_caches_compiles_its_layer_once(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    """The step's layers are one function called once per layer (``lower/outline.py``),
    with the caches' take-up (``cache.cache_prologue``) left in ``run``, and compute
    onnxruntime's step."""
    feeds = _feeds(20, _kv(model))
    _check(model.run(feeds), session.run(None, feeds), session)
    texts = [pathlib.Path(j.compiled.path).read_text() for j in model.native.sigs.values()
             if j.compiled is not None and j.lowered is not None and j.lowered.caches]  # fmt: skip
    assert texts, model.describe()
    for text in texts:
        assert "copy_past_f4(" in text and "def run_layer0(" in text
        assert text.count("run_layer0(") == 1 + LAYERS


@pytest.mark.compiles
def test_a_buffer_with_more_rows_than_the_step_is_written_in_place(
    model: tfrt_py.Model, session: ort.InferenceSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served batch keeps one buffer for every row it may seat (``serving/gen_cache.py``)
    and steps with its first rows: the step still takes the cache path and writes only
    its own rows' new positions."""
    feeds = _feeds(20, _kv(model))
    want = session.run(None, feeds)
    model.run(feeds)
    fed, outs, bufs = _in_buffers(feeds, 20, rows=3)
    checked = _count_checks(monkeypatch)
    got = model.run(fed, outputs=outs)
    _check(got, want, session)
    assert checked == []
    for _, present in _cache_names():
        assert got[present] is outs[present]
        assert np.isnan(bufs[present][1:]).all() and np.isnan(bufs[present][:1, :, 21:]).all()


def test_without_buffers_the_presents_are_made_apart(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    feeds = _feeds(33, _kv(model))
    got = model.run(feeds)
    _check(got, session.run(None, feeds), session)
    assert all(got[p].shape == (1, _kv(model), 34, HEAD) for _, p in _cache_names())
    np.testing.assert_array_equal(got["present.0.key"][:, :, :33], feeds["past_key_values.0.key"])


def test_a_past_apart_from_its_buffer_is_copied_in(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    feeds = _feeds(25, _kv(model))
    want = session.run(None, feeds)
    _, outs, bufs = _in_buffers(feeds, 25)
    for b in bufs.values():
        b[:] = np.nan  # the buffers hold nothing: the feeds are separate arrays
    got = model.run(feeds, outputs=outs)
    _check(got, want, session)
    for past_name, present in _cache_names():
        np.testing.assert_array_equal(bufs[present][:, :, :25], feeds[past_name])
        assert np.isnan(bufs[present][:, :, 26:]).all()


def test_bad_buffers_are_refused_and_the_model_stays_usable(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    feeds = _feeds(22, _kv(model))
    want = session.run(None, feeds)
    fed, outs, bufs = _in_buffers(feeds, 22)
    shifted = dict(fed)  # the past two positions into its buffer, overlapping the present
    b = bufs["present.0.key"]
    b[:, :, 2:24] = feeds["past_key_values.0.key"]
    shifted["past_key_values.0.key"] = b[:, :, 2:24]
    with pytest.raises(InputError, match="shares memory"):
        model.run(shifted, outputs=outs)
    short = dict(outs)
    short["present.1.value"] = np.empty((1, _kv(model), 5, HEAD), np.float32)
    with pytest.raises(InputError, match=r"present\.1\.value"):
        model.run(fed, outputs=short)
    ids = dict(fed)  # another feed inside a cache buffer
    ids["input_ids"] = bufs["present.1.key"].view(np.int64)[:1, :1, 5, :1].reshape(1, 1)
    with pytest.raises(InputError, match="shares memory"):
        model.run(ids, outputs=outs)
    fed, outs, _ = _in_buffers(feeds, 22)
    _check(model.run(fed, outputs=outs), want, session)


@pytest.mark.parametrize("layout", ["contiguous", "prefix", "transposed", "reversed", "empty"])
def test_a_past_of_any_layout_is_copied_into_its_buffer(layout: str) -> None:
    """``copy_past_f4``: the past's rows as runs where its last stride is one element, the
    element-wise loop for other strides; the positions after the past are left alone."""
    from tfrt_py.native.kernels.rowdot import copy_past_f4

    r = RNG.random
    past = {
        "contiguous": lambda: r((1, 4, 50, 8), np.float32),
        "prefix": lambda: r((2, 4, 60, 8), np.float32)[:, :, :50],
        "transposed": lambda: r((1, 4, 8, 50), np.float32).transpose(0, 1, 3, 2),
        "reversed": lambda: r((1, 4, 50, 8), np.float32)[:, ::-1],
        "empty": lambda: np.zeros((1, 4, 0, 8), np.float32),
    }[layout]()
    buf = np.full((*past.shape[:2], past.shape[2] + 3, past.shape[3]), np.nan, np.float32)
    copy_past_f4(past, buf)
    np.testing.assert_array_equal(buf[:, :, : past.shape[2]], past)
    assert np.isnan(buf[:, :, past.shape[2] :]).all()
