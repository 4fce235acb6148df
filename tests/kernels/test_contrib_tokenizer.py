"""com.microsoft Tokenizer against onnxruntime's CPU provider (separators, tokenexp,
character mode, mark, mincharnum, padding, empty inputs, [N, C] inputs), and skl2onnx's
text vectorizers end to end: they fail to load without Tokenizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import tfrt_py
from tests.support.contrib import check_node, node_model
from tfrt_py.errors import UnsupportedOpError


def _s(*items: str) -> np.ndarray:
    a = np.empty(len(items), dtype=object)
    a[:] = items
    return a


def _check(x: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    return check_node("Tokenizer", [x], {"mark": 0, "pad_value": "#", "mincharnum": 1, **attrs})


_TEXT = _s("Hello World", "I love computer science !", "", "  a  b ")


@pytest.mark.parametrize("mark", [0, 1])
@pytest.mark.parametrize("mincharnum", [1, 2])
def test_separators(mark: int, mincharnum: int) -> None:
    _check(_TEXT, separators=[" "], mark=mark, mincharnum=mincharnum)


def test_onnxruntime_layout_of_marks_and_padding() -> None:
    (y,) = _check(_s("Hello World", "a b c"), separators=[" "], mark=1, pad_value="<p>")
    assert y.tolist() == [
        ["\x02", "Hello", "World", "\x03", "<p>"],
        ["\x02", "a", "b", "c", "\x03"],
    ]


def test_several_separators_are_regular_expressions() -> None:
    _check(_s("a,b c;;d", "x;y,,z", "ab12cd345ef", "999"), separators=[",", "\\s+", ";", "[0-9]+"])


def test_separator_matching_empty_drops_characters() -> None:
    _check(_s("abc", "xx"), separators=["x*"])
    _check(_s("ab", "a"), separators=["b*$"])


@pytest.mark.parametrize("attrs", [{"separators": [""]}, {"tokenexp": "."}])
@pytest.mark.parametrize("mark", [0, 1])
def test_character_mode(attrs: dict[str, Any], mark: int) -> None:
    _check(_s("héllo", "", "ab"), mark=mark, **attrs)


@pytest.mark.parametrize(
    ("pattern", "mincharnum"),
    [
        ("[a-zA-Z]+", 1),
        ("[a-zA-Z]+", 2),
        ("[a-zA-Z0-9_]+", 1),  # skl2onnx's default
        ("\\b\\w+\\b", 1),
        ("\\w+", 3),  # ASCII \w, as RE2
        ("^ab", 1),
        ("\\bcat\\b", 1),
        ("foo|bar", 1),
    ],
)
def test_tokenexp(pattern: str, mincharnum: int) -> None:
    x = _s("Hello, World! 42 times", "a bc def", "", "héllo wörld_1 naïve", "ab ab cat concat")
    _check(np.append(x, _s("foobar foo cats")), tokenexp=pattern, mincharnum=mincharnum)


def test_tokenexp_alternatives_are_leftmost_first() -> None:
    """Python's choice among alternatives, not RE2's longest (documented difference)."""
    m = tfrt_py.load(
        node_model(
            "Tokenizer",
            [_s("ab")],
            {"mark": 0, "pad_value": "#", "mincharnum": 1, "tokenexp": "a|ab"},
        )
    )
    assert m.run({"i0": _s("abab")})["y0"].tolist() == [["a", "a"]]


def test_two_dimensional_input() -> None:
    x = np.array([["a b", "c"], ["", "d e f"]], dtype=object)
    _check(x, separators=[" "], mark=1)


@pytest.mark.parametrize("mark", [0, 1])
def test_no_tokens_anywhere(mark: int) -> None:
    (y,) = _check(_s("   ", " "), separators=[" "], mark=mark)
    assert y.shape == (2, 0)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
def test_empty_input(shape: tuple[int, ...]) -> None:
    _check(np.empty(shape, dtype=object), separators=[" "])


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"mincharnum": 0, "separators": [" "]}, "mincharnum"),
        ({"separators": None}, "separators must not be empty"),
        ({}, "separators and tokenexp"),
        ({"tokenexp": ""}, "separators and tokenexp"),
        ({"tokenexp": ".", "mincharnum": 2}, "character"),
        ({"tokenexp": "[a-"}, "invalid pattern"),
        ({"separators": [" ", "(?u)x"]}, "invalid pattern"),
    ],
)
def test_refused_at_load(attrs: dict[str, Any], match: str) -> None:
    base = {"mark": 0, "pad_value": "#", "mincharnum": 1}
    given = {k: v for k, v in {**base, **attrs}.items() if v is not None}
    model = node_model("Tokenizer", [_s("a")], given)
    if attrs.get("separators", ()) is None:  # an empty list: helper cannot infer its type
        empty = helper.make_attribute("separators", [], attr_type=onnx.AttributeProto.STRINGS)
        model.graph.node[0].attribute.append(empty)
    with pytest.raises(UnsupportedOpError, match=match):
        tfrt_py.load(model)


# -- skl2onnx -------------------------------------------------------------------------------

_CORPUS = np.array(
    [
        "This is the first document.",
        "This document is the second document.",
        "And this is the third one.",
        "Is this the first document?",
        "héllo wörld, naïve café",
        "",
    ],
    dtype=object,
).reshape(-1, 1)


def _vectorizers() -> list[Any]:
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    # onnxruntime's StringNormalizer needs a locale the machine has ("en_US" by default).
    locale = {"locale": "C.UTF-8"}
    return [
        pytest.param(TfidfVectorizer(), {TfidfVectorizer: locale}, id="tfidf"),
        pytest.param(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
            {TfidfVectorizer: locale},
            id="tfidf-bigrams",
        ),
        pytest.param(CountVectorizer(), {CountVectorizer: locale}, id="count"),
        pytest.param(
            TfidfVectorizer(),
            {TfidfVectorizer: {**locale, "separators": [" ", "[.]", "\\?", ",", "!"]}},
            id="tfidf-separators",
        ),
    ]


@pytest.mark.parametrize(("vectorizer", "options"), _vectorizers())
def test_skl2onnx_text_vectorizers_match_onnxruntime(vectorizer: Any, options: Any) -> None:
    import onnxruntime as ort
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import StringTensorType

    vectorizer.fit(_CORPUS.ravel())
    onx = convert_sklearn(
        vectorizer,
        initial_types=[("input", StringTensorType([None, 1]))],
        options=options,
        target_opset=17,
    )
    assert any(n.op_type == "Tokenizer" for n in onx.graph.node)
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    for rows in (_CORPUS, _CORPUS[:2]):
        (want,) = sess.run(None, {"input": rows})
        for ex in ("sync", "async"):
            (got,) = tfrt_py.load(onx, executor=ex).run({"input": rows}).values()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "pattern", ["[a-z]+", "\\b\\w+\\b", "a|ab", "(ab)+", "\\w\\w", "[ab]b*", "(?:a|b)c?"]
)
def test_tokenexp_scan_equals_finditer_when_no_match_is_too_short(pattern: str) -> None:
    """The kernel takes ``finditer``'s matches when every match of the pattern spans at
    least ``mincharnum`` characters (skl2onnx's ``[a-zA-Z0-9_]+``): the same tokens as the
    scan the module docstring defines, on random strings."""
    import re

    from tfrt_py.kernels.contrib.regex import compile_model_regex, min_match_width
    from tfrt_py.kernels.contrib.tokenizer import _match_tokens

    rx = compile_model_regex(pattern)
    assert min_match_width(rx) >= 1
    rng = np.random.default_rng(0)
    for _ in range(300):
        s = "".join(rng.choice(list("abc _-é"), int(rng.integers(0, 12))))
        assert [m.group() for m in rx.finditer(s)] == _match_tokens(s, rx, 1), s
    assert min_match_width(re.compile("a*")) == 0 and min_match_width(re.compile("\\b")) == 0


def _megabyte_rows() -> np.ndarray:
    """1 MB strings: the corpus's words, one word with no separator in it, non-ASCII
    text, separators only; and an empty string."""
    words = " ".join(str(r[0]) for r in _CORPUS).split()
    rng = np.random.default_rng(0)
    mb = 1 << 20
    text = " ".join(rng.choice(words, mb // 3))[:mb]
    return np.array(
        [[text], ["ka" * (mb // 2)], [("grün ßü ünïcödé, " * (mb // 17))[:mb]], [" ,." * (mb // 3)],
         [""]], dtype=object,
    )  # fmt: skip


@pytest.mark.parametrize(("vectorizer", "options"), _vectorizers())
def test_megabyte_strings_match_onnxruntime(vectorizer: Any, options: Any) -> None:
    """A 1 MB string is tokenized and counted as onnxruntime does (work linear in its
    length: one regular-expression scan and a dict lookup per token), and the model stays
    usable after it."""
    import onnxruntime as ort
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import StringTensorType

    vectorizer.fit(_CORPUS.ravel())
    onx = convert_sklearn(vectorizer, initial_types=[("input", StringTensorType([None, 1]))],
                          options=options, target_opset=17)  # fmt: skip
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    model = tfrt_py.load(onx, executor="sync")
    rows = _megabyte_rows()
    (want,) = sess.run(None, {"input": rows})
    (got,) = model.run({"input": rows}).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (small,) = model.run({"input": _CORPUS[:2]}).values()
    np.testing.assert_allclose(small, sess.run(None, {"input": _CORPUS[:2]})[0], rtol=1e-5)
