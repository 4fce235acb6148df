"""``tfrt_py.records.record`` behaves as ``dataclasses.dataclass`` for every option the
package uses, side by side on twin classes: construction, defaults, ``repr``, equality,
hashing, frozenness, slots, per-field flags, methods written in the class body, and the
``dataclasses`` functions."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from tfrt_py.records import record


def _twins(**options: Any) -> tuple[type, type]:
    """The same class body made by ``dataclass`` and by ``record``."""

    def body(deco: Any) -> type:
        @deco(**options)
        class Point:
            x: int
            y: tuple[int, ...] = ()
            tags: list[str] = field(default_factory=list, compare=False, repr=False)
            note: str = field(default="", hash=False)

        return Point

    return body(dataclass), body(record)


OPTIONS = [
    {},
    {"frozen": True},
    {"frozen": True, "slots": True},
    {"eq": False},
    {"slots": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_record_behaves_as_dataclass(options: dict[str, Any]) -> None:
    D, R = _twins(**options)
    for make in (lambda C: C(1), lambda C: C(1, (2,), ["a"], "n"), lambda C: C(x=3, note="q")):
        d, r = make(D), make(R)
        assert repr(r) == repr(d)
        assert [f.name for f in dataclasses.fields(r)] == [f.name for f in dataclasses.fields(d)]
        assert dataclasses.asdict(r) == dataclasses.asdict(d)
        assert dataclasses.replace(r, x=9).x == 9
        same_d, same_r = make(D), make(R)
        assert (r == same_r) == (d == same_d)
        assert (r != same_r) == (d != same_d)
        assert (r == make(D)) is False and (r.__eq__(d) is NotImplemented) == (
            d.__eq__(r) is NotImplemented
        )
        hashable = D.__hash__ is not None
        assert (R.__hash__ is not None) == hashable
        if hashable:
            if options.get("eq", True):
                assert hash(r) == hash(same_r)
            else:  # identity, as dataclass's eq=False keeps object's
                assert R.__hash__ is object.__hash__ and D.__hash__ is object.__hash__
        if options.get("frozen"):
            with pytest.raises(dataclasses.FrozenInstanceError):
                r.x = 5
            with pytest.raises(dataclasses.FrozenInstanceError):
                del r.x
        else:
            r.x = 5
            assert r.x == 5
        assert hasattr(r, "__dict__") == hasattr(d, "__dict__")


@record(frozen=True, slots=True)
class _Pickled:
    a: int
    b: tuple[int, ...] = ()


def test_a_frozen_slotted_record_pickles() -> None:
    r = _Pickled(1, (2, 3))
    back = pickle.loads(pickle.dumps(r))
    assert back == r and hash(back) == hash(r) and back is not r


def test_fields_left_out_of_comparison_or_hash_are_left_out() -> None:
    _, R = _twins(frozen=True)
    a, b = R(1, (2,), ["a"], "n"), R(1, (2,), ["b"], "m")
    assert a != b  # note compares
    c = R(1, (2,), ["z"], "n")
    assert a == c and hash(a) == hash(c)  # tags neither compares nor hashes
    assert hash(R(1, (2,), [], "n")) == hash(R(1, (2,), [], "other"))  # note: hash=False


def test_methods_written_in_the_class_body_are_kept() -> None:
    @record(frozen=True)
    class Named:
        name: str

        def __repr__(self) -> str:
            return f"<{self.name}>"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Named) and other.name.lower() == self.name.lower()

        def __hash__(self) -> int:
            return hash(self.name.lower())

    assert repr(Named("A")) == "<A>"
    assert Named("A") == Named("a") and hash(Named("A")) == hash(Named("a"))


def test_an_explicit_eq_without_hash_leaves_the_record_unhashable_as_dataclass_does() -> None:
    def make(deco: Any) -> type:
        @deco(frozen=True)
        class K:
            v: int

            def __eq__(self, other: object) -> bool:
                return isinstance(other, K) and other.v == self.v

        return K

    D, R = make(dataclass), make(record)
    assert (D.__hash__ is None) == (R.__hash__ is None)


def test_one_field_and_no_field_records_compare_and_hash() -> None:
    @record(frozen=True)
    class One:
        v: tuple[int, ...]

    @record(frozen=True)
    class Empty:
        pass

    assert One((1, 2)) == One((1, 2)) and One((1,)) != One((1, 2))
    assert hash(One((1, 2))) == hash(One((1, 2)))
    assert Empty() == Empty() and hash(Empty()) == hash(Empty())
    assert repr(Empty()).endswith("Empty()")


def test_a_record_that_contains_itself_repr_without_recursing() -> None:
    @record
    class Box:
        items: list[Any]

    b = Box([])
    b.items.append(b)
    assert repr(b).endswith("Box(items=[...])")


def test_a_body_that_sets_hash_none_stays_unhashable_as_dataclass_does() -> None:
    def make(deco: Any) -> type:
        @deco(frozen=True)
        class K:
            v: int
            __hash__ = None  # type: ignore[assignment]

        return K

    D, R = make(dataclass), make(record)
    assert D.__hash__ is None and R.__hash__ is None
