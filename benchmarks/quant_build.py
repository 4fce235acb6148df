"""The quantized zoo's models: fp32 exports from fixed seeds (random weights, nothing
downloaded) quantized by onnxruntime's own tool, ``onnxruntime.quantization``. Used by
``quant_zoo.py`` (the benchmark).

    python benchmarks/quant_build.py [--models a,b] [--rebuild]   # build (cache) and list

Recipes (``ZOO``):

* ``<vision>-qdq``: the vision zoo's TorchScript export (``vision_zoo.ensure_exported``:
  torchvision, ``weights=None``, seed 0, dynamic batch) through ``quant_pre_process``, then
  ``quantize_static`` in QDQ format, per channel, activations QUInt8, weights QInt8,
  calibrated (MinMax) on ``CALIBRATION_SAMPLES`` seeded random images;
* ``<vision>-qop``: the same in QOperator format (QLinearConv, QLinearAdd, ...);
* ``<vision>-qdq-rr``: ``-qdq`` with ``reduce_range=True`` (7-bit weights), which
  onnxruntime's docs advise on CPUs without VNNI, whose U8S8 kernel saturates otherwise;
* ``<text>-dynamic``: transformers' BERT / DistilBERT, 4 layers, hidden 256
  (``transformer_zoo.make`` with ``SIZE``: ``torch.onnx.export(dynamo=False)``, batch and
  sequence dynamic) through ``quantize_dynamic`` (weights QInt8); ``bert-ort-dynamic`` is
  the export with eager attention run through ``onnxruntime.transformers``' optimizer
  (model_type bert: Attention, EmbedLayerNormalization, SkipLayerNormalization) first, so
  ``quantize_dynamic`` makes QAttention and QEmbedLayerNormalization (``extra_options``
  ``DefaultTensorType`` FLOAT: the contrib ops' outputs have no inferred type);
  ``bert-dynamic-rr`` is ``bert-dynamic`` with ``reduce_range=True`` (7-bit weights);
* ``llama-nbits4``: ``generate.py``'s Llama decoder (optimum's ``text-generation-with-past``
  export, 4 layers/256, 8 heads over 2 KV heads; ``benchmarks/models/decoders/llama``,
  built by ``dynamic_shapes.decoder_paths`` unless there) through ``MatMulNBitsQuantizer``
  (4 bits, block 32, asymmetric): MatMulNBits; ``llama-nbits4-acc4`` the same at
  ``accuracy_level=4`` (A quantized to int8 per block: onnxruntime-genai's CPU default);
  ``llama1k-nbits4-acc4`` a wider Llama (``llama-1k``: 1024 wide, MLP 4096, 4 layers, 16
  heads over 4 KV heads, an 8k vocabulary) the same way, where the products dominate a step.

Files: ``benchmarks/models/quant/<name>.<tag>.onnx`` (gitignored) and a sidecar ``.json``
naming its fp32 source and its quantized ops, the tag the versions of torch, torchvision,
transformers and onnxruntime; the text sources under ``benchmarks/models/quant/fp32-<tag>/``.
Each model is built in a child process (torch never enters the measuring process; one
failure costs only that model); a failure is kept as ``<name>.<tag>.failed`` (its
traceback) until ``--rebuild``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from transformer_zoo import quiet

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
QUANT_DIR = os.path.join(HERE, "models", "quant")
SEED = 0
CALIBRATION_SAMPLES = 8


@dataclass(frozen=True)
class Spec:
    kind: str  # vision | text | decoder
    source: str  # vision_zoo name, transformer_zoo variant name, or decoder name
    recipe: str  # qdq | qop | qdq-rr | dynamic | dynamic-rr | nbits4 | nbits4-acc4


ZOO: dict[str, Spec] = {
    "resnet18-qdq": Spec("vision", "resnet18", "qdq"),
    "resnet18-qop": Spec("vision", "resnet18", "qop"),
    "mobilenet_v2-qdq": Spec("vision", "mobilenet_v2", "qdq"),
    "mobilenet_v2-qop": Spec("vision", "mobilenet_v2", "qop"),
    "efficientnet_b0-qdq": Spec("vision", "efficientnet_b0", "qdq"),
    "resnet18-qdq-rr": Spec("vision", "resnet18", "qdq-rr"),
    "mobilenet_v2-qdq-rr": Spec("vision", "mobilenet_v2", "qdq-rr"),
    "bert-dynamic": Spec("text", "bert", "dynamic"),
    "bert-ort-dynamic": Spec("text", "bert-ort", "dynamic"),
    "distilbert-dynamic": Spec("text", "distilbert", "dynamic"),
    "bert-dynamic-rr": Spec("text", "bert", "dynamic-rr"),
    "llama-nbits4": Spec("decoder", "llama", "nbits4"),
    "llama-nbits4-acc4": Spec("decoder", "llama", "nbits4-acc4"),
    "llama1k-nbits4-acc4": Spec("decoder", "llama-1k", "nbits4-acc4"),
}
RECIPES = {
    "qdq": "quantize_static QDQ per-channel U8/S8",
    "qop": "quantize_static QOperator per-channel U8/S8",
    "qdq-rr": "quantize_static QDQ per-channel U8/S8, reduce_range (7-bit weights)",
    "dynamic": "quantize_dynamic S8 weights",
    "dynamic-rr": "quantize_dynamic S8 weights, reduce_range (7-bit weights)",
    "nbits4": "MatMulNBits 4-bit block 32 asym",
    "nbits4-acc4": "MatMulNBits 4-bit block 32 asym, accuracy_level 4",
}


def text_size() -> Any:
    """BERT-base's shape cut to 4 layers of 256 (4 heads, FFN 1024), a 1000-token vocabulary,
    128 positions."""
    from transformer_zoo import Size

    return Size(hidden=256, layers=4, heads=4, ffn=1024, vocab=1000, positions=128)


def versions_tag() -> str:
    def v(p: str) -> str:
        try:
            return metadata.version(p).split("+")[0]
        except metadata.PackageNotFoundError:
            return "none"

    return "-".join(v(p) for p in ("torch", "torchvision", "transformers", "onnxruntime"))


def paths(name: str, tag: str) -> tuple[str, str, str]:
    """(model, sidecar json, failure note) of ``name``."""
    base = os.path.join(QUANT_DIR, f"{name}.{tag}")
    return base + ".onnx", base + ".json", base + ".failed"


# -- the child: one model ----------------------------------------------------------------------


class SeededImages:
    """``onnxruntime.quantization.CalibrationDataReader``: ``n`` standard-normal images of
    batch 1 from a seeded generator (the same samples on every build)."""

    def __init__(self, input_name: str, shape: tuple[int, ...], n: int, seed: int = SEED):
        import numpy as np

        rng = np.random.default_rng(seed)
        self.samples = [
            {input_name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)
        ]
        self.i = 0

    def get_next(self) -> dict[str, Any] | None:
        if self.i >= len(self.samples):
            return None
        self.i += 1
        return self.samples[self.i - 1]

    def rewind(self) -> None:
        self.i = 0


def _reader(path: str, n: int) -> Any:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader

    graph = onnx.load(path, load_external_data=False).graph
    inp = graph.input[0]
    dims = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]  # batch 1

    class Reader(SeededImages, CalibrationDataReader):  # the tool's ABC, iterable
        pass

    return Reader(inp.name, tuple(dims), n)


def _vision(spec: Spec, src: str, dst: str) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst + ".pre.onnx"
    try:
        with quiet():
            quant_pre_process(src, pre)
            quantize_static(
                pre, dst, _reader(pre, CALIBRATION_SAMPLES),
                quant_format=QuantFormat.QOperator if spec.recipe == "qop" else QuantFormat.QDQ,
                per_channel=True, reduce_range=spec.recipe.endswith("-rr"),
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
            )  # fmt: skip
    finally:
        if os.path.exists(pre):
            os.remove(pre)


def _dynamic(src: str, dst: str, reduce_range: bool = False) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The optimizer's contrib ops (SkipLayerNormalization, Attention) leave their outputs
    # untyped for ONNX shape inference: without a default type the tool stops at the first
    # MatMul after one ("Unable to find data type for weight_name=...", as it suggests).
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    with quiet():
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=reduce_range,
                         extra_options=extra)  # fmt: skip


def _nbits(src: str, dst: str, accuracy_level: int | None) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    with quiet():
        q = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=32, is_symmetric=False,
                                 accuracy_level=accuracy_level)  # fmt: skip
        q.process()
        q.model.save_model_to_file(dst, use_external_data_format=False)


def _source(spec: Spec, tag: str) -> str:
    """The fp32 model ``spec`` quantizes (exported now unless cached)."""
    if spec.kind == "vision":
        import vision_zoo

        got = vision_zoo.ensure_exported([spec.source], ["torchscript"])
        path = got[(spec.source, "torchscript")]
    elif spec.kind == "text":
        import transformer_zoo

        path = transformer_zoo.make(transformer_zoo.variant(spec.source), text_size(),
                                    os.path.join(QUANT_DIR, f"fp32-{tag}"))  # fmt: skip
    else:
        from dynamic_shapes import decoder_paths

        path = decoder_paths([spec.source]).get(spec.source, "error: export failed")
    if path.startswith("error:"):
        raise RuntimeError(f"fp32 source {spec.source}: {path}")
    return path


def quantized_ops(path: str) -> dict[str, int]:
    """The model's quantization op types and their counts."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    counts = collections.Counter(n.op_type for n in graph.node)
    keep = ("quantize", "integer", "nbits", "qlinear", "qgemm", "qattention", "qembed")
    return {op: c for op, c in sorted(counts.items()) if any(k in op.lower() for k in keep)}


