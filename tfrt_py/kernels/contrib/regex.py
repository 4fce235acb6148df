"""Regular expressions that come from a model file, compiled with bounds (Tokenizer).

A model's pattern is untrusted text. onnxruntime runs such patterns with RE2 (linear time);
tfrt_py has Python's backtracking ``re``, where a pattern like ``(a+)+b`` takes time
exponential in the input's length, inside one kernel call that no deadline interrupts. So
``compile_model_regex`` refuses, before compiling:

* patterns longer than ``MAX_PATTERN_CHARS`` (the parser and compiler recurse; a long
  pattern is also a long compile);
* constructs RE2 does not have, which onnxruntime refuses too: backreferences,
  conditionals, lookahead/lookbehind, atomic groups and possessive quantifiers (Python
  syntax RE2 rejects, such as ``(?u)``, fails to compile here as well);
* the constructs behind catastrophic backtracking that a walk of the parse tree finds
  cheaply: a repetition nested inside another repetition (``(a+)+``, ``(\\w+\\s?)*``)
  unless both are bounded with a product of bounds at most ``MAX_NESTED_REPEAT``
  (``(\\d{1,3}\\.){3}`` passes), and an alternation inside an unbounded or large
  repetition unless its branches begin with distinct literal characters (``(a|aa)*``,
  ``(x|\\w+)*`` are refused; ``(?:foo|bar)+`` passes; single-character alternatives
  ``(?:\\s|,)+`` are a character class and pass).

Matching uses ``re.ASCII`` (RE2's ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII; ``.``
still matches any character). Not detected: polynomial backtracking (``\\s*\\s*\\s*x`` is
cubic in the input), and RE2's leftmost-*longest* choice among alternatives (onnxruntime
sets ``longest_match``), where Python takes the leftmost-first alternative: ``a|ab``
matches ``a`` here and ``ab`` there (docs/security.md).
"""

from __future__ import annotations

import math
import re

# The parser and its tree's opcodes (Python 3.11+; typeshed does not declare these private
# modules, hence the ignores).
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser as _sre_parse  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "MAX_NESTED_REPEAT",
    "MAX_PATTERN_CHARS",
    "RegexRefused",
    "ascii_run_class",
    "compile_model_regex",
    "min_match_width",
]

#: Longest pattern accepted, in characters.
MAX_PATTERN_CHARS = 4096
#: Largest product of the upper bounds of nested repetitions.
MAX_NESTED_REPEAT = 256

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
_POSSESSIVE = getattr(_c, "POSSESSIVE_REPEAT", None)
_ATOMIC = getattr(_c, "ATOMIC_GROUP", None)
_NOT_RE2 = {
    _c.GROUPREF: "backreferences",
    _c.GROUPREF_EXISTS: "conditional groups",
    _c.ASSERT: "lookahead/lookbehind",
    _c.ASSERT_NOT: "lookahead/lookbehind",
}
if _POSSESSIVE is not None:
    _NOT_RE2[_POSSESSIVE] = "possessive quantifiers"
if _ATOMIC is not None:
    _NOT_RE2[_ATOMIC] = "atomic groups"


class RegexRefused(ValueError):
    """A model's pattern that ``compile_model_regex`` will not run; the message says why."""


def _bound(hi: Any) -> float:
    return math.inf if hi is _c.MAXREPEAT else float(hi)


def _first_literal(items: list[Any]) -> int | None:
    """The character a branch must begin with, when it begins with a plain literal."""
    while items:
        op, av = items[0]
        if op is _c.LITERAL:
            return int(av)
        if op is _c.SUBPATTERN:
            items = list(av[-1])
            continue
        return None
    return None


def _check_tree(tree: Any) -> None:
    """Walk the parse tree (iteratively) and raise RegexRefused at the first construct
    outside RE2's syntax or known to backtrack catastrophically."""
    # (items, product of the upper bounds of the repetitions enclosing them)
    stack: list[tuple[list[Any], float]] = [(list(tree), 1.0)]
    while stack:
        items, outer = stack.pop()
        for op, av in items:
            if op in _NOT_RE2:
                raise RegexRefused(f"{_NOT_RE2[op]} are not supported (not RE2 syntax)")
            if op in _REPEATS:
                hi = _bound(av[1])
                if hi > 1 and outer > 1:
                    product = outer * hi
                    if product > MAX_NESTED_REPEAT:
                        raise RegexRefused(
                            "nested repetition (like (a+)+) can backtrack exponentially"
                        )
                stack.append((list(av[2]), outer * hi if hi > 1 else outer))
            elif op is _c.SUBPATTERN:
                stack.append((list(av[-1]), outer))
            elif op is _c.BRANCH:
                branches = [list(b) for b in av[1]]
                if outer > MAX_NESTED_REPEAT:  # unbounded or large repetition around it
                    firsts = [_first_literal(b) for b in branches]
                    if None in firsts or len(set(firsts)) != len(firsts):
                        raise RegexRefused(
                            "an alternation whose branches may begin alike, inside a "
                            "repetition, can backtrack exponentially"
                        )
                stack.extend((b, outer) for b in branches)


def compile_model_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled with ``re.ASCII`` after the checks above; ``RegexRefused``
    (a ValueError) says what was refused. Load time only: the caller compiles once."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RegexRefused(f"pattern of {len(pattern)} characters (limit {MAX_PATTERN_CHARS})")
    try:
        tree = _sre_parse.parse(pattern, re.ASCII)
        _check_tree(tree)
        return re.compile(pattern, re.ASCII)
    except RegexRefused:
        raise
    except (re.error, ValueError, RecursionError, OverflowError) as e:
        raise RegexRefused(f"invalid pattern: {e}") from e


def min_match_width(pattern: re.Pattern[str]) -> int:
    """The fewest characters any match of ``pattern`` spans (0 when it can match the empty
    string, or when the parser cannot say)."""
    try:
        return int(_sre_parse.parse(pattern.pattern, pattern.flags).getwidth()[0])
    except Exception:  # noqa: BLE001 - unknown: assume empty matches are possible
        return 0


def ascii_run_class(pattern: re.Pattern[str]) -> frozenset[int] | None:
    """The ASCII codes of ``C`` where ``pattern`` is ``C+`` for one character class ``C``
    (a class, category or literal; one or more, unbounded; no anchors, no IGNORECASE)
    whose members are all ASCII: then its matches are exactly the maximal runs of those
    characters (the fused text front finds them with ``bytes.translate``). Else None."""
    if pattern.flags & re.IGNORECASE or not pattern.flags & re.ASCII:
        return None
    try:
        tree = list(_sre_parse.parse(pattern.pattern, pattern.flags))
    except Exception:  # noqa: BLE001 - unknown: say no
        return None
    if len(tree) != 1 or tree[0][0] is not _c.MAX_REPEAT:
        return None
    lo, hi, sub = tree[0][1]
    sub = list(sub)
    if lo != 1 or hi != _c.MAXREPEAT or len(sub) != 1:
        return None
    op, av = sub[0]
    items = [(op, av)] if op is _c.LITERAL else list(av) if op is _c.IN else None
    ascii_cats = {_c.CATEGORY_WORD, _c.CATEGORY_DIGIT, _c.CATEGORY_SPACE}
    for kind, val in items or [(None, None)]:
        ok = ((kind is _c.LITERAL and val < 128) or (kind is _c.RANGE and val[1] < 128)
              or (kind is _c.CATEGORY and val in ascii_cats))  # fmt: skip
        if not ok:
            return None
    return frozenset(c for c in range(128) if pattern.fullmatch(chr(c)))
