"""Running test code in a fresh process on a kernel path the host has but this process
did not choose (``TFRT_PY_ISA``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfrt_py.concurrency import isa


def run_on_path(path: str, code: str, marker: str, timeout: float = 300) -> None:
    """Run ``code`` in a fresh interpreter with ``TFRT_PY_ISA=path`` (cold start off):
    skipped where the host has no such path; it must exit 0 and print ``marker``."""
    if path not in isa.host_paths():
        pytest.skip(f"this host has no {path} path (it has {', '.join(isa.host_paths())})")
    env = {**os.environ, "TFRT_PY_ISA": path, "TFRT_PY_COLD_START": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0 and marker in done.stdout, done.stderr[-3000:]