def build_one(name: str) -> None:
    """Build ``name``'s quantized model and its sidecar (the child)."""
    spec, tag = ZOO[name], versions_tag()
    path, side, _ = paths(name, tag)
    os.makedirs(QUANT_DIR, exist_ok=True)
    src = _source(spec, tag)
    tmp = path + ".tmp.onnx"
    t0 = time.perf_counter()
    try:
        if spec.recipe in ("qdq", "qop", "qdq-rr"):
            _vision(spec, src, tmp)
        elif spec.recipe in ("dynamic", "dynamic-rr"):
            _dynamic(src, tmp, spec.recipe == "dynamic-rr")
        else:
            _nbits(src, tmp, 4 if spec.recipe == "nbits4-acc4" else None)
        os.replace(tmp, path)
    finally:
        for p in (tmp, tmp + ".data"):
            if os.path.exists(p):
                os.remove(p)
    info = {"int8": path, "fp32": src, "kind": spec.kind, "recipe": spec.recipe,
            "ops": quantized_ops(path), "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(side, "w") as f:
        json.dump(info, f, indent=1)


# -- the parent --------------------------------------------------------------------------------


def error_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()] or ["failed"]
    return next((ln.strip() for ln in reversed(lines) if "Error" in ln), lines[-1].strip())


