"""KernelRegistry lookups: a missing op's UnsupportedOpError says what is registered instead
(nearest names of the domain, the domains that have the op, the opsets it is served at)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.errors import UnsupportedOpError
from tfrt_py.kernels import ComputeFn, KernelContext, KernelRegistry, default_registry


def _identity(ctx: KernelContext) -> ComputeFn:
    return lambda x: x


def _lookup_error(reg: KernelRegistry, domain: str, op: str, opset: int) -> str:
    with pytest.raises(UnsupportedOpError) as info:
        reg.lookup(domain, op, opset, "n")
    assert info.value.op_type == op and info.value.opset == opset
    return str(info.value)


@pytest.mark.parametrize(
    ("op", "first"),
    [("Rellu", "Relu"), ("relu", "Relu"), ("MatMull", "MatMul"), ("Softmaxx", "Softmax")],
)
def test_missing_op_suggests_the_nearest_names(op: str, first: str) -> None:
    msg = _lookup_error(default_registry(), "", op, 17)
    m = re.search(r"no kernel for this op; did you mean (.+)\?$", msg)
    assert m is not None, msg
    names = m.group(1).split(", ")
    assert names[0] == first and 1 <= len(names) <= 3
    assert set(names) <= {name for _, name in default_registry().ops("")}


def test_suggestions_stay_in_the_domain() -> None:
    msg = _lookup_error(default_registry(), "ai.onnx.ml", "Scalar", 1)
    assert msg.endswith("did you mean Scaler?")


def test_an_op_of_another_domain_says_which() -> None:
    msg = _lookup_error(default_registry(), "", "LabelEncoder", 17)
    assert "it is registered in domain 'ai.onnx.ml'" in msg


def test_an_unknown_domain_lists_the_registered_ones() -> None:
    msg = _lookup_error(default_registry(), "com.example", "FusedMatMul", 1)
    assert "no kernels are registered in domain 'com.example'" in msg
    assert "'ai.onnx', 'ai.onnx.ml'" in msg and "'com.microsoft'" in msg


def test_nothing_close_adds_nothing() -> None:
    msg = _lookup_error(default_registry(), "", "Xyzzy", 17)
    assert msg.endswith("at node 'n': no kernel for this op")


def test_opset_outside_the_registered_ranges() -> None:
    reg = default_registry()
    assert _lookup_error(reg, "", "Attention", 22).endswith(
        "kernels are registered for opsets 23+ only"
    )
    # Scan has one kernel for opset 8 and one from 9: shown as one range.
    assert _lookup_error(reg, "", "Scan", 7).endswith("registered for opsets 8+ only")
    own = KernelRegistry()
    own.add("Op", _identity, since=1, until=5)
    own.add("Op", _identity, since=7, until=7)
    own.add("Op", _identity, since=9, until=12)
    own.add("Op", _identity, since=13)
    assert _lookup_error(own, "", "Op", 6).endswith("registered for opsets 1..5, 7, 9+ only")
    only = KernelRegistry()
    only.add("Op", _identity, since=3, until=3)
    assert _lookup_error(only, "ai.onnx", "Op", 4).endswith("registered for opset 3 only")
    assert only.lookup("ai.onnx", "Op", 3).since == 3


def test_load_reports_the_suggestion_naming_the_node() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("Rellu", ["x"], ["y"], name="act")
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(UnsupportedOpError, match=r"Rellu .*'act'.*did you mean Relu"):
        tfrt_py.load(model.SerializeToString())
    fixed = helper.make_node("Relu", ["x"], ["y"], name="act")
    model.graph.ClearField("node")
    model.graph.node.append(fixed)
    out = tfrt_py.load(model.SerializeToString()).run({"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["y"], [0.0, 2.0])
