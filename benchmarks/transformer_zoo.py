"""The transformer zoo's models: transformers-library BERT, DistilBERT, GPT-2 and T5 encoder
from small configs and fixed seeds (random weights, nothing downloaded), exported by
torch.onnx, some also run through onnxruntime's optimizers. Used by ``zoo_transformers.py``
(the benchmark) and by it to write the test files in ``tests/data/transformers``.

Needs torch and transformers (``make bench-zoo-transformers`` installs them); onnxscript for
the dynamo exporter. Every model takes ``input_ids`` and ``attention_mask`` (int64,
``[batch, sequence]``, both axes dynamic) and returns ``last_hidden_state``.

Variants (``VARIANTS``):

* ``<arch>``: ``torch.onnx.export(dynamo=False)`` (the TorchScript exporter), opset 17,
  ``dynamic_axes`` for batch and sequence;
* ``<arch>-dynamo``: ``torch.onnx.export(dynamo=True)`` with ``torch.export.Dim`` batch and
  sequence, opset 18 (the exporter's oldest: asking for 17 makes it down-convert, which
  leaves opset-18 attributes in GPT-2's Split and an invalid model);
* ``<arch>-ort``: the TorchScript export of the model with transformers' ``eager``
  attention (the pattern onnxruntime's fusions match; the default ``sdpa`` pattern is not
  fused into Attention) run through
  ``onnxruntime.transformers.optimizer.optimize_model``: com.microsoft Attention,
  EmbedLayerNormalization, SkipLayerNormalization, BiasGelu (BERT), FastGelu (GPT-2),
  SkipSimplifiedLayerNormalization and SimplifiedLayerNormalization (T5);
* ``<arch>-ortsession``: the TorchScript export as onnxruntime saves it after its own
  graph optimizations (``ORT_ENABLE_EXTENDED``, ``optimized_model_filepath``):
  FusedMatMul, FastGelu, BiasGelu, SkipLayerNormalization.

A variant that cannot be made raises ``ExportFailed`` saying why. Exports run under
``torch.no_grad()``: with autograd on, torch 2.14's dynamo export of the T5 encoder fails in
its decompositions ("Cannot view a tensor with shape [s, s, 4, 32] and strides ... as a
tensor with shape (s, s, 128)"); without it, every variant exports.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SIZES",
    "VARIANTS",
    "ExportFailed",
    "Size",
    "Variant",
    "feeds",
    "make",
    "variant",
]


@dataclass(frozen=True)
class Size:
    """A model size: every architecture is built from these numbers."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    positions: int


SIZES = {
    "bench": Size(hidden=128, layers=2, heads=4, ffn=512, vocab=1000, positions=128),
    "test": Size(hidden=32, layers=2, heads=2, ffn=64, vocab=100, positions=64),
}


@dataclass(frozen=True)
class Variant:
    """One zoo model: an architecture, its exporter and onnxruntime post-processing."""

    name: str
    arch: str  # bert | distilbert | gpt2 | t5
    exporter: str = "torchscript"  # or "dynamo"
    optimize: str = ""  # "" | "ort" (python optimizer) | "ortsession" (session-saved)


VARIANTS = (
    Variant("bert", "bert"),
    Variant("bert-dynamo", "bert", "dynamo"),
    Variant("bert-ort", "bert", optimize="ort"),
    Variant("bert-ortsession", "bert", optimize="ortsession"),
    Variant("distilbert", "distilbert"),
    Variant("distilbert-dynamo", "distilbert", "dynamo"),
    Variant("gpt2", "gpt2"),
    Variant("gpt2-dynamo", "gpt2", "dynamo"),
    Variant("gpt2-ort", "gpt2", optimize="ort"),
    Variant("t5-encoder", "t5"),
    Variant("t5-encoder-dynamo", "t5", "dynamo"),
    Variant("t5-encoder-ort", "t5", optimize="ort"),
)

#: onnxruntime's optimizer's model_type per architecture.
_ORT_TYPES = {"bert": "bert", "distilbert": "bert", "gpt2": "gpt2", "t5": "t5"}
SEED = 0


class ExportFailed(RuntimeError):
    """A variant could not be made; the message says which step failed and why."""


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise KeyError(f"no zoo model {name!r}; models: {', '.join(v.name for v in VARIANTS)}")


