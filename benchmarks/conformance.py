"""ONNX backend node conformance, counted as we report it (``make conformance``).

    python benchmarks/conformance.py [MODULE] [--calls N] [--per-case-s S] [--json OUT] [--failed]

Runs every node case the installed onnx package generates through MODULE (default
``tfrt_py.onnx_backend``; any ``onnx.backend.base``-style module, e.g.
``onnxruntime.backend``), one case at a time, and prints how many ops pass all their cases
and how many cases pass. The counting rules are those of ``../shared/tools/conformance.py``
(the project workspace's counter): a per-case time limit (prepare and every call),
rtol/atol from the case, sequences and optionals compared by arity, expected outputs NumPy
cannot hold (TensorProto) and every error or crash counted as failures. One difference:
each data set runs ``--calls`` times in a row (default 2) on the one prepared model -- the
first call plans the input signature, the next ones run the planned code with ``out=``
buffers -- and a case passes only if every call matches; ``--calls 1`` counts exactly as
that tool does. ``tests/models/test_conformance.py`` runs the same cases under pytest (with
explicit excludes).
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import time
import warnings
from types import FrameType
from typing import Any

import numpy as np


class Timeout(Exception):
    """The case ran past ``--per-case-s``."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Timeout()


def run_case(backend: Any, case: Any, calls: int) -> None:
    """Prepare ``case.model`` once and run each data set ``calls`` times in a row; raise on
    the first output that does not match."""
    rep = backend.prepare(case.model, "CPU")
    for k, (inputs, expected) in enumerate(case.data_sets):
        inputs = [
            np.asarray(i) if isinstance(i, (np.generic, int, float, bool)) else _array(i)
            for i in inputs
        ]
        expected = [_array(e) for e in expected]
        for call in range(1, calls + 1):
            try:
                check(case, rep.run(inputs), expected)
            except AssertionError as e:
                raise AssertionError(f"data set {k}, call {call}: {e}") from None


def _array(value: Any) -> Any:
    """A data set's TensorProto (onnx 1.23 stores the 2/4/8-bit types so) as the tool's
    runner reads it (``numpy_helper.to_array``); anything else as it is."""
    import onnx
    from onnx import numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def check(case: Any, outs: Any, expected: list[Any]) -> None:
    """One call's outputs against the case's: the tool's rules, unchanged."""
    outs = list(outs.values()) if isinstance(outs, dict) else list(outs)
    if len(outs) != len(expected):
        raise AssertionError(f"{len(outs)} outputs, expected {len(expected)}")
    for o, e in zip(outs, expected):
        if isinstance(e, list) or e is None:
            continue  # sequences / optionals: arity only
        o = np.asarray(o)
        if e.dtype == object or o.dtype == object:
            assert np.array_equal(o.astype(str), e.astype(str))
        elif e.dtype.kind == "V" or o.dtype.kind == "V" or e.dtype.name == "bfloat16":
            # ml_dtypes' types do not promote with a Python float (the tool's runner casts
            # bfloat16 to float32 with two ULPs of tolerance); the small ones compare exact
            rtol = max(case.rtol, 2**-6) if e.dtype.name == "bfloat16" else case.rtol
            np.testing.assert_allclose(o.astype(np.float32), e.astype(np.float32), rtol=rtol,
                                       atol=case.atol)  # fmt: skip
        else:
            np.testing.assert_allclose(o, e, rtol=case.rtol, atol=case.atol)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", nargs="?", default="tfrt_py.onnx_backend")
    ap.add_argument("--calls", type=int, default=2, help="calls per data set (1: as the tool)")
    ap.add_argument("--per-case-s", type=int, default=10)
    ap.add_argument("--json", help="write {case: {ok, op, why}} here")
    ap.add_argument("--failed", action="store_true", help="print each failing case")
    a = ap.parse_args()
    if a.calls < 1:
        ap.error("--calls must be at least 1")
    warnings.filterwarnings("ignore")
    backend = importlib.import_module(a.module)
    import onnx.backend.test.case.node as node

    results: dict[str, dict[str, Any]] = {}
    signal.signal(signal.SIGALRM, _alarm)
    t0 = time.time()
    for c in node.collect_testcases(None):
        if c.model is None:
            continue
        ok, why = False, ""
        signal.alarm(a.per_case_s)
        try:
            run_case(backend, c, a.calls)
            ok = True
        except Timeout:
            why = "timeout"
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - conformance counts every failure
            why = f"{type(e).__name__}: {str(e)[:160]}"
        finally:
            signal.alarm(0)
        op = c.model.graph.node[0].op_type if len(c.model.graph.node) else "?"
        results[c.name] = {"ok": ok, "op": op, "why": why}
        if a.failed and not ok:
            print(f"FAIL  {c.name} [{op}]: {why}", flush=True)
    passed = sum(r["ok"] for r in results.values())
    ops_all = {r["op"] for r in results.values()}
    ops_full = {op for op in ops_all if all(r["ok"] for r in results.values() if r["op"] == op)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    seconds = time.time() - t0
    print(f"calls per data set: {a.calls}; seconds: {seconds:.0f}")
    print(f"ops fully passing: {len(ops_full)}/{len(ops_all)}")
    print(f"conformance: {passed}/{len(results)} node cases passed")


if __name__ == "__main__":
    main()
