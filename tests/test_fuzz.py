"""Fuzzing the loader and the kernels: bad files give clear errors, random graphs agree.

* Truncations of real model files (every prefix of the small ones, a dense sample of the
  large one), random bytes, bit flips and byte mutations of valid models: ``tfrt_py.load``
  either succeeds -- and then the model runs and agrees with onnxruntime when onnxruntime
  runs it too -- or raises a tfrt_py error (``TfrtError``) with a message. Never another
  exception type (no AttributeError, IndexError, KeyError, RecursionError leaking out of
  the importer), never a hang: every load runs in a thread joined with a timeout.
* Random ONNX graphs made by hypothesis from a vocabulary of ops (elementwise unary and
  binary with broadcasting, MatMul/Gemm, Reshape/Transpose/Concat/Slice/Gather/Squeeze,
  reductions, Softmax, Where/Cast, If) with random shapes, dtypes and opsets: when
  onnxruntime runs the model, tfrt_py loads it and agrees on every executor (rtol 1e-4 /
  atol 1e-5 for floats, NaN where onnxruntime has NaN, infinities of the same sign, ints
  and bools exact). Some graphs are deliberately broken (an undefined input, mismatched
  shapes or dtypes, a duplicate output name, an unknown op): when onnx's checker rejects
  one, ``load`` raises a tfrt_py error.

Hypothesis runs derandomized (fixed examples, the same in CI as locally), with moderate
example counts: the machine is shared.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tfrt_py
from tests.support.fuzz_graphs import IR_VERSION, RandomModel, random_array, random_models
from tests.support.models.builders import FLOAT, tensor_info
from tests.support.models.control_flow import if_loop
from tfrt_py.errors import ExecutionError, InputError, ModelLoadError, TfrtError, UnsupportedOpError

# Mutated weights overflow: NumPy warns (an error under this suite's filter), ONNX gives inf.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

EXAMPLES = Path(tfrt_py.__file__).parent / "examples"
#: A load (or a run) taking longer than this is a hang.
TIMEOUT_S = 30.0
#: The executors every model runs on; "native" is skipped for models it refuses.
EXECUTORS = tuple(os.environ.get("FUZZ_EXECUTORS", "sync,async,native").split(","))


# -- guards ----------------------------------------------------------------------------------


def guarded(fn: Callable[[], Any], what: str, timeout: float = TIMEOUT_S) -> Any:
    """``fn()`` in a daemon thread joined with a timeout: a hang fails the test (naming
    ``what``) instead of stalling the suite. Exceptions are re-raised on this thread."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="fuzz-guard", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{what}: no answer after {timeout:.0f} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def load_or_error(source: Any, what: str, executor: str = "sync") -> tfrt_py.Model | None:
    """The loaded model, or None when ``load`` raised a tfrt_py error with a message.
    Any other exception fails the test with the input that triggered it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return guarded(lambda: tfrt_py.load(source, executor=executor), what)
    except TfrtError as e:
        assert len(str(e)) > 10, f"{what}: a tfrt_py error without a message: {e!r}"
        return None
    except Exception as e:
        raise AssertionError(
            f"{what}: load raised {type(e).__name__}, not a tfrt_py error: {e}"
        ) from e


# -- onnxruntime as the reference --------------------------------------------------------------

_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def ort_session(data: bytes) -> ort.InferenceSession | None:
    """An onnxruntime session (graph optimizations off: the spec's arithmetic), or None
    when onnxruntime refuses the model."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal: no reference
        return None


def feeds_for(sess: ort.InferenceSession, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Random feeds for the session's inputs (symbolic dims: 2), None for non-tensor inputs."""
    feeds: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        dt = _ORT_DTYPES.get(i.type)
        if dt is None:
            return None
        shape = tuple(d if isinstance(d, int) and d >= 0 else 2 for d in i.shape)
        if np.prod(shape, dtype=np.int64) > 1 << 20:
            return None
        feeds[i.name] = random_array(rng, np.dtype(dt), shape)
    return feeds


def assert_agree(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    """Same names; floats within rtol 1e-4/atol 1e-5 with NaN where the reference has NaN
    and infinities of the same sign; everything else exact."""
    assert list(got) == list(want), f"{what}: outputs {list(got)} != {list(want)}"
    for name, ref in want.items():
        out = np.asarray(got[name])
        ref = np.asarray(ref)
        msg = f"{what}: output {name!r}"
        assert out.shape == ref.shape, f"{msg}: shape {out.shape} != {ref.shape}"
        assert out.dtype == ref.dtype, f"{msg}: dtype {out.dtype} != {ref.dtype}"
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=msg)
        else:
            np.testing.assert_array_equal(out, ref, err_msg=msg)


def check_against_ort(data: bytes, what: str, seed: int = 0) -> int:
    """Load ``data`` on every executor; a model that loads must run (outputs or a tfrt_py
    error) and, when onnxruntime runs it, agree. Returns how many executors loaded it."""
    sess = guarded(lambda: ort_session(data), f"{what}: onnxruntime")
    feeds = None if sess is None else feeds_for(sess, np.random.default_rng(seed))
    want: dict[str, np.ndarray] | None = None
    if sess is not None and feeds is not None:
        try:
            outs = sess.run(None, feeds)
            want = {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), outs)}
        except Exception:  # noqa: BLE001 - onnxruntime fails at run time: no reference
            want = None
    loaded = 0
    for ex in EXECUTORS:
        try:
            model = load_or_error(data, f"{what} [{ex}]", ex)
        except AssertionError as e:
            if ex == "native" and isinstance(e.__cause__, ValueError):
                continue  # the native tier is not available here
            raise
        if model is None:
            if ex == "native":
                continue
            break  # a clear error: the other executors would give the same one
        loaded += 1
        if feeds is None:
            continue
        try:
            got = guarded(functools.partial(model.run, feeds), f"{what} [{ex}]: run")
        except (ExecutionError, InputError) as e:
            assert want is None, f"{what} [{ex}]: onnxruntime runs it, tfrt_py raised {e}"
            continue
        except TfrtError:
            raise
        except Exception as e:
            raise AssertionError(f"{what} [{ex}]: run raised {type(e).__name__}: {e}") from e
        if want is not None:
            assert_agree(got, want, f"{what} [{ex}]")
    return loaded


