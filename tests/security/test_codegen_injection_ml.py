"""Model text never becomes code in the classic-ML lowerings either (issue 14): class
labels (strings), ZipMap labels, node and graph names, doc strings and extra string
attributes of TreeEnsembleClassifier / LinearClassifier / SVMClassifier models reach
neither the native module nor its entry; the module is the same whatever they are, and
the model answers with the labels as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.native.lower.graph import lower

ML = "ai.onnx.ml"


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(tmp_path / "native_cache"))


def _model(labels: list[str], names: list[str], text: str, op: str) -> bytes:
    """X[N,2] -> classifier (string labels) -> label, scores -> ZipMap -> probabilities."""
    extra: dict[str, Any] = {"note": text} if text else {}
    if op == "tree":
        attrs: dict[str, Any] = dict(
            nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
            nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
            class_treeids=[0, 0, 0, 0], class_nodeids=[1, 1, 2, 2], class_ids=[0, 2, 1, 2],
            class_weights=[0.7, 0.3, 0.6, 0.4], post_transform="NONE",
        )  # fmt: skip
        cls = helper.make_node("TreeEnsembleClassifier", ["X"], [names[1], names[2]],
                               domain=ML, name=names[0], classlabels_strings=labels,
                               **attrs, **extra)  # fmt: skip
    else:
        cls = helper.make_node("LinearClassifier", ["X"], [names[1], names[2]], domain=ML,
                               name=names[0], classlabels_strings=labels,
                               coefficients=[1.0, -1.0, 0.5, 0.5, -1.0, 2.0],
                               intercepts=[0.1, 0.2, -0.3], post_transform="SOFTMAX",
                               **extra)  # fmt: skip
    zm = helper.make_node("ZipMap", [names[2]], [names[3]], domain=ML, name=names[4],
                          classlabels_strings=labels, **extra)  # fmt: skip
    for n in (cls, zm):
        n.doc_string = text
    graph = helper.make_graph(
        [cls, zm], names[5], [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info(names[1], TensorProto.STRING, ["N"]),
         helper.make_value_info(names[3], helper.make_sequence_type_proto(
             helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(
                 TensorProto.FLOAT, [])))),
         ], doc_string=text,
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(ML, 3)])  # fmt: skip
    m.ir_version = 9
    m.doc_string = text
    return m.SerializeToString()


def _payloads(tmp: Path) -> tuple[list[str], list[str], list[Path]]:
    marks = [tmp / f"pwned{i}" for i in range(3)]
    mk = [f'__import__("os").mkdir("{m}")' for m in marks]
    labels = [f'a""";{mk[0]};"""', f"b'];{mk[1]};x=['", f"c\n{mk[2]}\n#"]
    names = ["n0\n#", "lab'", 'prob"', "zip{}", "zm\\", 'g"""']
    return labels, names, marks


@pytest.mark.parametrize("op", ["tree", "linear"])
@pytest.mark.parametrize("executor", ["native", "auto"])
@pytest.mark.compiles
def test_payload_labels_are_data(tmp_path: Path, executor: str, op: str) -> None:
    labels, names, marks = _payloads(tmp_path)
    data = _model(labels, names, 'doc """ {x} ' + labels[0], op)
    model = tfrt_py.load(data, executor=executor, native="eager")
    sync = tfrt_py.load(data, executor="sync")
    assert model.executor == "native", model.describe()
    x = np.array([[0.1, 0.2], [0.9, 0.7], [-1.0, 3.0]], np.float32)
    for _ in range(8):  # the trial's candidates, then the chosen entry
        got, want = model.run({"X": x}), sync.run({"X": x})
        assert got[names[1]].tolist() == want[names[1]].tolist()
        assert all(set(d) <= set(labels) for d in got[names[3]])
        for dg, dw in zip(got[names[3]], want[names[3]]):
            np.testing.assert_allclose(list(dg.values()), list(dw.values()), rtol=1e-5)
    assert [m for m in marks if m.exists()] == []
    src = model.native.lowered.source
    for s in [*labels, *names]:
        assert s not in src


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) |
                st.sampled_from("\n\"'\\{}#"), min_size=1, max_size=6)  # fmt: skip


@settings(derandomize=True, max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(labels=st.lists(_text, min_size=3, max_size=3, unique=True),
       names=st.lists(_text, min_size=6, max_size=6, unique=True), text=_text,
       op=st.sampled_from(["tree", "linear"]))  # fmt: skip
def test_the_module_does_not_depend_on_model_text(labels: list[str], names: list[str],
                                                  text: str, op: str) -> None:  # fmt: skip
    if "X" in names:
        return
    plain = tfrt_py.load(_model(["p", "q", "r"], ["a", "b", "c", "d", "e", "f"], "", op),
                         executor="sync")  # fmt: skip
    evil = tfrt_py.load(_model(labels, names, text, op), executor="sync")
    srcs = []
    for m in (plain, evil):
        p = m.prepared.program
        srcs.append(lower(p.graph, p, rows=True).source)
    assert srcs[0] == srcs[1]
