"""scikit-learn's DictVectorizer pipelines against onnxruntime (issue 39): skl2onnx's export
of ``DictVectorizer -> LogisticRegression`` (with its ZipMap, as skl2onnx writes it by
default, and without) and ``DictVectorizer -> RandomForestClassifier``, fitted from fixed
seeds on maps of 8 of 40 string keys, and the logistic regression on one-hot maps of 8 of
10,000 keys (``"k123": 1.0``, what a DictVectorizer of categorical fields makes).
onnxruntime takes one map per call, so batch 1 only.

Per model: tfrt_py ``auto`` (``encode_maps``: the map made the DictVectorizer's row as
the feeds are checked, so the native tier compiles the rest), the same without
``encode_maps`` (the nodes on the sync interpreter), and onnxruntime, interleaved in one
process (``tfrt_py.bench.measure``); each answer is checked against onnxruntime's first.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. python benchmarks/dict_pipeline.py
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import numpy as np

KEYS = [f"f{i}" for i in range(40)]
WIDE = [f"k{i}" for i in range(10_000)]


def _maps(rng: np.random.Generator, n: int, keys: list[str] = KEYS,
          one_hot: bool = False) -> list[dict[str, float]]:  # fmt: skip
    return [{str(k): 1.0 if one_hot else float(rng.random())
             for k in rng.choice(keys, 8, replace=False)} for _ in range(n)]  # fmt: skip


def models() -> dict[str, Any]:
    """name -> ONNX model (skl2onnx), fitted from fixed seeds."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    rng = np.random.default_rng(0)
    x = _maps(rng, 400)
    y = np.array([int(sum(m.values()) * 3) % 3 for m in x])
    typ = [("input", DictionaryType(StringTensorType([]), FloatTensorType([])))]
    logistic = make_pipeline(DictVectorizer(sparse=False), LogisticRegression(max_iter=300))
    wide = make_pipeline(DictVectorizer(sparse=False), LogisticRegression(max_iter=50))
    trees = RandomForestClassifier(n_estimators=20, max_depth=6, random_state=0)
    forest = make_pipeline(DictVectorizer(sparse=False), trees)
    wide_x = _maps(rng, 3000, WIDE, one_hot=True)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logistic.fit(x, y)
        forest.fit(x, y)
        wide.fit(wide_x, rng.integers(0, 4, len(wide_x)))
        out["dict_logistic"] = convert_sklearn(logistic, initial_types=typ)
        out["dict_logistic_nozipmap"] = convert_sklearn(
            logistic, initial_types=typ, options={id(logistic.steps[-1][1]): {"zipmap": False}}
        )
        out["dict_forest"] = convert_sklearn(forest, initial_types=typ)
        out["dict_logistic_10k_keys"] = convert_sklearn(wide, initial_types=typ)
    return out


def _same(got: dict[str, Any], want: list[Any], names: list[str]) -> bool:
    for name, w in zip(names, want):
        g = got[name]
        if isinstance(w, list):  # ZipMap rows
            if [sorted(r) for r in g] != [sorted(r) for r in w]:
                return False
            g = [[r[k] for k in sorted(r)] for r in g]
            w = [[r[k] for k in sorted(r)] for r in w]
        if not np.allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                           rtol=1e-5, atol=1e-6):  # fmt: skip
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    feed = {"input": _maps(rng, 1)[0] | {"unseen": 2.0}}
    wide_feed = {"input": _maps(rng, 1, WIDE, one_hot=True)[0] | {"unseen": 1.0}}
    print("| model | tfrt_py auto µs | without encode_maps µs | onnxruntime µs | ratio | "
          "matches |\n|---|---|---|---|---|---|")  # fmt: skip
    for name, model in models().items():
        print(
            bench(
                name, model.SerializeToString(), wide_feed if "10k" in name else feed, args.seconds
            )
        )


def bench(name: str, data: bytes, feed: dict[str, Any], seconds: float) -> str:
    """One row of the table: ``name``'s model timed three ways on ``feed``."""
    import onnxruntime as ort

    import tfrt_py
    from tfrt_py.bench import measure
    from tfrt_py.compiler.pipeline import PASSES

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ours = tfrt_py.load(data)
    plain = tfrt_py.load(data, optimize=set(PASSES) - {"encode_maps"})
    for m in (ours, plain):
        m.wait_compiled(60)
    names = [o.name for o in sess.get_outputs()]
    ok = _same(ours.run(feed), sess.run(None, feed), names)
    res = measure({"auto": lambda: ours.run(feed), "plain": lambda: plain.run(feed),
                   "ort": lambda: sess.run(None, feed)}, "ort", seconds)  # fmt: skip
    a, p, o = res["auto"], res["plain"], res["ort"]
    return (f"| {name} | {a.median_us:.1f} | {p.median_us:.1f} | {o.median_us:.1f} | "
            f"{a.ratio:.2f} | {'yes' if ok else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