def ensure_built(names: list[str], rebuild: bool = False) -> dict[str, dict[str, Any]]:
    """Build what is not cached (one child process per model). Returns name -> the sidecar
    (``int8``, ``fp32`` paths, ``ops``...) or ``{"error": message}``."""
    os.makedirs(QUANT_DIR, exist_ok=True)
    tag = versions_tag()
    got: dict[str, dict[str, Any]] = {}
    for name in names:
        path, side, fail = paths(name, tag)
        if rebuild:
            for p in (path, side, fail):
                if os.path.exists(p):
                    os.remove(p)
        if os.path.exists(fail):
            with open(fail) as f:
                got[name] = {"error": error_line(f.read()) + f" (kept in {fail})"}
            continue
        if os.path.exists(path) and os.path.exists(side):
            with open(side) as f:
                info = json.load(f)
            if os.path.exists(info.get("fp32", "")):
                got[name] = info
                continue
        print(f"building {name} ({RECIPES[ZOO[name].recipe]}) ...", flush=True)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--child", name],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode == 0 and os.path.exists(side):
            with open(side) as f:
                got[name] = json.load(f)
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
        else:
            with open(fail, "w") as f:
                f.write(r.stderr[-6000:] or r.stdout[-2000:] or "failed")
            got[name] = {"error": error_line(r.stderr or r.stdout)}
            print(f"  failed: {got[name]['error']}", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--rebuild", action="store_true", help="build again (failures too)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        build_one(a.child)
        return
    names = [m for m in a.models.split(",") if m]
    unknown = set(names) - set(ZOO)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; the zoo has {', '.join(ZOO)}")
    for name, info in ensure_built(names, a.rebuild).items():
        if "error" in info:
            print(f"{name}: FAILED: {info['error']}")
        else:
            ops = ", ".join(f"{k} {v}" for k, v in info["ops"].items())
            print(f"{name}: {info['int8']} (from {info['fp32']}): {ops}")


if __name__ == "__main__":
    main()
