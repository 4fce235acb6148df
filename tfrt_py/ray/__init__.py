"""tfrt_py.ray: tfrt_py models in Ray Data pipelines (the ``ray`` extra).

    import ray, tfrt_py.ray
    ds = ray.data.read_parquet("rows/")
    ds = ds.map_batches(tfrt_py.ray.Predictor, fn_constructor_kwargs={"model": "m.onnx"},
                        batch_format="numpy", batch_size=1024,
                        compute=ray.data.ActorPoolStrategy(size=4), num_cpus=1)

See ``predictor`` and docs/scale.md.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401 - the ray extra's presence
except ImportError as _e:
    raise ImportError(
        f"tfrt_py.ray needs the ray extra ({_e.name} is missing): pip install 'tfrt-py[ray]'"
    ) from _e

from .predictor import Predictor as Predictor
from .predictor import unzip_zipmaps as unzip_zipmaps

__all__ = ["Predictor", "unzip_zipmaps"]
