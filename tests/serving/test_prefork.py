"""Pre-forked serving with shared weights, for real: ``tfrt-py serve MODEL --workers 2`` and
gunicorn ``--preload`` with the uvicorn worker (tfrt_py/examples/prefork_app.py), each on a
model of 256 MiB of weights, as external data and embedded in the .onnx:

* the workers' summed PSS (``/proc/<pid>/smaps_rollup``) stays below 1.5x the weights (a
  copy per worker would be 2x the weights plus the interpreters);
* requests are answered by both workers, with the right outputs;
* a worker killed with SIGKILL is replaced, and no request fails beyond those in flight;
* SIGTERM lets a request in flight finish (tfrt-py serve).

Also ``share_weights`` and ``describe()`` in process, and ``set_process_threads``.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tests.support.scale_models as sm
import tfrt_py

httpx = pytest.importorskip("httpx")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc: Linux's"),
]

MIB = 256
WEIGHT_BYTES = MIB * 2**20
BIN = os.path.join(os.path.dirname(sys.executable), "")
HEADER = "x-tfrt-py-worker"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ext = tmp_path_factory.mktemp("wide_ext")
    emb = tmp_path_factory.mktemp("wide_emb")
    return {
        "external": sm.wide_model(ext / "wide.onnx", MIB, external=True),
        "embedded": sm.wide_model(emb / "wide.onnx", MIB, external=False),
    }


@pytest.fixture(scope="module")
def expected(models: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) for 4 rows: the external model (memory-mapped: cheap here) computes y; the
    embedded one holds the same weights (same seed)."""
    m = tfrt_py.load(models["external"])
    shape = m.inputs[0].shape
    assert shape is not None and isinstance(shape[1], int)
    d = shape[1]
    x = np.random.default_rng(0).standard_normal((4, d)).astype(np.float32)
    return x, m.run({"x": x})["y"]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


class _Server:
    """A server subprocess (its own process group), its log lines and its URL."""

    def __init__(self, argv: list[str], env: dict[str, str], url_pattern: str) -> None:
        self.proc = subprocess.Popen(
            argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.url = ""
        self._found = threading.Event()
        self._pattern = re.compile(url_pattern)
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (self.proc.stderr, self.proc.stdout)
        ]
        for t in self._readers:
            t.start()
        if not self._found.wait(120):
            self.stop()
            raise AssertionError("the server did not bind:\n" + self.log())

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip())
            m = self._pattern.search(line)
            if m and not self.url:
                self.url = m.group(1)
                self._found.set()

    def log(self) -> str:
        return "\n".join(self.lines[-40:])

    def workers(self, n: int, timeout: float = 120) -> set[int]:
        """Poll /readyz on fresh connections until ``n`` distinct workers answered 200."""
        seen: set[int] = set()
        end = time.monotonic() + timeout
        while len(seen) < n and time.monotonic() < end:
            try:
                r = httpx.get(self.url + "/readyz", timeout=5)
                if r.status_code == 200:
                    seen.add(int(r.headers[HEADER]))
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        assert len(seen) >= n, f"only workers {seen} answered\n{self.log()}"
        return seen

    def stop(self) -> None:
        """SIGTERM to the process group (SIGKILL after 30 s), then the pipes closed."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for t in self._readers:
            t.join(10)
        for stream in (self.proc.stderr, self.proc.stdout):
            if stream is not None:
                stream.close()


def _env() -> dict[str, str]:
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "TFRT_PY_NATIVE": "0"}


def _pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def _predict(url: str, x: np.ndarray, timeout: float = 60) -> tuple[int, np.ndarray]:
    r = httpx.post(
        url,
        content=_npy(x),
        headers={"content-type": "application/x-npy", "accept": "application/x-npy"},
        timeout=timeout,
    )
    assert r.status_code == 200, r.text[:500]
    return int(r.headers[HEADER]), np.load(io.BytesIO(r.content))


def _check_shared_and_both_answer(
    server: _Server, predict_url: str, expected: tuple[np.ndarray, np.ndarray]
) -> set[int]:
    pids = server.workers(2)
    x, y = expected
    answered: set[int] = set()
    for _ in range(40):
        pid, out = _predict(predict_url, x)
        np.testing.assert_allclose(out, y, rtol=1e-4, atol=1e-4)
        answered.add(pid)
        if answered >= pids:
            break
    assert answered == pids, f"requests answered by {answered}, workers {pids}"
    pss = sum(_pss_kb(p) for p in pids) * 1024
    assert pss < 1.5 * WEIGHT_BYTES, (
        f"workers' summed PSS {pss / 2**20:.0f} MiB for {MIB} MiB of weights\n{server.log()}"
    )
    print(f"summed PSS of 2 workers: {pss / 2**20:.0f} MiB for {MIB} MiB of weights")
    return pids


def _kill_one_under_load(
    server: _Server, predict_url: str, pids: set[int], expected: tuple[np.ndarray, np.ndarray]
) -> None:
    """Two clients send requests (fresh connections) while one worker is SIGKILLed: it is
    replaced; at most one request per client (the one in flight) fails."""
    x, _ = expected
    failures: list[str] = []
    ok = [0]
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                _predict(predict_url, x, timeout=30)
                ok[0] += 1
            except (httpx.HTTPError, AssertionError) as e:
                failures.append(repr(e))

    clients = [threading.Thread(target=client) for _ in range(2)]
    for t in clients:
        t.start()
    time.sleep(0.5)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    new: set[int] = set()
    end = time.monotonic() + 60
    while time.monotonic() < end and not new:
        new = server.workers(2) - pids
    time.sleep(0.5)
    stop.set()
    for t in clients:
        t.join(60)
    assert new, f"worker {victim} was not replaced\n{server.log()}"
    assert len(failures) <= len(clients), failures
    assert ok[0] > 0


def test_serve_workers_share_weights_and_survive_a_killed_worker(
    models: dict[str, Path], expected: tuple[np.ndarray, np.ndarray]
) -> None:
    server = _Server(
        [BIN + "tfrt-py", "serve", str(models["external"]), "--port", "0", "--workers", "2",
         "--batching", "off", "--drain-timeout", "10"],
        _env(),
        r"on (http://\S+)",
    )  # fmt: skip
    try:
        url = server.url + "/v1/models/wide:predict"
        pids = _check_shared_and_both_answer(server, url, expected)
        _kill_one_under_load(server, url, pids, expected)
        assert any("killed by SIGKILL" in line for line in server.lines), server.log()
        # SIGTERM drains: a heavy request in flight (256 rows) still gets its answer.
        result: list[Any] = []
        big = np.random.default_rng(1).standard_normal((256, expected[0].shape[1]), np.float32)
        t = threading.Thread(target=lambda: result.append(_predict(url, big)))
        t.start()
        time.sleep(0.3)
        server.proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert result and result[0][1].shape == big.shape, server.log()
        assert server.proc.wait(30) == -signal.SIGTERM, server.log()
    finally:
        server.stop()


def test_serve_workers_share_embedded_weights(
    models: dict[str, Path], expected: tuple[np.ndarray, np.ndarray]
) -> None:
    server = _Server(
        [BIN + "tfrt-py", "serve", str(models["embedded"]), "--port", "0", "--workers", "2",
         "--batching", "off"],
        _env(),
        r"on (http://\S+)",
    )  # fmt: skip
    try:
        _check_shared_and_both_answer(server, server.url + "/v1/models/wide:predict", expected)
        assert any("256.0 MiB moved to the shared cache" in line for line in server.lines), (
            server.log()
        )
    finally:
        server.stop()


_GUNICORN_CONF = """
from tfrt_py.serving.prefork import configure_worker

