"""tfrt_py as an ``onnx.backend.base`` backend, for ``onnx.backend.test.BackendTest``.

import tfrt_py.onnx_backend as backend
rep = backend.prepare(model_proto, "CPU")
outputs = rep.run([x])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from .model import Model, load

__all__ = ["TfrtBackend", "TfrtBackendRep", "prepare", "run_model", "supports_device"]


class TfrtBackendRep(BackendRep):
    """A prepared model; ``run`` takes inputs positionally (graph input order) or by name."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self._names = [s.name for s in model.inputs]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            feeds = dict(zip(self._names, inputs))
        for k, v in feeds.items():
            if isinstance(v, onnx.TensorProto):  # types NumPy lacks (float8, int4) come so
                feeds[k] = numpy_helper.to_array(v)
        return tuple(self.model.run(feeds).values())


class TfrtBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> TfrtBackendRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"tfrt_py runs on CPU only, not {device!r}")
        executor = kwargs.pop("executor", "auto")
        return TfrtBackendRep(load(model, executor=executor))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")


prepare = TfrtBackend.prepare
run_model = TfrtBackend.run_model
supports_device = TfrtBackend.supports_device
is_compatible = TfrtBackend.is_compatible
