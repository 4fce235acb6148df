"""The native tier (tfrt_py.native): each lowered op against the sync interpreter, the
tier switch-over, the disk cache, declining with a reason, bad input, threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import pytest

import tfrt_py
from tfrt_py.errors import ExecutionError, InputError
from tfrt_py.ir import Graph, GraphBuilder, TensorType
from tfrt_py.native import Declined, NativeUnavailable
from tfrt_py.native.runtime import tier as tier_mod

F32 = np.float32
RNG = np.random.default_rng(7)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F32)


def _elementwise_graph() -> Graph:
    """Every elementwise op, reduction, Softmax and data-movement op the tier lowers."""
    b = GraphBuilder("elementwise")
    x = b.input("x", F32, (2, 3, 4))
    c4 = b.const(_rand(4))
    h = b.op("Add", x, c4)
    h = b.op("Mul", h, b.const(np.array(1.5, F32)))
    outs = {
        "sig": b.op("Sigmoid", h),
        "tanh": b.op("Tanh", h),
        "leaky": b.op("LeakyRelu", h, alpha=0.2),
        "clip": b.op("Clip", h, b.const(np.array(-0.5, F32)), b.const(np.array(0.7, F32))),
        "div": b.op("Div", h, b.const(_rand(3, 1) + 3)),
        "sub": b.op("Sub", b.const(_rand(1, 4)), h),
        "sqrt": b.op("Sqrt", b.op("Abs", h)),
        "exp_neg": b.op("Exp", b.op("Neg", h)),
        "relu": b.op("Relu", h),
        "sum1": b.op("ReduceSum", h, b.const(np.array([1], np.int64)), keepdims=1),
        "mean_last": b.op("ReduceMean", h, axes=[-1], keepdims=0),
        "max02": b.op("ReduceMax", h, axes=[0, 2], keepdims=1),
        "min_all": b.op("ReduceMin", h, keepdims=0),
        "sumsq1": b.op("ReduceSumSquare", h, axes=[1], keepdims=1),
        "l1_last": b.op("ReduceL1", h, axes=[-1], keepdims=0),
        "l2_02": b.op("ReduceL2", h, axes=[0, 2], keepdims=1),
        "logsum": b.op("ReduceLogSum", b.op("Abs", h), axes=[2], keepdims=0),
        "prod1": b.op("ReduceProd", h, axes=[1], keepdims=0),
        "lse_last": b.op("ReduceLogSumExp", h, axes=[-1], keepdims=1),
        "lse_02": b.op(
            "ReduceLogSumExp", b.op("Mul", h, b.const(np.array(40.0, F32))), axes=[0, 2], keepdims=0
        ),  # large values: the max keeps exp finite
        "softmax1": b.op("Softmax", h, axis=1),
        "logsoftmax": b.op("LogSoftmax", h, axis=-1),
        "transpose": b.op("Transpose", h, perm=[2, 0, 1]),
        "slice": b.op(
            "Slice",
            h,
            b.const(np.array([0, 3], np.int64)),
            b.const(np.array([2, -100], np.int64)),
            b.const(np.array([1, 2], np.int64)),
            b.const(np.array([1, -1], np.int64)),
        ),
        "concat": b.op("Concat", h, x, axis=1),
        "flat": b.op("Relu", b.op("Flatten", h, axis=2)),
        "reshaped": b.op("Reshape", h, b.const(np.array([4, 6], np.int64))),
        "f64": b.op("Cast", h, to=11),
    }
    for name, v in outs.items():
        b.output(v, name)
    b.output(x, "x_again")  # a feed as an output: copied
    return b.build()


def _matmul_graph() -> Graph:
    b = GraphBuilder("matmuls")
    x = b.input("x", F32, (3, 5))
    x3 = b.input("x3", F32, (2, 3, 5))
    w = b.const(_rand(5, 4))
    b.output(b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(_rand(4)))), "linear")
    b.output(b.op("Gemm", x, b.const(_rand(4, 5)), b.const(_rand(3, 4)), transB=1,
                  alpha=0.5, beta=2.0), "gemm_tb")  # fmt: skip
    b.output(b.op("Gemm", b.op("Transpose", x), b.const(_rand(5, 4)), transA=1), "gemm_ta")
    b.output(b.op("MatMul", x3, w), "batched")
    b.output(b.op("MatMul", x, b.op("Transpose", x)), "runtime_b")
    return b.build()


def _gather_graph() -> Graph:
    b = GraphBuilder("gather")
    ids = b.input("ids", np.int64, (4,))
    table = b.const(np.arange(30, dtype=F32).reshape(10, 3))
    b.output(b.op("Gather", table, ids, axis=0, name="lookup"), "rows")
    b.output(b.op("Gather", table, b.const(np.array([2, -1], np.int64)), axis=1), "cols")
    return b.build()


def _tiny_graph() -> Graph:
    b = GraphBuilder("tiny")
    x = b.input("x", F32, (1, 8))
    h = b.op("Relu", b.op("MatMul", x, b.const(_rand(8, 8))))
    b.output(b.op("Softmax", b.op("MatMul", h, b.const(_rand(8, 3)))), "probs")
    return b.build()


def _feeds(g: Graph) -> dict[str, np.ndarray]:
    out = {}
    for v in g.inputs:
        t = v.type
        assert isinstance(t, TensorType) and t.dtype is not None
        if t.dtype.kind == "i":
            out[v.name] = np.array([0, 9, -2, 4], t.dtype)
        else:
            assert t.is_static, t
            out[v.name] = _rand(*cast("tuple[int, ...]", t.shape))
    return out


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("build", [_elementwise_graph, _matmul_graph, _gather_graph])
@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.compiles
def test_every_lowered_op_agrees_with_the_sync_interpreter(build: Any, optimize: bool) -> None:
    g = build()
    native = tfrt_py.load(g, executor="native", native="eager", optimize=optimize)
    sync = tfrt_py.load(g, executor="sync", optimize=optimize)
    assert native.native.state == "ready"
    feeds = _feeds(g)
    for _ in range(2):
        _assert_same(native.run(feeds), sync.run(feeds))


def _transformer_ops_graph() -> Graph:
    """The ops small transformers add (issue 14): casts to and from bool, logic and
    comparisons, IsNaN, Where, Expand, Tile, stacked MatMul (one batch, and a broadcast one),
    LayerNormalization with and without bias, RMSNormalization, Split, both GELUs,
    GatherND, and onnxruntime's SkipLayerNormalization (with its sum output),
    SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, BiasGelu, FastGelu
    and FusedMatMul."""
    b = GraphBuilder("transformer_ops", opset=23)
    x = b.input("x", F32, (2, 3, 8))
    mask = b.input("mask", np.int64, (2, 8))
    z = b.input("z", F32, (2, 8))  # with NaNs: IsNaN and PyTorch's guard Where(IsNaN, 0, z)
    mb = b.op("Cast", mask, to=9)
    less = b.op("Less", mask, b.const(np.array(3, np.int64)))
    logic = b.op("Or", b.op("And", mb, b.op("Not", b.op("Xor", mb, less))),
                 b.op("Greater", mask, b.const(np.array(5, np.int64))))  # fmt: skip
    zero = b.const(np.array(0.0, F32))
    scale, bias = b.const(_rand(8) + 1), b.const(_rand(8))
    w_split = b.const(np.array([3, 5], np.int64))
    left, right = b.op("Split", x, w_split, axis=2, n_outputs=2)
    long_row = b.op("Reshape", x, b.const(np.array([1, 48], np.int64)))
    nan_row = b.op("Reshape", z, b.const(np.array([1, 16], np.int64)))
    outs = {
        "cast_bool": mb,
        "logic": logic,
        "ge": b.op("GreaterOrEqual", x, zero),
        "le_eq": b.op("Or", b.op("LessOrEqual", x, zero), b.op("Equal", x, zero)),
        "eq_int": b.op("Equal", mask, b.const(np.array([2], np.int64))),
        "isnan": b.op("IsNaN", z),
        "nan_guard": b.op("Where", b.op("IsNaN", z), zero, z),
        "where": b.op("Where", b.op("Greater", x, zero), x, b.const(np.array(-1.5, F32))),
        "expand": b.op("Expand", b.const(_rand(1, 1, 8)), b.const(np.array([2, 3, 8], np.int64))),
        "tile": b.op("Tile", x, b.const(np.array([2, 1, 3], np.int64))),
        "tile_int": b.op("Tile", mask, b.const(np.array([1, 2], np.int64))),
        "bmm": b.op("MatMul", x, b.op("Transpose", x, perm=[0, 2, 1])),
        "bmm_bcast": b.op("MatMul", x, b.const(_rand(1, 8, 4))),
        "ln": b.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=1e-5),
        "ln_nobias": b.op("LayerNormalization", x, scale, axis=-1, epsilon=1e-3),
        "rms": b.op("RMSNormalization", x, scale, axis=-1, epsilon=1e-6),
        "ln_odd": b.op("LayerNormalization", left, b.const(_rand(3)), axis=-1),  # one lane
        # rows longer than SHORT_ROW: each row's passes in turn; a NaN fills its row
        "softmax_long": b.op("Softmax", long_row),
        "softmax_long_nan": b.op("Softmax", b.op("Concat", long_row, nan_row, axis=1)),
        "split_left": left,
        "split_right": right,
        "gelu": b.op("Gelu", x),
        "gelu_tanh": b.op("Gelu", x, approximate="tanh"),
        "to_int": b.op("Cast", b.op("Mul", x, b.const(np.array(3.0, F32))), to=7),
        "to_float": b.op("Cast", logic, to=1),
        "gather_nd": b.op("GatherND", x, b.const(np.array([[1, 2], [0, -1]], np.int64))),
    }
    ms = "com.microsoft"
    skip = b.op("Exp", x)
    ln_out, ln_sum = b.op("SkipLayerNormalization", x, skip, scale, bias, bias, domain=ms,
                          n_outputs=4, epsilon=1e-5)[::3]  # fmt: skip
    outs |= {
        "skip_ln": ln_out,
        "skip_sum": ln_sum,
        "skip_ln_nobias": b.op("SkipLayerNormalization", x, skip, scale, domain=ms),
        "skip_rms": b.op("SkipSimplifiedLayerNormalization", x, skip, scale, bias, domain=ms,
                         epsilon=1e-6),
        "simplified": b.op("SimplifiedLayerNormalization", x, scale, axis=-1, epsilon=1e-5),
        "bias_gelu": b.op("BiasGelu", x, bias, domain=ms),
        "fast_gelu": b.op("FastGelu", x, bias, domain=ms),
        "fast_gelu_nobias": b.op("FastGelu", x, domain=ms),
        "fused_mm": b.op("FusedMatMul", x, b.op("Transpose", x, perm=[0, 2, 1]), domain=ms,
                         alpha=0.25),
    }  # fmt: skip
    for name, v in outs.items():
        b.output(v, name)
    return b.build()


@pytest.mark.compiles
def test_transformer_ops_agree_with_the_sync_interpreter() -> None:
    g = _transformer_ops_graph()
    native = tfrt_py.load(g, executor="native", native="eager", optimize=False)
    sync = tfrt_py.load(g, executor="sync", optimize=False)
    assert native.native.state == "ready"
    x = _rand(2, 3, 8) * 2
    x[0, 0, :2] = [0.0, -0.0]
    z = _rand(2, 8)
    z[0, 3] = z[1, 0] = np.nan
    feeds = {"x": x, "mask": np.array([[0, 1, 2, 3, 4, 5, 6, 7], [7, 1, 0, 9, 2, 2, 5, 3]]),
             "z": z}  # fmt: skip
    for _ in range(2):
        _assert_same(native.run(feeds), sync.run(feeds))


@pytest.mark.parametrize("dims", [(2, 5), ("B", "S")], ids=["static", "signature"])
@pytest.mark.compiles
def test_onnxruntime_bert_front_agrees_with_the_sync_interpreter(dims: tuple[Any, ...]) -> None:
    """onnxruntime's optimized BERT starts with EmbedLayerNormalization (word, position and
    segment tables, LayerNorm, the mask's lengths) feeding Attention (merged Q/K/V weight,
    the (B,) lengths as mask_index): both lowered, against the interpreter, with a
    padded row. Static shapes take Attention's loops; a signature of dynamic dims its
    strided gemm calls."""
    ms = "com.microsoft"
    b = GraphBuilder("bert_front")
    ids = b.input("ids", np.int32, dims)
    seg = b.input("seg", np.int32, dims)
    mask = b.input("mask", np.int32, dims)
    emb, index = b.op("EmbedLayerNormalization", ids, seg, b.const(_rand(20, 8)),
                      b.const(_rand(10, 8)), b.const(_rand(2, 8)), b.const(_rand(8) + 1),
                      b.const(_rand(8)), mask, domain=ms, n_outputs=2)  # fmt: skip
    att = b.op("Attention", emb, b.const(_rand(8, 24) * 0.5), b.const(_rand(24)), index,
               domain=ms, num_heads=2)  # fmt: skip
    b.output(emb, "emb")
    b.output(index, "mask_index")
    b.output(att, "attention")
    g = b.build()
    native = tfrt_py.load(g, executor="native", native="eager", optimize=False)
    sync = tfrt_py.load(g, executor="sync", optimize=False)
    feeds = {"ids": np.array([[1, 7, 19, 0, 3], [4, 4, 2, 0, 0]], np.int32),
             "seg": np.array([[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]], np.int32),
             "mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)}  # fmt: skip
    native.run(feeds)
    native.native.wait()  # a signature compiles on its first call (a box: its top 16 is
    # past the 10 positions the model has, so the box ends at 10)
    assert native.native.state == "ready"
    assert "compiled: B in 2..16, S in 2..10" in native.describe() or dims == (2, 5)
    for _ in range(2):
        _assert_same(native.run(feeds), sync.run(feeds))
    bad = dict(feeds, ids=np.array([[1, 7, 20, 0, 3], [4, 4, 2, 0, 0]], np.int32))
    with pytest.raises(ExecutionError):  # an id past the table, as the interpreter
        native.run(bad)


@pytest.mark.parametrize("to", [np.int64, np.int32])
def test_float_to_int_cast_of_nan_and_infinities_is_defined(to: Any) -> None:
    """A request's NaN, infinity or out-of-range float cast to an int (which a Gather may
    then use as an index) gives the type's minimum, as NumPy on x86, never an undefined
    value; in-range values truncate toward zero."""
    b = GraphBuilder("cast")
    x = b.input("x", F32, (8,))
    b.output(b.op("Cast", x, to=7 if to is np.int64 else 6), "y")
    native = tfrt_py.load(b.build(), executor="native", native="eager")
    assert native.native.state == "ready"
    big = 2.0**40 if to is np.int32 else 2.0**70
    xv = np.array([np.nan, np.inf, -np.inf, big, -big, 2.7, -2.7, 0.0], F32)
    with np.errstate(invalid="ignore"):
        want = xv.astype(to)
    low = np.iinfo(to).min
    np.testing.assert_array_equal(native.run({"x": xv})["y"], [low] * 5 + [2, -2, 0])
    np.testing.assert_array_equal(want[5:], [2, -2, 0])


def test_log_sum_exp_of_infinities_and_nan_matches_onnxruntime() -> None:
    """The native ReduceLogSumExp subtracts the row's maximum; an infinite maximum (a row of
    -inf, a row holding +inf) and a NaN give what onnxruntime gives, not inf - inf."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([node], "lse", [x_info], [y_info])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    xv = np.array([[-np.inf] * 4, [np.inf, 1, 2, 3], [np.nan, 1, 2, 3], [100, 90, 80, 70],
                   [-3, -1, 0.5, 2]], F32)  # fmt: skip
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": xv})[0]
    m = tfrt_py.load(model, executor="native", native="eager")
    assert m.native.state == "ready"
    np.testing.assert_allclose(m.run({"x": xv})["y"], want, rtol=1e-6)


