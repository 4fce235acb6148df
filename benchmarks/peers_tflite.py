"""TFLite flatbuffers for the anchor models, built from the anchors' own fixed-seed weights.

No TensorFlow converter is involved: ``build_tflite(anchor)`` writes the model with the
object API of the TFLite schema that ``ai_edge_litert`` ships
(``ai_edge_litert.schema_py_generated``, the schema its interpreter reads) and
``flatbuffers``. Ops used: FULLY_CONNECTED (weights [out, in], optional bias, fused RELU),
SOFTMAX, LOGISTIC, DIV and CONCATENATION, all float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["build_tflite"]

F32 = np.float32


class _Graph:
    """One subgraph under construction: tensors, constant buffers, operators."""

    def __init__(self, fb: Any) -> None:
        self.fb = fb
        self.tensors: list[Any] = []
        self.buffers: list[Any] = [fb.BufferT()]  # buffer 0: the empty sentinel
        self.ops: list[Any] = []
        self.codes: dict[int, int] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def tensor(self, name: str, shape: tuple[int, ...], data: np.ndarray | None = None) -> int:
        t = self.fb.TensorT()
        t.name, t.shape, t.type = name, list(shape), self.fb.TensorType.FLOAT32
        if data is not None:
            buf = self.fb.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, F32).tobytes(), np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        else:
            t.buffer = 0
        self.tensors.append(t)
        return len(self.tensors) - 1

    def input(self, name: str, shape: tuple[int, ...]) -> int:
        i = self.tensor(name, shape)
        self.inputs.append(i)
        return i

    def op(self, code: int, ins: list[int], out: int, kind: int = 0, options: Any = None) -> int:
        if code not in self.codes:
            self.codes[code] = len(self.codes)
        o = self.fb.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self.codes[code], ins, [out]
        if options is not None:
            o.builtinOptionsType, o.builtinOptions = kind, options
        self.ops.append(o)
        return out

    def fully_connected(self, name: str, x: int, w: np.ndarray, b: np.ndarray | None, relu: bool):
        """x[batch, in] @ w[in, out] + b; TFLite stores the weights transposed, [out, in]."""
        fb = self.fb
        batch = self.tensors[x].shape[0]
        wt = self.tensor(f"{name}/w", w.T.shape, w.T)
        bt = -1 if b is None else self.tensor(f"{name}/b", b.shape, b)
        out = self.tensor(name, (batch, w.shape[1]))
        opts = fb.FullyConnectedOptionsT()
        opts.fusedActivationFunction = (
            fb.ActivationFunctionType.RELU if relu else fb.ActivationFunctionType.NONE
        )
        kind = fb.BuiltinOptions.FullyConnectedOptions
        return self.op(fb.BuiltinOperator.FULLY_CONNECTED, [x, wt, bt], out, kind, opts)

    def finish(self, outputs: list[int]) -> bytes:
        import flatbuffers

        fb = self.fb
        sub = fb.SubGraphT()
        sub.tensors, sub.operators = self.tensors, self.ops
        sub.inputs, sub.outputs, sub.name = self.inputs, outputs, "main"
        model = fb.ModelT()
        model.version, model.description = 3, "tfrt_py anchor"
        model.subgraphs, model.buffers = [sub], self.buffers
        codes = []
        for code in sorted(self.codes, key=self.codes.__getitem__):
            c = fb.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            codes.append(c)
        model.operatorCodes = codes
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def build_tflite(anchor: Any) -> bytes:
    """The anchor model as a .tflite flatbuffer (inputs named as the anchor's feeds)."""
    from ai_edge_litert import schema_py_generated as fb

    g = _Graph(fb)
    p = anchor.params
    if anchor.kind == "matmul_chain":
        h = g.input("x", anchor.feeds["x"].shape)
        for i, w in enumerate(p["ws"]):
            h = g.fully_connected(f"r{i}", h, w, None, relu=True)
    elif anchor.kind == "mlp":
        h = g.input("x", anchor.feeds["x"].shape)
        n = len(p["ws"])
        for i, (w, b) in enumerate(zip(p["ws"], p["bs"])):
            h = g.fully_connected(f"g{i}", h, w, b, relu=i < n - 1 or p["relu_last"])
        if p["softmax"]:
            opts = fb.SoftmaxOptionsT()
            opts.beta = 1.0
            out = g.tensor("probs", tuple(g.tensors[h].shape))
            kind = fb.BuiltinOptions.SoftmaxOptions
            h = g.op(fb.BuiltinOperator.SOFTMAX, [h], out, kind, opts)
    elif anchor.kind == "ads":
        cols = []
        for i, m in enumerate(p["maxes"]):
            f = g.input(f"f{i}", anchor.feeds[f"f{i}"].shape)
            mt = g.tensor(f"max{i}", m.shape, m)
            cols.append(g.op(fb.BuiltinOperator.DIV, [f, mt], g.tensor(f"n{i}", (1, 1))))
        cat = fb.ConcatenationOptionsT()
        cat.axis = 1
        feat = g.tensor("feat", (1, len(cols)))
        kind = fb.BuiltinOptions.ConcatenationOptions
        h = g.op(fb.BuiltinOperator.CONCATENATION, cols, feat, kind, cat)
        h = g.fully_connected("r0", h, p["w0"], p["b0"], relu=True)
        h = g.fully_connected("g1", h, p["w1"], p["b1"], relu=False)
        h = g.op(fb.BuiltinOperator.LOGISTIC, [h], g.tensor("score", (1, 1)))
    else:
        raise ValueError(f"no TFLite builder for anchor kind {anchor.kind!r}")
    return g.finish([h])


if __name__ == "__main__":  # write the .tflite files: python benchmarks/peers_tflite.py [DIR]
    import os
    import sys

    from anchor_models import ANCHORS  # a sibling: this script's folder is on sys.path

    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    for key, build in ANCHORS.items():
        path = os.path.join(out, f"{key}.tflite")
        with open(path, "wb") as f:
            f.write(build_tflite(build()))
        print(path)
