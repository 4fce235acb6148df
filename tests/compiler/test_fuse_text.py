"""``fuse_text``: a text vectorizer's front (``[StringNormalizer] -> Tokenizer -> [Flatten]
-> TfIdfVectorizer`` on a string pool) becomes one ``tfrt_py.fused::TextVectorize``, with
the ``[Mul] -> [Normalizer] -> LinearClassifier | LinearRegressor`` after it where there is
one. Checked against the unfused nodes (the front's counts exactly; the linear model's
scores within float32 rounding, its labels exactly) and against onnxruntime, on the
strings a text endpoint meets: empty, non-ASCII, unseen words, case folds that change the
length, a NUL, lone surrogates, bytes, None; both fast paths (one row, many rows) and the
fallback (another rank, an empty batch). The bytes scan of ``[a-zA-Z0-9_]+`` tokens gives
``re.findall``'s tokens on random Unicode text."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import spy_compiled
from tfrt_py.compiler.pipeline import PASSES
from tfrt_py.kernels.contrib.regex import ascii_run_class, compile_model_regex
from tfrt_py.kernels.fused import text_grams_jit, text_jit
from tfrt_py.kernels.fused.text import _Front
from tfrt_py.kernels.misc.strings import TfIdfTable

MS, ML = "com.microsoft", "ai.onnx.ml"
POOL = ["ka", "lo", "mi", "ré", "ze", "ßu", "ss", "i̇", "k", "to", "vi", "ka", "lo"]
PATTERN = "[a-zA-Z0-9_]+"
TEXTS = [
    "Ka lo MI ré, ze ka ka", "", "unseen words only", "ẞu SS ss İ K kelvin K", "ka\x00lo",
    "lo \ud800 ka", "  \t\n ka\u3000lo  ", "x" * 300 + " ka", "ka-lo_mi 42 ka", "ŁÓDŹ ka",
]  # fmt: skip


def _model(mode: str = "TF", grams: int = 1, skip: int = 0, mul: bool = False,
           norm: str | None = None, head: str | None = "classifier", normalizer: bool = True,
           pattern: str = PATTERN, mark: int = 0, pad: str = "#",
           post: bool = False) -> onnx.ModelProto:  # fmt: skip
    """text [N, 1] -> Reshape [-1] -> [StringNormalizer LOWER] -> Tokenizer -> Flatten ->
    TfIdfVectorizer -> [Mul] -> [Normalizer] -> [LinearClassifier | LinearRegressor];
    ``post``: an L1 Normalizer of the classifier's scores (skl2onnx's after a softmax)."""
    uni = sorted(set(POOL))
    pool = uni + (["ka", "lo", "mi", "ka", "ze", "ka"] if grams == 2 else [])
    counts = [0, len(uni)] if grams == 2 else [0]
    width = len(uni) + (3 if grams == 2 else 0)
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["text", "shape"], ["flat"])]
    x = "flat"
    if normalizer:
        nodes.append(helper.make_node("StringNormalizer", [x], ["norm_text"],
                                      case_change_action="LOWER", locale="C.UTF-8"))  # fmt: skip
        x = "norm_text"
    nodes += [
        helper.make_node(
            "Tokenizer",
            [x],
            ["tokens"],
            domain=MS,
            mark=mark,
            mincharnum=1,
            pad_value=pad,
            tokenexp=pattern,
        ),
        helper.make_node("Flatten", ["tokens"], ["flat_tokens"], axis=1),
        helper.make_node(
            "TfIdfVectorizer",
            ["flat_tokens"],
            ["vec"],
            mode=mode,
            min_gram_length=1,
            max_gram_length=grams,
            max_skip_count=skip,
            ngram_counts=counts,
            ngram_indexes=list(range(width)),
            pool_strings=pool,
            weights=rng.uniform(0.5, 2.0, width).astype(np.float32).tolist(),
        ),
    ]
    y = "vec"
    if mul:
        inits.append(numpy_helper.from_array(rng.uniform(0.1, 3, width).astype(np.float32), "s"))
        nodes.append(helper.make_node("Mul", [y, "s"], ["scaled"]))
        y = "scaled"
    if norm:
        nodes.append(helper.make_node("Normalizer", [y], ["normed"], domain=ML, norm=norm))
        y = "normed"
    coefs = rng.standard_normal(3 * width).astype(np.float32).tolist()
    if head == "classifier":
        nodes.append(helper.make_node(
            "LinearClassifier", [y], ["label", "scores"], domain=ML, coefficients=coefs,
            intercepts=[0.1, -0.2, 0.05], classlabels_ints=[0, 1, 2], post_transform="SOFTMAX",
        ))  # fmt: skip
        scores = "scores"
        if post:
            nodes.append(helper.make_node("Normalizer", [scores], ["probs"], domain=ML,
                                          norm="L1"))  # fmt: skip
            scores = "probs"
        outs = [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                helper.make_tensor_value_info(scores, TensorProto.FLOAT, [None, 3])]  # fmt: skip
    elif head == "regressor":
        nodes.append(helper.make_node("LinearRegressor", [y], ["pred"], domain=ML,
                                      coefficients=coefs, intercepts=[0.5, 0.0, -1.0],
                                      targets=3))  # fmt: skip
        outs = [helper.make_tensor_value_info("pred", TensorProto.FLOAT, [None, 3])]
    else:
        outs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [None, width])]
    graph = helper.make_graph(
        nodes, "text", [helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])],
        outs, initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                              helper.make_opsetid(MS, 1), helper.make_opsetid(ML, 3)])  # fmt: skip
    model.ir_version = 9
    return model


def _feeds(texts: list[Any]) -> dict[str, np.ndarray]:
    a = np.empty((len(texts), 1), dtype=object)
    a[:, 0] = texts
    return {"text": a}


def _check(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        if want[k].dtype.kind in "iu":
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-6, atol=2e-7, err_msg=k)


def _batches() -> list[list[Any]]:
    rng = np.random.default_rng(0)
    many = [TEXTS[int(i)] for i in rng.integers(0, len(TEXTS), 300)]
    return [[t] for t in TEXTS] + [TEXTS, many, TEXTS[:4] * 2]


CASES: list[dict[str, Any]] = [
    {"mode": "TF", "post": True},
    {"mode": "TF", "normalizer": False},
    {"mode": "TFIDF", "mul": True, "norm": "L2", "post": True},
    {"mode": "TFIDF", "norm": "L1", "head": "regressor"},
    {"mode": "IDF", "norm": "L2"},
    {"mode": "TF", "mul": True, "norm": "MAX"},  # MAX stays dense
    {"mode": "TF", "grams": 2, "skip": 1, "norm": "L2"},
    {"mode": "TFIDF", "head": None},
    {"mode": "TF", "grams": 2, "head": None},
    {"mode": "TF", "pattern": "\\w+", "mark": 1},
    {"mode": "TF", "pattern": "[a-zé]+"},  # not an ASCII class: the regex per element
    {"mode": "TF", "pad": "ka"},  # the pad is in the pool: the stages one by one
]


@pytest.mark.parametrize("case", CASES, ids=[str(sorted(c.items())) for c in CASES])
def test_the_fused_vectorizer_gives_the_unfused_nodes_outputs(
    case: dict[str, Any], jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the compiled one-row pass (``text_jit``) and the Python one; each checked to have
    served where it applies (one row under a linear model)."""
    passes = spy_compiled(monkeypatch, text_jit, "row_pass")
    model = _model(**case)
    fused = tfrt_py.load(model, executor="sync")
    unfused = tfrt_py.load(model, executor="sync", optimize=set(PASSES) - {"fuse_text"})
    report = fused.describe()
    assert "fuse_text: 1 text vectorizers" in report, report
    ops = report.split("ops as loaded")[0].split("ops:")[1]
    assert "TfIdfVectorizer" not in ops
    assert ("Normalizer" in ops) == (case.get("norm") == "MAX"), ops  # the rest fuse
    linear = case.get("head", "classifier") is not None and case.get("norm") != "MAX"
    assert (", 1 with their linear model" in report) == linear, report
    for texts in _batches():
        feeds = _feeds(texts)
        _check(fused.run(feeds), unfused.run(feeds))
    sparse_head = linear and case.get("pad") != "ka"  # a pad in the pool: the stages alone
    assert bool(passes) == (jit == "jit" and sparse_head), len(passes)