def test_max_and_min_match_numpy() -> None:
    # Compared with NumPy directly: the sync interpreter's planned Max/Min call
    # np.maximum(a, b, out) positionally, which NumPy 2.4 deprecates.
    b = GraphBuilder("maxmin")
    x, y = b.input("x", F32, (3, 4)), b.input("y", F32, (4,))
    b.output(b.op("Max", x, y), "max")
    b.output(b.op("Min", x, y), "min")
    m = tfrt_py.load(b.build(), executor="native", native="eager")
    xv, yv = _rand(3, 4), _rand(4)
    xv[0, 0] = np.nan
    got = m.run({"x": xv, "y": yv})
    np.testing.assert_array_equal(got["max"], np.maximum(xv, yv))
    np.testing.assert_array_equal(got["min"], np.minimum(xv, yv))


def test_eager_load_is_ready_and_says_so() -> None:
    m = tfrt_py.load(_tiny_graph(), executor="native", native="eager")
    assert m.executor == "native" and m.native.state == "ready"
    assert m.native.run is not m.native._run_interp
    assert "as one numba function" in m.describe()


def test_background_tier_serves_on_the_interpreter_then_switches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    real = tier_mod.compile_lowered

    def held(lowered: Any) -> Any:
        release.wait(60)
        return real(lowered)

    monkeypatch.setattr(tier_mod, "compile_lowered", held)
    g = _tiny_graph()
    feeds = _feeds(g)
    want = tfrt_py.load(g, executor="sync").run(feeds)
    m = tfrt_py.load(g, executor="native")  # native="background" is the default
    assert m.native.state == "compiling"
    assert "compiling" in m.describe()
    _assert_same(m.run(feeds), want)  # served by the interpreter
    release.set()
    assert m.native.wait(120)
    assert m.native.state == "ready"
    assert m.native.run is not m.native._run_interp
    _assert_same(m.run(feeds), want)


