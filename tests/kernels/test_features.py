"""``features()``: the fast paths this process runs and why any is off, as ``describe()``
and ``tfrt-py inspect`` show them; reading them starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tfrt_py
from tfrt_py.kernels.lib.features import cpu_flags, features, format_features

_FRESH = """
import sys
import tfrt_py
from tfrt_py.kernels.lib.features import features, format_features
rows = {f.name: f for f in features()}
assert "numba" not in sys.modules, "reading the features imported numba"
assert rows["packed gemm"].on is None, rows["packed gemm"]
assert rows["native threads (TBB)"].on in (None, False), rows["native threads (TBB)"]
print("\\n".join(format_features()))
"""


def _fresh(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _FRESH],
        capture_output=True,
        text=True,
        timeout=300,
        # a clean slate: no TFRT_PY_* switch of this run (CI's fallback leg) leaks in
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TFRT_PY_")}, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_reading_the_features_starts_nothing() -> None:
    out = _fresh({})
    assert "packed gemm: not yet" in out
    assert out.startswith("cpu: ")


def test_a_switched_off_path_says_which_switch() -> None:
    out = _fresh({"TFRT_PY_JIT": "0", "TFRT_PY_NATIVE_THREADS": "0"})
    assert "numba kernels: off ($TFRT_PY_JIT=0)" in out
    assert "native threads (TBB): off ($TFRT_PY_NATIVE_THREADS=0)" in out


def test_describe_shows_the_fast_paths_once_decided() -> None:
    model = tfrt_py.load("tfrt_py/examples/mlp_small.onnx")
    feeds = {}
    for s in model.inputs:
        assert s.shape is not None
        feeds[s.name] = np.zeros([d if isinstance(d, int) else 1 for d in s.shape], s.dtype)
    model.run(feeds)
    text = model.describe()
    assert "fast paths of this process:" in text
    for line in format_features():
        assert f"    {line}" in text
    names = [f.name for f in features()]
    assert names == [
        "cpu",
        "numba kernels",
        "native threads (TBB)",
        "native pool",
        "packed gemm",
        "integer gemm",
        "scipy",
    ]


def test_the_integer_gemm_line_names_the_path_once_decided() -> None:
    from tfrt_py.concurrency.env_switch import switched_off
    from tfrt_py.kernels.lib import gemm_packed, qgemm_packed
    from tfrt_py.kernels.lib.features import _integer

    qgemm_packed.path()  # decides (and builds) this process's integer kernel
    got = _integer()
    chosen = qgemm_packed.chosen()
    assert chosen is not None and got.name == "integer gemm"
    if switched_off(gemm_packed.ENV_PACKED_GEMM):  # CI's fallback leg turns both gemms off
        assert got.on is False and gemm_packed.ENV_PACKED_GEMM in got.why
    elif chosen[0] == "portable":
        assert got.on is False and "float BLAS" in got.why
    else:
        assert got.on is True and f"path {chosen[0]}" in got.why
        assert ("pairs256" in got.why) == (chosen[0] == qgemm_packed.PAIRS_HOST)


def test_the_cpu_line_names_the_vector_features_the_kernels_dispatch_on() -> None:
    flags = cpu_flags()
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        have = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    assert flags["AVX2"] == ("avx2" in have)
    assert flags["AVX-512F"] == ("avx512f" in have)
    cpu = format_features()[0]
    for name, on in flags.items():
        assert (f" {name}" in cpu) == on, (name, cpu)


_HELD = """
from tfrt_py.concurrency import compiled_gate
from tfrt_py.kernels.lib.features import format_features
from tfrt_py.kernels.lib.jit import why_off

def numba_line():
    return next(ln for ln in format_features() if ln.startswith("numba kernels:"))

if why_off():
    print("SKIP", why_off())
    raise SystemExit
compiled_gate.hold()
try:
    print(numba_line())
finally:
    compiled_gate.release()
print(numba_line())
"""


def test_the_numba_line_says_why_the_compiled_kernels_are_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a cold start's warm-up holds the compiled kernels back, the numba line says
    so (it said "numba is not installed"); ``$TFRT_PY_JIT=0`` names the switch. The hold
    runs in a fresh process: held kernels would send this process's other tests to the
    NumPy paths."""
    monkeypatch.setenv("TFRT_PY_JIT", "0")
    line = next(ln for ln in format_features() if ln.startswith("numba kernels:"))
    assert line == "numba kernels: off ($TFRT_PY_JIT=0)"
    done = subprocess.run([sys.executable, "-c", _HELD], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TFRT_PY_JIT": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    if lines[0].startswith("SKIP"):
        pytest.skip(f"the compiled kernels cannot run here: {lines[0][5:]}")
    assert lines[0] == (
        "numba kernels: off (a cold start's warm-up holds them back until it switches)"
    ), lines
    assert lines[1].startswith("numba kernels: on"), lines
