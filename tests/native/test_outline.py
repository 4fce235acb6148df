"""``native/lower/outline.py``: a generated ``run``'s repeated layers become one function,
compiled once and called once per layer, that computes what the copies computed; copies
that do not correspond, or that leave a value behind, stay inline."""

from __future__ import annotations

import ast
import types

import numpy as np
import pytest

from tfrt_py.native.lower.outline import outline_repeats
from tfrt_py.native.lower.source import audit

F32 = np.float32
HEAD = [
    "import numpy as np",
    "from numba import njit, types",
    "f4 = np.float32",
    "SIG = (types.Array(types.float32, 1, 'C', readonly=True),)",
    "",
    "",
    "@njit(SIG, cache=False, nogil=True, error_model='numpy', fastmath={'contract'})",
    "def run(a0):",
    "    dv0 = a0.shape[0]",
    "    A_f4 = np.zeros(40 * dv0, f4)",
    "    r1 = A_f4[:dv0]",
    "    r2 = A_f4[dv0:2 * dv0]",
    "    r3 = A_f4[2 * dv0:3 * dv0]",
    "    for i0 in range(dv0):",
    "        A_f4[np.uint64(i0)] = a0[np.uint64(i0)]",
]


def _layer(k: int, view: str, scale: float = 2.0, kernel: str = "np.sqrt") -> list[str]:
    """One layer's code: its temporaries numbered ``n{k}_``, its values at offsets of its
    own, its view ``view`` (a name from before the layers)."""
    lines = []
    for s in range(6):  # 48 lines: long enough to be worth a function
        src, dst = 3 * k + s, 3 * k + s + 1
        lines += [
            "    for i0 in range(dv0):",
            f"        n{k}_{s}_a = A_f4[np.uint64({src} * dv0 + i0)]",
            f"        n{k}_{s}_b = n{k}_{s}_a * f4({scale}) + f4(1.0)",
            f"        A_f4[np.uint64({dst} * dv0 + i0)] = {kernel}(abs(n{k}_{s}_b))",
            f"        {view}[i0] += n{k}_{s}_b",
            "    for j in range(3):",
            "        for i0 in range(dv0):",
            f"            A_f4[np.uint64({dst} * dv0 + i0)] += f4(j) * f4(0.5)",
        ]
    return lines


def _module(layers: list[list[str]], tail: list[str] | None = None) -> str:
    body = [ln for layer in layers for ln in layer]
    return "\n".join([*HEAD, *body, *(tail or []), "    return A_f4", ""])


def _run(source: str, x: np.ndarray) -> tuple[np.ndarray, types.ModuleType]:
    mod = types.ModuleType("outline_case")
    exec(compile(source, "<outline_case>", "exec"), mod.__dict__)
    out: np.ndarray = mod.run(x)
    return out, mod


def _functions(source: str) -> list[str]:
    return [f.name for f in ast.parse(source).body if isinstance(f, ast.FunctionDef)]


@pytest.mark.compiles
def test_repeated_layers_become_one_function_compiled_once() -> None:
    source = _module([_layer(k, f"r{k % 3 + 1}") for k in range(4)])
    out = outline_repeats(source)
    audit(out)  # our identifiers and numbers only
    assert _functions(out) == ["run_layer0", "run"], out
    assert out.count("run_layer0(") == 5  # its definition and four calls
    x = np.linspace(-1, 1, 7, dtype=F32)
    got, mod = _run(out, x)
    want, _ = _run(source, x)
    np.testing.assert_array_equal(got, want)
    # the layers' offsets are passed as int64, not literals: one compile for the four
    assert len(mod.run_layer0.overloads) == 1


def test_a_layer_that_leaves_a_value_behind_stays_inline() -> None:
    """The last layer's temporary is read after the layers: the function would have to
    return it, and it returns nothing."""
    source = _module([_layer(k, "r1") for k in range(3)], tail=["    A_f4[0] = n2_5_b"])
    assert outline_repeats(source) == source


def test_copies_that_do_not_correspond_stay_inline() -> None:
    """A different kernel in one layer, or one layer's view being two names in another,
    is not a repeat."""
    layers = [_layer(k, "r1") for k in range(3)]
    layers[1] = _layer(1, "r1", kernel="np.exp")
    assert outline_repeats(_module(layers)) == _module(layers)
    mixed = [_layer(0, "r1"), _layer(1, "r2"), _layer(2, "r2")]
    mixed[1] = [ln.replace("r2[i0] += n1_3_b", "r3[i0] += n1_3_b") for ln in mixed[1]]
    assert outline_repeats(_module(mixed)) == _module(mixed)


def test_a_short_repeat_is_left_inline() -> None:
    short = [[ln for ln in _layer(k, "r1")[:2]] for k in range(3)]
    assert outline_repeats(_module(short)) == _module(short)