# -- real models -------------------------------------------------------------------------------


def _function_model() -> onnx.ModelProto:
    """A model-local function ``local.ScaledAct(x, w; alpha)`` = LeakyRelu(MatMul(x, w) *
    2, alpha), called twice with different alphas, one call nested in the other's input."""
    leaky = helper.make_node("LeakyRelu", ["scaled"], ["y"])
    leaky.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    fn = helper.make_function(
        "local",
        "ScaledAct",
        ["x", "w"],
        ["y"],
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Constant", [], ["two"], value_float=2.0),
            helper.make_node("Mul", ["xw", "two"], ["scaled"]),
            leaky,
        ],
        [helper.make_opsetid("", 17)],
        attributes=["alpha"],
    )
    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("ScaledAct", ["x", "w1"], ["h"], domain="local", alpha=0.1),
            helper.make_node("ScaledAct", ["h", "w2"], ["y"], domain="local", alpha=0.3),
        ],
        "function_model",
        [tensor_info("x", FLOAT, ["batch", 4])],
        [tensor_info("y", FLOAT, ["batch", 3])],
        initializer=[w1, w2],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        functions=[fn],
        ir_version=8,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _model_bytes(name: str) -> bytes:
    if name == "if_loop":
        return if_loop().model.SerializeToString()
    if name == "function":
        return _function_model().SerializeToString()
    return (EXAMPLES / f"{name}.onnx").read_bytes()


MODELS = ("mlp_small", "ads_normalize", "if_loop", "function")


@pytest.mark.parametrize("name", MODELS)
def test_valid_models_agree_with_onnxruntime(name: str) -> None:
    """The baseline of the fuzz tests below: every unmutated model loads and agrees."""
    assert check_against_ort(_model_bytes(name), name) >= 2


def _prefix_lengths(n: int) -> Iterator[int]:
    """Every prefix of a small file; of a large one every prefix near the start and end
    (the header and the graph's tail) and every 97th byte in between (weights)."""
    if n <= 16384:
        yield from range(n)
        return
    dense = set(range(4096)) | set(range(n - 4096, n)) | set(range(0, n, 97))
    yield from sorted(dense)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.compiles
def test_truncated_files(name: str) -> None:
    data = _model_bytes(name)
    parsed = 0
    for n in _prefix_lengths(len(data)):
        if load_or_error(data[:n], f"{name} truncated to {n} of {len(data)} bytes") is not None:
            parsed += 1
            check_against_ort(data[:n], f"{name} truncated to {n} bytes")
    # A protobuf cut between two fields parses; most cuts do not. Either way: no crash.
    assert parsed < len(data) // 10


