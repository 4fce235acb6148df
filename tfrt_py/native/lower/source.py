"""What may go into generated native source, and ``Declined``.

Model files come from strangers, and the native tier turns a model into Python source that
is compiled and cached on disk. The rule: generated source contains no model text at all.
Its identifiers are ours (``x0``, ``P_f4``, ``n3_a``, ...); its numbers are formatted here,
by ``literal``, from a Python int/float/bool we converted them to; its string literals and
comments come from a short fixed list. Names the model gives nodes, values or the graph
stay in side tables (``Lowered.input_names``, ...). ``audit`` checks the rule on every
generated module before it is compiled (defence in depth: a lowering that pasted model
text anyway is refused, not run).

``Declined`` is raised by every failure inside lowering, so ``executor="auto"`` falls back to
the sync interpreter and ``executor="native"`` raises a ``tfrt_py`` error.

Pure functions; thread-safe.
"""

from __future__ import annotations

import io
import math
import re
import tokenize
from typing import Any

import numpy as np

from ...errors import TfrtError

__all__ = ["ConstantsDiffer", "Declined", "audit", "literal"]


class Declined(TfrtError, ValueError):
    """The graph does not lower; ``reasons`` say why (op names, dynamic dims, ...)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


class ConstantsDiffer(Declined):
    """A box's sample packs other constants than its top (``generic.py``): the shape
    arithmetic folded at one signature is not the start of the top's."""


class ChoicesDiffer(ConstantsDiffer):
    """A box's sample makes more choices between forms of code than its top
    (``NodeContext.choose``): a folded constant of another shape took another form (a
    weight whose width is a panel's multiple at the top only). As for other constants,
    the box is lowered again with that shape arithmetic kept as code."""


def literal(x: Any) -> str:
    """``x`` as a Python expression of the generated module (which imports NumPy as
    ``np``). Only Python or NumPy bools, integers and floats are accepted, and each is
    first converted to an exact ``bool``/``int``/``float``, so the text is always that
    builtin's own repr: digits, a sign, ``.``, ``e``, or ``np.nan``/``np.inf``. Negative
    numbers come parenthesized. Anything else (a str, bytes, an array) is a TypeError."""
    if isinstance(x, (bool, np.bool_)):
        return "True" if bool(x) else "False"
    if isinstance(x, (int, np.integer)):
        v = int(x)
        return int.__repr__(v) if v >= 0 else f"({int.__repr__(v)})"
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if math.isnan(f):
            return "np.nan"
        if math.isinf(f):
            return "np.inf" if f > 0 else "(-np.inf)"
        text = float.__repr__(f)
        return text if math.copysign(1.0, f) > 0 else f"({text})"
    raise TypeError(f"a {type(x).__name__} cannot become a literal of generated code")


#: The only string literals generated modules contain (their own docstring, numba's array
#: layout, error model and fast-math flag, fixed error messages).
_STRINGS = re.compile(
    r"""(?x)
    '''tfrt_py\ native\ code\ \(generated;\ do\ not\ edit\)\.'''
    | "\"\"tfrt_py\ native\ code\ \(generated;\ do\ not\ edit\)\.\"\""
    | 'C' | 'A' | 'numpy' | 'contract' | 'feed\ \d+:\ wrong\ shape' | 'cache\ \d+:\ wrong\ shape'
    | 'cache\ \d+:\ the\ past\ overlaps\ its\ buffer' | 'Gather(ND)?\ index\ out\ of\ range'
    | 'GroupQueryAttention\ input\ out\ of\ range' | 'OneHotEncoder\ value\ not\ a\ category'
    """
)
#: The only comments: node numbers (indices into the graph's nodes, never names).
_COMMENTS = re.compile(
    r"# node \d+(: folded|: only its shape is read)?|# nodes \d+ to \d+ as one loop"
)
_PLAIN = frozenset({
    tokenize.NAME, tokenize.NUMBER, tokenize.OP, tokenize.NEWLINE, tokenize.NL,
    tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
})  # fmt: skip


def audit(source: str) -> None:
    """Raise Declined unless every string literal and comment of ``source`` is one of
    ours and the text is plain ASCII (model text would arrive as strings, comments, or
    non-ASCII identifiers)."""
    if not source.isascii():
        raise Declined(["internal: generated source is not ASCII (refused)"])
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING and not _STRINGS.fullmatch(tok.string):
                raise Declined([f"internal: generated source has a foreign string {tok.start}"])
            if tok.type == tokenize.COMMENT and not _COMMENTS.fullmatch(tok.string):
                raise Declined([f"internal: generated source has a foreign comment {tok.start}"])
            if tok.type not in _PLAIN and tok.type not in (tokenize.STRING, tokenize.COMMENT):
                raise Declined([f"internal: generated source has a foreign token {tok.start}"])
    except (tokenize.TokenError, SyntaxError) as e:
        raise Declined([f"internal: generated source does not tokenize ({e})"]) from e
