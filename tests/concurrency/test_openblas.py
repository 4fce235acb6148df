"""OpenBLAS set to one thread through its C API (``concurrency.openblas``), without
threadpoolctl's library scan; anything else still goes through threadpoolctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tfrt_py.concurrency import threads
from tfrt_py.concurrency.openblas import direct_blas

threadpoolctl = pytest.importorskip("threadpoolctl", reason="threadpoolctl checks the counts")


def _numpy_blas() -> frozenset[bytes]:
    mapped = threads._mapped_blas()
    if not isinstance(mapped, frozenset) or not mapped:
        pytest.skip("no /proc/self/maps or no BLAS library mapped")
    if direct_blas(mapped) is None:
        pytest.skip(f"NumPy's BLAS here is not an OpenBLAS with known entry points: {mapped}")
    return mapped


def _libraries(mapped: frozenset[bytes]) -> int:
    """How many of ``mapped`` are a CPU's BLAS libraries (``lib*``), not extension modules
    nor a GPU's BLAS (torch's CUDA wheels map cuBLAS)."""
    names = [os.path.basename(p) for p in mapped]
    return sum(n.startswith(b"lib") and not n.startswith(b"libcublas") for n in names)


def _counts() -> dict[str, int]:
    return {os.path.basename(i["filepath"]): i["num_threads"]
            for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}  # fmt: skip


def test_the_direct_controller_sets_what_threadpoolctl_reads() -> None:
    mapped = _numpy_blas()
    blas = direct_blas(mapped)
    assert blas is not None and len(blas.lib_controllers) == _libraries(mapped)
    try:
        blas.limit(limits=2)
        assert all(lib.num_threads == 2 for lib in blas.lib_controllers)
        assert set(_counts().values()) == {2}
    finally:
        blas.limit(limits=1)
    assert set(_counts().values()) == {1}


def test_a_gpus_blas_is_passed_over() -> None:
    """cuBLAS (mapped by torch's CUDA wheels: any test or user that imports torch) and
    ROCm's BLAS have no CPU threads and no threadpoolctl controller: NumPy's OpenBLAS is
    still set directly beside them (it took threadpoolctl's scan, and this module's
    tests skipped, whenever torch was loaded)."""
    mapped = _numpy_blas()
    gpu = {b"/venv/nvidia/cu13/lib/libcublas.so.13", b"/venv/nvidia/cu13/lib/libcublasLt.so.13",
           b"/opt/rocm/lib/librocblas.so.4", b"/opt/rocm/lib/libhipblas.so.2"}  # fmt: skip
    blas = direct_blas(mapped | gpu)
    assert blas is not None
    want = direct_blas(mapped)
    assert want is not None
    got_paths = [lib.filepath for lib in blas.lib_controllers]
    assert got_paths == [lib.filepath for lib in want.lib_controllers]


def test_other_libraries_are_left_to_threadpoolctl() -> None:
    mapped = _numpy_blas()
    assert direct_blas(mapped | {b"/opt/intel/lib/libmkl_rt.so.2"}) is None
    assert direct_blas(frozenset({b"/nonexistent/libopenblas.so.0"})) is None
    assert direct_blas(frozenset()) is None


_FRESH = """
import json, sys
import numpy as np
import tfrt_py
m = tfrt_py.load({model!r}, executor="sync")
m.run({{m.inputs[0].name: np.ones((1, m.inputs[0].shape[1]), np.float32)}})
scanned = "threadpoolctl" in sys.modules
import threadpoolctl
print(json.dumps({{"scanned": scanned, "threads": sorted({{
    i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}})}}))
"""


def test_a_fresh_load_sets_numpys_openblas_to_one_thread_without_a_scan() -> None:
    """Also with the compiled kernels warmed at load (conftest: no cold start), which
    import SciPy and its own OpenBLAS (threadpoolctl: ~5 ms of a ~30 ms first load)."""
    _numpy_blas()
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_NUM_THREADS") and k != threads.THREADS_ENV}  # fmt: skip
    env["TFRT_PY_THREADS"] = "2"
    model = str(ROOT / "tfrt_py" / "examples" / "mlp_small.onnx")
    out = subprocess.run([sys.executable, "-c", _FRESH.format(model=model)], env=env,
                         cwd=str(ROOT), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"scanned": False, "threads": [1]}, got


def test_extension_modules_linked_to_a_blas_are_passed_over() -> None:
    """SciPy's ``_fblas`` and ``cython_blas`` match /proc/self/maps' "blas" but are not
    BLAS libraries (their OpenBLAS is mapped on its own); the rest is still driven."""
    mapped = _numpy_blas()
    fake = b"/site-packages/scipy/linalg/_fblas.cpython-311-x86_64-linux-gnu.so"
    blas = direct_blas(mapped | {fake})
    assert blas is not None and len(blas.lib_controllers) == _libraries(mapped)
