"""Shared test set-up: make ``tests/`` (node_cases, conformance_excludes, models) and
``benchmarks/`` (anchor_models: the benchmark models are also test cases) importable."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _TESTS)
sys.path.insert(0, os.path.join(os.path.dirname(_TESTS), "benchmarks"))
