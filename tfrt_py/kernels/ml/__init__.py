"""Kernels: the ai.onnx.ml family (classical ML operators).

Registered in domain ``ai.onnx.ml``: tree ensembles (``tree_ops``, on the vectorized
evaluator of ``tree``), scalers, linear models and feature plumbing (``linear``), label
and category encoders, ZipMap, DictVectorizer (``encode``) and support vector machines
(``svm``); shared attribute readers and post transforms in ``common``. Scores and labels
follow onnxruntime where the ONNX-ML spec leaves details open.
"""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_kernels"]


def register_kernels(registry: KernelRegistry) -> None:
    """Register this family's kernels. Its modules are imported here, not with the
    package: the default registry imports only the modules whose ops a model uses."""
    from . import encode, linear, svm, tree_ops

    linear.register_kernels(registry)
    encode.register_kernels(registry)
    svm.register_kernels(registry)
    tree_ops.register_kernels(registry)
