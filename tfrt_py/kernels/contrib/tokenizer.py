"""Kernels (contrib): Tokenizer-1 of the com.microsoft domain (skl2onnx's text vectorizers
emit it in front of TfIdfVectorizer).

``X`` (strings, ``[C]`` or ``[N, C]``) -> ``Y`` (strings, ``X.shape + [D]``), D the most
tokens any element gave (plus 2 with ``mark``). Each row is ``[0x02 marker]`` +
tokens + ``[0x03 marker]`` + ``pad_value`` up to D, as onnxruntime writes it (padding after
the end marker). No tokens anywhere gives ``X.shape + [0]``; an empty X gives ``[0]`` for
``[0]`` and ``[N, 0]`` for ``[N, 0]``.

Modes, as onnxruntime's CPU kernel:

* character mode (``separators=[""]`` or ``tokenexp="."``): every character is a token
  (``mincharnum`` must be 1);
* ``separators`` (regular expressions, tried in order): each separator splits every piece
  the previous ones left; a piece shorter than ``mincharnum`` characters is dropped; an
  empty separator match drops the character after it; once no pieces are left the
  element has no tokens;
* ``tokenexp``: the non-overlapping matches of the expression scanned from the left;
  a match shorter than ``mincharnum`` is skipped and the scan restarts one character
  after its start; an element shorter than ``mincharnum`` has no tokens.

Patterns are compiled at load by ``regex.compile_model_regex`` (bounded, RE2 subset,
catastrophic constructs refused); a refused pattern is a load error naming the node.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..base import ComputeFn, KernelContext
from ..registry import KernelRegistry
from .activation import MS_DOMAIN
from .regex import RegexRefused, compile_model_regex, min_match_width

__all__ = ["Splitter", "register_kernels", "splitter"]

_START = "\x02"
_END = "\x03"


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)


def _split_separators(s: str, seps: list[re.Pattern[str]], min_chars: int) -> list[str]:
    """The tokens of ``s`` in separator mode (see the module docstring)."""
    row = [s]
    for sep in seps:
        tokens: list[str] = []
        for text in row:
            start, end = 0, len(text)
            while start <= end:
                m = sep.search(text, start)
                if m is None:
                    if end - start >= min_chars:
                        tokens.append(text[start:end])
                    break
                at = m.start()
                if at - start >= min_chars:
                    tokens.append(text[start:at])
                start = m.end() if m.end() > at else at + 1
        if not tokens:
            return []
        row = tokens
    return row


def _match_tokens(s: str, rx: re.Pattern[str], min_chars: int) -> list[str]:
    """The tokens of ``s`` in tokenexp mode (see the module docstring)."""
    row: list[str] = []
    if len(s) < min_chars:
        return row
    start, end = 0, len(s)
    while start <= end:
        m = rx.search(s, start)
        if m is None:
            break
        if m.end() - m.start() >= min_chars:
            row.append(m.group())
            start = m.end()
        else:
            start = m.start() + 1
    return row


def _all_matches(rx: re.Pattern[str]) -> Callable[[str], list[str]]:
    def all_matches(s: str) -> list[str]:
        return [m.group() for m in rx.finditer(s)]

    return all_matches


class Splitter(NamedTuple):
    """A Tokenizer node's attributes read at load: ``split(str) -> tokens`` (one element's
    tokens, no markers, no padding), whether rows are marked, the pad value. Any thread."""

    split: Callable[[str], list[str]]
    mark: bool
    pad: str


def splitter(ctx: KernelContext) -> Splitter:
    """The Tokenizer node of ``ctx`` as a ``Splitter`` (``ctx.unsupported`` on a bad
    attribute or a refused pattern). The kernel and the fused text front
    (``fused.text``) split with it."""
    mark = bool(int(ctx.attr("mark")))
    pad = _text(ctx.attr("pad_value"))
    min_chars = int(ctx.attr("mincharnum"))
    if min_chars <= 0:
        raise ctx.unsupported(f"mincharnum={min_chars} must be positive")
    seps_attr = ctx.attr("separators", None)
    tokenexp = ctx.attr("tokenexp", None)
    seps: list[str] | None = None
    if seps_attr is not None:
        seps = [_text(v) for v in seps_attr]
        if not seps:
            raise ctx.unsupported("separators must not be empty")
        char_mode = seps == [""]
    else:
        if tokenexp is None or not _text(tokenexp):
            raise ctx.unsupported("one of separators and tokenexp (non-empty) is required")
        char_mode = _text(tokenexp) == "."
    if char_mode and min_chars > 1:
        raise ctx.unsupported("mincharnum must be 1 for character tokenization")
    try:
        split: Callable[[str], list[str]]
        if char_mode:
            split = list
        elif seps is not None:
            compiled = [compile_model_regex(p) for p in seps]

            def split_on(s: str) -> list[str]:
                return _split_separators(s, compiled, min_chars)

            split = split_on

        else:
            rx = compile_model_regex(_text(tokenexp))
            if min_chars <= min_match_width(rx):
                # every match is long enough and none is empty: the scan is finditer's
                split = rx.findall if rx.groups == 0 else _all_matches(rx)
            else:

                def match_in(s: str) -> list[str]:
                    return _match_tokens(s, rx, min_chars)

                split = match_in

    except RegexRefused as e:
        raise ctx.unsupported(f"pattern refused: {e}") from e
    return Splitter(split, mark, pad)


def _tokenizer(ctx: KernelContext) -> ComputeFn:
    """Tokenizer-1: ``fn(X) -> Y``, strings to padded token rows."""
    split, mark, pad = splitter(ctx)

    def tokenizer(X: np.ndarray) -> np.ndarray:
        if X.ndim not in (1, 2):
            raise ValueError(f"Tokenizer: input must be [C] or [N, C], not rank {X.ndim}")
        if X.size == 0:
            shape = (X.shape[0], 0) if X.ndim == 2 else (0,)
            return np.empty(shape, dtype=object)
        rows = [split(_text(s)) for s in X.reshape(-1).tolist()]
        width = max(len(r) for r in rows)
        if width == 0:
            return np.empty((*X.shape, 0), dtype=object)
        extra = 2 if mark else 0
        out = np.full((len(rows), width + extra), pad, dtype=object)
        for i, r in enumerate(rows):
            if mark:
                out[i, 0] = _START
                out[i, 1 : len(r) + 1] = r
                out[i, len(r) + 1] = _END
            else:
                out[i, : len(r)] = r
        return out.reshape((*X.shape, width + extra))

    return tokenizer


def register_kernels(registry: KernelRegistry) -> None:
    """Register Tokenizer (com.microsoft)."""
    registry.add("Tokenizer", _tokenizer, domain=MS_DOMAIN, since=1)
