"""Generation on KV-cache decoders: ``Model.generate``, ``Model.stream`` and
``Model.generate_async`` (``mixin``), over a decoder signature read from the model's names
(``decoder``), checked prompts and settings (``prompts``), token choice (``sampling``) and
one generation's step state (``steps``)."""

from .decoder import CachePair, Decoder, read_decoder
from .mixin import Deadline, GenerateOptions, GenerationMixin, first_step_feeds, start
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
