"""``record``: ``dataclasses.dataclass`` that compiles at most three methods, not six.

Before CPython 3.13, each method a dataclass generates is compiled by its own ``exec``
(~80 µs): a frozen dataclass with ``eq`` and ``repr`` costs six, ~0.5 ms, and a fresh
process made 24 of them before its first result (issue 33: ~12 ms of a ~27 ms ``import
tfrt_py``). ``record`` lets dataclasses generate what must be compiled per class --
``__init__``, and for frozen records ``__setattr__``/``__delattr__`` -- and gives every
record the same ``__repr__``, ``__eq__`` and ``__hash__``, which read the fields through
one ``operator.attrgetter`` made per class.

The semantics are dataclass's for the options used here (``frozen``, ``eq``, ``slots``;
per field ``repr``/``compare``/``hash``): fields in definition order, ``__eq__`` only
against the same class (else ``NotImplemented``), hashable when frozen and unhashable when
compared and not frozen, methods written in the class body kept, ``dataclasses.fields``,
``replace`` and ``asdict`` work. (``__dataclass_params__`` says ``eq=False, repr=False``:
nothing here reads it.) Imports nothing of tfrt_py; any thread.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["record"]

T = TypeVar("T", bound=type)


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, frozen: bool = False, eq: bool = True, slots: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(
    cls: Any = None, /, *, frozen: bool = False, eq: bool = True, slots: bool = False
) -> Any:
    """``@record``, ``@record(frozen=True, slots=True)``: as ``@dataclass(...)``."""

    def wrap(c: T) -> T:
        return _finish(c, frozen=frozen, eq=eq, slots=slots)

    return wrap if cls is None else wrap(cls)


def _finish(cls: T, *, frozen: bool, eq: bool, slots: bool) -> T:
    body = dict(cls.__dict__)  # what the class body wrote, before dataclasses adds to it
    made: Any = dataclasses.dataclass(cls, frozen=frozen, eq=False, repr=False, slots=slots)
    fields = dataclasses.fields(made)
    made.__record_shown__ = tuple(f.name for f in fields if f.repr)
    if "__repr__" not in body:
        made.__repr__ = _repr
    if not eq:
        return made
    made.__record_compared__ = _key([f.name for f in fields if f.compare])
    if "__eq__" not in body:
        made.__eq__ = _eq
    # dataclass's rule for eq=True without unsafe_hash: a body's __hash__ is kept, unless it
    # is the None Python writes for a body that defines __eq__ alone
    explicit_hash = "__hash__" in body and not (body["__hash__"] is None and "__eq__" in body)
    if not explicit_hash:
        if frozen:
            hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
            made.__record_hashed__ = _key(hashed)
            made.__hash__ = _hash
        else:
            made.__hash__ = None
    return made


def _key(names: list[str]) -> Callable[[Any], Any]:
    """The fields' values, as one value the dataclass tuple compares and hashes alike."""
    if not names:
        return _empty
    return attrgetter(*names)


def _empty(_self: Any) -> tuple[()]:
    return ()


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self).__record_shown__)
    return f"{self.__class__.__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = type(self).__record_compared__
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(type(self).__record_hashed__(self))
