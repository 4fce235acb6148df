"""At run time, no call goes up the layer stack past ``executors/``.

The compiler, the native tier's lowering, selection and the model facade are load-time
code: once ``load()`` has returned, a call served by the sync interpreter or the async
dataflow executor runs only code of ``executors/`` and the layers below it (kernels,
concurrency, ir, errors). A kernel defined in the compiler, or an executor calling back
into the package that built it, shows up here as a call from a module at or below
``executors`` into a module above it.

The calls are recorded with ``sys.setprofile`` (Python frames only: a NumPy or numba
function has none) over the first and a later call of models that exercise every fused
kernel the compiler makes, on both executors and through ``run_async``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, FunctionType
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.architecture.stack import LAYERS
from tests.support.models import anchors, nn

_EXECUTORS_LAYER = next(i for i, layer in enumerate(LAYERS) if "executors" in layer)


def _layer_of(module: str) -> int | None:
    """The stack layer of a ``tfrt_py`` module, None for modules outside the package."""
    if module == "tfrt_py":
        return next(i for i, layer in enumerate(LAYERS) if "tfrt_py" in layer)
    if not module.startswith("tfrt_py."):
        return None
    top = module.split(".")[1]
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


@contextmanager
def _upward_calls() -> Iterator[list[str]]:
    """Record, on every thread, each call from a module at or below ``executors`` into a
    module above it, as ``caller -> callee.function``."""
    found: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        lo, hi = _layer_of(caller), _layer_of(callee)
        if lo is not None and hi is not None and lo <= _EXECUTORS_LAYER < hi:
            found.append(f"{caller} -> {callee}.{frame.f_code.co_name}")

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield found
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


_CASES: dict[str, Callable[[], Any]] = {
    "mlp": nn.mlp,  # Linear with activations, the chains after it
    "cnn": nn.cnn,  # fused Conv (BatchNormalization and Relu folded in)
    "transformer": nn.transformer_erf,  # LayerNorm, GELU, MatMulTransB, SoftmaxAttention
    "m3": anchors.m3,  # elementwise chains
    "m4": anchors.m4,  # wide Linear layers
}


@pytest.mark.parametrize("executor", ["sync", "async"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_no_run_time_call_goes_above_executors(case: str, executor: str) -> None:
    model_case = _CASES[case]()
    feeds = model_case.feeds[0]
    model = tfrt_py.load(model_case.model.SerializeToString(), executor=executor)
    expected = model.run(feeds)  # a first call outside the recording: the reference
    model = tfrt_py.load(model_case.model.SerializeToString(), executor=executor)
    with _upward_calls() as found:
        first = model.run(feeds)
        later = model.run(feeds)
        awaited = asyncio.run(model.run_async(feeds))
    for got in (first, later, awaited):
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
    assert not found, f"{len(found)} run-time calls above executors/:\n" + "\n".join(
        sorted(set(found))
    )


def test_the_recorder_sees_an_upward_call() -> None:
    """A function of ``executors`` calling one whose module is above it is caught."""
    import tfrt_py.executors.program as low
    import tfrt_py.model as high

    def make(module: Any, name: str, body: Callable[..., Any]) -> Callable[..., Any]:
        """``body`` as if defined in ``module`` (its globals say where a frame is)."""
        return FunctionType(body.__code__, vars(module), name, None, body.__closure__)

    above = make(high, "kernel_above", lambda x: x)
    below = make(low, "call_from_executors", lambda f, x: f(x))
    with _upward_calls() as found:
        below(above, 1)
    assert found == ["tfrt_py.executors.program -> tfrt_py.model.<lambda>"]
