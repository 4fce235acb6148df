"""Real models end to end: load with tfrt_py, run, and compare every output with
onnxruntime, on "auto" and on every executor (the ``executor`` fixture). The models are
built in ``tests/support/models`` (fixed seeds, nothing downloaded)."""

from __future__ import annotations

import copy
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.executors import load_on
from tests.support.models import MODELS, ModelCase, build
from tests.support.models.nn import DYNAMIC_BATCH_SIZES

CASE_NAMES = list(MODELS)


# -- references ---------------------------------------------------------------------------


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # the CI box is small and shared
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@functools.cache
def reference(name: str) -> tuple[dict[str, Any], ...]:
    """onnxruntime's outputs for every feed of case ``name``, by output name."""
    case = build(name)
    sess = ort_session(case.model)
    names = [o.name for o in sess.get_outputs()]
    return tuple(dict(zip(names, sess.run(None, feed))) for feed in case.feeds)


def assert_same_output(name: str, got: Any, want: Any, *, rtol: float, atol: float) -> None:
    """Tensors: same dtype and shape, ints/bools exactly, floats within rtol/atol.
    ZipMap outputs (onnxruntime gives a list of {label: probability}): same rows, same
    keys, values within rtol/atol."""
    if isinstance(want, list):
        rows = list(got)
        assert len(rows) == len(want), f"{name}: {len(rows)} rows, expected {len(want)}"
        for i, (row, ref_row) in enumerate(zip(rows, want)):
            row = dict(row)
            assert set(row) == set(ref_row), f"{name}[{i}]: keys {set(row)} != {set(ref_row)}"
            for key, value in ref_row.items():
                assert float(row[key]) == pytest.approx(value, rel=rtol, abs=atol), (
                    f"{name}[{i}][{key!r}]"
                )
        return
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def assert_matches_reference(case: ModelCase, index: int, got: dict[str, Any]) -> None:
    want = reference(case.name)[index]
    assert list(got) == list(want), "outputs missing, extra or out of model.outputs order"
    for out_name, ref in want.items():
        assert_same_output(out_name, got[out_name], ref, rtol=case.rtol, atol=case.atol)


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=CASE_NAMES)
def case(request: pytest.FixtureRequest) -> ModelCase:
    return build(request.param)


@pytest.fixture(scope="module")
def loaded(case: ModelCase) -> tfrt_py.Model:
    """The case's model on "auto", loaded once per module and shared by the tests (as a
    server would)."""
    return tfrt_py.load(case.model)


#: Models the native tier must run (the anchors and the MLP).
MUST_RUN_NATIVE = {"mlp", "anchor_m1", "anchor_m2", "anchor_m2b", "anchor_m3", "anchor_m4"}


@pytest.fixture(scope="module")
def on_executor(case: ModelCase, executor: str) -> tfrt_py.Model:
    """The case's model on the fixture's executor, loaded once and shared by the tests."""
    return load_on(executor, case.model, native_must_lower=case.name in MUST_RUN_NATIVE)


# -- every model --------------------------------------------------------------------------


def test_matches_onnxruntime(case: ModelCase, loaded: tfrt_py.Model) -> None:
    assert loaded.executor in ("sync", "async", "native")
    for i, feed in enumerate(case.feeds):
        assert_matches_reference(case, i, loaded.run(feed))


def test_every_executor_matches_onnxruntime(case: ModelCase, on_executor: tfrt_py.Model) -> None:
    for i, feed in enumerate(case.feeds):
        assert_matches_reference(case, i, on_executor.run(feed))


def _declared(vi: onnx.ValueInfoProto) -> tuple[np.dtype | None, list[int | str | None] | None]:
    """(dtype, dims) the ONNX graph declares; (None, None) for non-tensor types."""
    if not vi.type.HasField("tensor_type"):
        return None, None
    tt = vi.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
    if not tt.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or None)
    return dtype, dims


def _check_specs(specs: list[tfrt_py.TensorSpec], declared: list[onnx.ValueInfoProto]) -> None:
    assert [s.name for s in specs] == [vi.name for vi in declared]
    for spec, vi in zip(specs, declared):
        dtype, dims = _declared(vi)
        if dtype is None:  # sequence / map outputs (ZipMap): only the name is promised
            continue
        assert spec.dtype is not None and np.dtype(spec.dtype) == dtype, (
            f"{spec.name}: dtype {spec.dtype}, declared {dtype}"
        )
        if dims is None:
            continue
        assert spec.shape is not None, f"{spec.name}: rank lost, declared {dims}"
        assert len(spec.shape) == len(dims), f"{spec.name}: shape {spec.shape} vs {dims}"
        for got, want in zip(spec.shape, dims):
            if isinstance(want, int):
                assert got == want, f"{spec.name}: shape {spec.shape}, declared {dims}"
            else:
                assert got is None or isinstance(got, str), (
                    f"{spec.name}: dynamic dim reported as {got!r} in {spec.shape}"
                )


