"""Runners for a model: each tfrt_py executor it accepts, and onnxruntime (run, io binding).

``make_runners`` checks that every runner's outputs agree with the first before any timing
(an honest benchmark compares equal work).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import tfrt_py
from tfrt_py.errors import InputError
from tfrt_py.generation import first_step_feeds
from tfrt_py.native.runtime.entry import rounding_tolerance, scaled_atol

__all__ = ["check_agreement", "make_runners", "random_feeds"]


def random_feeds(model: tfrt_py.Model, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Inputs of the right dtype and shape; symbolic or unknown dims become ``batch``.
    Integer inputs that index a table (token ids: ``id_limits``) take values inside it;
    ones named like a mask are ones; other integers are in [0, 4). A KV-cache decoder gets
    the first step of a generation (``batch`` prompts of 4 tokens, an empty cache): its
    dims are tied to each other (the mask spans past + new)."""
    decoder = first_step_feeds(model, batch)
    if decoder is not None:
        return decoder
    rng = np.random.default_rng(seed)
    limits = id_limits(model.graph)
    feeds: dict[str, np.ndarray] = {}
    for spec in model.inputs:
        shape = tuple(d if isinstance(d, int) else batch for d in (spec.shape or ()))
        dtype = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu" and "mask" in spec.name.lower():
            feeds[spec.name] = np.ones(shape, dtype)
        elif dtype.kind in "iu":
            high = max(1, min(4, limits.get(spec.name, 4)))
            feeds[spec.name] = rng.integers(0, high, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[spec.name] = np.full(shape, "a", dtype=object)
    return feeds


#: Ops an id passes through unchanged on its way to a table.
_ID_VIEWS = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})
#: (op type, index of the ids input, index of the table input) of the ops that index one:
#: ONNX's Gather and onnxruntime's embedding ops (word, position, segment tables).
_TABLE_OPS = {"Gather": ((1, 0),), "EmbedLayerNormalization": ((0, 2), (1, 4))}


def id_limits(graph: Any) -> dict[str, int]:
    """Input name -> the smallest table it indexes (rows of a constant Gather table, or of
    an embedding op's word/segment table), for integer inputs that are ids: random ids
    past it would fail with "index out of bounds" (a BERT's token_type_ids index 2 rows)."""
    readers: dict[int, list[tuple[Any, int]]] = {}
    for node in graph.nodes:
        for k, v in enumerate(node.inputs):
            if v is not None:
                readers.setdefault(id(v), []).append((node, k))
    out: dict[str, int] = {}
    for v in graph.inputs:
        todo, seen = [v], {id(v)}
        while todo:
            cur = todo.pop()
            for node, k in readers.get(id(cur), ()):
                if node.op_type in _ID_VIEWS and k == 0:
                    for o in node.outputs:
                        if o is not None and id(o) not in seen:
                            seen.add(id(o))
                            todo.append(o)
                for ids_at, table_at in _TABLE_OPS.get(node.op_type, ()):
                    table = node.inputs[table_at] if table_at < len(node.inputs) else None
                    if k == ids_at and table is not None and table.const is not None:
                        rows = int(np.shape(table.const)[0]) if np.ndim(table.const) else 1
                        out[v.name] = min(out.get(v.name, rows), rows)
    return out


def make_runners(
    source: Any,
    feeds: dict[str, np.ndarray],
    executors: tuple[str, ...] = ("auto",),
    vs: tuple[str, ...] = ("onnxruntime",),
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], list[np.ndarray]]]]:
    """(runners for timing, output getters for the agreement check), by runner name."""
    timed: dict[str, Callable[[], object]] = {}
    outputs: dict[str, Callable[[], list[np.ndarray]]] = {}
    for ex in executors:
        model = tfrt_py.load(source, executor=ex)
        # time the compiled code, not a cold start's or the tier-up: in signature mode the
        # feeds' signature compiles only once hot (a 2 s window timed the interpreter)
        try:
            model.warmup([feeds])
        except InputError:  # feeds warmup cannot take (run says why, in the check)
            model.wait_compiled()
        name = f"tfrt_py[{model.executor}]"

        def run(model: tfrt_py.Model = model) -> dict[str, np.ndarray]:
            return model.run(feeds)

        timed[name] = run
        outputs[name] = _getter(run)
    if "onnxruntime" in vs:
        _add_onnxruntime(source, feeds, timed, outputs)
    return timed, outputs


def _getter(run: Callable[[], dict[str, Any]]) -> Callable[[], list[np.ndarray]]:
    return lambda: [np.asarray(v) for v in run().values()]


def _add_onnxruntime(
    source: Any,
    feeds: dict[str, np.ndarray],
    timed: dict[str, Callable[[], object]],
    outputs: dict[str, Callable[[], list[np.ndarray]]],
) -> None:
    import onnxruntime as ort

    data = source if isinstance(source, (str, bytes)) else source.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])

    def ort_run() -> list[Any]:
        return sess.run(None, feeds)

    timed["onnxruntime run"] = ort_run
    outputs["onnxruntime run"] = lambda: [np.asarray(v) for v in ort_run()]
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")

    def ort_bound() -> None:
        sess.run_with_iobinding(binding)

    timed["onnxruntime io binding"] = ort_bound

    def bound_outputs() -> list[np.ndarray]:
        ort_bound()
        return [np.asarray(v) for v in binding.copy_outputs_to_cpu()]

    outputs["onnxruntime io binding"] = bound_outputs


def check_agreement(
    outputs: dict[str, Callable[[], list[np.ndarray]]], rtol: float = 1e-4, atol: float = 1e-5,
    scale_tol: float = 0.0, graph: Any = None,
) -> None:  # fmt: skip
    """Raise AssertionError naming the runner and output when any two runners disagree.
    ``scale_tol``: floats may also differ by that fraction of the reference output's largest
    finite magnitude (a model that rounds activations to int8 at run time, where runtimes
    differ by a step wherever a rounding flips); with the model's ``graph``, its
    ``native.runtime.entry.rounding_tolerance`` when larger."""
    if graph is not None:
        scale_tol = max(scale_tol, rounding_tolerance(graph))
    names = list(outputs)
    ref = outputs[names[0]]()
    for name in names[1:]:
        got = outputs[name]()
        if len(got) != len(ref):
            raise AssertionError(f"{name}: {len(got)} outputs, {names[0]} has {len(ref)}")
        for i, (a, b) in enumerate(zip(got, ref)):
            if a.dtype.kind in "fc":
                tol = scaled_atol(b, atol, scale_tol)
                np.testing.assert_allclose(
                    a, b, rtol=rtol, atol=tol, err_msg=f"{name} output {i} vs {names[0]}"
                )
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} output {i} vs {names[0]}")
