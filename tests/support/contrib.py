"""Helpers of the contrib-kernel tests: one-node com.microsoft models checked against
onnxruntime's CPU provider on tfrt_py's executors.

``node_model`` builds the model (inputs named ``i0..``, outputs ``y0..``; an input given as
``None`` or an output not wanted is an empty name, as ONNX omits optional ones; inputs
whose positions are in ``const`` become initializers). ``check_node`` runs it on
onnxruntime and on each executor, twice per executor (the second call takes the planned
path) and compares every output: dtype, shape, values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import tfrt_py

__all__ = [
    "MS",
    "assert_same",
    "check_node",
    "edge_codes",
    "nbits_inputs",
    "node_model",
    "ort_outputs",
    "tfrt_outputs",
]

MS = "com.microsoft"
EXECUTORS = ("sync", "async")


def _elem(a: np.ndarray) -> int:
    if a.dtype == object:
        return onnx.TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(a.dtype)


def edge_codes(rng: np.random.Generator, shape: tuple[int, ...], dt: Any) -> np.ndarray:
    """Random integer codes of ``dt`` with its minimum first and its maximum last (when
    there are two elements): the saturation edges every quantized test wants."""
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max + 1, shape).astype(dt)
    flat = x.reshape(-1)
    if flat.size >= 2:
        flat[0], flat[-1] = info.min, info.max
    return x


def nbits_inputs(rng: np.random.Generator, a_shape: tuple[int, ...], k: int, n: int,
                 bits: int, block: int, zp: str, bias: bool) -> list[Any]:  # fmt: skip
    """MatMulNBits' inputs (A float32 ``a_shape + (k,)``, B's ``bits``-bit codes in blocks,
    scales; zero points ``"none"``, ``"packed"`` or ``"float"``; with ``bias``, g_idx absent
    and a bias): random, from ``rng``."""
    k_blocks = -(-k // block)
    b = rng.integers(0, 256, (n, k_blocks, block * bits // 8)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (n * k_blocks,)).astype(np.float32)
    zps: Any = None
    if zp == "packed":
        zps = rng.integers(0, 256, (n, -(-k_blocks * bits // 8))).astype(np.uint8)
    elif zp == "float":
        zps = rng.uniform(0, 2**bits - 1, (n, k_blocks)).astype(np.float32)
    a = rng.standard_normal((*a_shape, k)).astype(np.float32)
    extra = [None, rng.standard_normal(n).astype(np.float32)] if bias else []
    return [a, b, scales, zps, *extra]


def node_model(
    op: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    outputs: Sequence[bool] = (True,),
    const: Sequence[int] = (),
    domain: str = MS,
    opset: int = 17,
) -> onnx.ModelProto:
    """A one-node model of ``op``; ``outputs[k]`` says whether output k is produced."""
    names = [f"i{i}" if a is not None else "" for i, a in enumerate(inputs)]
    outs = [f"y{k}" if want else "" for k, want in enumerate(outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    graph_inputs = []
    inits = []
    for i, (n, a) in enumerate(zip(names, inputs)):
        if a is None:
            continue
        if i in const:
            inits.append(numpy_helper.from_array(a, n))
        else:
            graph_inputs.append(helper.make_tensor_value_info(n, _elem(a), a.shape))
    graph = helper.make_graph(
        [node],
        "g",
        graph_inputs,
        [onnx.ValueInfoProto(name=o) for o in outs if o],
        initializer=inits,
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 9
    return model


def runtime_feeds(
    inputs: Sequence[np.ndarray | None], const: Sequence[int] = ()
) -> dict[str, np.ndarray]:
    return {f"i{i}": a for i, a in enumerate(inputs) if a is not None and i not in const}


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in sess.run(None, feeds)]


def tfrt_outputs(
    model: onnx.ModelProto | tfrt_py.Model, feeds: dict[str, np.ndarray], executor: str = "sync"
) -> list[np.ndarray]:
    m = model if isinstance(model, tfrt_py.Model) else tfrt_py.load(model, executor=executor)
    got = m.run(feeds)
    return [np.asarray(got[o.name]) for o in m.outputs]


def assert_same(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float, what: str
) -> None:
    assert len(got) == len(want), (what, len(got), len(want))
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, (what, k, g.dtype, w.dtype)
        assert g.shape == w.shape, (what, k, g.shape, w.shape)
        if g.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} output {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {k}")


def check_node(
    op: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    outputs: Sequence[bool] = (True,),
    consts: Sequence[Sequence[int]] = ((),),
    rtol: float = 1e-5,
    atol: float = 1e-5,
    executors: Sequence[str] = EXECUTORS,
    domain: str = MS,
) -> list[np.ndarray]:
    """Every output equals onnxruntime's on every executor, with the inputs at each
    position set of ``consts`` given as initializers. Returns onnxruntime's outputs."""
    want: list[np.ndarray] = []
    for const in consts:
        model = node_model(op, inputs, attrs, outputs=outputs, const=const, domain=domain)
        feeds = runtime_feeds(inputs, const)
        want = ort_outputs(model, feeds)
        for ex in executors:
            m = tfrt_py.load(model, executor=ex)
            for call in range(2):
                got = tfrt_outputs(m, feeds)
                assert_same(got, want, rtol, atol, f"{op} {ex} const={const} call {call}")
    return want
