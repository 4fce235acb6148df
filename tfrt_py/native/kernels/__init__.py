"""Hand-written numba kernels the generated modules call (imported by them by path).

``trees`` (forests as data), ``svm`` (support vectors and linear models), ``post`` (the
classic-ML post transforms, argmax, normalization), ``blas`` (NumPy's gemm for tile and
signature bodies), ``fastmath`` (a vectorizable float32 ``expf``). Their source is hashed
into every generated module (``lower.ops_ml.kernel_version``), so numba's cache of a
module is not reused after a kernel changes.
"""
