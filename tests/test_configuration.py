"""docs/configuration.md lists every ``TFRT_PY_*`` environment variable the code reads,
and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import tfrt_py

_ROOT = Path(tfrt_py.__file__).parent
_DOC = _ROOT.parent / "docs" / "configuration.md"
_NAME = re.compile(r"\bTFRT_PY_[A-Z][A-Z_]*[A-Z]\b")


def _in_code() -> set[str]:
    found: set[str] = set()
    for path in _ROOT.rglob("*.py"):
        found |= set(_NAME.findall(path.read_text(encoding="utf-8")))
    return found


def _in_table() -> set[str]:
    rows = [ln for ln in _DOC.read_text(encoding="utf-8").splitlines() if ln.startswith("| `")]
    return {m.group(0) for ln in rows if (m := _NAME.search(ln.split("|")[1]))}


def test_every_switch_the_code_reads_is_in_the_table() -> None:
    assert _in_code() - _in_table() == set()


def test_the_table_lists_no_switch_the_code_does_not_read() -> None:
    assert _in_table() - _in_code() == set()


def test_the_check_finds_switch_names() -> None:
    assert _NAME.findall("os.environ['TFRT_PY_NEW_THING'] and $TFRT_PY_JIT=0") == [
        "TFRT_PY_NEW_THING",
        "TFRT_PY_JIT",
    ]
