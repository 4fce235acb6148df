"""``Predictor``: a tfrt_py model as a callable class for Ray Data's ``Dataset.map_batches``.

    ds.map_batches(
        tfrt_py.ray.Predictor,
        fn_constructor_kwargs={"model": "model.onnx"},
        batch_format="numpy", batch_size=1024,
        compute=ray.data.ActorPoolStrategy(size=4), num_cpus=1,
    )

Where things run: Ray constructs one Predictor per actor, in the actor's process; the
constructor loads the model there, once, and sets the process's thread counts to the
actor's CPUs (``threads=``, default its ``num_cpus``). ``__call__`` runs on the actor's
thread for each batch: it takes the batch (a dict of NumPy arrays, one per column), feeds
the model's inputs from their columns, runs the whole batch as one call (the bulk path:
``Model.run_batches``, which streams stage-major for a ``memory_budget=`` load) and returns
the batch with one column per output added (a column of the same name is replaced) and
every other column passed through.

Outputs that are ZipMaps (scikit-learn classifiers converted with skl2onnx) become one
float column per class, ``<output>_<label>``: the ZipMap node is cut off at load and its
(N, classes) scores sliced, never turned into N Python dicts. String inputs take Ray's
string columns (object arrays of ``str``) as they come.

A bad batch fails naming the column: a missing column (with the columns the batch has), a
column whose dtype or shape the input does not take (with what it expects), a column
whose length differs from the others', or one that is not a column of rows (a scalar).
A column given as a list of rows is taken as the array it makes, of the input's dtype.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..concurrency.threads import set_process_threads
from ..errors import InputError

__all__ = ["Predictor", "unzip_zipmaps"]


class Predictor:
    """Loads ``model`` (a path, or ONNX bytes) once; ``__call__(batch)`` adds its outputs.

    ``executor`` and ``load_options`` (``optimize=``, ``memory_budget=``, ...) go to
    ``tfrt_py.load``. ``threads``: the threads this process computes with (BLAS, tfrt_py's
    pool; ``concurrency.threads``); default the CPUs Ray assigned to the actor, and left
    alone outside a Ray worker. ``output_names``: the outputs to compute and add (default
    all). ``columns``: model input name -> batch column name, for inputs whose column is
    named differently (the others are read from the column of their own name). A model
    the native tier takes is compiled (or loaded from its disk cache) in the constructor,
    before the first batch."""

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        executor: str = "auto",
        threads: int | None = None,
        output_names: Sequence[str] | None = None,
        columns: Mapping[str, str] | None = None,
        **load_options: Any,
    ) -> None:
        import tfrt_py

        n = threads if threads is not None else _actor_cpus()
        self.threads = n
        if n is not None:
            set_process_threads(n)
        source, labels = _source(model, load_options)
        self.model = tfrt_py.load(source, executor=executor, **load_options)
        if self.model.native is not None:
            # Compile before the first batch: a bulk job amortizes the seconds, and an
            # actor answering through the interpreter while its CPU compiles is slower
            # than either (measured: trees 0.5x onnxruntime's rows/s through Ray).
            self.model.native.wait()
        self._labels = labels  # output -> class labels of the ZipMap cut off at load
        names = [s.name for s in self.model.outputs]
        wanted = list(output_names) if output_names is not None else names
        unknown = [o for o in wanted if o not in names]
        if unknown:
            raise ValueError(f"output_names {unknown} are not model outputs; outputs: {names}")
        self.output_names = wanted
        inputs = [s.name for s in self.model.inputs]
        extra = sorted(set(columns or {}) - set(inputs))
        if extra:
            raise ValueError(f"columns maps {extra}, which are not model inputs; inputs: {inputs}")
        self.columns = {name: (columns or {}).get(name, name) for name in inputs}
        #: input name -> its numeric dtype: a column given as a Python list takes it
        self._dtypes = {s.name: s.dtype for s in self.model.inputs
                        if s.dtype is not None and np.dtype(s.dtype).kind in "biuf"}  # fmt: skip

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with the model's outputs added as columns (see the module docstring);
        ValueError/InputError naming the column for a batch the model cannot take."""
        rows = _batch_rows(batch)
        feeds = {}
        for name, col in self.columns.items():
            if col not in batch:
                what = f"column {col!r}" + (f" (model input {name!r})" if col != name else "")
                raise ValueError(
                    f"tfrt_py.ray.Predictor: the batch has no {what}; its columns: "
                    f"{sorted(batch)[:20]}"
                )
            feeds[name] = _column_array(batch[col], col, self._dtypes.get(name))
        try:
            (out,) = self.model.run_batches([feeds])
        except InputError as e:
            raise InputError(f"tfrt_py.ray.Predictor: {self._which(e)}: {e}") from None
        result = dict(batch)
        for name in self.output_names:
            value = out[name]
            labels = self._labels.get(name)
            if labels is not None:  # a ZipMap cut off at load: (N, classes) scores
                scores = np.asarray(value).reshape(rows, len(labels))
                for j, label in enumerate(labels):
                    result[f"{name}_{label}"] = scores[:, j]
                continue
            if isinstance(value, list) and value and isinstance(value[0], dict):
                for key in value[0]:
                    result[f"{name}_{key}"] = np.array([d[key] for d in value])
                continue
            arr = np.asarray(value)
            if arr.ndim == 0 or arr.shape[0] != rows:
                raise ValueError(
                    f"tfrt_py.ray.Predictor: output {name!r} has shape {arr.shape}, not one "
                    f"row per row of the batch ({rows}); it cannot be a column "
                    "(leave it out with output_names=)"
                )
            result[name] = arr
        return result

    def _which(self, e: InputError) -> str:
        """The column an InputError is about (it names the model input)."""
        for name, col in self.columns.items():
            if f"input {name!r}" in str(e):
                return f"column {col!r}" + (f" (model input {name!r})" if col != name else "")
        return "the batch"

    def __repr__(self) -> str:
        return f"<tfrt_py.ray.Predictor {self.model!r} threads={self.threads}>"