@pytest.mark.parametrize("case", CASES[:5], ids=[str(sorted(c.items())) for c in CASES[:5]])
def test_the_fused_vectorizer_matches_onnxruntime(case: dict[str, Any]) -> None:
    model = _model(**case)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - the host's locale decides
        pytest.skip(f"onnxruntime refuses StringNormalizer's locale here: {e}")
    m = tfrt_py.load(model)
    texts = [t for t in TEXTS if "\ud800" not in t]  # onnxruntime takes UTF-8 only
    for batch in ([texts[0]], texts, texts * 30):
        feeds = _feeds(batch)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = m.run(feeds)
        for k, v in want.items():
            if v.dtype.kind in "iu":
                np.testing.assert_array_equal(got[k], v, err_msg=k)
            else:
                np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_inputs_the_fast_paths_do_not_take_fall_back_to_the_stages() -> None:
    model = _model(mode="TFIDF", mul=True, norm="L2")
    fused = tfrt_py.load(model, executor="sync")
    unfused = tfrt_py.load(model, executor="sync", optimize=set(PASSES) - {"fuse_text"})
    as_bytes = _feeds([t.encode("utf-8", "surrogatepass") for t in TEXTS[:4]])
    for m in (fused, unfused):  # StringNormalizer's case change takes str only
        with pytest.raises(tfrt_py.errors.TfrtError, match="bytes"):
            m.run(as_bytes)
    plain = _model(mode="TFIDF", mul=True, norm="L2", normalizer=False)  # the Tokenizer decodes
    got = tfrt_py.load(plain, executor="sync").run(as_bytes)
    _check(got, tfrt_py.load(plain, optimize=set(PASSES) - {"fuse_text"}).run(as_bytes))
    empty = {"text": np.empty((0, 1), dtype=object)}
    _check(fused.run(empty), unfused.run(empty))
    with pytest.raises(tfrt_py.errors.TfrtError):
        unfused.run(_feeds([None, "ka"]))
    with pytest.raises(tfrt_py.errors.TfrtError):
        fused.run(_feeds([None, "ka"]))
    _check(fused.run(_feeds(["ka lo"])), unfused.run(_feeds(["ka lo"])))  # still usable


