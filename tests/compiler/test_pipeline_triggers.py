"""Passes gated by their trigger ops (``compiler.pipeline.TRIGGERS``): a pass whose ops the
graph lacks is reported as the pass itself would report it, changes nothing, and its
module is never imported (a small model's first load in a fresh process is mostly
imports, issue 33; tests/test_import_cost.py checks that a fresh process does not import
them)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tfrt_py.compiler.context import PassContext
from tfrt_py.compiler.pipeline import TRIGGERS, pass_fn
from tfrt_py.compiler.rewrite import clone_graph
from tfrt_py.ir import Graph, GraphBuilder, format_graph
from tfrt_py.kernels import default_registry

F32 = np.float32


def _mlp() -> Graph:
    rng = np.random.default_rng(0)
    b = GraphBuilder("mlp")
    x = b.input("x", F32, ("N", 8))
    w = b.const(rng.standard_normal((8, 4)).astype(F32))
    h = b.op("Relu", b.op("Add", b.op("MatMul", x, w), b.const(rng.standard_normal(4).astype(F32))))
    b.output(b.op("Softmax", h, axis=-1), "y")
    return b.build()


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_a_gated_pass_reports_and_does_what_the_pass_does_without_its_ops(name: str) -> None:
    graph = _mlp()
    ops, said = TRIGGERS[name]
    assert not ops & {n.op_type for n in graph.nodes}
    before = format_graph(graph)
    assert pass_fn(name)(graph, PassContext(default_registry())) == said
    assert format_graph(graph) == before


@pytest.mark.slow
def test_no_gated_pass_acts_on_an_onnx_node_case_without_its_ops() -> None:
    """Over every ONNX node case (imported, shapes inferred): each gated pass, run itself
    on a graph without its trigger ops, reports the gate's words and changes nothing."""
    import onnx.backend.test.case.node as node_cases

    from tfrt_py.frontends.onnx import import_model

    registry = default_registry()
    with warnings.catch_warnings():  # the case generators' own casts overflow on purpose
        warnings.simplefilter("ignore")
        cases = list(node_cases.collect_testcases(None))
    checked = 0
    for case in cases:
        if case.model is None:
            continue
        try:
            graph = import_model(case.model, None, registry.has)
        except Exception:  # noqa: BLE001 - models our importer refuses are not the point
            continue
        present = {n.op_type for n in graph.nodes}
        for name, (ops, said) in TRIGGERS.items():
            if ops & present:
                continue
            g = clone_graph(graph)
            before = format_graph(g)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = pass_fn(name)(g, PassContext(registry))
            assert (got, format_graph(g)) == (said, before), (case.name, name)
            checked += 1
    assert checked > 10_000, checked
