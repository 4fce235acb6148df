"""What a KV-cache decoder looks like from outside: which inputs carry the tokens, the mask,
the positions and the cache, which outputs carry the logits and the new cache, and where
the cache's sequence axis lies. Read once per model (``read_decoder``), from the names and
shapes the exporters write:

* Hugging Face optimum (``text-generation-with-past``) and onnxruntime-genai:
  ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.N.key/value`` ->
  ``logits``, ``present.N.key/value``; the cache is ``[batch, heads, past, head_dim]``.
* older exports: ``past_N``/``past.N`` -> ``present_N``/``present.N``.

Every name is the model's text: it is used as a dict key, never pasted into code. A model
that does not fit (no ``input_ids`` or ``logits``, no cache pairs, an input the loop would
not know how to feed) is refused with an ``InputError`` naming what is missing; the model
stays loaded and ``run`` works as before (a server answers 400).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from ..errors import InputError
from ..feeds import concat_prefixes
from ..records import record

__all__ = ["CachePair", "Decoder", "read_decoder"]

#: How much of a ``config.json`` beside the model is read (it holds the position limit).
CONFIG_MAX_BYTES = 1 << 16
_CONFIG_LIMIT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")

#: (past input pattern, present output template): the first pattern an input matches names
#: the output that carries its next value.
_PAIR_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"past_key_values\.(\d+)\.(key|value)"), "present.{0}.{1}"),
    (re.compile(r"past_key_values\.(\d+)"), "present.{0}"),
    (re.compile(r"past\.(\d+)\.(key|value)"), "present.{0}.{1}"),
    (re.compile(r"past_(\d+)"), "present_{0}"),
    (re.compile(r"past\.(\d+)"), "present.{0}"),
)


@record(frozen=True)
class CachePair:
    """One cache tensor: fed as ``past``, returned as ``present``. ``axis`` is its sequence
    axis; ``shape`` the input's declared dims (ints, or None/str where dynamic: the batch
    axis and ``axis`` are filled per call); ``dtype`` what the model takes."""

    past: str
    present: str
    axis: int
    shape: tuple[Any, ...]
    dtype: np.dtype[Any]

    def empty(self, batch: int) -> np.ndarray:
        """The cache before the first token: ``batch`` rows, length 0."""
        dims = [batch if i == 0 else 0 if i == self.axis else int(d)
                for i, d in enumerate(self.shape)]  # fmt: skip
        return np.zeros(dims, self.dtype)

    def buffer(self, batch: int, length: int) -> np.ndarray:
        """A buffer holding this cache for ``batch`` rows up to ``length`` positions."""
        dims = [batch if i == 0 else length if i == self.axis else int(d)
                for i, d in enumerate(self.shape)]  # fmt: skip
        return np.empty(dims, self.dtype)

    def upto(self, n: int) -> tuple[slice, ...]:
        """The index of this cache's first ``n`` positions."""
        return (*(slice(None),) * self.axis, slice(0, n))

    def bytes_per_token(self, batch: int) -> int:
        """Bytes one more token adds to this cache tensor."""
        n = batch * self.dtype.itemsize
        for i, d in enumerate(self.shape):
            if i not in (0, self.axis):
                n *= int(d)
        return n


@record(frozen=True)
class Decoder:
    """The generation-facing signature of a model (see the module docstring). ``vocab`` is
    the logits' last dim when known (token ids are checked against it);
    ``max_positions`` the longest sequence the model embeds positions for, when known (from
    the position table the model gathers from, or ``config.json`` beside the file)."""

    input_ids: str
    logits: str
    cache: tuple[CachePair, ...]
    attention_mask: str | None
    position_ids: str | None
    ids_dtype: np.dtype[Any]
    mask_dtype: np.dtype[Any]
    positions_dtype: np.dtype[Any]
    vocab: int | None
    max_positions: int | None
    #: every ``present`` is ``Concat(past, new)`` along the cache's axis: the generation
    #: keeps each cache in one buffer and the model writes only the new rows into it
    in_place: bool = False
    #: rows of different lengths may be padded on the left (false for GroupQueryAttention,
    #: whose ``seqlens_k`` counts a row's tokens from its start: right padding)
    pads_left: bool = True

    def bytes_per_token(self, batch: int) -> int:
        return sum(c.bytes_per_token(batch) for c in self.cache)


