"""The LLVM IR row reductions (``kernels/lib/rowreduce_ir``, a long softmax row's max and
sum on the native tier): on every vector width the host has, the max is NumPy's (NaN
wins, either sign of NaN, anywhere in the row, the masked tail included), the sum is
within float32 rounding of float64's, nothing past ``n`` is read into either; a native
Softmax over long rows calls them and matches onnxruntime, NaN rows included."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the kernels are LLVM IR built with llvmlite")

from tests.support.jit_paths import need_lanes
from tfrt_py.kernels.lib import rowreduce_ir

_PROTO = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)
LENGTHS = [0, 1, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 513, 1000]


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_reduces_rows_as_numpy(lanes: int) -> None:
    need_lanes(lanes)
    engine = rowreduce_ir.build(lanes)
    rowmax = _PROTO(engine.get_function_address(rowreduce_ir.SYMBOL_MAX))
    rowsum = _PROTO(engine.get_function_address(rowreduce_ir.SYMBOL_SUM))
    rng = np.random.default_rng(lanes)
    for n in LENGTHS:
        row = (rng.standard_normal(n) * 3).astype(np.float32)
        x = np.concatenate([row, np.full(20, np.nan, np.float32)])  # NaN past n: not read
        assert rowmax(x.ctypes.data, n) == (row.max() if n else -np.inf), n
        exact = row.astype(np.float64).sum()
        bound = 1e-6 + n * np.finfo(np.float32).eps * abs(row.astype(np.float64)).sum()
        assert abs(rowsum(x.ctypes.data, n) - exact) <= bound, n
        for at in sorted({0, n // 2, n - 1} if n else set()):
            for bad in (np.float32(np.nan), -np.float32(np.nan)):
                y = x.copy()
                y[at] = bad
                assert np.isnan(rowmax(y.ctypes.data, n)), (n, at)
                assert np.isnan(rowsum(y.ctypes.data, n)), (n, at)
            y = x.copy()
            y[at] = np.inf
            assert rowmax(y.ctypes.data, n) == np.inf and rowsum(y.ctypes.data, n) == np.inf
    minus = np.full(40, -np.inf, np.float32)
    assert rowmax(minus.ctypes.data, 40) == -np.inf


def test_a_native_softmax_over_long_rows_calls_them_and_matches_onnxruntime() -> None:
    pytest.importorskip("numba", reason="the native tier needs numba")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    if rowreduce_ir.kernels() is None:
        pytest.skip(f"the kernels do not run here ({rowreduce_ir.describe() or 'off'})")
    from onnx import TensorProto, helper

    import tfrt_py

    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 77])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 77])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                              [x_info], [y_info])  # fmt: skip
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = tfrt_py.load(onx.SerializeToString(), executor="native", native="eager")
    source = model.native.lowered.source
    assert "rowmax_f4(" in source and "rowsum_f4(" in source
    x = (np.random.default_rng(0).standard_normal((6, 77)) * 4).astype(np.float32)
    x[1, 70] = np.nan  # a NaN row stays NaN
    x[2] = -np.inf  # an all -inf row: NaN, as onnxruntime
    x[3, 76] = np.inf  # +inf: NaN where inf - inf
    session = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    got = model.run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)
