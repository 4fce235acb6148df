"""External data from a stranger's model (issue 12, item 1): a ``location`` that leaves the
model's directory -- absolute, ``..``, a symlink (file or directory), a hard link -- or
that names something other than a regular file (a directory, a FIFO, a device, a NUL
byte) is refused at load with a ModelLoadError naming the tensor and the location, on
normal, async and streamed loads; ``offset``/``length`` are bounded; bytes and
ModelProto sources need ``base_dir``; the streaming transfer re-checks the file it opens.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from sec_models import (
    NBYTES,
    STREAM_BUDGET,
    expected,
    external_model,
    save,
    weight_bytes,
    write_weights,
)

import tfrt_py
from tfrt_py.errors import ExecutionError, ModelLoadError

LOADS = {
    "normal": {"executor": "sync"},
    "async": {"executor": "async"},
    "streamed": {"memory_budget": STREAM_BUDGET},
}


@pytest.fixture(params=list(LOADS))
def load_kw(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(LOADS[str(request.param)])


def _dirs(tmp_path: Any) -> tuple[str, str]:
    """(the model's directory with its legitimate weights, a directory outside it holding
    a 'secret' file long enough to pass for the weight)."""
    model_dir, outside = str(tmp_path / "model"), str(tmp_path / "outside")
    write_weights(model_dir)
    os.makedirs(outside)
    with open(os.path.join(outside, "secret.bin"), "wb") as f:
        f.write(b"SECRET!!" * (NBYTES // 8 + 8))
    return model_dir, outside


def _absolute(model_dir: str, outside: str) -> str:
    return os.path.join(outside, "secret.bin")


def _dotdot(model_dir: str, outside: str) -> str:
    return "../outside/secret.bin"


def _dotdot_inside(model_dir: str, outside: str) -> str:
    os.makedirs(os.path.join(model_dir, "sub"))
    return "sub/../../outside/secret.bin"


def _symlink(model_dir: str, outside: str) -> str:
    os.symlink(os.path.join(outside, "secret.bin"), os.path.join(model_dir, "link.bin"))
    return "link.bin"


def _symlink_within(model_dir: str, outside: str) -> str:
    os.symlink("w.bin", os.path.join(model_dir, "alias.bin"))  # onnx refuses this too
    return "alias.bin"


def _dir_symlink(model_dir: str, outside: str) -> str:
    os.symlink(outside, os.path.join(model_dir, "sub"))
    return "sub/secret.bin"


def _hardlink(model_dir: str, outside: str) -> str:
    os.link(os.path.join(outside, "secret.bin"), os.path.join(model_dir, "hard.bin"))
    return "hard.bin"


def _directory(model_dir: str, outside: str) -> str:
    os.makedirs(os.path.join(model_dir, "weights"))
    return "weights"


def _dot(model_dir: str, outside: str) -> str:
    return "."


def _fifo(model_dir: str, outside: str) -> str:
    os.mkfifo(os.path.join(model_dir, "pipe"))
    return "pipe"


def _device(model_dir: str, outside: str) -> str:
    try:
        os.mknod(os.path.join(model_dir, "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("cannot make a device node here")
    return "null"


def _nul(model_dir: str, outside: str) -> str:
    return "w.bin\0/../../outside/secret.bin"


REFUSED: dict[str, Callable[[str, str], str]] = {
    "absolute": _absolute,
    "dotdot": _dotdot,
    "dotdot-inside": _dotdot_inside,
    "symlink": _symlink,
    "symlink-within": _symlink_within,
    "dir-symlink": _dir_symlink,
    "hardlink": _hardlink,
    "directory": _directory,
    "dot": _dot,
    "fifo": _fifo,
    "device": _device,
    "nul": _nul,
}


@pytest.mark.parametrize("form", list(REFUSED))
def test_refused_location(tmp_path: Any, load_kw: dict[str, Any], form: str) -> None:
    model_dir, outside = _dirs(tmp_path)
    location = REFUSED[form](model_dir, outside)
    path = save(external_model(location), model_dir)
    with pytest.raises(ModelLoadError, match=rf"tensor 'w'.*location {re.escape(repr(location))}"):
        tfrt_py.load(path, **load_kw)


def test_legitimate_external_data_in_a_subdirectory_loads(
    tmp_path: Any, load_kw: dict[str, Any]
) -> None:
    model_dir = str(tmp_path / "models")
    write_weights(model_dir, "data/w.bin")
    path = save(external_model("data/w.bin"), model_dir)
    model = tfrt_py.load(path, **load_kw)
    assert (model.executor == "stream") == ("memory_budget" in load_kw)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], expected(x))


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (None, NBYTES - 4),  # shorter than the dims declare
        (None, NBYTES + 4),  # longer than the dims declare
        (NBYTES, None),  # past the data: file too short
        (10**30, None),  # absurd offset
        ("-4", None),
        ("1e3", None),
        ("0x10", None),
        (None, "-256"),
    ],
)
def test_offset_and_length_are_bounded(
    tmp_path: Any, load_kw: dict[str, Any], offset: Any, length: Any
) -> None:
    model_dir, _ = _dirs(tmp_path)
    path = save(external_model("w.bin", offset=offset, length=length), model_dir)
    with pytest.raises(ModelLoadError, match=r"tensor 'w'.*(offset|length|too short)"):
        tfrt_py.load(path, **load_kw)


def test_bytes_and_proto_sources_need_base_dir(tmp_path: Any, load_kw: dict[str, Any]) -> None:
    model_dir, _ = _dirs(tmp_path)
    proto = external_model("w.bin")
    x = np.ones(64, np.float32)
    for source in (proto.SerializeToString(), proto):
        with pytest.raises(ModelLoadError, match=r"tensor 'w'.*pass load\(\.\.\., base_dir="):
            tfrt_py.load(source, **load_kw)
        model = tfrt_py.load(source, base_dir=model_dir, **load_kw)
        np.testing.assert_allclose(model.run({"x": x})["y"], expected(x))


def test_bytes_source_without_base_dir_ignores_the_current_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir, _ = _dirs(tmp_path)
    monkeypatch.chdir(model_dir)  # the weights are right here, but nobody said to use it
    with pytest.raises(ModelLoadError, match="base_dir"):
        tfrt_py.load(external_model("w.bin").SerializeToString())


def test_base_dir_keeps_the_location_rules(tmp_path: Any, load_kw: dict[str, Any]) -> None:
    model_dir, outside = _dirs(tmp_path)
    proto = external_model(_symlink(model_dir, outside))
    with pytest.raises(ModelLoadError, match=r"tensor 'w'.*symbolic link"):
        tfrt_py.load(proto, base_dir=model_dir, **load_kw)
    proto = external_model("../outside/secret.bin")
    with pytest.raises(ModelLoadError, match=r"tensor 'w'.*'\.\.'"):
        tfrt_py.load(proto.SerializeToString(), base_dir=model_dir, **load_kw)


def test_base_dir_with_a_path_source_must_be_its_directory(tmp_path: Any) -> None:
    model_dir, outside = _dirs(tmp_path)
    path = save(external_model("w.bin"), model_dir)
    tfrt_py.load(path, base_dir=model_dir)  # repeating the file's own directory is fine
    with pytest.raises(ValueError, match="differs from the model file's directory"):
        tfrt_py.load(path, base_dir=outside)
    with pytest.raises(ValueError, match="existing directory"):
        tfrt_py.load(external_model("w.bin"), base_dir=os.path.join(model_dir, "w.bin"))


def test_streamed_run_rechecks_the_weight_file(tmp_path: Any) -> None:
    """The transfer kernel re-opens the weight file on every run: a symlink swapped in
    after load is refused there too, and the model works again once the file is back."""
    model_dir, outside = _dirs(tmp_path)
    path = save(external_model("w.bin"), model_dir)
    model = tfrt_py.load(path, memory_budget=STREAM_BUDGET)
    assert model.executor == "stream"
    wfile = os.path.join(model_dir, "w.bin")
    os.replace(wfile, wfile + ".orig")
    os.symlink(os.path.join(outside, "secret.bin"), wfile)
    x = np.zeros(64, np.float32)
    with pytest.raises(ExecutionError, match=r"transfer.*tensor 'w'.*symbolic link"):
        model.run({"x": x})
    os.remove(wfile)
    os.replace(wfile + ".orig", wfile)
    np.testing.assert_allclose(model.run({"x": x})["y"], expected(x))


def test_onnx_itself_refuses_what_we_refuse(tmp_path: Any) -> None:
    """Our rules are at least as strict as onnx's: each form onnx.load refuses, we refuse
    (the converse need not hold: we also refuse '..' anywhere and hard links on load)."""
    for form, make in REFUSED.items():
        if form in ("device", "nul"):
            continue
        sub = tmp_path / form
        model_dir, outside = _dirs(sub)
        location = make(model_dir, outside)
        path = save(external_model(location), model_dir)
        try:
            onnx.load(path)
        except Exception:  # noqa: BLE001 - onnx refuses: so must we
            with pytest.raises(ModelLoadError):
                tfrt_py.load(path)
        else:
            with pytest.raises(ModelLoadError):  # onnx reads it; we are stricter
                tfrt_py.load(path)
    assert len(weight_bytes()) == NBYTES
