"""JSON answers encoded in pieces, so that a large one does not stop the event loop.

``json.dumps`` runs in C and holds the GIL for the whole call: encoding a 16 MB answer
(12,000 x 64 floats) took ~0.5 s in one call, and the event loop, though the encoding ran
on a decode thread, answered nothing meanwhile (``/healthz`` waited 340-545 ms). ``dumps``
writes the same text as ``json.dumps(doc, separators=(",", ":"), allow_nan=True)`` with
NumPy arrays written as their ``tolist()``, but a large array or list is converted and
encoded ``PIECE_VALUES`` values at a time: between pieces the thread can give the GIL
back (at the switch interval), so the loop waits for one piece, not the whole answer.

Pure functions: thread-safe. Used by the response encoders (``codec``, ``v2_binary``) for
every JSON answer; a document of at most ``PIECE_VALUES`` values is one ``json.dumps``
call, as before.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["PIECE_VALUES", "dumps"]

#: Values encoded per ``json.dumps`` call in a large answer: a few milliseconds each.
PIECE_VALUES = 1 << 14


def dumps(doc: Any) -> bytes:
    """``doc`` (dicts with string keys, lists, scalars, NumPy arrays) as compact JSON bytes,
    NaN and infinities allowed, in pieces when it holds more than ``PIECE_VALUES`` values."""
    if _count(doc) <= PIECE_VALUES:
        return _dumps(_plain(doc)).encode()
    out: list[str] = []
    _pieces(doc, out)
    return "".join(out).encode()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def _plain(value: Any) -> Any:
    """``value`` with every NumPy array made a list. A list whose first element is a
    scalar is taken as a list of scalars (as ``tolist()`` makes them) and not walked."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and value and isinstance(value[0], _CONTAINERS):
        return [_plain(v) for v in value]
    return value


_CONTAINERS = (np.ndarray, dict, list, tuple)


def _count(value: Any) -> int:
    """About how many values ``value`` holds (lists by their first element's size)."""
    if isinstance(value, np.ndarray):
        return int(value.size)
    if isinstance(value, dict):
        return sum(_count(v) for v in value.values())
    if isinstance(value, list | tuple):
        return len(value) * max(1, _count(value[0])) if value else 0
    return 1


def _pieces(value: Any, out: list[str]) -> None:
    """Append ``value``'s JSON to ``out``, one ``json.dumps`` per piece."""
    if isinstance(value, dict):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            out.append("," if i else "")
            out.append(_dumps(k) + ":")
            _pieces(v, out)
        out.append("}")
        return
    n = _count(value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        out.append(_dumps(value.tolist()))
        return
    if n <= PIECE_VALUES or not isinstance(value, np.ndarray | list | tuple):
        out.append(_dumps(_plain(value)))
        return
    per = max(1, n // len(value))  # values per element (row)
    step = max(1, PIECE_VALUES // per)
    out.append("[")
    for i in range(0, len(value), step):
        out.append("," if i else "")
        if step == 1:  # one element holds more than a piece: into it
            _pieces(value[i], out)
        else:
            out.append(_dumps(_plain(value[i : i + step]))[1:-1])
    out.append("]")
