"""Fuzzing external-data locations (issue 12): whatever string a model gives as a tensor's
``location``, ``load`` either reads the legitimate file inside the model's directory and
answers correctly, or refuses with a ModelLoadError -- it never reads the secret file
outside the directory, and never fails any other way."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sec_models import NBYTES, expected, external_model, save, write_weights

import tfrt_py
from tfrt_py.errors import ModelLoadError

_PIECES = ["w.bin", "..", ".", "/", "//", "outside", "secret.bin", "sub", "\\", "%2e%2e",
           "~", "\x00", "w.bin\x00.txt", "C:", "ü", " ", "w.bin/"]  # fmt: skip

locations = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=5).map("".join) | st.text(
    max_size=20
)


@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(location=locations)
@example(location="../outside/secret.bin")
@example(location="sub/../../outside/secret.bin")
@example(location="w.bin")
def test_any_location_reads_only_inside_the_directory(tmp_path: Path, location: str) -> None:
    model_dir = tmp_path / "model"
    outside = tmp_path / "outside"
    if not model_dir.exists():
        write_weights(str(model_dir))
        os.makedirs(model_dir / "sub", exist_ok=True)
        outside.mkdir()
        (outside / "secret.bin").write_bytes(b"SECRET!!" * (NBYTES // 8 + 8))
    path = save(external_model(location), str(model_dir), "fuzz.onnx")
    x = np.ones(NBYTES // 4, np.float32)
    try:
        model = tfrt_py.load(path, executor="sync")
    except ModelLoadError:
        return
    np.testing.assert_array_equal(model.run({"x": x})["y"], expected(x))