def test_input_output_specs(case: ModelCase, loaded: tfrt_py.Model) -> None:
    inits = {t.name for t in case.model.graph.initializer}
    _check_specs(loaded.inputs, [vi for vi in case.model.graph.input if vi.name not in inits])
    _check_specs(loaded.outputs, list(case.model.graph.output))


def test_calls_are_independent(case: ModelCase, on_executor: tfrt_py.Model) -> None:
    """Load once, call many times: feeds are never mutated, a returned output is never
    overwritten by a later call, the caller may scribble on what it got without affecting
    later calls, and the same feed gives bit-identical results."""
    loaded = on_executor
    feeds_before = copy.deepcopy(case.feeds)
    first = loaded.run(case.feeds[0])
    snapshot = copy.deepcopy(first)
    for feed in case.feeds[1:] + case.feeds[:1]:
        again = loaded.run(feed)
    for feed, before in zip(case.feeds, feeds_before):
        for k in feed:
            np.testing.assert_array_equal(feed[k], before[k], err_msg=f"feed {k!r} was mutated")
    for k, v in snapshot.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(first[k], v, err_msg=f"output {k!r} was overwritten")
            np.testing.assert_array_equal(again[k], v, err_msg=f"output {k!r} not reproducible")
            assert not np.shares_memory(first[k], again[k]), f"{k!r} shares a buffer"
    for v in again.values():  # the caller owns its outputs and may write into them
        if isinstance(v, np.ndarray) and v.size and v.flags.writeable:
            v[...] = 0 if v.dtype.kind in "biu" else np.nan
    assert_matches_reference(case, 0, loaded.run(case.feeds[0]))


def test_concurrent_calls(case: ModelCase, on_executor: tfrt_py.Model) -> None:
    """``run`` from several threads at once on one model gives each caller its own result."""
    jobs = [i for _ in range(3) for i in range(len(case.feeds))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: on_executor.run(case.feeds[i]), jobs))
    for i, got in zip(jobs, results):
        assert_matches_reference(case, i, got)


@pytest.mark.asyncio
async def test_run_async(case: ModelCase, on_executor: tfrt_py.Model) -> None:
    for i, feed in enumerate(case.feeds):
        assert_matches_reference(case, i, await on_executor.run_async(feed))


def test_describe(case: ModelCase, loaded: tfrt_py.Model) -> None:
    text = loaded.describe()
    assert isinstance(text, str)
    for spec in loaded.inputs + loaded.outputs:
        assert spec.name in text


# -- loading and executors ----------------------------------------------------------------


@pytest.mark.parametrize("source", ["path", "str_path", "bytes", "proto"])
def test_load_sources(case: ModelCase, source: str, tmp_path: Any, loaded: tfrt_py.Model) -> None:
    path = tmp_path / f"{case.name}.onnx"
    onnx.save(case.model, path)
    src: Any = {
        "path": path,
        "str_path": str(path),
        "bytes": path.read_bytes(),
        "proto": onnx.load(path),
    }[source]
    model = tfrt_py.load(src)
    assert [s.name for s in model.inputs] == [s.name for s in loaded.inputs]
    assert_matches_reference(case, 0, model.run(case.feeds[0]))


# -- dynamic batch ------------------------------------------------------------------------


def test_dynamic_batch_sizes_on_one_model(executor: str) -> None:
    """One loaded model serves batch 1, 3 and 17 in any order; the batch dim is dynamic in
    the specs and follows the feed in the outputs."""
    case = build("dynamic_batch")
    model = load_on(executor, case.model)
    assert model.inputs[0].shape is not None
    assert model.inputs[0].shape[0] in ("N", None)
    assert model.inputs[0].shape[1] == 10
    by_size = {int(f["x"].shape[0]): i for i, f in enumerate(case.feeds)}
    assert sorted(by_size) == sorted(DYNAMIC_BATCH_SIZES)
    for n in (17, 1, 3, 17, 1):
        i = by_size[n]
        got = model.run(case.feeds[i])
        assert got["probs"].shape == (n, 4)
        assert got["hidden"].shape == (n, 20)
        assert_matches_reference(case, i, got)