def test_wait_returns_only_after_the_tier_switched(monkeypatch: pytest.MonkeyPatch) -> None:
    """``wait()`` is the promise that the tier is ready: the job's done-event is set after
    the tier installed the compile, not before (the worker thread runs both; a slow
    install used to let ``wait`` return while ``state`` still said "compiling")."""
    real = tier_mod.NativeTier._installed

    def slow_install(self: Any, job: Any) -> None:
        time.sleep(0.3)
        real(self, job)

    monkeypatch.setattr(tier_mod.NativeTier, "_installed", slow_install)
    m = tfrt_py.load(_tiny_graph(), executor="native")
    assert m.native.wait(120)
    assert m.native.state == "ready"
    assert m.native.run is not m.native._run_interp


def test_disk_cache_hit_on_the_second_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(tmp_path))
    first = tfrt_py.load(_tiny_graph(), executor="native", native="eager")
    second = tfrt_py.load(_tiny_graph(), executor="native", native="eager")  # other weights
    assert first.native.compiled.cache_hit is False
    assert second.native.compiled.cache_hit is True
    assert first.native.compiled.path == second.native.compiled.path
    assert str(tmp_path) in first.native.compiled.path
    assert "loaded from the disk cache" in second.describe()


def test_declines_with_the_ops_that_block_it() -> None:
    b = GraphBuilder("conv")
    x = b.input("x", F32, (1, 1, 4, 4))
    # a Conv alone: Conv + Relu would load as one tfrt_py.fused::Conv (fuse_conv)
    b.output(b.op("Conv", x, b.const(_rand(1, 1, 2, 2))), "y")
    with pytest.raises(Declined, match="Conv x1"):
        tfrt_py.load(b.build(), executor="native")
    assert "native tier: not used: ops without a native lowering: Conv x1" in (
        tfrt_py.load(b.build()).describe()
    )


