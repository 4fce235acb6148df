"""``native/lower/split.py``: a long generated ``run`` compiles as parts that numba types
one at a time, and computes what the whole function computed."""

from __future__ import annotations

import ast
import pathlib
import types

import numpy as np
import pytest

import tfrt_py
from tfrt_py.ir import GraphBuilder
from tfrt_py.native.lower.split import split_run

F32 = np.float32


#: A KV cache's take-up as ``cache.cache_prologue`` writes it: a buffer bound in an ``if``
#: and read by every node after it.
CACHE_TAKE_UP = [
    "    c0 = np.empty(0, f4)",
    "    if c0.size == 0:",
    "        c0 = np.zeros(dv0, f4)",
    "    elif c0.shape[0] < dv0:",
    "        raise ValueError('cache 0: wrong shape')",
    "    r1 = c0.reshape(c0.size)",
]


def _module(n_nodes: int, carried: bool = False, cache: bool = False) -> str:
    """A generated-like module: ``n_nodes`` loops over an arena, each with its own
    temporaries; with ``carried``, a scalar written by the first node and read by the
    last (no cut may separate them); with ``cache``, each node also adds into a cache
    buffer taken up before them (``CACHE_TAKE_UP``)."""
    body = []
    for i in range(n_nodes):
        body += ["    for i0 in range(dv0):",
                 f"        n{i}_a = A_f4[np.uint64({i} * dv0 + i0)]",
                 f"        A_f4[np.uint64({i + 1} * dv0 + i0)] = n{i}_a * f4(2.0)"]  # fmt: skip
        if cache:
            body.append(f"        r1[i0] += n{i}_a")
        if carried and i == 0:
            body.append("    keep = A_f4[np.uint64(dv0)]")
    if carried:
        body.append("    A_f4[np.uint64(0)] = keep")
    if cache:
        body.append("    A_f4[np.uint64(0)] = r1[0]")
    return "\n".join([
        "import numpy as np",
        "from numba import njit, types",
        "f4 = np.float32",
        "SIG = (types.Array(types.float32, 1, 'C', readonly=True),)",
        "",
        "",
        "@njit(SIG, cache=False, nogil=True, error_model='numpy', fastmath={'contract'})",
        "def run(a0):",
        "    dv0 = a0.shape[0]",
        f"    A_f4 = np.zeros({n_nodes + 1} * dv0, f4)",
        *(CACHE_TAKE_UP if cache else []),
        "    for i0 in range(dv0):",
        "        A_f4[np.uint64(i0)] = a0[np.uint64(i0)]",
        *body,
        "    return A_f4",
        "",
    ])  # fmt: skip


def _run(source: str, x: np.ndarray) -> np.ndarray:
    mod = types.ModuleType("split_case")
    exec(compile(source, "<split_case>", "exec"), mod.__dict__)
    out: np.ndarray = mod.run(x)
    return out


@pytest.mark.compiles
def test_a_long_run_becomes_parts_that_compute_the_same() -> None:
    source = _module(60)
    split = split_run(source, part_lines=40)
    tree = ast.parse(split)
    parts = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name != "run"]
    assert len(parts) >= 3, split
    run = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "run")
    assert len(run.body) < 12  # the prologue, the calls and the return
    x = np.arange(5, dtype=F32)
    np.testing.assert_array_equal(_run(split, x), _run(source, x))


@pytest.mark.compiles
def test_a_cache_taken_up_at_the_top_does_not_stop_the_cuts() -> None:
    """The take-up's ``if`` binds the buffer every node reads: it belongs to the prologue
    the parts are cut after (taken for a part's statement, it left no allowed cut, and a
    decoder's step compiled whole)."""
    source = _module(60, cache=True)
    split = split_run(source, part_lines=40)
    tree = ast.parse(split)
    parts = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name != "run"]
    assert len(parts) >= 3, split
    assert all("r1" in [a.arg for a in f.args.args] for f in parts)
    x = np.arange(5, dtype=F32)
    np.testing.assert_array_equal(_run(split, x), _run(source, x))


@pytest.mark.compiles
def test_no_cut_separates_a_name_from_a_later_read() -> None:
    source = _module(60, carried=True)
    split = split_run(source, part_lines=40)
    tree = ast.parse(split)
    parts = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name != "run"]
    # ``keep``, written by the first node and read at the end, stays inside one function:
    # no part receives it (``run`` would have none to pass)
    assert parts and all("keep" not in [a.arg for a in f.args.args] for f in parts)
    x = np.arange(5, dtype=F32)
    np.testing.assert_array_equal(_run(split, x), _run(source, x))


def test_a_short_run_is_left_whole() -> None:
    source = _module(4)
    assert split_run(source, part_lines=40) == source


@pytest.mark.compiles
def test_a_model_whose_function_is_split_agrees_with_the_interpreter() -> None:
    """12 softmaxes over a (B, S, 16) input: signature mode, a function long enough to
    compile as parts (``compile_source``). Their kinds follow a square-free word, so no
    run of them repeats back to back (``outline.py`` would move a repeat into a function
    of its own, leaving ``run`` too short to cut)."""
    kinds = {"a": ("Softmax", -1), "b": ("LogSoftmax", -1), "c": ("Softmax", 1)}
    b = GraphBuilder("chain")
    h = b.input("x", F32, ("B", "S", 16))
    for i, kind in enumerate("abcacbabcbac"):
        op, axis = kinds[kind]
        h = b.op(op, b.op("Add", h, b.const(np.full(16, i % 5, F32))), axis=axis)
    b.output(h, "y")
    g = b.build()
    native = tfrt_py.load(g, executor="native", native="eager", optimize=False)
    sync = tfrt_py.load(g, executor="sync", optimize=False)
    for shape in ((1, 3, 16), (1, 5, 16)):  # one box: B=1, S in 2..16
        x = np.random.default_rng(shape[1]).standard_normal(shape).astype(F32)
        np.testing.assert_allclose(native.run({"x": x})["y"], sync.run({"x": x})["y"],
                                   rtol=2e-5, atol=2e-6)  # fmt: skip
    jobs = [j for j in native.native.sigs.values() if j.compiled is not None]
    assert jobs, native.describe()
    assert any("def run_part" in pathlib.Path(j.compiled.path).read_text() for j in jobs)
