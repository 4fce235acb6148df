"""Shared test set-up: make ``tests/`` importable (node_cases, conformance_excludes)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
