"""A classic-ML model's outputs are onnxruntime's: labels exactly, floats within 1e-5
relative (issue 39's bar)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import tfrt_py

__all__ = ["assert_matches_onnxruntime"]


def assert_matches_onnxruntime(model: tfrt_py.Model, data: bytes, *batches: np.ndarray) -> None:
    """``model`` (loaded from ``data``) on each batch of rows for its one input: every
    output as onnxruntime's, integers and strings equal, floats within 1e-5 relative
    (1e-6 absolute)."""
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    for rows in batches:
        got = list(model.run({name: rows}).values())
        for g, w in zip(got, sess.run(None, {name: rows}), strict=True):
            if np.asarray(w).dtype.kind == "f":
                np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(np.asarray(g), w)
