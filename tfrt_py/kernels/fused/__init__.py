"""Kernels: the compiler's fused ops, in the private domain ``tfrt_py.fused``.

The fusion passes of ``tfrt_py.compiler`` rewrite runs of ONNX nodes into one node of this
domain; the kernels that run those nodes live here, with the other kernel families, so
that a model's run-time code is all at or below ``executors/`` (the compiler is load-time
only). ``Linear`` (``linear``: a product with its bias and activations),
``ElementwiseChain``/``ElementwiseChainShared`` (``chain``), the vision and transformer
ops (``vision``: Conv with its epilogue, ChannelLayerNorm, SqueezeExcite, MatMulTransB,
SoftmaxAttention; ``rotary``: RotaryHalf), ``PairwiseSqDist`` (``ml``), ``QTable``
(``qtable``: a quantized SiLU's codes as one lookup) and ``TextVectorize`` (``text``: a
text vectorizer's tokenizing and counting in one pass). ``domain`` has
the domain's name and the form of a fused step.

This is the one family that composes others: a fused op runs the other families' compute
cores (``nn``'s convolution, ``linalg``'s compiled epilogue), and its elementwise steps
are the registry's own kernels for those ops. No other family imports it.
"""

from __future__ import annotations

from ..registry import KernelRegistry
from .domain import DOMAIN as DOMAIN
from .domain import Step as Step

__all__ = ["DOMAIN", "Step", "register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register the fused ops into ``registry``; ``Linear``'s and the chains' elementwise
    steps are looked up in ``registry`` when a node is built. The kernel modules are
    imported here, not with the package: the compiler's passes import ``domain`` only."""
    from . import chain, linear, ml, qtable, rotary, text, vision

    linear.register_kernels(registry)
    rotary.register_kernels(registry)
    chain.register_kernels(registry)
    vision.register_kernels(registry)
    ml.register_kernels(registry)
    qtable.register_kernels(registry)
    text.register_kernels(registry)
