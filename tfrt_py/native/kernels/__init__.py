"""Hand-written numba kernels the generated modules call (imported by them by path).

``trees`` (forests as data), ``svm`` (support vectors and linear models), ``post`` (the
classic-ML post transforms, argmax, normalization), ``blas`` (NumPy's gemm for tile and
signature bodies), ``fastmath`` (a vectorizable float32 ``expf``), ``rowdot`` (decode
scores), ``nbits`` and ``nbits_int8`` (MatMulNBits at a decode step's rows; the latter on
``kernels/lib/qnbits_ir``'s integer kernels), ``qdynamic`` (DynamicQuantizeLinear and
MatMulIntegerToFloat on ``kernels/lib/qgemm_packed``'s scaled kernel). Their source is hashed
into every generated module (``lower.ops_ml.kernel_version``), so numba's cache of a
module is not reused after a kernel changes.
"""
