"""numba's loops at the host path's vector width (``concurrency.numba_target``): 512-bit
vectors on the avx512 path, numba's default elsewhere, and never over a choice numba or
the user made first. Each case runs in a fresh process (numba makes its CPU target once
per process) and checks the machine code of a loop compiled there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tfrt_py.concurrency import isa
from tfrt_py.kernels.lib import jit

pytestmark = pytest.mark.skipif(not jit.jit_enabled(), reason="needs numba")

HOST = isa.host_paths()

#: In a fresh process: (optionally) the user's own numba function first, then a tfrt_py
#: kernel, then a float32 loop compiled uncached; what was decided and the loop's registers.
_PROBE = """
import json, re, sys
import numpy as np
if sys.argv[1] == "user-first":
    import numba
    numba.njit(lambda a: a + 1)(1)
from tfrt_py.concurrency import numba_target
from tfrt_py.kernels.lib import softmax_jit
from tfrt_py.native.runtime import compile_server
assert softmax_jit.softmax_rows_f32() is not None
import numba
from numba.core import registry

@numba.njit(cache=False)
def axpy(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] * np.float32(2.0) + y[i]

x = np.ones(1000, np.float32)
y = np.zeros(1000, np.float32)
axpy(x, y)
asm = "".join(axpy.inspect_asm().values())
features = registry.cpu_target.target_context.codegen()._tm_features
print(json.dumps({
    "state": numba_target.state(), "zmm": bool(re.search(r"%zmm", asm)),
    "ymm": bool(re.search(r"%ymm", asm)), "narrow_off": "-prefer-256-bit" in features,
    "child_features": compile_server._environment()["NUMBA_CPU_FEATURES"] == features,
    "right": bool((y == 2).all()),
}))
"""


def _probe(mode: str = "", **env: str) -> dict[str, object]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    run_env.update(env)
    run_env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([sys.executable, "-c", _PROBE, mode], env=run_env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["right"] and got["child_features"], got
    return got


@pytest.mark.skipif("avx512" not in HOST, reason="the host has no AVX-512 (its paths: "
                    + ", ".join(HOST) + "): numba's width is its default there")  # fmt: skip
def test_the_avx512_path_compiles_numba_loops_with_512_bit_vectors() -> None:
    got = _probe(TFRT_PY_ISA="avx512")
    assert got["state"] == "512-bit vectors (path avx512)", got
    assert got["narrow_off"] and got["zmm"], got


@pytest.mark.parametrize("path", [p for p in ("avx2", "portable") if p in HOST])
def test_other_paths_compile_numba_loops_without_512_bit_vectors(path: str) -> None:
    """On an AVX-512 host a forced narrower path asks for 256-bit vectors (LLVM's Zen 4
    tuning takes zmm by default: this failed on an AMD EPYC host); elsewhere numba's
    default stays, which has no zmm to take."""
    got = _probe(TFRT_PY_ISA=path)
    if "avx512" in HOST:
        assert got["state"] == f"256-bit vectors (path {path})", got
    else:
        assert got["state"] == f"numba's default (path {path})", got
    assert not got["narrow_off"] and not got["zmm"], got


def test_numbas_own_target_made_first_is_kept() -> None:
    """The process's own numba code compiled before tfrt_py's first kernel: numba's
    default stays (tfrt_py cannot change it then, and says so)."""
    got = _probe("user-first")
    assert "made before tfrt_py's first kernel" in str(got["state"]), got
    assert not got["narrow_off"], got


def test_the_users_numba_cpu_features_are_kept() -> None:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    mine = llvm.get_host_cpu_features().flatten()
    got = _probe(NUMBA_CPU_FEATURES=mine)
    assert "$NUMBA_CPU_NAME/$NUMBA_CPU_FEATURES are set" in str(got["state"]), got
    assert not got["narrow_off"], got
