"""benchmarks/kernels.py, the per-path kernel microbenchmark (issue 35 item 5): its peak
loop compiles at each vector width and counts FLOPs, and its conv and gemm rows compare
tfrt_py with onnxruntime on the same one-node models (shapes cut down here; no timing is
asserted)."""

from __future__ import annotations

import math

import pytest

from benchmarks import kernels
from tests.support.x86_loops import fma_loops
from tfrt_py.concurrency import isa


@pytest.mark.parametrize("vw", [4, 8, 16])
def test_the_peak_loop_counts_flops(vw: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if vw == 16 and "avx512" not in isa.host_paths():
        pytest.skip("no AVX-512 on this host: the 16-wide loop would not run natively")
    monkeypatch.setattr(kernels, "PEAK_ITERS", 1 << 12)
    text = kernels._peak_ir(vw)
    assert f"llvm.fma.v{vw}f32" in text
    # 512-bit vectors ask for the wide registers (LLVM splits them on some CPUs otherwise)
    assert ('"prefer-vector-width"="512"' in text) == (vw == 16)
    g = kernels.peak_gflops(vw)
    assert math.isfinite(g) and g > 0


def test_the_peak_loop_fits_sixteen_ymm_registers() -> None:
    """Its chains and two constants stay in registers on an AVX2 CPU without AVX-512: 16
    chains spilled there, and Zen 3's peak read 54.8 GFLOP/s a core (98 with 10), below
    what the packed gemm reached."""
    assert fma_loops(kernels._peak_ir(8)) == [(kernels.PEAK_CHAINS, 0)]


def test_rows_compare_the_same_one_node_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "GEMMS", [("small", 9, 24, 64)])
    monkeypatch.setattr(kernels, "CONVS", [("small", 8, 12, 40, 3, 1, 1, 1),
                                           ("depthwise", 16, 10, 16, 3, 2, 1, 16)])  # fmt: skip
    rows = kernels.gemm_rows(0.05) + kernels.conv_rows(0.05)
    assert [r["kind"] for r in rows] == ["gemm", "conv", "conv"]
    for r in rows:
        assert r["err"] < 1e-4, r
        assert r["tfrt_us"] > 0 and r["ort_us"] > 0
        assert r["flops"] == pytest.approx(r["tfrt_gflops"] * r["tfrt_us"] * 1e3)
    assert rows[1]["flops"] == 2.0 * 40 * 8 * 9 * 12 * 12
    assert rows[2]["flops"] == 2.0 * 16 * 1 * 9 * 5 * 5
