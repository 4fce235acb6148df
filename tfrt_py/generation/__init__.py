"""Generation on KV-cache decoders: ``Model.generate``, ``Model.stream`` and
``Model.generate_async`` (``mixin``), over a decoder signature read from the model's names
(``decoder``), checked prompts and settings (``prompts``), token choice (``sampling``) and
one generation's step state (``steps``).

Only ``mixin`` is imported with the package (``Model`` inherits it); the rest is imported
when a model first generates, or when one of its names is read here: ``import tfrt_py``
does not pay for generation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .mixin import Deadline, GenerateOptions, GenerationMixin, start
from .warm import first_step_feeds

if TYPE_CHECKING:
    from .decoder import CachePair, Decoder, read_decoder
    from .prompts import MAX_CACHE_BYTES, MAX_NEW_TOKENS
    from .steps import Steps

__all__ = [
    "MAX_CACHE_BYTES",
    "MAX_NEW_TOKENS",
    "CachePair",
    "Deadline",
    "Decoder",
    "GenerateOptions",
    "GenerationMixin",
    "Steps",
    "first_step_feeds",
    "read_decoder",
    "start",
]

#: The names read from a submodule on first access.
_LAZY = {
    "CachePair": "decoder",
    "Decoder": "decoder",
    "read_decoder": "decoder",
    "MAX_CACHE_BYTES": "prompts",
    "MAX_NEW_TOKENS": "prompts",
    "Steps": "steps",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
