"""The native tier's disk cache trusts no file in it (issue 12): a tampered module or a
planted numba index is never run, the cache dir is created 0700, and a directory others
could write is refused (auto stays on the sync interpreter and says why)."""

from __future__ import annotations

import glob
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tfrt_py.concurrency.cachedir import UnsafeCacheDir
from tfrt_py.ir import Graph, GraphBuilder

F32 = np.float32
W = np.random.default_rng(3).standard_normal((4, 3)).astype(F32)


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)


def _use_cache(monkeypatch: pytest.MonkeyPatch, d: Path) -> None:
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(d))


def _graph() -> Graph:
    b = GraphBuilder("cached")
    x = b.input("x", F32, (2, 4))
    b.output(b.op("Relu", b.op("MatMul", x, b.const(W))), "y")
    return b.build()


def _check_answers(model: tfrt_py.Model) -> None:
    x = np.arange(8, dtype=F32).reshape(2, 4) - 3
    for _ in range(2):
        got = model.run({"x": x})["y"]
        np.testing.assert_allclose(got, np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)


class _Payload:
    def __init__(self, mark: Path) -> None:
        self.mark = str(mark)

    def __reduce__(self) -> Any:
        return (os.mkdir, (self.mark,))


def test_a_tampered_module_is_not_executed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _use_cache(monkeypatch, tmp_path / "cache")
    first = tfrt_py.load(_graph(), executor="native", native="eager")
    path = Path(first.native.compiled.path)
    mark = tmp_path / "pwned"
    path.write_text(
        f'__import__("os").mkdir("{mark}")\n'
        "import numpy as np\n"
        "def run(*args):\n"
        "    return np.full((2, 3), 42, np.float32)\n"
    )
    second = tfrt_py.load(_graph(), executor="native", native="eager")
    assert second.native.state == "ready"
    assert not mark.exists()
    _check_answers(second)
    assert path.read_text() == second.native.lowered.source  # rewritten


def _plant_and_reload(index: Path, module: Path, mark: Path) -> None:
    """Plant a pickle (which would create ``mark``) as numba's ``index``, tamper with the
    generated ``module``, load again: the pickle must not run, the model must answer."""
    index.write_bytes(pickle.dumps(_Payload(mark)))
    module.write_text(module.read_text() + "\n# changed\n")
    second = tfrt_py.load(_graph(), executor="native", native="eager")
    assert not mark.exists()
    assert second.native.state == "ready"
    _check_answers(second)


def test_a_planted_numba_index_beside_a_tampered_module_is_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """numba's cache files are pickles: when the module beside them is not ours, they are
    deleted unread."""
    _use_cache(monkeypatch, tmp_path / "cache")
    first = tfrt_py.load(_graph(), executor="native", native="eager")
    path = Path(first.native.compiled.path)
    index = glob.glob(str(path.parent / "__pycache__" / (path.stem + ".*.nbi")))
    assert index, os.listdir(path.parent / "__pycache__")
    _plant_and_reload(Path(index[0]), path, tmp_path / "pwned_by_pickle")


def test_a_planted_index_under_numba_cache_dir_is_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 33, N3: with ``$NUMBA_CACHE_DIR`` set numba keeps its index there, not in
    ``__pycache__``; a tampered module's index there was left in place and unpickled."""
    from numba.core import caching, config

    _use_cache(monkeypatch, tmp_path / "cache")
    numba_dir = tmp_path / "numba_cache"
    numba_dir.mkdir(mode=0o700)
    monkeypatch.setattr(config, "CACHE_DIR", str(numba_dir))  # what the variable sets
    first = tfrt_py.load(_graph(), executor="native", native="eager")
    path = Path(first.native.compiled.path)
    where = numba_dir / caching._CacheLocator.get_suitable_cache_subpath(str(path))
    index = glob.glob(str(where / (path.stem + ".*.nbi")))
    assert index, list(numba_dir.rglob("*"))
    _plant_and_reload(Path(index[0]), path, tmp_path / "pwned_by_pickle")


def test_a_new_cache_dir_is_private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    d = tmp_path / "new" / "native"
    _use_cache(monkeypatch, d)
    old = os.umask(0o022)
    try:
        model = tfrt_py.load(_graph(), executor="native", native="eager")
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    _check_answers(model)


@pytest.mark.parametrize("where", ["dir", "parent"])
def test_a_cache_dir_others_can_write_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    d = tmp_path / "shared" / "native"
    d.mkdir(parents=True, mode=0o700)
    os.chmod(d if where == "dir" else d.parent, 0o777)
    _use_cache(monkeypatch, d)
    auto = tfrt_py.load(_graph(), native="eager")
    assert auto.executor == "sync"
    text = auto.describe()
    assert "UnsafeCacheDir" in text and "group or others" in text, text
    _check_answers(auto)
    with pytest.raises(UnsafeCacheDir, match="group or others"):
        tfrt_py.load(_graph(), executor="native", native="eager")
    assert os.listdir(d) == []  # nothing written, nothing read


def test_a_sticky_world_writable_parent_is_fine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    d = tmp_path / "tmp_like" / "native"
    d.mkdir(parents=True, mode=0o700)
    os.chmod(d.parent, 0o1777)  # like /tmp: others cannot rename our entries
    _use_cache(monkeypatch, d)
    model = tfrt_py.load(_graph(), native="eager")
    assert model.executor == "native"
    _check_answers(model)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_a_cache_dir_owned_by_another_user_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    _use_cache(monkeypatch, d)
    with pytest.raises(UnsafeCacheDir, match="owned by uid 65534"):
        tfrt_py.load(_graph(), executor="native", native="eager")
    assert tfrt_py.load(_graph()).executor == "sync"
