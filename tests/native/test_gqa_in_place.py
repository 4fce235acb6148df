"""A GroupQueryAttention decoder's KV cache written in place by native code
(``native/lower/ops_gqa.py`` with ``cache.py``): the attention's presents grow its pasts,
so a step given each present's buffer, its past that buffer's prefix, writes only the new
positions (and the zeros after a shorter row) there; results are onnxruntime's, with
the queries, keys and values apart or packed in one input (the model builder's form)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.models.decoder import VOCAB, genai_decoder
from tfrt_py.native.lower.cache import cache_pairs

LAYERS, KV, HEAD = 2, 2, 16
CAP = 40  # positions in each cache buffer
NAMES = [(f"past_key_values.{i}.{p}", f"present.{i}.{p}") for i in range(LAYERS)
         for p in ("key", "value")]  # fmt: skip


@pytest.fixture(scope="module", params=[False, True], ids=["apart", "packed"])
def onnx_bytes(request: pytest.FixtureRequest) -> bytes:
    return genai_decoder(layers=LAYERS, kv_heads=KV, head_dim=HEAD,
                         packed=request.param).SerializeToString()  # fmt: skip


@pytest.fixture(scope="module")
def model(onnx_bytes: bytes) -> tfrt_py.Model:
    return tfrt_py.load(onnx_bytes, executor="native", native="eager")


@pytest.fixture(scope="module")
def session(onnx_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])


def _feeds(past: int, lengths: list[int], seed: int) -> dict[str, Any]:
    """A decode step of ``len(lengths)`` rows over a past of ``past`` positions; row ``b``
    holds ``lengths[b]`` tokens in all (right-padded: its mask ends in zeros)."""
    rng = np.random.default_rng(seed)
    b = len(lengths)
    mask = np.zeros((b, past + 1), np.int64)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    f: dict[str, Any] = {"input_ids": rng.integers(0, VOCAB, (b, 1)).astype(np.int64),
                         "attention_mask": mask}  # fmt: skip
    for name, _ in NAMES:
        f[name] = rng.standard_normal((b, KV, past, HEAD)).astype(np.float32)
    return f


def _in_buffers(feeds: dict[str, Any], past: int) -> tuple[dict[str, Any], dict[str, Any],
                                                          dict[str, np.ndarray]]:  # fmt: skip
    fed, outs, bufs = dict(feeds), {}, {}
    for past_name, present in NAMES:
        b = np.full((feeds[past_name].shape[0], KV, CAP, HEAD), np.nan, np.float32)
        b[:, :, :past] = feeds[past_name]
        fed[past_name] = b[:, :, :past]
        outs[present] = b[:, :, : past + 1]
        bufs[present] = b
    return fed, outs, bufs


def _check(got: dict[str, Any], feeds: dict[str, Any], session: ort.InferenceSession) -> None:
    for out, w in zip(session.get_outputs(), session.run(None, feeds)):
        np.testing.assert_allclose(np.asarray(got[out.name]), w, rtol=1e-4, atol=1e-5,
                                   err_msg=out.name)  # fmt: skip


def test_the_attentions_presents_are_cache_pairs(model: tfrt_py.Model) -> None:
    graph = model.native.graph
    pairs = [(graph.inputs[k].name, graph.outputs[j].name) for k, j in cache_pairs(graph)]
    assert pairs == NAMES
    assert model.runtime.writes_concat_in_place
    assert model.decoder().in_place


@pytest.mark.parametrize("lengths", [[21], [21, 21], [21, 14]], ids=["one", "even", "short"])
@pytest.mark.compiles
def test_a_step_writes_only_its_new_rows_into_the_buffers(
    model: tfrt_py.Model, session: ort.InferenceSession, lengths: list[int]
) -> None:
    """Past 20: onnxruntime's outputs; the presents are the caller's views; a full row's
    past is unchanged and its new row written at 20, a shorter row's new row at its own
    length with zeros after; nothing past the present is touched (NaN)."""
    feeds = _feeds(20, lengths, seed=len(lengths) * 10 + lengths[-1])
    model.run(feeds)  # compiles the box (eager)
    fed, outs, bufs = _in_buffers(feeds, 20)
    got = model.run(fed, outputs=outs)
    _check(got, feeds, session)
    assert any(j.lowered is not None and j.lowered.caches for j in model.native.sigs.values())
    for past_name, present in NAMES:
        assert got[present] is outs[present]
        b = bufs[present]
        for r, n in enumerate(lengths):
            np.testing.assert_array_equal(b[r, :, : n - 1], feeds[past_name][r, :, : n - 1])
            assert not np.isnan(b[r, :, n - 1]).any()
            assert (b[r, :, n:21] == 0).all()
        assert np.isnan(b[:, :, 21:]).all()


@pytest.mark.compiles
def test_a_past_apart_from_its_buffer_is_copied_in(
    model: tfrt_py.Model, session: ort.InferenceSession
) -> None:
    feeds = _feeds(25, [26], seed=3)
    _, outs, bufs = _in_buffers(feeds, 25)
    for b in bufs.values():
        b[:] = np.nan
    _check(model.run(feeds, outputs=outs), feeds, session)
    for past_name, present in NAMES:
        np.testing.assert_array_equal(bufs[present][:, :, :25], feeds[past_name])
