"""The test suite. A package so that ``tests.support`` (the shared helpers) has one
import name; pytest puts the repository root on ``sys.path`` (``pythonpath`` in
pyproject.toml)."""
