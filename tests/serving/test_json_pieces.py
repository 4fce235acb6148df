"""``json_pieces.dumps``: the same text as ``json.dumps`` (compact, NaN allowed, arrays as
their ``tolist()``), with no single ``json.dumps`` call encoding more than
``PIECE_VALUES`` values, so the thread encoding a large answer gives the event loop the GIL
between pieces (issue 38: a 16 MB JSON answer held the loop ~0.5 s in one call)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tfrt_py.serving import json_pieces
from tfrt_py.serving.json_pieces import PIECE_VALUES

RNG = np.random.default_rng(0)


def reference(doc: Any) -> bytes:
    def plain(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return v.tolist()
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(doc), separators=(",", ":"), allow_nan=True).encode()


def values_in(text: str) -> int:
    """Scalars in a JSON text (a whole document, or a piece: list items without brackets)."""
    doc = json.loads("[" + text + "]")

    def count(v: Any) -> int:
        if isinstance(v, list):
            return sum(count(x) for x in v)
        if isinstance(v, dict):
            return sum(count(x) for x in v.values())
        return 1

    return count(doc)


big_2d = RNG.standard_normal((3000, 64)).astype(np.float32)
with_specials = RNG.standard_normal(50_000)
with_specials[[3, 40_000]] = np.nan
with_specials[7] = np.inf
with_specials[9] = -np.inf
CASES = {
    "small dict": {"model": "m", "outputs": {"y": np.arange(6, dtype=np.float32).reshape(2, 3)}},
    "large 2-d float32": {"model": "m", "outputs": {"y": big_2d, "z": np.array(3)}},
    "flat with NaN and infinities": {"data": with_specials},
    "one row larger than a piece": {"y": RNG.standard_normal((1, 3 * PIECE_VALUES + 5))},
    "3-d int64": {"y": RNG.integers(-9, 9, (40, 30, 50))},
    "bool and 0-d": {"b": RNG.random(70_000) > 0.5, "s": np.array(2.5)},
    "empty": {"e": np.zeros((0, 4)), "l": []},
    "list of row objects": {"predictions": [{"a": [1.0, 2.0], "b": 3} for _ in range(20_000)]},
    "plain lists": {"x": [[float(i), 1.0] for i in range(30_000)], "t": (1, 2)},
    "strings": {"s": np.array(["a", 'é\n"q"'] * 10_000, dtype=object)},
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_text_as_json_dumps(name: str) -> None:
    doc = CASES[name]
    assert json_pieces.dumps(doc) == reference(doc)


@pytest.mark.parametrize("name", [n for n in CASES if n not in ("small dict", "empty")])
def test_no_call_encodes_more_than_a_piece(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    real = json_pieces._dumps

    def spy(value: Any) -> str:
        text = real(value)
        sizes.append(values_in(text))
        return text

    monkeypatch.setattr(json_pieces, "_dumps", spy)
    json_pieces.dumps(CASES[name])
    assert len(sizes) > 1  # these documents are larger than a piece
    # a piece of whole rows: at most PIECE_VALUES values, or one row's
    assert max(sizes) <= PIECE_VALUES, sorted(sizes)[-3:]


def _scalars(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(_scalars(x) for x in value)
    if isinstance(value, dict):
        return sum(_scalars(x) for x in value.values())
    if isinstance(value, np.ndarray):
        return int(value.size)
    return 1


@pytest.fixture
def dumps_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The values each ``json.dumps`` call is given (whoever calls it)."""
    sizes: list[int] = []
    real = json.dumps

    def spy(obj: Any, *args: Any, **kw: Any) -> str:
        sizes.append(_scalars(obj))
        return real(obj, *args, **kw)

    monkeypatch.setattr(json, "dumps", spy)
    return sizes


def test_large_answers_are_encoded_in_pieces_by_every_route(dumps_sizes: list[int]) -> None:
    """A 12,000 x 64 answer (16 MB of JSON) over v2, v1 and v1's row format: before, each
    was one json.dumps call of 768,000 values, holding the GIL ~0.5 s."""
    from tfrt_py.feeds import TensorSpec
    from tfrt_py.serving.codec import JSON, encode_outputs, encode_predictions
    from tfrt_py.serving.v2_binary import decode_infer, encode_infer

    y = RNG.standard_normal((12_000, 64)).astype(np.float32)
    spec = [TensorSpec("x", np.dtype(np.float32), ("N", 64))]
    out_spec = [TensorSpec("y", np.dtype(np.float32), ("N", 64))]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                   "data": [0.0] * 64}]}).encode()  # fmt: skip
    req, _ = decode_infer(body, None, "m", spec, out_spec, 1 << 30)
    dumps_sizes.clear()
    v2 = json.loads(encode_infer("m", "1", req, {"y": y})[0])
    v1 = json.loads(encode_outputs("m", {"y": y}, JSON))
    rows = json.loads(encode_predictions({"y": y}))
    assert max(dumps_sizes) <= PIECE_VALUES
    assert np.array_equal(np.asarray(v2["outputs"][0]["data"], np.float32), y.ravel())
    assert np.array_equal(np.asarray(v1["outputs"]["y"], np.float32), y)
    assert np.array_equal(np.asarray(rows["predictions"], np.float32), y)