def read_decoder(model: Any) -> Decoder:
    """``model``'s Decoder, or InputError saying why it is not a KV-cache decoder."""
    inputs = {s.name: s for s in model.inputs}
    outputs = {s.name: s for s in model.outputs}
    missing = [n for n, have in (("input_ids", inputs), ("logits", outputs)) if n not in have]
    if missing:
        raise InputError(
            f"this model is not a KV-cache decoder: it has no {' or '.join(missing)} "
            f"(inputs {list(inputs)[:8]!r:.300}, outputs {list(outputs)[:8]!r:.300}); "
            "generate() takes a text-generation-with-past export"
        )
    ids = inputs["input_ids"]
    if ids.dtype is None or np.dtype(ids.dtype).kind not in "iu":
        raise InputError(f"input_ids must be an integer input, this model's is {ids.dtype}")
    cache = tuple(_pair(inputs[n], outputs) for n in inputs if _present_name(n) is not None)
    if not cache:
        raise InputError(
            "this model is not a KV-cache decoder: no past_key_values.N.key/value inputs "
            "with present.N.key/value outputs (generate() needs a -with-past export)"
        )
    known = {"input_ids", "attention_mask", "position_ids"} | {c.past for c in cache}
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise InputError(
            f"generate() does not know how to feed the inputs {unknown[:8]!r:.300} "
            "(it feeds input_ids, attention_mask, position_ids and the past_key_values)"
        )
    return Decoder(
        input_ids="input_ids",
        logits="logits",
        cache=cache,
        attention_mask="attention_mask" if "attention_mask" in inputs else None,
        position_ids="position_ids" if "position_ids" in inputs else None,
        ids_dtype=np.dtype(ids.dtype),
        mask_dtype=_int_dtype(inputs.get("attention_mask")),
        positions_dtype=_int_dtype(inputs.get("position_ids")),
        vocab=_static_last(outputs["logits"].shape),
        max_positions=_position_limit(model, "position_ids" in inputs),
        in_place=_grown_in_place(model, cache),
        pads_left=not any(n.op_type == "GroupQueryAttention" for n in model.graph.walk()),
    )


def _grown_in_place(model: Any, cache: tuple[CachePair, ...]) -> bool:
    """Every cache output is a Concat of its own past input first, along the cache's
    sequence axis (``feeds.concat_prefixes``): its buffer may then start with that past."""
    g = model.graph
    outs = {v.name: k for k, v in enumerate(g.outputs)}
    ins = {v.name: k for k, v in enumerate(g.inputs)}
    prefixes = concat_prefixes(g)
    for c in cache:
        found = prefixes.get(outs.get(c.present, -1))
        if found is None or found[0] != ins.get(c.past) or found[1] % len(c.shape) != c.axis:
            return False
    return True


def _int_dtype(spec: Any) -> np.dtype[Any]:
    dt = np.dtype(spec.dtype) if spec is not None and spec.dtype is not None else None
    if dt is not None and dt.kind not in "iu":
        raise InputError(f"{spec.name!r:.100} must be an integer input, this model's is {dt}")
    return dt if dt is not None else np.dtype(np.int64)


def _present_name(past: str) -> str | None:
    for pattern, template in _PAIR_RULES:
        m = pattern.fullmatch(past)
        if m:
            return template.format(*m.groups())
    return None


def _pair(spec: Any, outputs: dict[str, Any]) -> CachePair:
    present = _present_name(spec.name)
    assert present is not None
    if present not in outputs:
        raise InputError(f"the cache input {spec.name!r:.200} has no output {present!r:.200}")
    shape = tuple(spec.shape or ())
    if len(shape) < 2 or spec.dtype is None or np.dtype(spec.dtype).kind != "f":
        raise InputError(
            f"the cache input {spec.name!r:.200} is not a float tensor of rank >= 2 "
            f"({spec.dtype}, {shape!r:.100})"
        )
    dynamic = [i for i in range(1, len(shape)) if not isinstance(shape[i], int)]
    if len(dynamic) > 1:  # more than the sequence axis is free: take the one named for it
        dynamic = [i for i in dynamic if "past" in str(shape[i]) or "seq" in str(shape[i])]
    if len(dynamic) != 1:
        raise InputError(
            f"cannot tell the sequence axis of the cache input {spec.name!r:.200} "
            f"(shape {shape!r:.100}): one dim after the batch must be dynamic"
        )
    odd = [d for i, d in enumerate(shape) if i not in (0, dynamic[0]) and not isinstance(d, int)]
    if odd:
        raise InputError(f"the cache input {spec.name!r:.200} has dynamic dims {odd!r:.100} "
                         "besides the batch and the sequence")  # fmt: skip
    return CachePair(spec.name, present, dynamic[0], shape, np.dtype(spec.dtype))


def _static_last(shape: Any) -> int | None:
    last = shape[-1] if shape else None
    return last if isinstance(last, int) and last > 0 else None


def _position_limit(model: Any, has_positions: bool) -> int | None:
    """The rows of the table ``position_ids`` is gathered from (through Casts), else the
    limit ``config.json`` beside the model file names, else None."""
    if has_positions:
        rows = [_gathered_rows(n) for n in model.graph.walk() if n.op_type == "Gather"]
        found = [r for r in rows if r is not None]
        if found:
            return min(found)
    return _config_limit(getattr(model, "_origin", ""))


def _gathered_rows(node: Any) -> int | None:
    if len(node.inputs) < 2 or node.attrs.get("axis", 0) != 0:
        return None
    table, idx = node.inputs[0], node.inputs[1]
    while idx is not None and idx.producer is not None and idx.producer.op_type == "Cast":
        idx = idx.producer.inputs[0]
    if table is None or idx is None or idx.name != "position_ids" or idx.producer is not None:
        return None
    shape = table.type.shape if table.type is not None else None
    return shape[0] if shape and isinstance(shape[0], int) else None


def _config_limit(origin: str) -> int | None:
    """The position limit of the ``config.json`` in the model file's directory (read at
    most ``CONFIG_MAX_BYTES``; anything unreadable or odd counts as no limit)."""
    if not origin or not os.path.isfile(origin):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(origin)), "config.json")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(CONFIG_MAX_BYTES + 1)[:CONFIG_MAX_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key in _CONFIG_LIMIT_KEYS:
        v = data.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None
