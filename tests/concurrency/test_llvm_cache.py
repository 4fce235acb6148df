"""Machine code of hand-written LLVM IR kept in the private cache dir
(``llvm_jit.compile_ir_cached``): a later build loads it instead of compiling, a damaged
file is rebuilt, an unsafe directory is not used; and the packed gemm of a second process
comes from the cache and computes what NumPy does."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

llvm = pytest.importorskip("llvmlite.binding", reason="the IR is compiled by llvmlite")

from tfrt_py.concurrency.llvm_jit import compile_ir_cached  # noqa: E402

_IR = """
define i64 @"tfrt_py_cache_test_{tag}"(i64 %a, i64 %b) {{
  %c = mul i64 %a, %b
  %d = add i64 %c, {add}
  ret i64 %d
}}
"""


def _build(cache: Path, monkeypatch: pytest.MonkeyPatch, tag: str = "a", add: int = 1,
           key: str = "k1",
           sources: tuple[str, ...] = ()) -> tuple[int, bool, list[int]]:  # fmt: skip
    """(f(6, 7) by the engine, whether it came from the cache, how often the IR was made)."""
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(cache))
    made: list[int] = []

    def make() -> str:
        made.append(1)
        return _IR.format(tag=tag, add=add)

    engine, cached = compile_ir_cached(make, key, sources, opt=2)
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address(f"tfrt_py_cache_test_{tag}")
    )
    return fn(6, 7), cached, made


def _objects(cache: Path) -> list[Path]:
    return sorted(cache.glob("llvm_*.o"))


def test_a_second_build_loads_the_machine_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    assert _build(cache, monkeypatch) == (43, False, [1])
    files = _objects(cache)
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert _build(cache, monkeypatch) == (43, True, [])  # no IR made, nothing compiled
    assert _build(cache, monkeypatch, tag="b", add=2, key="k2") == (44, False, [1])
    assert len(_objects(cache)) == 2


def test_a_changed_generator_file_builds_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The code writing the IR is part of the key: an upgrade that changes it (or the
    base class it builds on, in another file) never loads the old machine code."""
    cache, gen = tmp_path / "cache", tmp_path / "generator.py"
    gen.write_text("version 1")
    assert _build(cache, monkeypatch, sources=(str(gen),)) == (43, False, [1])
    assert _build(cache, monkeypatch, sources=(str(gen),)) == (43, True, [])
    gen.write_text("version 2")
    assert _build(cache, monkeypatch, sources=(str(gen),)) == (43, False, [1])


def test_the_integer_kernels_key_covers_the_base_generator() -> None:
    from tfrt_py.kernels.lib import gemm_packed, qgemm_packed

    assert gemm_packed.__file__ in qgemm_packed.IR_SOURCES
    assert qgemm_packed.__file__ in qgemm_packed.IR_SOURCES


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "link"])
def test_a_damaged_object_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     damage: str) -> None:  # fmt: skip
    cache = tmp_path / "cache"
    _build(cache, monkeypatch)
    path = _objects(cache)[0]
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[-10] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    if damage == "link":  # a link to a whole object elsewhere: not followed, not touched
        elsewhere = tmp_path / "elsewhere.o"
        elsewhere.write_bytes(bytes(data))
        path.unlink()
        path.symlink_to(elsewhere)
    else:
        path.write_bytes(bytes(data))
    assert _build(cache, monkeypatch) == (43, False, [1])
    assert _build(cache, monkeypatch) == (43, True, [])  # the rebuilt file is whole
    assert not path.is_symlink()
    if damage == "link":
        assert (tmp_path / "elsewhere.o").read_bytes() == bytes(data)


def test_an_unsafe_cache_dir_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "open"
    cache.mkdir()
    os.chmod(cache, 0o777)  # anyone could plant machine code here
    assert _build(cache, monkeypatch) == (43, False, [1])
    assert _build(cache, monkeypatch) == (43, False, [1])
    assert _objects(cache) == []


_GEMM = """
import json
import numpy as np
from tfrt_py.kernels.lib import gemm_packed
from tfrt_py.kernels.lib.features import format_features
fn = gemm_packed.kernel()
if fn is None:
    print(json.dumps({"none": True})); raise SystemExit
tile = gemm_packed.tile()
rng = np.random.default_rng(0)
k, n, m = 24, 2 * tile.nr, 9
w = rng.standard_normal((k, n)).astype(np.float32)
x = rng.standard_normal((m, k)).astype(np.float32)
y = np.zeros((m, n), np.float32)
packed = gemm_packed.pack(w).ravel()
b = np.zeros(n, np.float32)
fn(x.ravel(), 0, k, packed, 0, y.ravel(), 0, n, m, k, n, b, 0, 0, tile.nr)
line = [f for f in format_features() if f.startswith("packed gemm")][0]
print(json.dumps({"err": float(np.abs(y - x @ w).max()), "origin": gemm_packed.origin(),
                  "line": line}))
"""


@pytest.mark.slow  # two fresh processes (~3 s each)
def test_the_packed_gemm_of_a_second_process_comes_from_the_cache(tmp_path: Path) -> None:
    env = {**os.environ, "TFRT_PY_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    got = []
    for _ in range(2):
        run = subprocess.run([sys.executable, "-c", _GEMM], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        got.append(json.loads(run.stdout.strip().splitlines()[-1]))
    if got[0].get("none"):
        pytest.skip("no packed gemm kernel on this host (portable path or no numba)")
    assert [g["origin"] for g in got] == ["built", "the machine code from the cache"], got
    assert all(g["err"] < 1e-4 for g in got), got
    assert got[1]["line"].endswith("the machine code from the cache)"), got
