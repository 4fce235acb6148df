"""tfrt_py owns its threads (issue 15): the intra-op pool, split matrix products, the
process budget (``load(threads=)``, ``$TFRT_PY_THREADS``) and single-threaded BLAS."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable

import numpy as np
import pytest
import threadpoolctl

import tfrt_py
from tfrt_py.concurrency.intraop import MAX_THREADS, IntraOpPool
from tfrt_py.concurrency.threads import THREADS_ENV, configure, threads
from tfrt_py.ir import GraphBuilder
from tfrt_py.kernels.lib.gemm import matmul_cols_into, matmul_into


def test_pool_runs_every_part_and_the_caller_takes_part() -> None:
    pool = IntraOpPool(3)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def part(i: int) -> Callable[[], None]:
        def run() -> None:
            with lock:
                seen.append((i, threading.get_ident()))

        return run

    pool.run([part(i) for i in range(16)])
    assert sorted(i for i, _ in seen) == list(range(16))
    pool.close()


def test_a_large_budget_runs_on_at_most_max_threads() -> None:
    """A 16-thread budget: the parts run on the caller and at most MAX_THREADS - 1 helpers
    (16 threads queueing for the GIL made ResNet-18 slower than 4 did, and than 1), while
    the pool still reports the budget, which compiled kernels split their work by."""
    pool = IntraOpPool(16)
    seen: set[int] = set()
    lock = threading.Lock()
    gate = threading.Barrier(MAX_THREADS, timeout=10)

    def part() -> None:
        with lock:
            seen.add(threading.get_ident())
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()  # the first MAX_THREADS parts meet: every helper gets a part

    pool.run([part] * 64)
    assert pool.threads == 16
    assert len(seen) == MAX_THREADS
    assert len(pool._helpers) == MAX_THREADS - 1
    pool.close()


def test_a_busy_helper_never_stalls_the_caller() -> None:
    """Both helpers of a 2-thread pool are stuck in another job: the caller runs every
    part of its own job itself and returns (work stealing), long before they are free."""
    pool = IntraOpPool(2)
    release = threading.Event()
    started = threading.Barrier(3)

    def stuck() -> None:
        started.wait(10)
        release.wait(30)

    other = threading.Thread(target=pool.run, args=([stuck, stuck],))
    other.start()
    started.wait(10)  # the other job's caller and the helper are both inside it
    ran: list[int] = []
    pool.run([functools.partial(ran.append, i) for i in range(8)])
    assert sorted(ran) == list(range(8)) and not release.is_set()
    release.set()
    other.join(30)
    pool.close()


def test_a_part_error_reaches_the_caller() -> None:
    pool = IntraOpPool(2)

    def bad() -> None:
        raise ZeroDivisionError("part")

    with pytest.raises(ZeroDivisionError, match="part"):
        pool.run([lambda: None, bad, lambda: None])
    pool.run([lambda: None, lambda: None])  # still usable
    pool.close()


@pytest.mark.parametrize(("m", "k", "n"), [(1, 8, 8), (64, 64, 64), (700, 300, 90), (4097, 33, 17)])
def test_matmul_into_matches_numpy(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = np.matmul(a, b)
    np.testing.assert_allclose(matmul_into(a, b), want, rtol=1e-5, atol=1e-4)
    out = np.empty((m, n), np.float32)
    assert matmul_into(a, b, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    strided = np.asfortranarray(a)  # rows are views with any strides
    np.testing.assert_allclose(matmul_into(strided, b), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("m", "k", "n"), [(3, 8, 8), (64, 576, 3136), (512, 300, 200), (7, 4096, 700)]
)
def test_matmul_cols_into_matches_numpy(m: int, k: int, n: int) -> None:
    """Column blocks (wide right operand: an im2col product) and row blocks alike."""
    configure(2)
    try:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        assert matmul_cols_into(a, b, out) is out
        np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-4, atol=1e-3)
    finally:
        configure(None)


def test_load_configures_the_budget_and_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    b = GraphBuilder("g")
    x = b.input("x", np.float32, (512, 256))
    b.output(b.op("MatMul", x, b.const(np.ones((256, 256), np.float32))), "y")
    try:
        model = tfrt_py.load(b.build(), threads=3)
        assert threads() == 3
        assert "threads: 3 per call" in model.describe()
        blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert blas and all(i["num_threads"] == 1 for i in blas)
        y = model.run({"x": np.ones((512, 256), np.float32)})["y"]
        np.testing.assert_array_equal(y, np.full((512, 256), 256, np.float32))
        monkeypatch.setenv(THREADS_ENV, "2")
        tfrt_py.load(b.build(), threads=5)
        assert threads() == 2  # the environment wins
        monkeypatch.setenv(THREADS_ENV, "many")
        with pytest.raises(ValueError, match=THREADS_ENV):
            tfrt_py.load(b.build())
        monkeypatch.delenv(THREADS_ENV)
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="threads"):
                tfrt_py.load(b.build(), threads=bad)  # type: ignore[arg-type]
    finally:
        configure(None)


def _blas() -> list[dict]:
    return [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_loads_scan_the_libraries_again_only_after_a_blas_arrived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """threadpoolctl's scan of the loaded libraries (milliseconds, and it holds the
    dynamic loader's lock while calling back into Python: a thread importing an
    extension module meanwhile deadlocks with it) runs again only when a BLAS library
    was mapped since -- not after every import -- and a load still sets a BLAS whose
    threads something raised back to one."""
    if not _blas():
        pytest.skip("no BLAS library found by threadpoolctl")
    scans = []
    controller = threadpoolctl.ThreadpoolController()
    load_libraries = threadpoolctl.ThreadpoolController._load_libraries

    def counting(self: threadpoolctl.ThreadpoolController) -> None:
        scans.append(1)
        load_libraries(self)

    monkeypatch.setattr(threadpoolctl.ThreadpoolController, "_load_libraries", counting)
    configure(None)  # a first scan may happen here (modules were imported since the last)
    scans.clear()
    for _ in range(3):
        configure(None)
    assert scans == []
    with controller.limit(limits=2, user_api="blas"):
        configure(None)  # raised by someone else: set back without a scan
        assert scans == []
        assert all(i["num_threads"] == 1 for i in _blas())  # (a scan of its own)
    scans.clear()
    monkeypatch.setitem(__import__("sys").modules, "tfrt_py_test_new_module", os)
    configure(None)
    assert scans == []  # an import, no new BLAS: no scan
    from tfrt_py.concurrency import threads as threads_mod

    mapped = threads_mod._mapped_blas()
    assert isinstance(mapped, frozenset) and mapped  # NumPy's BLAS, from /proc/self/maps
    monkeypatch.setattr(threads_mod, "_mapped_blas", lambda: mapped | {b"/x/libnewblas.so"})
    monkeypatch.setitem(__import__("sys").modules, "tfrt_py_test_blas_module", os)
    configure(None)
    assert scans == [1]  # an import that brought a BLAS library: scanned again
    assert all(i["num_threads"] == 1 for i in _blas())


_LOAD_THEN_BLAS = """
import sys
import numpy as np
import threadpoolctl
import tfrt_py
from tfrt_py.ir import GraphBuilder
assert "numba" not in sys.modules and "scipy" not in sys.modules
b = GraphBuilder("g")
x = b.input("x", np.float32, (4, 64))
b.output(b.op("Softmax", b.op("MatMul", x, b.const(np.eye(64, dtype=np.float32)))), "y")
model = tfrt_py.load(b.build())  # the compiled Softmax rows: numba, which imports SciPy
if "scipy" not in sys.modules:
    print("no-scipy")
print(sorted({i["num_threads"] for i in threadpoolctl.threadpool_info()
              if i["user_api"] == "blas"}))
"""


def test_a_blas_loaded_during_load_is_single_threaded_after_it() -> None:
    """A BLAS library loaded while a model loads -- ``import numba`` imports SciPy, whose
    own OpenBLAS starts a thread per core -- runs one thread once ``load`` returns."""
    pytest.importorskip("numba", reason="the compiled kernels import numba during load")
    pytest.importorskip("scipy.linalg", reason="SciPy's BLAS is the library loaded")
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.pop(THREADS_ENV, None)
    env.pop("TFRT_PY_JIT", None)
    out = subprocess.run([sys.executable, "-c", _LOAD_THEN_BLAS], capture_output=True,
                         text=True, env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    if "no-scipy" in out.stdout:
        pytest.skip("this numba did not import SciPy during load: no library arrived late")
    assert out.stdout.split()[-1] == "[1]", out.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_split_products_work_in_a_forked_child() -> None:
    configure(2)
    a = np.ones((1024, 256), np.float32)
    b = np.ones((256, 128), np.float32)
    matmul_into(a, b)  # the parent's helpers are running
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ok = bool((matmul_into(a, b) == 256).all())
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    configure(None)