def _front(pattern: str, pool: list[str]) -> _Front:
    from tfrt_py.ir import Node, Value
    from tfrt_py.kernels.base import KernelContext

    node = Node("TfIdfVectorizer", [Value("x")], [Value("y")], {
        "mode": "TF", "min_gram_length": 1, "max_gram_length": 1, "max_skip_count": 0,
        "ngram_counts": [0], "ngram_indexes": list(range(len(pool))), "pool_strings": pool,
    })  # fmt: skip
    return _Front(str.lower, compile_model_regex(pattern).findall, TfIdfTable(KernelContext(node)))


def test_the_bytes_scan_finds_the_regex_tokens_in_any_unicode_text() -> None:
    front = _front(PATTERN, ["ka", "lo", "42"])
    assert front.byte_table is not None  # the scan is taken for skl2onnx's pattern
    rng = np.random.default_rng(1)
    alphabet = [chr(c) for c in range(0, 0x3000)] + ["K", "İ", "ẞ", "\ud800", "\udfff"]
    for _ in range(200):
        texts = ["".join(rng.choice(alphabet, int(rng.integers(0, 40))).tolist())
                 for _ in range(int(rng.integers(1, 6)))]  # fmt: skip
        texts = [t.replace("\x00", "") for t in texts]
        rows, get = front.rows(texts)
        want = [re.findall(PATTERN, t.lower(), re.ASCII) for t in texts]
        assert [[b.decode() for b in r] for r in rows] == want
        assert get is front.byte_get


def _gram_front(pool: list[str], counts: list[int], lengths: tuple[int, int], skip: int) -> _Front:
    from tfrt_py.ir import Node, Value
    from tfrt_py.kernels.base import KernelContext

    n_grams = counts[1] + (len(pool) - counts[1]) // 2 if len(counts) > 1 else len(pool)
    node = Node("TfIdfVectorizer", [Value("x")], [Value("y")], {
        "mode": "TF", "min_gram_length": lengths[0], "max_gram_length": lengths[1],
        "max_skip_count": skip, "ngram_counts": counts,
        "ngram_indexes": list(range(n_grams))[::-1], "pool_strings": pool,
    })  # fmt: skip
    return _Front(str.lower, compile_model_regex(PATTERN).findall, TfIdfTable(KernelContext(node)))


