"""The compute library: the shared cores the kernel families call, and what they run on.

Products (``gemm``: row blocks on the intra-op pool or native threads; ``gemm_packed``: a
float32 product on a weight packed at load, LLVM IR; ``blas``: NumPy's own gemm for
compiled code; ``linear_par``: a Linear's blocks with their epilogues), attention
(``sdpa``), the compiled elementwise and row kernels (``activations``, ``gelu_jit``,
``sigmoid_jit``, ``softmax_jit``, ``norm_jit``, ``erf``), numba's wrapper (``jit``) and
array addresses (``addresses``). ``features`` says which of these fast paths this process
runs and why any is off.

The library imports no kernel family (families import it); it imports only
``concurrency``, ``errors`` and ``ir`` besides itself.
"""
