"""The kernel tests' fixture: ``harness``, the one-node helpers of
``tests/support/kernel_harness.py`` bound to the kernel families the test module declares
(``KERNEL_FAMILIES``, with ``KERNEL_OPSET`` and ``KERNEL_TOL`` where its defaults differ)."""

from __future__ import annotations

import pytest

from tests.support.kernel_harness import Harness, harness_for


@pytest.fixture(scope="module")
def harness(request: pytest.FixtureRequest) -> Harness:
    """Build kernels from, and check them against onnxruntime with, a registry of the
    module's ``KERNEL_FAMILIES`` only."""
    return harness_for(request.module)
