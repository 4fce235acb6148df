"""A model with If and Loop: branches and loop bodies that use outer-scope values,
loop-carried values, scan outputs, a run-time trip count and a condition-driven loop."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .builders import BOOL, FLOAT, INT64, ModelCase, Net, tensor_info


def if_loop() -> ModelCase:
    """Inputs x float32[4] and trip_count int64 scalar.

    * ``y = If(ReduceSum(x) > 0)``: then ``x * w``, else ``b - x`` (``x``, ``w``, ``b`` all
      from the outer graph).
    * ``Loop(trip_count)`` carrying ``(total, power)``: ``power *= y`` (outer scope),
      ``total += power``; scan output ``total + i``.
    * A while-style Loop (no trip count) doubling ``v = |y| + 0.1`` until ``max(v) >= 50``,
      counting iterations.
    """
    net = Net("if_loop", seed=108)
    w = net.uniform("w", (4,), -1.0, 1.0)
    b = net.uniform("b", (4,), -1.0, 1.0)
    zero = net.const("zero", np.float32(0.0))

    # -- If ---------------------------------------------------------------------------------
    total = net.op("ReduceSum", "x", keepdims=0)
    cond = net.op("Greater", total, zero)
    then_net = net.sub_net("then_branch")
    then_net.op("Mul", "x", w, outputs=["then_y"])
    else_net = net.sub_net("else_branch")
    else_net.op("Sub", b, "x", outputs=["else_y"])
    net.op(
        "If",
        cond,
        outputs=["y"],
        name="choose_branch",
        then_branch=then_net.graph([], [tensor_info("then_y", FLOAT, [4])]),
        else_branch=else_net.graph([], [tensor_info("else_y", FLOAT, [4])]),
    )

    # -- counted Loop with scan output -----------------------------------------------------
    body = net.sub_net("power_body")
    p_out = body.op("Mul", "p_in", "y", outputs=["p_out"])
    body.op("Add", "sum_in", p_out, outputs=["sum_out"])
    i_float = body.op("Cast", "iter", to=FLOAT)
    body.op("Add", "sum_out", i_float, outputs=["scan_out"])
    body.op("Identity", "cond_in", outputs=["cond_out"])
    body_graph = body.graph(
        [
            tensor_info("iter", INT64, []),
            tensor_info("cond_in", BOOL, []),
            tensor_info("sum_in", FLOAT, [4]),
            tensor_info("p_in", FLOAT, [4]),
        ],
        [
            tensor_info("cond_out", BOOL, []),
            tensor_info("sum_out", FLOAT, [4]),
            tensor_info("p_out", FLOAT, [4]),
            tensor_info("scan_out", FLOAT, [4]),
        ],
    )
    net.op_multi(
        "Loop",
        "trip_count",
        net.const("keep_going", np.bool_(True)),
        net.const("sum0", np.zeros(4, np.float32)),
        net.const("p0", np.ones(4, np.float32)),
        outputs=["running_sum", "power", "sums_per_step"],
        name="power_loop",
        body=body_graph,
    )

    # -- while Loop: no trip count, the body decides when to stop --------------------------
    v0 = net.op("Add", net.op("Abs", "y"), net.const("offset", np.float32(0.1)))
    wbody = net.sub_net("doubling_body")
    two_value = numpy_helper.from_array(np.array(2.0, np.float32), "two_value")
    two = wbody.op("Constant", value=two_value)
    v_out = wbody.op("Mul", "v_in", two, outputs=["v_out"])
    wbody.op("Add", "n_in", "one_i64", outputs=["n_out"])
    vmax = wbody.op("ReduceMax", v_out, keepdims=0)
    wbody.op("Less", vmax, "limit", outputs=["go_on"])
    wbody_graph = wbody.graph(
        [
            tensor_info("i", INT64, []),
            tensor_info("c_in", BOOL, []),
            tensor_info("v_in", FLOAT, [4]),
            tensor_info("n_in", INT64, []),
        ],
        [
            tensor_info("go_on", BOOL, []),
            tensor_info("v_out", FLOAT, [4]),
            tensor_info("n_out", INT64, []),
        ],
    )
    net.const("one_i64", np.int64(1))
    net.const("limit", np.float32(50.0))
    net.op_multi(
        "Loop",
        "",
        net.const("start", np.bool_(True)),
        v0,
        net.const("n0", np.int64(0)),
        outputs=["doubled", "doublings"],
        name="doubling_loop",
        body=wbody_graph,
    )
    model = net.model(
        [tensor_info("x", FLOAT, [4]), tensor_info("trip_count", INT64, [])],
        [
            tensor_info("y", FLOAT, [4]),
            tensor_info("running_sum", FLOAT, [4]),
            tensor_info("power", FLOAT, [4]),
            tensor_info("sums_per_step", FLOAT, ["steps", 4]),
            tensor_info("doubled", FLOAT, [4]),
            tensor_info("doublings", INT64, []),
        ],
    )
    feeds = (
        # sum(x) > 0: the then branch, 5 iterations
        {"x": np.array([0.5, -0.25, 1.0, 0.75], np.float32), "trip_count": np.array(5, np.int64)},
        # sum(x) < 0: the else branch, 3 iterations
        {"x": np.array([-0.5, 0.25, -1.0, -0.2], np.float32), "trip_count": np.array(3, np.int64)},
        # zero iterations: the scan output is empty, loop-carried values keep their start
        {"x": np.array([1.0, 2.0, 3.0, 4.0], np.float32), "trip_count": np.array(0, np.int64)},
    )
    return ModelCase("if_loop", model, feeds)
