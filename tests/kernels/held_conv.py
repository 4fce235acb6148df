"""A Conv node with constant weights and bias built and called while a cold start holds
the compiled kernels (its NumPy stand-in), with a spy on the function its ctypes path
calls: the shared body of the raw-kernel tests (``test_depthwise_raw``,
``test_conv_cols_raw``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest


def run_held_conv(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, w: np.ndarray,
                  b: np.ndarray, x: np.ndarray,
                  attrs: dict[str, Any]) -> tuple[np.ndarray, int]:  # fmt: skip
    """(the node's answer for ``x``, how many times ``module.name`` ran) for a Conv of
    ``w``, ``b`` and ``attrs`` built and called under ``compiled_gate.hold()``."""
    from tfrt_py.concurrency import compiled_gate
    from tfrt_py.ir.graph import Node, Value
    from tfrt_py.kernels import KernelContext, default_registry

    calls: list[int] = []
    real = getattr(module, name)

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(module, name, spy)
    node = Node("Conv", [Value("x"), Value("w", const=w), Value("b", const=b)], [Value("y")],
                attrs, name="conv", opset=11)  # fmt: skip
    compiled_gate.hold()
    try:
        fn = default_registry().lookup("", "Conv", 11).build(KernelContext(node))
        got = fn(x, w, b)
    finally:
        compiled_gate.release()
    return got, len(calls)
