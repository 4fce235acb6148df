"""The executors every executor-level test runs on, and the one way such a test loads a model.

The ``executor`` fixture (``tests/conftest.py``) runs a test once per name in
``EXECUTORS``: "sync" (the planned interpreter), "async" (the dataflow executor) and
"native" (numba; compiled before ``load`` returns). A test loads its model with
``load_on(executor, source, ...)``. The native tier lowers only some models (static shapes,
ops in its table, no custom kernels, no control flow): for any other model, and where numba
is not installed, the native instance of the test skips with the tier's reason, as it would
in ``describe()``. The test session keeps "auto" off the native tier (``TFRT_PY_NATIVE=0``,
conftest); ``executor="native"`` asks for it explicitly.
"""

from __future__ import annotations

from typing import Any

import pytest

import tfrt_py
from tfrt_py.native import Declined, available

__all__ = ["EXECUTORS", "load_on"]

EXECUTORS = ("sync", "async", "native")


def load_on(
    executor: str, source: Any, *, native_must_lower: bool = False, **kw: Any
) -> tfrt_py.Model:
    """``tfrt_py.load(source, executor=executor, **kw)``, checked to be served by that
    executor ("native": compiled eagerly). A model the native tier does not lower skips the
    calling test on "native" (fails it with ``native_must_lower``); so does a missing numba."""
    if executor == "native":
        if not available():
            pytest.skip("the native tier needs numba, which is not installed")
        kw.setdefault("native", "eager")
    try:
        model = tfrt_py.load(source, executor=executor, **kw)
    except Declined as e:
        if executor != "native" or native_must_lower:
            raise
        pytest.skip(f"the native tier does not lower this model: {e}")
    assert model.executor == executor, (model.executor, executor)
    if executor == "native":
        assert model.native is not None and model.native.state == "ready", model.describe()
    return model