def post_fork(server, worker):
    configure_worker(server.cfg.workers)
"""


@pytest.mark.parametrize("kind", ["embedded"])
def test_gunicorn_preload_fastapi(
    kind: str, models: dict[str, Path], expected: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(_GUNICORN_CONF)
    server = _Server(
        [BIN + "gunicorn", "--preload", "-w", "2", "-k", "uvicorn_worker.UvicornWorker",
         "-c", str(conf), "-b", "127.0.0.1:0", "--graceful-timeout", "10",
         "tfrt_py.examples.prefork_app:app"],
        {**_env(), "TFRT_PY_MODEL": str(models[kind])},
        r"Listening at: (http://\S+)",
    )  # fmt: skip
    try:
        url = server.url + "/predict"
        pids = _check_shared_and_both_answer(server, url, expected)
        _kill_one_under_load(server, url, pids, expected)
    finally:
        server.stop()


def test_share_weights_in_process_keeps_answers_and_describes(tmp_path: Path) -> None:
    from tfrt_py.sharing import share_weights

    path = sm.mlp_model(tmp_path / "mlp.onnx", hidden=512)
    model = tfrt_py.load(path)
    x = sm.mlp_data(8)
    before = model.run({"x": x})["probs"]
    assert "shared across forks: none" in model.describe()
    report = share_weights(model)
    assert report.shared_bytes > 0 and report.arrays >= 1, report
    assert np.array_equal(model.run({"x": x})["probs"], before)
    assert "shared cache: 1 (1.0 MiB)" in model.describe(), model.describe()
    assert share_weights(model).shared_bytes == 0  # idempotent: nothing anonymous left
    # the cache file is gone at once; the mapping says so
    with open("/proc/self/maps") as f:
        cache = [line for line in f if "tfrt_py-weights-" in line]
    assert cache and all(line.rstrip().endswith("(deleted)") for line in cache)
    # a forked child computes the same from the shared pages
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = np.array_equal(model.run({"x": x})["probs"], before)
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)


def test_set_process_threads_sets_blas_and_env() -> None:
    from tfrt_py.concurrency.threads import blas_threads, set_process_threads

    code = (
        "import numpy, os\n"
        "from tfrt_py.concurrency.threads import blas_threads, set_process_threads\n"
        "set_process_threads(1)\n"
        "print(sorted(set(blas_threads().values())), os.environ['TFRT_PY_THREADS'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # numpy's OpenBLAS now runs 1 thread (when this numpy has a BLAS we can see)
    assert out.stdout.split() == (["[1]", "1"] if blas_threads() else ["[]", "1"]), out.stdout
    with pytest.raises(ValueError):
        set_process_threads(0)


def test_freeze_for_fork_moves_objects_to_the_permanent_generation() -> None:
    """What the gunicorn app and ``run_prefork`` call before forking: afterwards the
    collector no longer walks (and so no longer writes to) the objects that exist now."""
    import gc

    from tfrt_py.serving.prefork import freeze_for_fork

    gc.unfreeze()
    try:
        before = gc.get_freeze_count()
        freeze_for_fork()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
