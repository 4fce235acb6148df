"""Run ONNX backend node cases for chosen ops against tfrt_py, case by case.

    python tests/support/node_cases.py Relu Add        # cases whose first node is Relu or Add
    python tests/support/node_cases.py --all --failed  # every case, print only failures

Each data set runs twice on one prepared model (the second call takes the planned path)
and both calls must match, as in ``benchmarks/conformance.py``. Compares the way that
counter does (the case's rtol/atol; sequences by arity), except that expected outputs
stored as TensorProto (float8, int4, ... which NumPy lacks) are converted and compared
here, where the counter counts them as failures. A developer tool: pytest's conformance
test uses ``run_case`` from here.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper


def all_cases() -> list[Any]:
    import onnx.backend.test.case.node as node

    return [c for c in node.collect_testcases(None) if c.model is not None]


def case_op(case: Any) -> str:
    nodes = case.model.graph.node
    return nodes[0].op_type if len(nodes) else "?"


def run_case(case: Any, calls: int = 2) -> None:
    """Run one case through tfrt_py.onnx_backend: each data set ``calls`` times in a row on
    one prepared model (the first call with an input signature plans it; the next ones run
    the planned code, writing into ``out=`` buffers). Raise AssertionError on a mismatch,
    naming the data set and the call."""
    from tfrt_py import onnx_backend

    rep = onnx_backend.prepare(case.model, "CPU")
    for k, (inputs, expected) in enumerate(case.data_sets):
        inputs = [
            np.asarray(i) if isinstance(i, (np.generic, int, float, bool)) else i for i in inputs
        ]
        for call in range(1, calls + 1):
            res = rep.run(inputs)
            try:
                check_outputs(case, res, expected)
            except AssertionError as e:
                raise AssertionError(f"data set {k}, call {call} of {calls}: {e}") from None


def check_outputs(case: Any, res: Any, expected: list[Any]) -> None:
    """The backend's outputs against a case's expected ones (rtol/atol from the case;
    sequences and optionals by arity; TensorProto-stored values converted)."""
    outs = list(res.values()) if isinstance(res, dict) else list(res)
    if len(outs) != len(expected):
        raise AssertionError(f"{len(outs)} outputs, expected {len(expected)}")
    for o, e in zip(outs, expected):
        if isinstance(e, onnx.TensorProto):
            e = onnx.numpy_helper.to_array(e)
        if isinstance(e, list) or e is None:
            continue
        o = np.asarray(o)
        if o.dtype.kind == "V" or e.dtype.kind == "V":  # ml_dtypes: compare as float64
            assert o.dtype == e.dtype, f"dtype {o.dtype} != expected {e.dtype}"
            o, e = o.astype(np.float64), e.astype(np.float64)
        if e.dtype == object or o.dtype == object:
            assert np.array_equal(o.astype(str), e.astype(str)), "string mismatch"
        else:
            assert o.shape == e.shape, f"shape {o.shape} != expected {e.shape}"
            np.testing.assert_allclose(o, e, rtol=case.rtol, atol=case.atol)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ops", nargs="*")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--failed", action="store_true", help="print failures only")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    cases = [c for c in all_cases() if a.all or case_op(c) in a.ops or c.name in a.ops]
    passed = 0
    for c in cases:
        try:
            run_case(c)
            passed += 1
            if not a.failed:
                print(f"ok    {c.name}")
        except Exception as e:  # noqa: BLE001 - a dev report counts every failure
            print(f"FAIL  {c.name} [{case_op(c)}]: {type(e).__name__}: {str(e)[:300]}")
    print(f"{passed}/{len(cases)} passed", file=sys.stderr)


if __name__ == "__main__":
    main()
