"""The native tier sums where onnxruntime sums the same way: a product over at most
``emit.CHAIN_K`` terms is one chain of fused multiply-adds from zero at any width (MLAS's
order), and ReduceSumSquare/ReduceL2 round each square before adding it (no contraction into
a fused multiply-add); the interpreter's ReduceSumSquare/ReduceL2 add in order too. So a
model that subtracts large, nearly equal sums -- a GaussianMixture's log-densities -- gives
onnxruntime's probabilities, not ones 1e-3 away."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.native.lower import emit

pytestmark = pytest.mark.skipif(
    gemm_packed.kernel() is None, reason="needs numba and an AVX2/FMA (or aarch64) host"
)

F = TensorProto.FLOAT
BATCHES = (1, 37, 1000)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)


def _model(nodes: list[Any], inits: dict[str, np.ndarray], width: int, out: str) -> bytes:
    graph = helper.make_graph(
        nodes, "order", [helper.make_tensor_value_info("X", F, ["N", width])],
        [helper.make_tensor_value_info(out, F, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _both(data: bytes, x: np.ndarray, executor: str = "native") -> tuple[np.ndarray, np.ndarray]:
    model = tfrt_py.load(data, executor=executor, native="eager")
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = np.asarray(next(iter(model.run({"X": x}).values())))
    return got, sess.run(None, {"X": x})[0]


def _rows(n: int, width: int, seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, width)) * scale).astype(np.float32)


@pytest.mark.parametrize("k, n", [(20, 20), (64, 10), (7, 3), (10, 8), (10, 9), (128, 33)])
@pytest.mark.compiles
def test_products_of_a_few_terms_are_onnxruntimes_bits(k: int, n: int) -> None:
    """At any width; one row's product at most ``emit.REGISTER_N`` wide sums in scalars,
    unless it is the packed kernel's (a width that is half a panel or more: ``avx2``'s
    16-wide panels take N = 8)."""
    rng = np.random.default_rng(k * 1000 + n)
    w = (rng.standard_normal((k, n)) * 4).astype(np.float32)
    b = (rng.standard_normal(n) * 50).astype(np.float32)
    gemm = _model([helper.make_node("Gemm", ["X", "W", "B"], ["Y"])], {"W": w, "B": b}, k, "Y")
    matmul = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], {"W": w}, k, "Y")
    source = tfrt_py.load(matmul, executor="native", native="eager").native.lowered.source
    in_scalars = re.search(rf"\w+a{n - 1} \+= ", source) is not None
    assert in_scalars == (n <= emit.REGISTER_N and "sgemm_packed(" not in source)
    for data in (gemm, matmul):
        for i, rows in enumerate(BATCHES):
            got, want = _both(data, _rows(rows, k, i))
            np.testing.assert_array_equal(got, want, err_msg=f"K={k} N={n} batch {rows}")


@pytest.mark.parametrize("executor", ["native", "sync"])
@pytest.mark.parametrize("op", ["ReduceSumSquare", "ReduceL2"])
@pytest.mark.parametrize("width", [20, 67])
@pytest.mark.compiles
def test_squares_are_rounded_before_they_are_summed(op: str, width: int, executor: str) -> None:
    """On the native tier and in the interpreter (which summed pairwise)."""
    node = helper.make_node(op, ["X"], ["Y"], axes=[1], keepdims=1)
    data = _model([node], {}, width, "Y")
    for i, rows in enumerate(BATCHES):
        got, want = _both(data, _rows(rows, width, i, scale=100.0), executor)
        np.testing.assert_array_equal(got, want, err_msg=f"{op} width {width} batch {rows}")


def _mixture(components: int, width: int, seed: int) -> bytes:
    """skl2onnx's GaussianMixture graph (full covariances): per component a Gemm by the
    precision's Cholesky factor, ReduceSumSquare, then the weights and log-determinants
    added, ReduceLogSumExp and Exp: the log-densities are -0.5 * sums of squares in the
    thousands, which the softmax then subtracts from each other."""
    rng = np.random.default_rng(seed)
    nodes, inits, sums = [], {}, []
    for c in range(components):
        inits[f"P{c}"] = (rng.standard_normal((width, width)) * 2).astype(np.float32)
        inits[f"M{c}"] = (rng.standard_normal(width) * 3).astype(np.float32)
        nodes += [helper.make_node("Gemm", ["X", f"P{c}", f"M{c}"], [f"Y{c}"]),
                  helper.make_node("ReduceSumSquare", [f"Y{c}"], [f"S{c}"], axes=[1])]  # fmt: skip
        sums.append(f"S{c}")
    inits["half"] = np.asarray([-0.5], np.float32)
    inits["logdet"] = (rng.standard_normal(components) * 10).astype(np.float32)
    nodes += [
        helper.make_node("Concat", sums, ["S"], axis=1),
        helper.make_node("Mul", ["S", "half"], ["H"]),
        helper.make_node("Add", ["H", "logdet"], ["L"]),
        helper.make_node("ReduceLogSumExp", ["L"], ["Z"], axes=[1]),
        helper.make_node("Sub", ["L", "Z"], ["D"]),
        helper.make_node("Exp", ["D"], ["probabilities"]),
    ]
    return _model(nodes, inits, width, "probabilities")


@pytest.mark.parametrize("executor", ["native", "sync"])
@pytest.mark.compiles
def test_a_gaussian_mixture_gives_onnxruntimes_probabilities(executor: str) -> None:
    data = _mixture(4, 20, 0)
    for i, rows in enumerate(BATCHES):
        got, want = _both(data, _rows(rows, 20, i), executor)
        big = want > 1e-3  # (exp's last bits differ by a few 1e-7 between libraries)
        assert big.any()
        np.testing.assert_allclose(got[big], want[big], rtol=1e-5, err_msg=f"batch {rows}")


@pytest.mark.compiles
def test_exponentials_are_libms_in_a_vectorized_loop() -> None:
    """float32 Exp and ReduceLogSumExp's exponentials go through ``fastmath.expf_rn`` (no
    libm call per element): the correctly rounded values libm's ``expf`` gives, so a
    GaussianMixture's probabilities stay onnxruntime's."""
    data = _model([helper.make_node("Exp", ["X"], ["E"]),
                   helper.make_node("ReduceLogSumExp", ["E"], ["L"], axes=[1], keepdims=1),
                   helper.make_node("Sub", ["E", "L"], ["Y"])], {}, 6, "Y")  # fmt: skip
    model = tfrt_py.load(data, executor="native", native="eager")
    assert model.native is not None and model.native.state == "ready", model.describe()
    assert model.native.lowered.source.count("expf_rn(") >= 2
    x = _rows(1000, 6, 9, scale=2.0)
    got = np.asarray(model.run({"X": x})["Y"])
    e = np.exp(x.astype(np.float64)).astype(np.float32)
    mx = e.max(axis=1, keepdims=True)
    s = np.exp((e - mx).astype(np.float64)).astype(np.float32).sum(axis=1, keepdims=True,
                                                                    dtype=np.float32)  # fmt: skip
    want = e - (np.log(s) + mx)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    exp_only = _model([helper.make_node("Exp", ["X"], ["Y"])], {}, 6, "Y")
    got_e = tfrt_py.load(exp_only, executor="native", native="eager").run({"X": x})["Y"]
    np.testing.assert_array_equal(got_e, e)


@pytest.mark.parametrize("executor", ["native", "sync"])
def test_squares_are_onnxruntimes_products(executor: str) -> None:
    """Pow by a constant 2 is ``x * x``, as onnxruntime computes it (libm's ``powf``
    differs in the last bit for ~1 float in 1,000): alone, and as a GaussianNB squares
    (a difference, squared, scaled)."""
    rng = np.random.default_rng(2)
    two = np.array(2.0, np.float32)
    c = (rng.standard_normal(20) * 3).astype(np.float32)
    alone = _model([helper.make_node("Pow", ["X", "E"], ["Y"])], {"E": two}, 20, "Y")
    scaled = _model([helper.make_node("Sub", ["X", "C"], ["D"]),
                     helper.make_node("Pow", ["D", "E"], ["P"]),
                     helper.make_node("Mul", ["P", "H"], ["Y"])],
                    {"C": c, "E": two, "H": np.array(0.5, np.float32)}, 20, "Y")  # fmt: skip
    x = _rows(5000, 20, 3, scale=10.0)
    for data in (alone, scaled):
        got, want = _both(data, x, executor)
        np.testing.assert_array_equal(got, want)
