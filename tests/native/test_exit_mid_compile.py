"""A process that ends while a native compile is in flight ends cleanly (issue 32).

Each case is a fresh interpreter (this file run as a script) that loads a model whose native
code compiles in the background into an empty cache directory, waits until the compile is
in flight -- the worker waiting on the compile server, or LLVM optimizing the model's
function on the worker thread (two runs set ``$TFRT_PY_COMPILE_SERVER=0``: the compile
runs in process, as before the server, and the exit waits for it) -- and then ends: by
returning from the script, by ``sys.exit(3)``, by SIGTERM turned into SystemExit, by
deleting the model first, or in a forked child that exits while the parent's compile
runs. Every exit status must be the expected one: before the fix the interpreter's exit
destroyed LLVM's globals while the compile thread was inside LLVM, and such processes
aborted (134) or segfaulted (139). The compile server's child process must be gone soon
after its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import DATA as TEST_DATA
from tests.support.paths import ROOT as REPO_ROOT

#: Not slow: issue 32 asks that this run in ``make test``.
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="signals and fork: Linux")  # fmt: skip

ROOT = str(REPO_ROOT)
WAYS = ("return", "exit3", "sigterm", "delete", "fork")
EXPECTED = {"return": 0, "exit3": 3, "sigterm": 0, "delete": 0, "fork": 0}
RUNS = 20
#: Runs that compile in process (slower: the exit waits for the compile to end).
IN_PROCESS = (RUNS - 5, RUNS - 3)  # a return and a SIGTERM


BERT = str(TEST_DATA / "transformers" / "bert.onnx")
HOT = 20  # calls of one signature: more than the native tier's HOT_CALLS


#: Frames of a function numba compiles while typing or lowering another: their own final
#: optimization is short; the model function's, last and long, has none of these above it.
_NESTED = ("typeinfer.py", "/typing/", "lowering.py")


class _Watch:
    """Sees the moment the compile is in flight, from wrappers around two functions the
    compile worker thread calls (no polling of other threads' frames and no profile hook,
    which changed the timing enough to hide the crash): numba's final optimization of the
    model's function, a long stretch inside LLVM ("llvm": the compile in this process),
    or the worker's wait for the compile server's answer ("server")."""

    def __init__(self) -> None:
        import threading

        self.where = ""
        self.seen = threading.Event()

    def install(self) -> None:
        from numba.core import codegen

        lib = codegen.CPUCodeLibrary
        optimize = lib._optimize_final_module
        watch = self

        def optimize_watched(self: codegen.CPUCodeLibrary) -> object:
            f = sys._getframe(1)
            while f is not None and not any(n in f.f_code.co_filename for n in _NESTED):
                f = f.f_back  # type: ignore[assignment]
            if f is None:  # the model's function, not a helper compiled inside it
                watch._found("llvm")
            return optimize(self)

        lib._optimize_final_module = optimize_watched  # type: ignore[method-assign]
        try:
            from tfrt_py.native.runtime import compile_server as cs
        except ImportError:  # before the compile server existed
            return
        receive = cs._receive

        def receive_watched(proc: object, timeout: float) -> object:
            if timeout == cs.COMPILE_S:  # the module sent, the child compiling it
                watch._found("server")
            return receive(proc, timeout)  # type: ignore[arg-type]

        cs._receive = receive_watched  # type: ignore[assignment]

    def _found(self, where: str) -> None:
        if not self.seen.is_set():
            self.where = where
            self.seen.set()


def child(way: str, delay: float) -> None:
    """One process of the test: start a compile, end while it runs."""
    import gc

    import tfrt_py

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    watch = _Watch()
    watch.install()
    # a small BERT: signature mode, one compile of a function big enough that LLVM's
    # optimizer runs for a while (a tiny graph's optimizer seldom crashed at exit)
    model = tfrt_py.load(BERT, executor="native")
    feeds = {"input_ids": np.ones((1, 16), np.int64), "attention_mask": np.ones((1, 16), np.int64)}
    for _ in range(HOT):  # a hot signature compiles in the background
        model.run(feeds)
    tier = model.native
    watch.seen.wait(240)
    time.sleep(delay)
    compiling = any(job.state == "compiling" for job in list(tier.sigs.values()))
    worker = __import__("tfrt_py.native.runtime.worker", fromlist=["server"])
    pid = worker.server().pid if hasattr(worker, "server") else None
    print(json.dumps({"where": watch.where, "compiling": compiling, "server": pid}), flush=True)
    if way == "exit3":
        sys.exit(3)
    if way == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    if way == "delete":
        del model, tier
        gc.collect()
    if way == "fork":
        pid = os.fork()
        if pid == 0:
            ok = np.all(np.isfinite(model.run(feeds)["last_hidden_state"]))
            os._exit(0 if ok else 5)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status != 0:
            sys.exit(10 + max(status, 0))


def _run(i: int, tmp: Path) -> tuple[str, int, dict[str, object], str]:
    way = WAYS[i % len(WAYS)]
    env = {k: v for k, v in os.environ.items() if k != "TFRT_PY_NATIVE"}
    if i in IN_PROCESS:  # compiles in process, as before the server; the exit waits for it
        env["TFRT_PY_COMPILE_SERVER"] = "0"
    env["TFRT_PY_CACHE_DIR"] = str(tmp / f"cache{i}")  # cold: the compile takes a while
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    delay = (i * 7 % 10) / 20  # 0 to 450 ms past the moment the compile was seen
    r = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", __file__, way, str(delay)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    report = json.loads(lines[-1]) if lines else {}
    return way, r.returncode, report, r.stderr[-2000:]


def _gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of an init that has not reaped it yet counts as gone
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_processes_that_exit_mid_compile_exit_cleanly(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: _run(i, tmp_path), range(RUNS)))
    bad = [(way, code, report, err) for way, code, report, err in results
           if code != EXPECTED[way]]  # fmt: skip
    assert not bad, bad
    # the case under test: the processes ended with the compile in flight
    flight = [(report.get("where"), report.get("compiling")) for _, _, report, _ in results]
    assert sum(1 for w, c in flight if w and c) >= RUNS * 3 // 4, flight
    for _, _, report, _ in results:
        pid = report.get("server")
        if isinstance(pid, int):
            assert _gone(pid, 10.0), f"compile server {pid} outlived its parent"


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    child(sys.argv[1], float(sys.argv[2]))