def _config(arch: str, size: Size, eager: bool) -> Any:
    import transformers as tr

    s = size
    if arch == "bert":
        cfg = tr.BertConfig(
            vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
            num_attention_heads=s.heads, intermediate_size=s.ffn,
            max_position_embeddings=s.positions,
        )  # fmt: skip
    elif arch == "distilbert":
        cfg = tr.DistilBertConfig(
            vocab_size=s.vocab, dim=s.hidden, n_layers=s.layers, n_heads=s.heads,
            hidden_dim=s.ffn, max_position_embeddings=s.positions,
        )  # fmt: skip
    elif arch == "gpt2":
        cfg = tr.GPT2Config(
            vocab_size=s.vocab, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
            n_inner=s.ffn, n_positions=s.positions, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    elif arch == "t5":
        cfg = tr.T5Config(
            vocab_size=s.vocab, d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=s.ffn,
            num_layers=s.layers, num_heads=s.heads,
        )  # fmt: skip
    else:
        raise KeyError(arch)
    if eager:
        cfg._attn_implementation = "eager"
    return cfg


def torch_model(arch: str, size: Size, eager: bool = False) -> Any:
    """The architecture with random weights from ``SEED``, wrapped to take
    ``(input_ids, attention_mask)`` by keyword (transformers 5's forward signatures do not
    take them positionally as the TorchScript exporter passes them) and return the last
    hidden state."""
    import torch
    import transformers as tr

    classes = {
        "bert": tr.BertModel,
        "distilbert": tr.DistilBertModel,
        "gpt2": tr.GPT2Model,
        "t5": tr.T5EncoderModel,
    }
    torch.manual_seed(SEED)
    inner = classes[arch](_config(arch, size, eager)).eval()
    extra = {"use_cache": False} if arch == "gpt2" else {}

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **extra
            )
            return out.last_hidden_state

    return LastHiddenState().eval()


_NAMES = {"input_names": ["input_ids", "attention_mask"], "output_names": ["last_hidden_state"]}


@contextlib.contextmanager
def quiet() -> Any:
    """The exporters' and optimizer's chatter (progress lines, deprecation warnings) off."""
    logging.disable(logging.WARNING)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _export(arch: str, size: Size, exporter: str, path: str, eager: bool = False) -> None:
    import torch

    model = torch_model(arch, size, eager)
    ids = torch.randint(0, size.vocab, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    with quiet(), torch.inference_mode(False), torch.no_grad():
        if exporter == "torchscript":
            axes = {0: "batch", 1: "sequence"}
            torch.onnx.export(
                model, (ids, mask), path, dynamo=False, opset_version=17,
                dynamic_axes={"input_ids": axes, "attention_mask": axes,
                              "last_hidden_state": axes},
                **_NAMES,
            )  # fmt: skip
        else:
            b, s = torch.export.Dim("batch"), torch.export.Dim("sequence")
            torch.onnx.export(
                model, (ids, mask), path, dynamo=True, opset_version=18,
                dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}), **_NAMES,
            )  # fmt: skip


def _ort_python_optimize(src: str, dst: str, arch: str, size: Size) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    with quiet():
        opt = optimize_model(
            src, model_type=_ORT_TYPES[arch], num_heads=size.heads, hidden_size=size.hidden
        )
        opt.save_model_to_file(dst)


def _ort_session_optimize(src: str, dst: str) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = dst
    ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def make(v: Variant, size: Size, directory: str, rebuild: bool = False) -> str:
    """The path of ``v``'s model file in ``directory``, exported now unless it is there
    (``rebuild``: always). ``ExportFailed`` says why a variant cannot be made."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{v.name}.onnx")
    if os.path.exists(path) and not rebuild:
        return path
    tmp = path + ".tmp.onnx"
    base = path + ".base.onnx"
    try:
        if v.optimize:
            _export(v.arch, size, "torchscript", base, eager=v.optimize == "ort")
            if v.optimize == "ort":
                _ort_python_optimize(base, tmp, v.arch, size)
            else:
                _ort_session_optimize(base, tmp)
        else:
            _export(v.arch, size, v.exporter, tmp)
        _save_whole(tmp, path)
    except Exception as e:  # any exporter failure becomes ExportFailed, reported
        raise ExportFailed(f"{type(e).__name__}: {_summary(str(e))}") from e
    finally:
        for p in (tmp, base):
            for leftover in (p, p + ".data"):
                if os.path.exists(leftover):
                    os.remove(leftover)
    return path


def _save_whole(src: str, dst: str) -> None:
    """``src`` (which may keep its weights in a ``.data`` file beside it, as the dynamo
    exporter writes) saved as one self-contained file ``dst``."""
    import onnx

    model = onnx.load(src, load_external_data=True)
    onnx.save(model, dst + ".part", save_as_external_data=False)
    os.replace(dst + ".part", dst)


def _summary(message: str) -> str:
    """The line of an exporter error that says what went wrong (torch.onnx puts it under
    '## Exception summary')."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("## Exception summary") and i + 1 < len(lines):
            return lines[i + 1][:300]
    return lines[0][:300] if lines else ""


def feeds(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids and an attention mask whose first row is right-padded by a quarter."""
    rng = np.random.default_rng(seed * 1_000_003 + batch * 1009 + seq)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    if seq >= 4:
        mask[0, seq - seq // 4 :] = 0
    return {"input_ids": ids, "attention_mask": mask}
