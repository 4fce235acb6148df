"""The transformer zoo's small models (tests/data/transformers, written by
``python benchmarks/zoo_transformers.py --write-test-files tests/data/transformers``: BERT,
DistilBERT, GPT-2, T5 encoder at hidden 32 exported by torch.onnx's TorchScript and dynamo
exporters, and onnxruntime-optimized ones with com.microsoft ops) agree with onnxruntime on
every executor, the second and third calls changing batch and sequence length. No torch
needed: the files and onnxruntime's outputs at export time are committed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnx
import pytest

import tfrt_py
from tests.support.paths import DATA as TEST_DATA
from tfrt_py.native.lower.generic import describe_box

DATA = str(TEST_DATA / "transformers")
with open(os.path.join(DATA, "manifest.json"), encoding="utf-8") as _f:
    MANIFEST = json.load(_f)
SHAPES = [tuple(s) for s in MANIFEST["shapes"]]
RTOL, ATOL = 1e-4, 1e-4

# T5's relative-position buckets take log(0) and cast the -inf to int64 before a Where
# discards those lanes; NumPy warns about both (onnxruntime is silent). The values agree.
_T5_WARNINGS = [
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]


def _params() -> list[Any]:
    return [
        pytest.param(name, id=name, marks=_T5_WARNINGS if info["arch"] == "t5" else [])
        for name, info in sorted(MANIFEST["models"].items())
    ]


def _reference(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(DATA, f"{name}.npz")) as z:
        return {k: z[k] for k in z.files}


def _feeds(ref: dict[str, np.ndarray], b: int, s: int) -> dict[str, np.ndarray]:
    return {n: ref[f"{b}x{s}/{n}"] for n in ("input_ids", "attention_mask")}


def test_every_variant_was_made() -> None:
    """The manifest records a failed export instead of a model; none failed at this size."""
    assert MANIFEST["failed"] == {}
    assert len(MANIFEST["models"]) >= 12


@pytest.mark.parametrize("name", _params())
@pytest.mark.parametrize("executor", ["auto", "sync", "async"])
def test_agrees_with_onnxruntime(name: str, executor: str) -> None:
    ref = _reference(name)
    model = tfrt_py.load(os.path.join(DATA, f"{name}.onnx"), executor=executor)
    for b, s in [*SHAPES, SHAPES[0]]:  # later calls change batch and sequence
        got = model.run(_feeds(ref, b, s))["last_hidden_state"]
        want = ref[f"{b}x{s}/last_hidden_state"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{b}x{s}")


@pytest.mark.parametrize("name", _params())
def test_matches_the_installed_onnxruntime(name: str) -> None:
    """The committed outputs are still what onnxruntime computes (and so is tfrt_py)."""
    import onnxruntime as ort

    path = os.path.join(DATA, f"{name}.onnx")
    ref = _reference(name)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    b, s = SHAPES[-1]
    feeds = _feeds(ref, b, s)
    (want,) = sess.run(["last_hidden_state"], feeds)
    np.testing.assert_allclose(want, ref[f"{b}x{s}/last_hidden_state"], rtol=RTOL, atol=ATOL)
    got = tfrt_py.load(path).run(feeds)["last_hidden_state"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_optimized_variants_carry_the_contrib_ops() -> None:
    ops = {
        name: {
            f"{n.domain}:{n.op_type}"
            for n in onnx.load(os.path.join(DATA, f"{name}.onnx")).graph.node
        }
        for name in ("bert-ort", "bert-ortsession", "gpt2-ort", "t5-encoder-ort")
    }
    ms = "com.microsoft:"
    assert {ms + o for o in ("Attention", "EmbedLayerNormalization", "SkipLayerNormalization",
                             "BiasGelu")} <= ops["bert-ort"]  # fmt: skip
    assert ms + "FusedMatMul" in ops["bert-ortsession"]
    assert {ms + "FastGelu", ms + "SkipLayerNormalization"} <= ops["gpt2-ort"]
    assert {ms + "SkipSimplifiedLayerNormalization", ":SimplifiedLayerNormalization"} <= ops[
        "t5-encoder-ort"
    ]


#: The variants the native tier lowers whole: all of them (their shape arithmetic folded
#: per signature; LayerNorm/RMSNorm, the masks' logic, stacked MatMul, Split, GELU,
#: GatherND and onnxruntime's fused norms, GELUs, FusedMatMul, EmbedLayerNormalization and
#: Attention lowered).
NATIVE = tuple(MANIFEST["models"])


def _compiled_job(model: Any, feeds: dict[str, np.ndarray]) -> Any:
    """Call with ``feeds`` until the native tier's compile for their signature is ready:
    its box of dims, or (the box declined) the signature alone, which starts on the call
    after the decline. The job."""
    key = tuple(feeds[n].shape for n in ("input_ids", "attention_mask"))
    for _ in range(3):
        model.run(feeds)
        assert model.native.wait(timeout=300)
        job = model.native.job(key)
        if job is not None and job.state == "ready":
            return job
    raise AssertionError(f"no native code for {key}: {model.native.describe()}")


@pytest.mark.slow  # a numba compile per model and box of dims, ~8-20 s each
@pytest.mark.parametrize("name", [p for p in _params() if p.values[0] in NATIVE])
def test_native_tier_agrees_with_onnxruntime(name: str) -> None:
    """The whole model as numba functions, one per box of dims (or per input signature
    where a box declines): each signature's compiled answer (awaited: the interpreter
    serves while it compiles) agrees with onnxruntime, and ``describe()`` lists what
    serves it."""
    ref = _reference(name)
    model = tfrt_py.load(os.path.join(DATA, f"{name}.onnx"), executor="native")
    assert model.native is not None and model.native.form == "signature"
    # every signature for the TorchScript exports; one for the others (a compile each)
    shapes = SHAPES if name in ("bert", "distilbert", "gpt2", "t5-encoder") else SHAPES[:1]
    for b, s in shapes:
        feeds = _feeds(ref, b, s)
        job = _compiled_job(model, feeds)
        got = model.run(feeds)["last_hidden_state"]
        want = ref[f"{b}x{s}/last_hidden_state"]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{b}x{s}")
        box = job.lowered.box
        if box:  # one function for the box: the signature lies in it
            assert all(lo < v <= hi for v, (lo, hi) in zip((b, s), box)), (box, b, s)
            label = describe_box(box, model.native.dims.names)
        else:
            label = f"(({b}, {s}), ({b}, {s}))"
        assert label in model.native.describe(), model.describe()
    assert model.native.error is None
