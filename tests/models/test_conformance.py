"""ONNX backend node conformance: every case the installed onnx package generates runs
through ``tfrt_py.onnx_backend`` and must match, except those excluded
(``tests/support/conformance_excludes.py``), each group with the reason. Each data set
runs twice on one prepared model: the first call plans its input signature, the second
runs the planned code with ``out=`` buffers; both must match. ``make conformance``
(``benchmarks/conformance.py``) counts the same cases the same way.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

from tests.support.conformance_excludes import EXCLUDES
from tests.support.node_cases import all_cases, run_case

pytestmark = pytest.mark.slow

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # onnx's case generators warn about their own helpers
    CASES = all_cases()

_EXCLUDE_RES = [(re.compile(pattern), why) for pattern, why in EXCLUDES.items()]


def _excluded(name: str) -> str | None:
    for rx, why in _EXCLUDE_RES:
        if rx.fullmatch(name):
            return why
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case: Any) -> None:
    why = _excluded(case.name)
    if why is not None:
        pytest.skip(f"excluded: {why}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cases feed inf/nan on purpose
        run_case(case)


def test_every_exclude_pattern_matches_a_case() -> None:
    names = [c.name for c in CASES]
    stale = [p for p, _ in EXCLUDES.items() if not any(re.fullmatch(p, n) for n in names)]
    assert stale == [], f"exclude patterns that match no case (remove them): {stale}"