def test_dynamic_batch_runs_in_rows_mode() -> None:
    """A dynamic first dim no longer declines (issue 14): rows are independent, so one
    function serves every batch size (tests/native/test_dynamic.py has the rest)."""
    b = GraphBuilder("dyn")
    x = b.input("x", F32, ("N", 4))
    b.output(b.op("Relu", x), "y")
    m = tfrt_py.load(b.build(), executor="native", native="eager")
    assert m.native.form == "rows"
    for n in (1, 3, 1):
        xv = _rand(n, 4)
        np.testing.assert_array_equal(m.run({"x": xv})["y"], np.maximum(xv, 0))


def _runtime_shape_graph(op: str) -> Graph:
    """x[2,3,4] with the op's shape-determining input a feed (found by the conformance
    cases: Reshape's shape and Slice's steps as int64 inputs)."""
    b = GraphBuilder(op.lower())
    x = b.input("x", F32, (2, 3, 4))
    if op == "Reshape":
        b.output(b.op("Reshape", x, b.input("shape", np.int64, (2,))), "y")
    else:
        starts, ends = b.input("starts", np.int64, (1,)), b.input("ends", np.int64, (1,))
        axes, steps = b.input("axes", np.int64, (1,)), b.input("steps", np.int64, (1,))
        b.output(b.op("Slice", x, starts, ends, axes, steps), "y")
    return b.build()


