"""What the tests share, imported as ``tests.support.<module>`` (never by path):

- ``models``: real ONNX models from fixed seeds (``build(name)``, ``MODELS``) and the
  ``Net`` graph writer; the anchors wrap ``benchmarks.anchor_models``.
- ``executors``: the executors every executor-level test runs on (``EXECUTORS``: the
  ``executor`` fixture in ``tests/conftest.py``) and ``load_on``, which loads a model on
  one of them (skipping "native" for a model the native tier does not lower).
- ``kernel_harness``: one kernel built from a registry, checked against onnxruntime;
  ``Harness`` (the ``harness`` fixture of ``tests/kernels/conftest.py``) binds it to the
  kernel families a test module declares.
- ``fuzz_graphs``: random ONNX models (some deliberately broken) for ``test_fuzz.py``.
- ``random_graphs``: random ``tfrt_py.ir`` graphs for the planner and compiler properties.
- ``node_cases``, ``conformance_excludes``: the ONNX backend node cases
  (``test_conformance.py``; ``python tests/support/node_cases.py Op ...`` by hand).
- ``dataflow``: models and helpers of the dataflow executor tests.
- ``serving``: models, hostile bodies and the server subprocess of the serving tests.
- ``trees``: random tree ensembles (nodes, attributes, inputs) for the ML tests.
- ``classic_cnns``: the nine classic CNNs the onnx package ships.
- ``agreement``: a model agrees with the same model unoptimized.
- ``threads``: one model called from several threads; ``waiting``: ``until`` a condition.
- ``spies``: recording a function's calls.
"""
