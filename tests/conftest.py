"""Shared fixtures: the executor fixtures (below), the seeded ready queue, the native
tier's cache dir, ``jit`` (compiled kernels on and off, ``tests/support/jit_paths``).
Shared helpers are in ``tests/support`` (imported as ``tests.support``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.executors import EXECUTORS
from tests.support.jit_paths import jit  # noqa: F401 - the compiled/NumPy fixture, by name
from tfrt_py.concurrency import HostContext
from tfrt_py.executors.dataflow import SCHEDULE_SEED_ENV

#: ``--param-sample``, ``--param-rest``, ``--file-sample`` (the Makefile's legs:
#: tests/support/param_sample.py)
pytest_plugins = ["tests.support.param_sample"]

# -- the executor fixtures; modules may override them ----------------------------------------


@pytest.fixture(scope="module", params=EXECUTORS)
def executor(request: pytest.FixtureRequest) -> str:
    """Every executor-level test runs once per executor (sync, async, native), as
    ``anyio_backend`` runs async tests once per event loop; the test loads its model with
    ``tests.support.executors.load_on(executor, ...)``, which skips "native" for a model the
    native tier does not lower. Module-scoped so module-scoped model fixtures can use it."""
    return str(request.param)


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(scope="module")
def host() -> Any:
    with HostContext(num_workers=2, name="test-dataflow") as h:
        yield h


@pytest.fixture(autouse=True)
def shuffled_ready_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dataflow ready queue pops in a seeded random order in every test, so no test can
    depend on scheduling order (trio randomizes its run queue for the same reason)."""
    monkeypatch.setenv(SCHEDULE_SEED_ENV, "8675309")


#: The switches every test process runs under, set in ``pytest_configure``: before
#: collection, which imports test modules and so whatever they load at import (the Flask
#: example loads its model there). "auto" keeps models off the native tier
#: (``TFRT_PY_NATIVE=0``) so the other tests see the sync interpreter deterministically
#: and no background compiles compete for the CPU; test_native.py turns it back on. Loads
#: wait for the compiled kernels (``TFRT_PY_COLD_START=0``), as tests expect them: the cold
#: start (NumPy paths first, tfrt_py.cold_start) is tested in fresh processes,
#: test_cold_start.py. A cold start begun at collection held the compiled kernels back
#: from the tests that ran during its warm-up (CI, on a cold numba cache). Every load
#: imports its ONNX file (``TFRT_PY_GRAPH_CACHE=0``): tests that count the importer's work
#: or lower its limits see it run; test_graph_cache.py turns the cache on.
SUITE_ENV = {"TFRT_PY_NATIVE": "0", "TFRT_PY_COLD_START": "0", "TFRT_PY_GRAPH_CACHE": "0"}
_suite_mp = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    for name, value in SUITE_ENV.items():
        _suite_mp.setenv(name, value)


def pytest_unconfigure(config: pytest.Config) -> None:
    _suite_mp.undo()


@pytest.fixture(autouse=True, scope="session")
def native_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The native tier compiles into one cache dir per session (each model compiles once
    per session; nothing leaks into ~/.cache)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TFRT_PY_CACHE_DIR", str(tmp_path_factory.mktemp("native_cache")))
        yield
