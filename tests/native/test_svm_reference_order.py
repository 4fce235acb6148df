"""An SVC's probabilities are onnxruntime's: its RBF distances summed in float32 over the
features in order with a correctly rounded ``exp``, its decision values summed in float64,
and libsvm's pairwise coupling in float32 in onnxruntime's order -- on the native tier and in
the interpreter. The coupling stops at a tolerance of 0.005 / classes, so its small
probabilities hang on the last bits of every step: in another order (float32 decision
sums, float64 coupling, a fused multiply-add where LLVM finds one) they came out 6e-5
relative from onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.native import available

F = TensorProto.FLOAT


def _svc(classes: int, per_class: int, width: int, seed: int) -> bytes:
    """A one-vs-one RBF SVC with probabilities, libsvm's layout, random but plausible."""
    rng = np.random.default_rng(seed)
    n_sv = classes * per_class
    n_pairs = classes * (classes - 1) // 2
    node = helper.make_node(
        "SVMClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
        classlabels_ints=list(range(classes)), kernel_type="RBF",
        kernel_params=[0.04, 0.0, 3.0], vectors_per_class=[per_class] * classes,
        support_vectors=(rng.standard_normal(n_sv * width) * 2).tolist(),
        coefficients=rng.uniform(-1, 1, (classes - 1) * n_sv).tolist(),
        rho=rng.uniform(-0.3, 0.3, n_pairs).tolist(),
        prob_a=rng.uniform(-6, -2, n_pairs).tolist(),
        prob_b=rng.uniform(-0.2, 0.2, n_pairs).tolist(),
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "svc", [helper.make_tensor_value_info("X", F, ["N", width])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, None),
         helper.make_tensor_value_info("probabilities", F, None)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


EXECUTORS = [
    "sync",
    pytest.param(
        "native", marks=pytest.mark.skipif(not available(), reason="numba is not installed")
    ),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("classes, per_class, width", [(3, 120, 20), (5, 40, 9), (2, 150, 30)])
def test_svc_probabilities_are_onnxruntimes(
    executor: str, classes: int, per_class: int, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if executor == "native":
        monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    data = _svc(classes, per_class, width, seed=classes * 100 + width)
    model = tfrt_py.load(data, executor=executor, native="eager")
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for n in (1, 300):
        x = (np.random.default_rng(n + width).standard_normal((n, width)) * 2).astype(np.float32)
        got = model.run({"X": x})
        want_label, want = sess.run(None, {"X": x})
        np.testing.assert_array_equal(got["label"], want_label)
        p = np.asarray(got["probabilities"])
        # the same bits but where a float32 rounding lands on the other side of a tie
        assert np.mean(p == want) > 0.5, (executor, n)
        np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-7)
