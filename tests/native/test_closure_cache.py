"""Kernels a factory builds (closures over compiled functions) find numba's disk cache in
the next process (``native.kernels.closure_cache``): numba's own key pickles the cells, and
a dispatcher in a cell pickles with a per-process uuid, so they compiled again in every
process, and every native module that called them paid for it. A kernel's cached code
holds what it calls from other files of the package: their stamps join its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("numba", reason="the native tier's kernels are numba functions")

_FACTORY = textwrap.dedent(
    """
    from numba import njit
    from tfrt_py.native.kernels.closure_cache import cached

    @njit(cache=True)
    def add1(v):
        return v + 1

    @njit(cache=True)
    def add2(v):
        return v + 2

    def apply_twice(f, scale):
        @njit(cache=False)
        def kernel(v):
            return f(f(v)) * scale
        return cached(kernel)

    twice1 = apply_twice(add1, 3)
    twice2 = apply_twice(add2, 3)

    import os
    from tfrt_py.native.kernels.closure_cache import stamp_with
    stamp_with(globals(), [os.path.join(os.path.dirname(__file__), "sibling.py")])
    """
)

_PROBE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import factory_mod as m
    out = {}
    for name in ("twice1", "twice2"):
        d = getattr(m, name)
        out[name] = [d(10), sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values())]
    print(json.dumps(out))
    """
)


def _probe(tmp_path: Path) -> dict[str, list[int]]:
    got = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_a_closure_over_compiled_functions_is_loaded_from_the_cache_next_time(
    tmp_path: Path,
) -> None:
    (tmp_path / "factory_mod.py").write_text(_FACTORY)
    (tmp_path / "sibling.py").write_text("# a kernel file the factory's kernels may call\n")
    first = _probe(tmp_path)
    # two closures of one factory differ only in a cell (add1 and add2 differ only in a
    # constant): each keeps its own entry and its own answer
    assert first == {"twice1": [36, 0, 1], "twice2": [42, 0, 1]}
    assert _probe(tmp_path) == {"twice1": [36, 1, 0], "twice2": [42, 1, 0]}
    # a change to a file whose stamp joined theirs (stamp_with) compiles them again
    (tmp_path / "sibling.py").write_text("# changed\n")
    assert _probe(tmp_path) == {"twice1": [36, 0, 1], "twice2": [42, 0, 1]}


def test_the_forest_walks_are_cached_closures_stamped_with_their_siblings() -> None:
    from tfrt_py.native.kernels import post, svm, trees

    for d in (trees.forest_leq, trees.forest_rows_mixed, trees._add_binary_base):
        assert type(d._cache).__name__ == "_StableCellsCache", d
    kernels: tuple[Any, ...] = (trees.forest_leq, svm.svm_cls_row, post.post)
    for d in kernels:
        _own, siblings = d._cache._cache_file._source_stamp
        assert any(f.endswith("fastmath.py") for f, _, _ in siblings), d