def test_truncated_file_errors_name_the_file(tmp_path: Path) -> None:
    data = _model_bytes("ads_normalize")
    for n in (0, 1, 17, len(data) // 2, len(data) - 3):
        path = tmp_path / f"cut_{n}.onnx"
        path.write_bytes(data[:n])
        with pytest.raises(ModelLoadError) as info:
            tfrt_py.load(path)
        assert str(path) in str(info.value)
        assert "truncated" in str(info.value) or "empty" in str(info.value)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=512))
def test_random_bytes(data: bytes) -> None:
    load_or_error(data, f"random bytes {data[:40]!r}...")


_MUTATIONS = ("flip", "byte", "bytes", "insert", "delete", "splice")


def mutate(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """One random mutation of ``data`` and its description (for the failure message)."""
    b = bytearray(data)
    kind = rnd.choice(_MUTATIONS)
    p = rnd.randrange(len(b))
    if kind == "flip":
        bit = rnd.randrange(8)
        b[p] ^= 1 << bit
        return bytes(b), f"bit {bit} of byte {p} flipped"
    if kind == "byte":
        v = rnd.randrange(256)
        b[p] = v
        return bytes(b), f"byte {p} set to {v}"
    if kind == "bytes":
        changes = [(rnd.randrange(len(b)), rnd.randrange(256)) for _ in range(rnd.randint(2, 8))]
        for q, v in changes:
            b[q] = v
        return bytes(b), f"bytes set: {changes}"
    if kind == "insert":
        ins = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 4)))
        return bytes(b[:p] + ins + b[p:]), f"{ins!r} inserted at {p}"
    if kind == "delete":
        k = rnd.randint(1, 8)
        return bytes(b[:p] + b[p + k :]), f"{k} bytes deleted at {p}"
    q = rnd.randrange(len(b))
    k = rnd.randint(1, 64)
    return bytes(b[:p] + b[q : q + k] + b[p:]), f"bytes {q}:{q + k} copied to {p}"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.compiles
def test_mutated_files(name: str) -> None:
    """Seeded mutations of each model; the ones that still load must agree with
    onnxruntime when it runs them (a mutated weight changes both the same way)."""
    data = _model_bytes(name)
    rnd = random.Random(f"mutate-{name}")
    count = 250 if len(data) > 100_000 else 600
    loaded = 0
    for i in range(count):
        bad, how = mutate(data, rnd)
        what = f"{name} mutation {i} ({how})"
        if load_or_error(bad, what) is not None:
            loaded += check_against_ort(bad, what, seed=i)
    assert loaded > 0  # many mutations only change a weight: those must still agree


def test_invalid_utf8_names_are_a_load_error() -> None:
    """proto2 parses any bytes into a string field; the loader names the field."""
    data = bytearray(_model_bytes("ads_normalize"))
    at = data.index(b"Concat")
    data[at] = 0xFF
    with pytest.raises(ModelLoadError, match=r"op_type is not UTF-8"):
        tfrt_py.load(bytes(data))


@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.data())
def test_hypothesis_mutations(data: st.DataObject) -> None:
    """Hypothesis-driven byte edits of the small models (shrinks to a minimal edit)."""
    name = data.draw(st.sampled_from(["ads_normalize", "if_loop", "function"]))
    raw = bytearray(_model_bytes(name))
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), min_size=1, max_size=6
        )
    )
    for p, v in edits:
        raw[p] = v
    what = f"{name} with bytes set {edits}"
    if load_or_error(bytes(raw), what) is not None:
        check_against_ort(bytes(raw), what)