def _actor_cpus() -> int | None:
    """The CPUs Ray assigned to this worker (None outside a Ray worker process)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        if ctx.worker.mode != ray.WORKER_MODE:
            return None
        cpus = ctx.get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - no Ray context: leave the threads alone
        return None
    return max(1, int(cpus)) if cpus else None


def _column_array(value: Any, col: str, dtype: Any = None) -> Any:
    """A column as the model takes it: an ndarray (a list of rows becomes one, of the
    input's ``dtype`` when it is numeric: a list has none of its own); a variable-shaped
    tensor column (an object array of arrays, or ragged lists) cannot be one input."""
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value, dtype=dtype)
        except (ValueError, TypeError) as e:
            what = "array" if dtype is None else f"{np.dtype(dtype)} array"
            raise InputError(
                f"tfrt_py.ray.Predictor: column {col!r} is a list of rows that makes no "
                f"{what} (rows of different shapes, or values of another type: {e})"
            ) from None
    if isinstance(value, np.ndarray) and value.dtype == object and value.size:
        first = value.flat[0]
        if isinstance(first, np.ndarray):
            try:
                return np.stack(list(value))
            except ValueError:
                raise InputError(
                    f"tfrt_py.ray.Predictor: column {col!r} holds arrays of different shapes "
                    "(a variable-shaped tensor column); pad them to one shape first"
                ) from None
    return value


def _batch_rows(batch: Mapping[str, Any]) -> int:
    """The batch's number of rows: every column's length, which must agree (a column of
    another length would be passed through, or fed, misaligned with the others)."""
    lengths: dict[str, int] = {}
    for col, v in batch.items():
        shape = getattr(v, "shape", None)
        try:
            n = int(shape[0]) if shape is not None else len(v)
        except (TypeError, IndexError):
            raise ValueError(
                f"tfrt_py.ray.Predictor: column {col!r} is a {type(v).__name__}"
                f"{'' if shape is None else f' of shape {tuple(shape)}'}, not a column of "
                "rows"
            ) from None
        lengths[col] = n
    if len(set(lengths.values())) > 1:
        first = next(iter(lengths))
        bad = next(c for c, n in lengths.items() if n != lengths[first])
        raise ValueError(
            f"tfrt_py.ray.Predictor: the batch's columns differ in length: column {bad!r} "
            f"has {lengths[bad]} rows, column {first!r} {lengths[first]}"
        )
    return next(iter(lengths.values()), 0)


def _source(model: Any, load_options: dict[str, Any]) -> tuple[Any, dict[str, list[Any]]]:
    """The source to load, with graph outputs made by ZipMap nodes cut back to their
    scores (``unzip_zipmaps``); a path keeps its directory for external data."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        proto = onnx.load(os.fspath(model), load_external_data=False)
        load_options.setdefault("base_dir", os.path.dirname(os.path.abspath(os.fspath(model))))
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        raise TypeError(f"model must be a path or ONNX bytes, got {type(model).__name__}")
    labels = unzip_zipmaps(proto)
    return (proto if labels else model), labels


def unzip_zipmaps(proto: Any) -> dict[str, list[Any]]:
    """Cut every ZipMap whose output is a graph output off ``proto`` (in place): the graph
    output keeps its name but is the ZipMap's (N, classes) float input. Returns output name
    -> class labels, in column order. Other models are left unchanged ({})."""
    from onnx import TensorProto, helper

    g = proto.graph
    outputs = {o.name: i for i, o in enumerate(g.output)}
    cut: dict[str, list[Any]] = {}
    for node in list(g.node):
        if node.op_type != "ZipMap" or node.domain != "ai.onnx.ml" or node.output[0] not in outputs:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        strs = attrs.get("classlabels_strings", [])
        labels = [s.decode() if isinstance(s, bytes) else s for s in strs]
        labels = labels or [int(i) for i in attrs.get("classlabels_int64s", [])]
        if not labels:
            continue
        name = node.output[0]
        index = list(g.node).index(node)
        g.node.remove(node)  # the scores pass through; load's cleanup drops the Identity
        g.node.insert(index, helper.make_node("Identity", [node.input[0]], [name]))
        info = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        g.output[outputs[name]].CopyFrom(info)
        cut[name] = labels
    return cut
