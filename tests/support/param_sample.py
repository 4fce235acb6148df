"""``--param-sample N``: run at most N cases of each parametrized test function;
``--param-rest N``: run the cases that ``--param-sample N`` leaves out, and nothing else;
``--file-sample N``: then run at most N tests of each test file.

``make test`` runs a sample of each grid (every test function, its first and last case
and some between) so that it stays within minutes on two cores; ``make test-slow`` runs
the rest, so CI runs every case once. CI's extra legs (the declared minimum versions,
numba's own TBB workers) ask whether each module's paths run there: they take a smaller
sample and then a few tests of each file (``--file-sample``). Cases and tests are kept
evenly spaced over their lists; the choice depends only on the collected ids, so every
pytest-xdist worker makes the same one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

__all__ = ["sample_indices"]


def sample_indices(count: int, keep: int) -> list[int]:
    """Which of ``count`` cases to keep (``keep`` >= 1): all when there are no more than
    ``keep``, else ``keep`` indices evenly spaced from the first to the last."""
    if keep < 1:
        raise ValueError("keep at least one case")
    if count <= keep:
        return list(range(count))
    if keep == 1:
        return [0]
    return sorted({round(i * (count - 1) / (keep - 1)) for i in range(keep)})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--param-sample",
        type=int,
        default=0,
        metavar="N",
        help="run at most N cases of each parametrized test (0: all)",
    )
    parser.addoption(
        "--param-rest",
        type=int,
        default=0,
        metavar="N",
        help="run only the cases --param-sample N leaves out",
    )
    parser.addoption("--file-sample", type=int, default=0, metavar="N",
                     help="then run at most N tests of each test file (0: all)")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, rest = config.getoption("--param-sample"), config.getoption("--param-rest")
    if keep and rest:
        raise pytest.UsageError("--param-sample and --param-rest exclude each other")
    if keep or rest:
        kept = _sample(items, lambda item: item.nodeid.split("[", 1)[0], keep or rest)
        if rest:
            kept = set(range(len(items))) - kept
        _keep(config, items, kept)
    per_file = config.getoption("--file-sample")
    if per_file:
        _keep(config, items, _sample(items, lambda item: item.nodeid.split("::", 1)[0], per_file))


def _sample(items: list[pytest.Item], group: Callable[[pytest.Item], str], keep: int) -> set[int]:
    """The indices of ``items`` kept: ``keep`` of each group, evenly spaced."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(group(item), []).append(i)
    kept: set[int] = set()
    for members in groups.values():
        kept.update(members[j] for j in sample_indices(len(members), keep))
    return kept


def _keep(config: pytest.Config, items: list[pytest.Item], kept: set[int]) -> None:
    deselected = [item for i, item in enumerate(items) if i not in kept]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for i, item in enumerate(items) if i in kept]
