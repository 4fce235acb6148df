"""A small model (bytes to a few hundred KB) must not make ``load`` compute gigabytes
(issue 12).

Constant folding and the zero-feed shape probes run kernels at load; each now predicts a
node's output size before running it (``compiler/load_limits.py``). Each case loads in a
fresh interpreter and reports its peak resident memory: before the fix the 20000 x 20000
cases allocated 1.6 GB (folding ``ConstantOfShape``) and the probe allocated the declared
input's 1.6 GB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

N = 20000  # N * N float32 = 1.6 GB; the budget below is a fraction of that
PEAK_BUDGET_MB = 600


def _const(name: str, value: Any) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def _model(nodes: list[Any], inputs: list[Any] | None = None) -> onnx.ModelProto:
    out = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    graph = helper.make_graph(nodes, "blowup", inputs or [], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _cases() -> dict[str, onnx.ModelProto]:
    big = np.array([N, N], np.int64)
    return {
        "constant_of_shape": _model(
            [
                _const("s", big),
                helper.make_node(
                    "ConstantOfShape",
                    ["s"],
                    ["y"],
                    value=numpy_helper.from_array(np.array([1.0], np.float32)),
                ),
            ]
        ),
        "expand": _model(
            [
                _const("one", np.ones((1, 1), np.float32)),
                _const("s", big),
                helper.make_node("Expand", ["one", "s"], ["y"]),
            ]
        ),
        "tile": _model(
            [
                _const("one", np.ones((1, 1), np.float32)),
                _const("r", big),
                helper.make_node("Tile", ["one", "r"], ["y"]),
            ]
        ),
        "range": _model(
            [
                _const("a", np.array(0.0, np.float32)),
                _const("b", np.array(N * N, np.float32)),
                _const("d", np.array(1.0, np.float32)),
                helper.make_node("Range", ["a", "b", "d"], ["y"]),
            ]
        ),
        "outer_add": _model(
            [
                _const("col", np.ones((N, 1), np.float32)),
                _const("row", np.ones((1, N), np.float32)),
                helper.make_node("Add", ["col", "row"], ["y"]),
            ]
        ),
        # The probe (zero feeds): a huge declared input, computed on before a NonZero
        # whose shape only a run can tell.
        "probe_input": _model(
            [
                helper.make_node("Relu", ["big"], ["r"]),
                helper.make_node("NonZero", ["r"], ["y"]),
            ],
            [helper.make_tensor_value_info("big", TensorProto.FLOAT, [N, N])],
        ),
    }


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tfrt_py
    model = tfrt_py.load(sys.argv[1], executor=sys.argv[2])
    # VmHWM: this process image's peak (getrusage's ru_maxrss would include the parent's
    # peak, recorded at exec)
    status = open("/proc/self/status").read()
    peak_mb = int(status.split("VmHWM:")[1].split()[0]) / 1024
    print(json.dumps({"peak_mb": peak_mb, "executor": model.executor}))
    """
)


@pytest.mark.parametrize("executor", ["sync", "auto"])
@pytest.mark.parametrize("case", sorted(_cases()))
def test_load_computes_no_huge_value(case: str, executor: str, tmp_path: Any) -> None:
    path = tmp_path / f"{case}.onnx"
    onnx.save(_cases()[case], str(path))
    assert path.stat().st_size < 200_000  # vs 1.6 GB computed
    env = {"TFRT_PY_NATIVE": "1" if executor == "auto" else "0"}
    import os

    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(path), executor],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["peak_mb"] < PEAK_BUDGET_MB, result