def _checker_error(model: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - checker and inference errors alike
        return f"{type(e).__name__}: {e}"
    return None


def run_random_model(case: RandomModel) -> None:
    model, feeds = case.model, case.feeds
    data = model.SerializeToString()
    rejected = _checker_error(model)
    opset = model.opset_import[0].version
    what = f"random model (broken: {case.broken}; opset {opset})\n{_text(model)}"
    if rejected is not None:
        assert case.broken is not None, f"{what}\nthe generator made an invalid model: {rejected}"
        for ex in ("sync", "async"):
            loaded = load_or_error(data, f"{what} [{ex}]", ex)
            if loaded is None:
                continue
            # Loaded: then the first call must fail with a tfrt_py error naming the node
            # (a shape conflict between constants that ONNX inference finds but no
            # load-time pass of tfrt_py evaluates).
            try:
                guarded(functools.partial(loaded.run, feeds), f"{what} [{ex}]: run")
            except TfrtError:
                continue
            except Exception as e:
                raise AssertionError(f"{what} [{ex}]: run raised {type(e).__name__}: {e}") from e
            raise AssertionError(
                f"{what} [{ex}]: onnx's checker rejects it ({rejected}), tfrt_py loads and runs it"
            )
        return
    sess = ort_session(data)
    want = None
    if sess is not None:
        try:
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        except Exception:  # noqa: BLE001 - no reference
            want = None
    for ex in EXECUTORS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = guarded(functools.partial(tfrt_py.load, data, executor=ex), f"{what} [{ex}]")
        except (ValueError, UnsupportedOpError) as e:
            if ex == "native":
                continue
            if want is None and isinstance(e, TfrtError):
                continue  # onnxruntime refuses it too
            raise AssertionError(f"{what} [{ex}]: onnxruntime runs it, load raised {e!r}") from e
        except Exception as e:  # the failure this module hunts for
            raise AssertionError(f"{what} [{ex}]: load raised {type(e).__name__}: {e}") from e
        try:
            got = guarded(functools.partial(m.run, feeds), f"{what} [{ex}]: run")
        except (ExecutionError, InputError) as e:
            assert want is None, f"{what} [{ex}]: onnxruntime runs it, tfrt_py raised {e}"
            continue
        if want is not None:
            agree_or_reference(got, want, model, feeds, f"{what} [{ex}]")


def agree_or_reference(
    got: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    what: str,
) -> None:
    """tfrt_py agrees with onnxruntime -- or, where they differ, with onnx's reference
    implementation (the spec in NumPy) while onnxruntime does not: onnxruntime 1.31 has
    its own answers for some empty tensors (a 0 batch dim broadcast against 1 gives 1, a
    keepdims=0 reduction over an empty axis keeps the axis, Gemm with K=0 drops beta)."""
    try:
        assert_agree(got, want, what)
    except AssertionError as ort_says:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = ReferenceEvaluator(model).run(None, feeds)
        except Exception as e:
            raise AssertionError(f"{ort_says}\n(onnx's reference fails: {e!r})") from e
        names = [o.name for o in model.graph.output]
        spec = {n: np.asarray(v) for n, v in zip(names, ref)}
        assert_agree(got, spec, f"{what} (vs onnx's reference; onnxruntime: {ort_says})")
        with pytest.raises(AssertionError):
            assert_agree(want, spec, what)  # onnxruntime is the odd one out


def _text(model: onnx.ModelProto) -> str:
    return onnx.printer.to_text(model.graph) if len(model.graph.node) < 40 else "(large)"


@settings(
    derandomize=True,
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(random_models())
@pytest.mark.compiles
def test_random_graphs_agree_with_onnxruntime(case: RandomModel) -> None:
    run_random_model(case)


@settings(
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(random_models(break_prob=1.0))
def test_broken_random_graphs_are_load_errors(case: RandomModel) -> None:
    run_random_model(case)


def test_linear_k0() -> None:
    """MatMul of an empty x[2,3,0] by a constant w[0,1]: zeros[2,3,1] (the spec; onnxruntime
    agrees). Found by the random graphs: the fused Linear kernel's reshape(-1, k) failed."""
    w = numpy_helper.from_array(np.zeros((0, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul_k0",
        [tensor_info("x", FLOAT, [2, 3, 0])],
        [tensor_info("y", FLOAT, [2, 3, 1])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = tfrt_py.load(model, executor="sync").run({"x": np.zeros((2, 3, 0), np.float32)})
    np.testing.assert_array_equal(out["y"], np.zeros((2, 3, 1), np.float32))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family_on_empty_inputs(op: str, opset: int) -> None:
    """Found by the random graphs: NumPy's max/argmax refuse empty arrays; the result is
    the empty tensor of the input's shape (onnxruntime agrees)."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], axis=0)],
        "empty",
        [tensor_info("x", FLOAT, [0, 3])],
        [tensor_info("y", FLOAT, [0, 3])],
    )
    ir = IR_VERSION[opset]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    x = np.zeros((0, 3), np.float32)
    for ex in ("sync", "async"):
        y = tfrt_py.load(model, executor=ex).run({"x": x})["y"]
        assert y.shape == (0, 3) and y.dtype == np.float32
