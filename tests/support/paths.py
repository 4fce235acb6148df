"""Where the tests' files are, for test modules at any depth of ``tests/``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA", "EXAMPLES", "ROOT", "TESTS"]

#: ``tests/``
TESTS = Path(__file__).resolve().parents[1]
#: The repository root (``PYTHONPATH`` for child processes that import ``tests``).
ROOT = TESTS.parent
#: ``tests/data/``: the committed exports (transformers, the classic-ML zoo).
DATA = TESTS / "data"
#: The bundled example models.
EXAMPLES = ROOT / "tfrt_py" / "examples"
