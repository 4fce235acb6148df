"""The demo behind ``make demo``: load a bundled model, show what tfrt_py chose, run it.

python -m tfrt_py.examples.demo [MODEL.onnx]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

import tfrt_py

HERE = os.path.dirname(os.path.abspath(__file__))


def random_feeds(model: tfrt_py.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right dtype and shape (symbolic dims become 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = tuple(d if isinstance(d, int) else 1 for d in (spec.shape or ()))
        dtype = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 10, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[spec.name] = np.full(shape, "a", dtype=object)
    return feeds


def median_us(fn: object, calls: int = 2000) -> float:
    """Median wall time of one call, in µs, over bursts of 100 calls."""
    bursts = []
    for _ in range(calls // 100):
        t0 = time.perf_counter()
        for _ in range(100):
            fn()  # type: ignore[operator]
        bursts.append((time.perf_counter() - t0) / 100 * 1e6)
    return statistics.median(bursts)


def main(argv: list[str]) -> None:
    path = argv[0] if argv else os.path.join(HERE, "mlp_small.onnx")
    model = tfrt_py.load(path)
    print(f"loaded {path}")
    print(f"executor chosen: {model.executor}\n")
    print(model.describe(), "\n")
    feeds = random_feeds(model)
    outputs = model.run(feeds)
    for name, value in outputs.items():
        arr = np.asarray(value)
        print(f"output {name}: {arr.dtype}{list(arr.shape)} = {np.array2string(arr, precision=4)}")
    us = median_us(lambda: model.run(feeds))
    print(f"\nlatency: {us:.1f} µs per call (median of bursts)")
    try:
        import onnxruntime as ort
    except ImportError:
        return
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    agree = all(
        np.allclose(np.asarray(a), b, rtol=1e-4, atol=1e-5) for a, b in zip(outputs.values(), ref)
    )
    ort_us = median_us(lambda: sess.run(None, feeds))
    print(f"onnxruntime: {ort_us:.1f} µs per call; outputs agree: {agree}")


if __name__ == "__main__":
    main(sys.argv[1:])
