"""``fused.ml.encoder``: strings to vocabulary ids, in one compiled pass over the joined
UTF-8 from ``JOINED_MIN`` strings on (``string_ids_jit``), else a dict lookup each -- the
same ids either way, whatever the strings hold."""

from __future__ import annotations

import numpy as np
import pytest

from tfrt_py.kernels.fused import ml, string_ids_jit
from tfrt_py.kernels.fused.ml import JOINED_MIN, encoder

VOCAB = ("red", "", "grün", "ßu", "日本", "red ", "a" * 300, "\ud800x", "Qa", "green")


def _by_dict(vocab: tuple[str, ...], x: np.ndarray) -> np.ndarray:
    d = {s: i for i, s in enumerate(vocab)}
    return np.array([d.get(s, -1) for s in x.reshape(-1).tolist()], np.int64).reshape(x.shape)


def _strings(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    pool = [*VOCAB, "unseen", "RED", "red\u0301", "日", "a" * 299, "\ud800", "grü"]
    return [pool[i] for i in rng.integers(0, len(pool), n)]


@pytest.mark.parametrize("n", [1, JOINED_MIN - 1, JOINED_MIN, 1000])
@pytest.mark.parametrize("kind", ["object", "unicode"])
def test_ids_are_the_dicts_on_both_paths(n: int, kind: str, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:  # fmt: skip
    fn = string_ids_jit.lookup()  # None where TFRT_PY_JIT=0: the dict serves every n
    calls: list[int] = []

    def counted(*a: object) -> object:
        calls.append(1)
        return fn(*a)

    if fn is not None:
        monkeypatch.setattr(ml, "lookup", lambda: counted)
    items = _strings(n, n)
    x = np.array(items, dtype=object if kind == "object" else None).reshape(-1, 1)
    got = encoder(VOCAB)(x)
    assert got.dtype == np.int64 and got.shape == x.shape
    np.testing.assert_array_equal(got, _by_dict(VOCAB, x))
    assert len(calls) == (n >= JOINED_MIN and fn is not None)  # which path served


def test_elements_that_are_not_str_or_hold_nul_are_looked_up_one_by_one() -> None:
    items: list[object] = list(_strings(100, 3))
    for k, v in ((5, None), (17, 3.5), (40, b"red"), (64, "red\x00green"), (80, "\x00")):
        items[k] = v
    x = np.array(items, dtype=object)
    got = encoder(VOCAB)(x)
    np.testing.assert_array_equal(got, _by_dict(VOCAB, x))
    assert got[5] == got[17] == got[40] == got[64] == got[80] == -1


def test_a_repeated_key_answers_its_last_index_and_a_megabyte_string_is_unseen() -> None:
    vocab = ("x", "y", "x", "")
    items = ["x", "y", "", "z"] * 8 + ["x" * (1 << 20)]
    got = encoder(vocab)(np.array(items, dtype=object))
    np.testing.assert_array_equal(got, [2, 1, 3, -1] * 8 + [-1])


def test_an_empty_vocabulary_maps_everything_to_minus_one() -> None:
    got = encoder(())(np.array(["", "a"] * 20, dtype=object))
    np.testing.assert_array_equal(got, [-1] * 40)


def test_the_table_probes_past_collisions() -> None:
    """Many keys in a table twice their number: runs of occupied slots are walked."""
    vocab = tuple(f"k{i}" for i in range(500))
    items = [f"k{i}" for i in range(0, 1000, 3)]
    got = encoder(vocab)(np.array(items, dtype=object))
    np.testing.assert_array_equal(got, [i if i < 500 else -1 for i in range(0, 1000, 3)])
