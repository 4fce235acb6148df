"""Build the bundled example models from fixed seeds (run to regenerate the .onnx files).

    python -m tfrt_py.examples.make_models

``mlp_small.onnx``: x[1,64] -> Gemm 64x256 + Relu -> Gemm 256x256 + Relu -> Gemm 256x10
-> Softmax (benchmark model M2). ``ads_normalize.onnx``: 18 inputs f0..f17 [1,1], each
divided by its own constant max, Concat -> [1,18] -> Gemm 18x64 + Relu -> Gemm 64x1 ->
Sigmoid (benchmark model M3).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def _gemm_stack(x: str, sizes: list[int], rng: np.random.Generator, acts: list[str]) -> tuple:
    nodes, inits = [], []
    cur = x
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"h{i}"], name=f"gemm{i}"))
        cur = f"h{i}"
        if acts[i]:
            nodes.append(helper.make_node(acts[i], [cur], [f"a{i}"], name=f"{acts[i].lower()}{i}"))
            cur = f"a{i}"
    return nodes, inits, cur


def mlp_small(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, cur = _gemm_stack("x", [64, 256, 256, 10], rng, ["Relu", "Relu", ""])
    nodes.append(helper.make_node("Softmax", [cur], ["probs"], axis=-1, name="softmax"))
    graph = helper.make_graph(
        nodes,
        "mlp_small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ads_normalize(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, ins = [], [], []
    for i in range(18):
        ins.append(helper.make_tensor_value_info(f"f{i}", TensorProto.FLOAT, [1, 1]))
        mx = np.array([[rng.uniform(10, 1000)]], dtype=np.float32)
        inits.append(numpy_helper.from_array(mx, f"max{i}"))
        nodes.append(helper.make_node("Div", [f"f{i}", f"max{i}"], [f"n{i}"], name=f"norm{i}"))
    nodes.append(helper.make_node("Concat", [f"n{i}" for i in range(18)], ["feat"], axis=1))
    more, winits, cur = _gemm_stack("feat", [18, 64, 1], rng, ["Relu", "Sigmoid"])
    graph = helper.make_graph(
        nodes + more,
        "ads_normalize",
        ins,
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, 1])],
        inits + winits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    for name, build in (("mlp_small", mlp_small), ("ads_normalize", ads_normalize)):
        model = build()
        model.ir_version = 8  # readable by older onnxruntime builds too
        onnx.checker.check_model(model)
        path = os.path.join(HERE, f"{name}.onnx")
        onnx.save(model, path)
        print(f"wrote {path} ({os.path.getsize(path):,} bytes)")


if __name__ == "__main__":
    main()
