"""Model text never becomes code (issue 12): names, graph names, attribute strings and doc
strings of an untrusted model reach neither the native module (``Lowered.source``, also
cached on disk) nor the sync interpreter's generated plan (``Generated.source``).

Payloads are written so that the code before the fix would have run them (a graph name
closing the module docstring, a node name ending the ``# op name`` comment); each creates a
marker directory, which must not exist afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.errors import TfrtError
from tfrt_py.native import Declined
from tfrt_py.native.lower.graph import lower
from tfrt_py.native.lower.source import audit, literal

F32 = np.float32
RNG = np.random.default_rng(12)
W = RNG.standard_normal((3, 4)).astype(F32)
B = RNG.standard_normal(4).astype(F32)
ODD = ['q"uo\'te', '"""', "'''", "new\nline", "back\\slash", "{brace}", "{out}{in0}",
       "ünï©ødé ✓", "tab\tcr\r", "# hash", "@0@"]  # fmt: skip

#: The role of each name in ``_model``, in order.
ROLES = ("graph", "x", "W", "b", "h", "y", "z", "mm", "add", "relu", "leaky", "softmax")


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(tmp_path / "native_cache"))


def _model(names: dict[str, str], text: str = "", alpha: float = 0.1) -> bytes:
    """x[2,3] -> MatMul W -> Add b -> Relu -> h; y = LeakyRelu(h); z = Softmax(h). Every
    name from ``names``; ``text`` goes into doc strings, metadata and extra string
    attributes of every node."""
    n = names
    extra = {"note": text, "mode": text} if text else {}
    nodes = [
        helper.make_node("MatMul", [n["x"], n["W"]], [n["mm"]], name=n["mm"], **extra),
        helper.make_node("Add", [n["mm"], n["b"]], [n["add"]], name=n["add"], **extra),
        helper.make_node("Relu", [n["add"]], [n["h"]], name=n["relu"], **extra),
        helper.make_node("LeakyRelu", [n["h"]], [n["y"]], name=n["leaky"], alpha=alpha, **extra),
        helper.make_node("Softmax", [n["h"]], [n["z"]], name=n["softmax"], axis=-1, **extra),
    ]
    for node in nodes:
        node.doc_string = text
    graph = helper.make_graph(
        nodes,
        n["graph"],
        [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info(n["z"], TensorProto.FLOAT, [2, 4]),
        ],
        [numpy_helper.from_array(W, n["W"]), numpy_helper.from_array(B, n["b"])],
        doc_string=text,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string = text
    if text:
        helper.set_model_props(model, {text: text})
    return model.SerializeToString()


def _reference(x: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x @ W + B, 0)
    y = np.where(h >= 0, h, h * F32(alpha))
    e = np.exp(h - h.max(-1, keepdims=True))
    return y, e / e.sum(-1, keepdims=True)


def _payload_names(tmp: Path) -> tuple[dict[str, str], list[Path]]:
    """Names carrying payloads (each mkdirs its own marker) plus odd characters."""
    marks = [tmp / f"pwned{i}" for i in range(4)]
    mk = [f'__import__("os").mkdir("{m}")' for m in marks]  # no ' (repr would escape it)
    names = {role: f"{role}_{ODD[k % len(ODD)]}" for k, role in enumerate(ROLES)}
    names["graph"] = f'g""";{mk[0]};"""'  # closes the module docstring
    names["relu"] = f"r\n{mk[1]}\ndef _tail():\n"  # ends the "# op name" comment
    names["x"] = f"x'];{mk[2]};feeds['x"  # closes a feeds['...'] subscript
    names["y"] = f'y"}};{mk[3]};{{"y'  # closes a {'...': r} dict
    return names, marks


@pytest.mark.parametrize(
    ("executor", "tier"), [("native", "native"), ("sync", "sync"), ("auto", "native")]
)
def test_payload_names_do_not_run_and_the_model_answers(
    tmp_path: Path, executor: str, tier: str
) -> None:
    names, marks = _payload_names(tmp_path)
    text = 'doc """ \n\\ {x} ünï ' + names["graph"]
    model = tfrt_py.load(_model(names, text), executor=executor, native="eager")
    assert model.executor == tier
    x = RNG.standard_normal((2, 3)).astype(F32)
    want_y, want_z = _reference(x, 0.1)
    for _ in range(3):  # the first call (interpreter probe) and the generated fast paths
        out = model.run({names["x"]: x})
        np.testing.assert_allclose(out[names["y"]], want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[names["z"]], want_z, rtol=1e-5, atol=1e-6)
    assert [m for m in marks if m.exists()] == []
    sources = _plan_sources(model)
    if tier == "native":
        assert model.native.state == "ready", model.native.error
        sources.append(model.native.lowered.source)
        assert Path(model.native.compiled.path).read_text() == model.native.lowered.source
    assert sources
    for src in sources:
        for name in [*names.values(), text]:
            assert name not in src


def _plan_sources(model: tfrt_py.Model) -> list[str]:
    rt: Any = model.runtime  # the native tier (its .interp) or the sync interpreter
    interp = rt.interp if model.native is not None else rt if model.executor == "sync" else None
    if interp is None:
        return []
    return [p.gen.source for p in interp._plans.values() if p.gen is not None]


def test_a_second_load_of_a_poisoned_model_is_as_clean(tmp_path: Path) -> None:
    """The module is cached on disk: a later load (a cache hit) must not run anything
    either."""
    names, marks = _payload_names(tmp_path)
    data = _model(names)
    first = tfrt_py.load(data, executor="native", native="eager")
    second = tfrt_py.load(data, executor="native", native="eager")
    assert second.native.compiled.path == first.native.compiled.path
    x = RNG.standard_normal((2, 3)).astype(F32)
    np.testing.assert_allclose(second.run({names["x"]: x})[names["y"]], _reference(x, 0.1)[0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert [m for m in marks if m.exists()] == []


def _clip6(lo: float, hi: float) -> bytes:
    node = helper.make_node("Clip", ["x"], ["y"], min=lo, max=hi)
    graph = helper.make_graph(
        [node], "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)]).SerializeToString()


@pytest.mark.parametrize(
    "data",
    [
        *[_model({r: r for r in ROLES}, alpha=a) for a in (1e38, -0.0, 1e-300, 3)],
        _clip6(float("-inf"), 0.5),
        _clip6(-0.5, float("inf")),
    ],
    ids=["alpha1e38", "alpha-0", "alpha1e-300", "alpha3", "clip-inf", "clip+inf"],
)
def test_attribute_numbers_reach_the_source_as_numbers(data: bytes) -> None:
    """Attribute floats are formatted by ``literal``: infinities compile (``np.inf``; the
    old ``repr`` wrote ``inf``, a NameError at compile time), tiny and huge values keep
    their value."""
    native = tfrt_py.load(data, executor="native", native="eager")
    sync = tfrt_py.load(data, executor="sync")
    x = RNG.standard_normal((2, 3)).astype(F32)
    got, want = native.run({"x": x}), sync.run({"x": x})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_string_where_a_number_belongs_declines() -> None:
    """A LeakyRelu whose alpha is a string attribute: the lowering must not paste or
    parse it; it declines (auto serves on the sync interpreter, which raises or not as
    its kernel decides)."""
    names = {role: role for role in ROLES}
    model = onnx.load_from_string(_model(names))
    leaky = model.graph.node[3]
    del leaky.attribute[:]
    leaky.attribute.append(helper.make_attribute("alpha", "1);__import__('os').abort(#"))
    data = model.SerializeToString()
    with pytest.raises(TfrtError):
        tfrt_py.load(data, executor="native")


def test_literal() -> None:
    values: list[Any] = [0, 7, -3, 2**70, True, False, np.int64(-5), np.bool_(True), 0.1, -2.5,
                         1e300, float("inf"), float("-inf"), -0.0, np.float32(0.2),
                         np.float64(-1e-310)]  # fmt: skip
    for x in values:
        text = literal(x)
        back = eval(text, {"np": np, "__builtins__": {}})  # our own text only
        assert back == x or (type(back) is float and np.float64(back) == np.float64(x))
        assert np.copysign(1, float(back)) == np.copysign(1, float(x))
    assert literal(float("nan")) == "np.nan"
    for bad in ["1", b"1", "nan", np.array([1.0]), None, [1], 1j]:
        with pytest.raises(TypeError):
            literal(bad)


def test_audit_refuses_foreign_text() -> None:
    ok = "def run(a0):\n    # node 3\n    raise ValueError('feed 0: wrong shape')\n"
    audit(ok)
    for bad in ["x = 'evil'\n", "# Relu evil\n", "x = f'{1}'\n", "é = 1\n", "x = b'C'\n",
                '"""tfrt_py native code for graph \'g\'."""\n']:  # fmt: skip
        with pytest.raises(Declined):
            audit(bad)


# -- property: no generated source depends on model text ------------------------------------

_names = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("\n\"'\\{}"),
    min_size=1,
    max_size=8,
)


def _sources(data: bytes, x_name: str) -> tuple[str, str]:
    """(native module source, sync plan source) for a model."""
    model = tfrt_py.load(data, executor="sync")
    program = model.prepared.program
    lowered = lower(program.graph, program)
    with np.errstate(all="ignore"):
        model.run({x_name: np.zeros((2, 3), F32)})
    (plan,) = _plan_sources(model)
    return lowered.source, plan


@settings(derandomize=True, max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    names=st.lists(_names, min_size=len(ROLES), max_size=len(ROLES), unique=True),
    text=_names,
    alpha=st.floats(allow_nan=True, allow_infinity=True, width=32),
)
def test_generated_source_holds_no_model_text(names: list[str], text: str, alpha: float) -> None:
    evil = dict(zip(ROLES, names))
    plain = {role: f"v{k}" for k, role in enumerate(ROLES)}
    native, plan = _sources(_model(evil, text, alpha), evil["x"])
    native0, plan0 = _sources(_model(plain, "", alpha), plain["x"])
    # The code is the same code whatever the model calls things ...
    assert native == native0
    assert plan == plan0
    # ... so no name or attribute string appears in it (unless our own text has it anyway).
    for s in [*names, text]:
        assert s not in native or s in native0
        assert s not in plan or s in plan0
