"""Kernels: the contrib family -- onnxruntime's com.microsoft operators that saved models
contain.

Registered in domain ``com.microsoft`` (``activation.MS_DOMAIN``): the GELU variants and
FusedMatMul (``activation``), the fused normalizations SkipLayerNormalization,
SkipSimplifiedLayerNormalization and EmbedLayerNormalization (``norm``), Attention
(``attention``) -- what onnxruntime's transformer optimizer writes into a model --,
GroupQueryAttention (``gqa``: onnxruntime-genai's decoders), MultiHeadAttention (``mha``:
the optimizer's cross attention and decoders with a past) and
Tokenizer (``tokenizer``, its patterns compiled by ``regex``), which skl2onnx's text
vectorizers emit, and the QOperator ops onnxruntime's quantization tool writes
(``quantized``, ``quantized_transformer``) and the 2/4/8-bit weight-only MatMulNBits
(``matmul_nbits``). Semantics follow onnxruntime's CPU provider,
which the tests compare against (``tests/test_kernels_contrib*.py``).
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import (
        activation,
        attention,
        gather_block_quantized,
        gqa,
        matmul_nbits,
        mha,
        norm,
        quantized,
        quantized_softmax_pool,
        quantized_transformer,
        tokenizer,
    )

    activation.register_kernels(registry)
    norm.register_kernels(registry)
    attention.register_kernels(registry)
    gqa.register_kernels(registry)
    mha.register_kernels(registry)
    tokenizer.register_kernels(registry)
    quantized.register_kernels(registry)
    quantized_transformer.register_kernels(registry)
    quantized_softmax_pool.register_kernels(registry)
    gather_block_quantized.register_kernels(registry)
    matmul_nbits.register_kernels(registry)
