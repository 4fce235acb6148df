"""The classic zoo's pipelines with string inputs (issue 39): TF-IDF and count vectorizers
(words, and words with their bigrams) before a logistic regression, and ColumnTransformers
over string and numeric columns (one hot before a logistic regression, ordinal codes
before a random forest).

Built by ``zoo_build.py`` from fixed seeds (a synthetic corpus of pseudo-words, nothing
downloaded). Each builder has a ``feeds(rng, batch)`` attribute: the named inputs the
model takes at that batch (strings as NumPy unicode arrays, the form ``np.savez`` stores
without pickling; ``zoo.py`` hands them over as object arrays). skl2onnx writes a
StringNormalizer whose default locale (en_US.UTF-8) is not installed on every host, and
onnxruntime then refuses the model: the builders set ``C.UTF-8``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

#: pseudo-words of the corpus: a few frequent, many rare, some capitalized and non-ASCII
_SYLLABLES = ["ka", "lo", "mi", "nu", "ré", "sa", "to", "vi", "ze", "ßu", "Qa", "ox"]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    k = rng.integers(1, 4, n)
    return ["".join(rng.choice(_SYLLABLES, int(j))) for j in k]


def _corpus(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` sentences of 3-24 pseudo-words (some empty strings), punctuation between."""
    out = []
    for _ in range(n):
        if rng.random() < 0.02:
            out.append("")
            continue
        words = _words(rng, int(rng.integers(3, 25)))
        out.append(" ".join(w + ("," if rng.random() < 0.1 else "") for w in words))
    return out


def _labels(texts: list[str]) -> np.ndarray:
    return np.array([(t.count("ka") + 2 * t.count("ré")) % 3 for t in texts])


def _c_locale(model: Any) -> Any:
    from onnx import helper

    for node in model.graph.node:
        if node.op_type == "StringNormalizer":
            kept = [a for a in node.attribute if a.name != "locale"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("locale", "C.UTF-8")])
    return model


def _export(est: Any, inputs: list[tuple[str, Any]]) -> Any:
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(est, initial_types=inputs, target_opset={"": 17, "ai.onnx.ml": 3},
                        options={id(est.steps[-1][1]): {"zipmap": False}})  # fmt: skip
    return _c_locale(model)


def _text_feeds(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {"text": np.array(_corpus(rng, batch)).reshape(batch, 1)}


def _vectorizer(kind: str) -> Callable[[], Any]:
    def build() -> Any:
        from skl2onnx.common.data_types import StringTensorType
        from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        texts = _corpus(np.random.default_rng(7), 2000)
        vec = {"tfidf": TfidfVectorizer(), "count": CountVectorizer(),
               "bigrams": CountVectorizer(ngram_range=(1, 2))}[kind]  # fmt: skip
        est = make_pipeline(vec, LogisticRegression(max_iter=300)).fit(texts, _labels(texts))
        return _export(est, [("text", StringTensorType([None, 1]))])

    build.feeds = _text_feeds  # type: ignore[attr-defined]
    return build


_COLORS = np.array(["red", "green", "blue", "", "grün", "violet"])  # "violet": unseen at fit
_SIZES = np.array(["S", "M", "L", "XL"])


def _column_frame(rng: np.random.Generator, n: int, fit: bool) -> dict[str, np.ndarray]:
    colors = _COLORS[: 5 if fit else 6]
    n1 = rng.standard_normal(n).astype(np.float32)
    n1[rng.random(n) < 0.1] = np.nan
    return {
        "color": rng.choice(colors, n).reshape(n, 1),
        "size": rng.choice(_SIZES, n).reshape(n, 1),
        "n1": n1.reshape(n, 1),
        "n2": rng.standard_normal((n, 1)).astype(np.float32),
    }


def _column_transformer() -> Any:
    import pandas as pd
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    cols = _column_frame(np.random.default_rng(8), 2000, fit=True)
    frame = pd.DataFrame({k: v[:, 0] for k, v in cols.items()})
    y = (frame["color"].str.len() + (frame["n2"] > 0)) % 3
    pre = ColumnTransformer([
        ("strings", OneHotEncoder(handle_unknown="ignore"), ["color", "size"]),
        ("numbers", make_pipeline(SimpleImputer(), StandardScaler()), ["n1", "n2"]),
    ])  # fmt: skip
    est = make_pipeline(pre, LogisticRegression(max_iter=300)).fit(frame, y)
    types = [("color", StringTensorType([None, 1])), ("size", StringTensorType([None, 1])),
             ("n1", FloatTensorType([None, 1])), ("n2", FloatTensorType([None, 1]))]  # fmt: skip
    return _export(est, types)


_column_transformer.feeds = lambda rng, batch: _column_frame(rng, batch, fit=False)  # type: ignore[attr-defined]


def _column_ordinal_forest() -> Any:
    """String columns through an OrdinalEncoder (unknown values -1) before a random forest:
    skl2onnx writes a LabelEncoder per column (string keys to codes)."""
    import pandas as pd
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OrdinalEncoder

    cols = _column_frame(np.random.default_rng(9), 2000, fit=True)
    frame = pd.DataFrame({k: v[:, 0] for k, v in cols.items()})
    y = (frame["color"].str.len() + (frame["n2"] > 0)) % 3
    codes = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)
    pre = ColumnTransformer([("strings", codes, ["color", "size"]),
                             ("numbers", "passthrough", ["n1", "n2"])])  # fmt: skip
    forest = RandomForestClassifier(50, max_depth=8, random_state=0)
    est = make_pipeline(pre, forest).fit(frame, y)
    types = [("color", StringTensorType([None, 1])), ("size", StringTensorType([None, 1])),
             ("n1", FloatTensorType([None, 1])), ("n2", FloatTensorType([None, 1]))]  # fmt: skip
    return _export(est, types)


_column_ordinal_forest.feeds = _column_transformer.feeds  # type: ignore[attr-defined]


def models() -> dict[str, Callable[[], Any]]:
    """name -> builder (each with its ``feeds``)."""
    return {
        "sklearn_tfidf_logreg": _vectorizer("tfidf"),
        "sklearn_count_logreg": _vectorizer("count"),
        "sklearn_count_bigrams_logreg": _vectorizer("bigrams"),
        "sklearn_column_strings_logreg": _column_transformer,
        "sklearn_column_ordinal_forest": _column_ordinal_forest,
    }
