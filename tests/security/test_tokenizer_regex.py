"""Regular expressions inside a model (the com.microsoft Tokenizer's separators and tokenexp)
must not let a model hang a call: Python's backtracking ``re`` takes exponential time on
patterns such as ``(a+)+b`` (onnxruntime's RE2 does not), and a kernel call is never
interrupted by a deadline. ``kernels/contrib/regex.py`` refuses, at load, patterns that
are too long, constructs outside RE2's syntax, and the nested-repetition and ambiguous-
alternation shapes behind catastrophic backtracking.

Without the guard, the first case loads, and its call on 40 characters runs for hours.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tfrt_py.errors import UnsupportedOpError
from tfrt_py.kernels.contrib.regex import (
    MAX_PATTERN_CHARS,
    RegexRefused,
    compile_model_regex,
)

REFUSED = [
    ("(a+)+b", "nested repetition"),
    ("(?:\\w+\\s?)*$", "nested repetition"),
    ("(x*)*y", "nested repetition"),
    ("((ab){2,}){2,}", "nested repetition"),
    ("(a|aa)*b", "alternation"),
    ("(?:a|ab)+c", "alternation"),
    ("(x|\\w+)*y", "alternation"),
    ("(?:\\d|[0-9]x)*z", "alternation"),
    ("(a)\\1", "backreferences"),
    ("a(?=b)", "lookahead"),
    ("(?<!a)b", "lookahead"),
    ("(a)?(?(1)b|c)", "conditional"),
    ("(?>a+)b", "atomic"),
    ("a++b", "possessive"),
    ("(?u)\\w+", "invalid pattern"),
    ("a" * (MAX_PATTERN_CHARS + 1), "characters"),
    ("(" * 3000 + ")" * 3000, "characters"),
    ("(" * 1500 + ")" * 1500, "invalid pattern"),  # deeper than the parser's recursion
]

ACCEPTED = [
    "[a-zA-Z0-9_]+",
    "\\b\\w\\w+\\b",
    "(\\d{1,3}\\.){3}\\d{1,3}",
    "(?:foo|bar)+",
    "(?:\\s|,)+",
    "[.]|\\?|!",
    "x{1000}",
]


@pytest.mark.parametrize(("pattern", "match"), REFUSED, ids=[r[1] for r in REFUSED])
def test_refused_patterns(pattern: str, match: str) -> None:
    with pytest.raises(RegexRefused, match=match):
        compile_model_regex(pattern)


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_accepted_patterns(pattern: str) -> None:
    assert compile_model_regex(pattern).pattern == pattern


def _tokenizer_model(**attrs: Any) -> bytes:
    node = helper.make_node(
        "Tokenizer",
        ["x"],
        ["y"],
        domain="com.microsoft",
        mark=0,
        pad_value="#",
        mincharnum=1,
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "tok",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)],
    )
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=9).SerializeToString()


@pytest.mark.parametrize("attr", ["tokenexp", "separators"])
def test_a_catastrophic_pattern_fails_the_load_naming_the_node(attr: str) -> None:
    pattern = "(a+)+b"
    value = pattern if attr == "tokenexp" else [" ", pattern]
    with pytest.raises(UnsupportedOpError, match=r"Tokenizer.*nested repetition"):
        tfrt_py.load(_tokenizer_model(**{attr: value}))


def test_accepted_patterns_stay_fast_on_adversarial_text() -> None:
    text = np.array(["a" * 5000 + "!", "1." * 3000, " ," * 3000], dtype=object)
    for pattern in ACCEPTED:
        m = tfrt_py.load(_tokenizer_model(tokenexp=pattern))
        t0 = time.perf_counter()
        m.run({"x": text})
        assert time.perf_counter() - t0 < 5.0, pattern