GRAM_POOL = ["ka", "lo", "42", "ß", "x_1", "ka", "lo", "lo", "ka", "42", "42", "日本", "ka"]


@pytest.mark.parametrize(("lengths", "skip"), [((1, 1), 0), ((1, 2), 0), ((2, 2), 1), ((1, 2), 2)])
def test_the_compiled_pass_finds_the_columns_the_tables_rows_give(lengths: tuple[int, int],
                                                                   skip: int) -> None:  # fmt: skip
    """``_Front.columns`` (one compiled pass, the batch path under a linear model): each
    found n-gram's column and row, in ``TfIdfTable.row_columns``' order, as the regex's
    tokens give them one row at a time (unigrams, bigrams, skips, a non-ASCII key)."""
    front = _gram_front(GRAM_POOL, [0, 5], lengths, skip)
    if text_grams_jit.columns() is None:
        assert front.columns(["ka"]) is None  # TFRT_PY_JIT=0: the rows serve
        return
    rng = np.random.default_rng(2)
    words = ["ka", "KA", "lo", "42", "x_1", "kalo", "ß", "ẞ", "日本", "", ",", "ka-lo", "\ud800",
             "\t", "lo\n", "é"]  # fmt: skip
    for _ in range(100):
        texts = [" ".join(rng.choice(words, int(rng.integers(0, 12))).tolist())
                 for _ in range(int(rng.integers(1, 20)))]  # fmt: skip
        found = front.columns(texts)
        assert found is not None
        tokens = [re.findall(PATTERN, t.lower(), re.ASCII) for t in texts]
        want = [(c, r) for r, row in enumerate(tokens) for c in front.table.row_columns(row)]
        assert list(zip(found[0].tolist(), found[1].tolist())) == want
    assert front.columns(["ka\x00lo", "ka"]) is None  # a NUL inside: the rows serve


def test_huge_gram_lengths_and_skips_cost_what_the_rows_hold() -> None:
    """A model's max_gram_length and max_skip_count of 2**62 (untrusted attributes) load at
    once and count what the bounded ones do: no gram is longer than the pool's longest,
    none spans more than its row."""
    huge = _gram_front(GRAM_POOL, [0, 5], (1, 1 << 62), 1 << 62)
    bounded = _gram_front(GRAM_POOL, [0, 5], (1, 2), 100)  # no row has 100 tokens
    assert huge.table.lengths == [1, 2]
    texts = ["ka lo ka lo 42 42 x_1 ka", "ka lo " * 40, "", "ka"]
    rows = [re.findall(PATTERN, t, re.ASCII) for t in texts]
    assert [huge.table.row_columns(r) for r in rows] == [bounded.table.row_columns(r) for r in rows]
    found, want = huge.columns(texts), bounded.columns(texts)
    if found is not None and want is not None:  # the compiled pass (numba on)
        assert found[0].tolist() == want[0].tolist() and found[1].tolist() == want[1].tolist()
        assert len(found[0]) > 2 * len("".join(texts))  # more than the first room: called again


@pytest.mark.parametrize(("pattern", "is_class"), [
    ("[a-zA-Z0-9_]+", True), ("\\w+", True), ("\\d+", True), ("[\\w-]+", True), ("a+", True),
    ("[^a]+", False), ("\\S+", False), (".+", False), ("[a-z]{2,}", False), ("[a-z]", False),
    ("\\b\\w\\w+\\b", False), ("(?:ab)+", False), ("[é]+", False), ("(?i)[a-z]+", False),
])  # fmt: skip
def test_ascii_run_class_accepts_only_one_ascii_class_repeated(pattern: str,
                                                              is_class: bool) -> None:  # fmt: skip
    got = ascii_run_class(compile_model_regex(pattern))
    assert (got is not None) == is_class
    if got is not None:
        assert got == {c for c in range(128) if re.fullmatch(pattern, chr(c), re.ASCII)}


def test_a_normalizer_with_stop_words_is_not_fused() -> None:
    model = _model()
    for node in model.graph.node:
        if node.op_type == "StringNormalizer":
            node.attribute.extend([helper.make_attribute("stopwords", ["ka"])])
    m = tfrt_py.load(model)
    assert "StringNormalizer x1" in m.describe().split("ops as loaded")[0]
