"""NumPy's floating-point RuntimeWarnings from tfrt_py's kernels stay out of a user's
output (log(0) is -inf by the spec; onnxruntime computes it silently), with Python's
default warning filters as a user has them."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_log_of_zero_then_an_int_cast_prints_no_runtime_warning() -> None:
    script = textwrap.dedent(
        """
        import numpy as np
        from onnx import TensorProto, helper

        import tfrt_py

        g = helper.make_graph(
            [helper.make_node("Log", ["x"], ["l"]),
             helper.make_node("Cast", ["l"], ["y"], to=TensorProto.INT64)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.INT64, [4])],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model = tfrt_py.load(m.SerializeToString(), executor="sync")
        model.run({"x": np.array([0.0, 1.0, 0.0, -1.0], np.float32)})
        print("ran")
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran" in done.stdout
    assert "RuntimeWarning" not in done.stderr, done.stderr[-2000:]