@pytest.mark.parametrize("op", ["Reshape", "Slice"])
def test_declines_shapes_given_at_run_time(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """A shape that depends on a feed's values cannot be baked into the function: native
    declines (never a load failure from its zero-feed probe), auto stays on sync."""
    monkeypatch.delenv("TFRT_PY_NATIVE")
    with pytest.raises(Declined, match=r"run time|probed"):
        tfrt_py.load(_runtime_shape_graph(op), executor="native")
    model = tfrt_py.load(_runtime_shape_graph(op))
    assert model.executor == "sync"
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    if op == "Reshape":
        got = model.run({"x": x, "shape": np.array([4, 6], np.int64)})["y"]
        np.testing.assert_array_equal(got, x.reshape(4, 6))
    else:
        one = np.array([1], np.int64)
        feeds = {"x": x, "starts": np.array([0], np.int64), "ends": np.array([4], np.int64)}
        got = model.run({**feeds, "axes": np.array([2], np.int64), "steps": one * 2})["y"]
        np.testing.assert_array_equal(got, x[:, :, 0:4:2])


def test_auto_picks_native_only_for_tiny_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE")
    tiny = tfrt_py.load(_tiny_graph(), native="eager")
    assert tiny.executor == "native"
    assert "whose ops all lower" in tiny.describe()
    b = GraphBuilder("wide")
    x = b.input("x", F32, (1, 1024))
    b.output(b.op("MatMul", x, b.const(np.zeros((1024, 1024), F32))), "y")
    wide = tfrt_py.load(b.build())
    assert wide.executor == "sync"
    assert "not tiny" in wide.describe()


def test_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfrt_py import selection

    monkeypatch.delenv("TFRT_PY_NATIVE")
    monkeypatch.setattr(selection, "available", lambda: False)
    with pytest.raises(NativeUnavailable, match="numba"):
        tfrt_py.load(_tiny_graph(), executor="native")
    assert tfrt_py.load(_tiny_graph()).executor == "sync"


def test_bad_input_raises_what_sync_raises_and_the_model_stays_usable() -> None:
    g = _tiny_graph()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    x = _feeds(g)["x"]
    bad: list[Any] = [
        {"x": x.astype(np.float64)},
        {"x": np.zeros((1, 9), F32)},
        {"x": np.zeros((8,), F32)},
        {},
        {"x": x, "y": x},
        [x],
    ]
    for feeds in bad:
        with pytest.raises(InputError) as want:
            sync.run(feeds)
        with pytest.raises(InputError) as got:
            native.run(feeds)
        assert str(got.value) == str(want.value)
    good = sync.run({"x": x})
    _assert_same(native.run({"x": x.tolist()}), good)  # converted like sync
    _assert_same(native.run({"x": x.astype(np.float16)}), sync.run({"x": x.astype(np.float16)}))
    wide = np.zeros((1, 16), F32)
    wide[:, ::2] = x
    _assert_same(native.run({"x": wide[:, ::2]}), good)  # not contiguous
    ro = x.copy()
    ro.flags.writeable = False
    _assert_same(native.run({"x": ro}), good)
    buf = np.empty((1, 3), F32)
    assert native.run({"x": x}, outputs={"probs": buf})["probs"] is buf
    np.testing.assert_allclose(buf, good["probs"], rtol=2e-5)
    with pytest.raises(InputError, match="unknown output"):
        native.run({"x": x}, outputs={"nope": buf})


def test_kernel_error_names_the_node_like_sync() -> None:
    g = _gather_graph()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    bad = {"ids": np.array([0, 1, 2, 10], np.int64)}
    with pytest.raises(ExecutionError) as want:
        sync.run(bad)
    with pytest.raises(ExecutionError) as got:
        native.run(bad)
    assert got.value.node_name == want.value.node_name == "lookup"
    good = _feeds(g)
    _assert_same(native.run(good), sync.run(good))


def test_eight_threads_share_one_native_model() -> None:
    g = _tiny_graph()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    xs = [_rand(1, 8) for _ in range(64)]
    want = [sync.run({"x": x})["probs"] for x in xs]

    def work(i: int) -> bool:
        for _ in range(50):
            got = native.run({"x": xs[i]})["probs"]
            if not np.allclose(got, want[i], rtol=2e-5, atol=1e-6):
                return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(64)))
