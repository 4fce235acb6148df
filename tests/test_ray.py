"""tfrt_py.ray.Predictor on a real local Ray cluster (``ray.init(num_cpus=2)``, one per
session, shut down after): 20,000 rows of gradient-boosted trees and of an MLP through
``Dataset.map_batches`` with an actor pool of 2 agree with onnxruntime row for row; a bad
batch fails naming the column, through Ray and directly; string columns and renamed
columns; without Ray installed, the import says which extra to install.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import tests.support.scale_models as sm  # noqa: E402
from tfrt_py.errors import InputError  # noqa: E402
from tfrt_py.ray import Predictor  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    # Ray's own code warns (deprecations, resource hints) in the driver; not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

ROWS = 20_000


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    """One local Ray cluster of 2 CPUs for the session; the actors inherit this process's
    environment (TFRT_PY_NATIVE=0 and the session's native cache dir, see conftest)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ray_models")
    return {
        "gbt": sm.gbt_model(d / "gbt.onnx"),
        "mlp": sm.mlp_model(d / "mlp.onnx"),
        "cities": sm.string_model(d / "cities.onnx"),
    }


def _map(ds: Any, model: Path, **kwargs: Any) -> dict[str, np.ndarray]:
    out = ds.map_batches(
        Predictor,
        fn_constructor_kwargs={"model": str(model), **kwargs},
        batch_format="numpy",
        batch_size=1024,
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
    )
    batch: dict[str, np.ndarray] = out.take_batch(ROWS + 1, batch_format="numpy")
    order = np.argsort(batch["id"])  # actors finish blocks in any order
    return {k: v[order] for k, v in batch.items()}


def _from_columns(columns: dict[str, np.ndarray]) -> Any:
    """A dataset of ``columns`` plus an ``id`` column, in 8 blocks (both actors get work),
    made without a task: the two actors hold both CPUs, so a repartition would wait for a
    CPU forever."""
    import pyarrow as pa

    n = len(next(iter(columns.values())))
    arrays: dict[str, Any] = {"id": pa.array(np.arange(n))}
    for name, v in columns.items():
        arrays[name] = _arrow_column(v)
    table = pa.table(arrays)
    step = -(-n // 8)
    return ray.data.from_arrow([table.slice(i, step) for i in range(0, n, step)])


def _arrow_column(v: np.ndarray) -> Any:
    import pyarrow as pa

    if v.ndim == 1:
        return pa.array(v)
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(v)


def test_gradient_boosted_trees_agree_with_onnxruntime(cluster: None, models: dict[str, Path]):
    import onnxruntime as ort

    x = sm.gbt_data(ROWS)
    out = _map(_from_columns({"features": x}), models["gbt"])
    assert len(out["id"]) == ROWS and np.array_equal(out["id"], np.arange(ROWS))
    np.testing.assert_array_equal(out["features"], x)  # passed through
    labels, probs = ort.InferenceSession(str(models["gbt"])).run(None, {"features": x})
    np.testing.assert_array_equal(out["output_label"], labels)
    for c in probs[0]:
        want = np.array([row[c] for row in probs], np.float32)
        np.testing.assert_allclose(out[f"output_probability_{c}"], want, rtol=1e-5, atol=1e-6)


def test_mlp_agrees_with_onnxruntime_under_a_renamed_column(cluster: None, models: dict[str, Path]):
    import onnxruntime as ort

    x = sm.mlp_data(ROWS)
    out = _map(_from_columns({"pixels": x}), models["mlp"], columns={"x": "pixels"})
    (want,) = ort.InferenceSession(str(models["mlp"])).run(None, {"x": x})
    assert out["probs"].shape == (ROWS, 4)
    np.testing.assert_allclose(out["probs"], want, rtol=1e-5, atol=1e-6)


def test_a_bad_batch_fails_through_ray_naming_the_column(cluster: None, models: dict[str, Path]):
    ds = _from_columns({"feature": sm.gbt_data(64)})  # the model's input is "features"
    with pytest.raises(Exception, match="no column 'features'") as info:
        _map(ds, models["gbt"])
    assert "feature" in str(info.value)


def test_string_columns_as_ray_gives_them(cluster: None, models: dict[str, Path]):
    cities = np.array(["oslo", "lima", "nowhere", "berlin"] * 8)
    batch = _from_columns({"city": cities}).take_batch(64, batch_format="numpy")
    out = Predictor(models["cities"])(batch)
    want = {c: 10 + i for i, c in enumerate(sm.CITIES)}
    np.testing.assert_array_equal(out["code"], [want.get(c, -1) for c in batch["city"]])


def test_wrong_dtype_and_missing_column_name_the_column(models: dict[str, Path]):
    p = Predictor(models["mlp"], columns={"x": "pixels"})
    x = sm.mlp_data(8)
    with pytest.raises(ValueError, match=r"no column 'pixels' \(model input 'x'\)"):
        p({"x": x})
    with pytest.raises(InputError, match=r"column 'pixels' \(model input 'x'\).*float64"):
        p({"pixels": x.astype(np.float64)})
    with pytest.raises(InputError, match=r"column 'pixels'.*object"):
        p({"pixels": np.array([["a"] * sm.MLP_IN] * 8, dtype=object)})
    with pytest.raises(ValueError, match="not model inputs"):
        Predictor(models["mlp"], columns={"y": "pixels"})
    with pytest.raises(ValueError, match="not model outputs"):
        Predictor(models["mlp"], output_names=["nope"])


def test_list_columns_and_misaligned_columns(models: dict[str, Path]):
    """Issue 33, N5: a list-valued column failed with a misleading "not one row per row"
    error, and a column of another length was passed through silently."""
    p = Predictor(models["mlp"], columns={"x": "pixels"})
    x = sm.mlp_data(8)
    want = p({"pixels": x})
    got = p({"pixels": x.tolist(), "note": ["n"] * 8})
    for name in want:
        if name != "pixels":
            np.testing.assert_array_equal(got[name], want[name])
    with pytest.raises(ValueError, match=r"column 'note' has 5 rows, column 'pixels' 8"):
        p({"pixels": x, "note": np.array(["n"] * 5, dtype=object)})
    with pytest.raises(ValueError, match=r"column 'pixels' has 7 rows, column 'id' 8"):
        p({"id": np.arange(8), "pixels": x[:7]})
    with pytest.raises(ValueError, match=r"column 'scale' is a ndarray of shape \(\), not a"):
        p({"pixels": x, "scale": np.array(2.0)})
    with pytest.raises(InputError, match=r"column 'pixels' is a list of rows that makes no"):
        p({"pixels": [[1.0, 2.0], [1.0]]})
    with pytest.raises(InputError, match=r"makes no float32 array"):
        p({"pixels": [["a"] * sm.MLP_IN] * 8})


def test_output_names_and_pass_through(models: dict[str, Path]):
    p = Predictor(models["gbt"], output_names=["output_label"])
    x = sm.gbt_data(16)
    out = p({"features": x, "note": np.array(["n"] * 16, dtype=object)})
    assert sorted(out) == ["features", "note", "output_label"]
    assert out["note"][0] == "n"


def test_the_native_tier_is_compiled_before_the_first_batch(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bulk scoring: the constructor waits for the native tier (an actor must not serve
    its batches through the interpreter while its one CPU compiles)."""
    pytest.importorskip("numba")
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    p = Predictor(models["gbt"], executor="auto")
    assert p.model.native is not None, p.model.describe()
    assert p.model.native.wait(timeout=0), "constructor returned before the compile ended"
    x = sm.gbt_data(64)
    assert p({"features": x})["output_label"].shape == (64,)


_WITHOUT_RAY = textwrap.dedent(
    """
    import importlib.abc, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "ray":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Missing())
    try:
        import tfrt_py.ray
    except ImportError as e:
        assert "tfrt-py[ray]" in str(e), e
        print("ok")
    """
)


def test_without_ray_the_import_names_the_extra() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_RAY], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"
