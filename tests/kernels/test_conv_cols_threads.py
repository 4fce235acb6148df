"""conv_cols on native threads with more blocks than threads (kernels/nn/conv_cols.py):
each block's scratch in the row of the thread that runs it, every form against
onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.kernels.test_conv_cols import _model
from tests.support.spies import record_calls
from tfrt_py.concurrency import native_threads
from tfrt_py.kernels.lib import gemm_cols
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import conv, conv_blocked, conv_cols, conv_packed

pytestmark = pytest.mark.skipif(not jit_enabled(), reason=why_off() or "numba kernels off")

_RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def _no_packed_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """conv_cols' route, not conv_packed's (as in test_conv_cols) or conv_stem's (which
    takes the 3-channel 3x3/2 case first)."""
    monkeypatch.setattr(conv_packed, "plan", lambda *args, **kwargs: None)
    monkeypatch.setattr(conv, "stem_conv_fn", lambda node: None)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [((8, 16, 23, 23), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # GRID
     ((8, 32, 24, 24), (24, 32, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # phases
     ((8, 3, 64, 64), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # IM2COL
     ((8, 24, 12, 12), (48, 24, 1, 1), {})],  # DIRECT
)  # fmt: skip
def test_more_blocks_than_threads_share_each_threads_scratch(
    monkeypatch: pytest.MonkeyPatch, x_shape: Any, w_shape: Any, attrs: dict[str, Any]
) -> None:
    """Batch 8 on two native threads: 16 blocks, each block's padded rows and columns in
    the scratch row of the thread that runs it (rows: numba's thread bound, not the
    blocks), every form matching onnxruntime."""
    if not gemm_cols.available():
        pytest.skip("no gemm_cols kernel on this host (portable path, or packed gemm off)")
    if not native_threads.ready() or native_threads.max_threads() < 2:
        pytest.skip("needs two native threads (numba's TBB layer, two CPUs)")
    plans = record_calls(monkeypatch, conv_blocked, "run_blocked")
    x = _RNG.standard_normal(x_shape).astype(np.float32)
    w = (_RNG.standard_normal(w_shape) * 0.2).astype(np.float32)
    m = _model(x, w, attrs, "Relu", False)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    model = tfrt_py.load(m, executor="sync", threads=2)
    for _ in range(3):
        np.testing.assert_allclose(model.run({"x": x})["y"], sess.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
    cp = plans[-1].cols
    assert plans[-1].route == "cols" and cp is not None and cp.parallel
    assert len(cp.blocks) > cp.rows == native_threads.max_threads()
    if cp.mode == conv_cols.GRID:
        assert cp.xpad_shape[0] == cp.rows
