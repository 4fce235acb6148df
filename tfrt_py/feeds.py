"""Feed validation: names, dtypes, ranks and static dims, checked before any kernel runs.

Checks are built once per model (``FeedChecker``) so a call does a tuple compare per
input in the common case (an ndarray of the right dtype and shape). Python values
(lists, scalars) are accepted when converting them to the input's dtype is lossless;
arrays are cast only when NumPy calls the cast safe (e.g. int8 -> float32).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InputError
from .ir import TensorType, Value
from .records import record

__all__ = [
    "CheckedFeeds",
    "FeedChecker",
    "TensorSpec",
    "check_output_buffers",
    "concat_prefixes",
    "fill_outputs",
    "is_prefix",
    "warmup_feeds",
]


@record(frozen=True, slots=True)
class TensorSpec:
    """A model input or output: name, dtype (None when unknown), shape (None when even the
    rank is unknown; a dim is an int, a symbolic name, or None), and ``type``: the value's
    type as text -- "tensor" for tensors, else what it is (``seq<map<int64,float32[*]>>``
    for a scikit-learn classifier's ZipMap probabilities, ``optional<...>``)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None
    type: str = "tensor"

    def __str__(self) -> str:
        if self.type != "tensor":
            return f"{self.name}: {self.type}"
        return f"{self.name}: {TensorType(self.dtype, self.shape)}"


def spec_of(v: Value) -> TensorSpec:
    if v.convert is not None:  # what the model declares, not the form it runs on
        return TensorSpec(v.name, None, None, str(v.convert.declared))
    t = v.type
    if isinstance(t, TensorType) or t is None:
        return TensorSpec(v.name, t.dtype if t else None, t.shape if t else None)
    return TensorSpec(v.name, None, None, str(t))


def _describe(spec: TensorSpec) -> str:
    return f"{TensorType(spec.dtype, spec.shape)}"


class _InputCheck:
    __slots__ = (
        "convert", "default", "dtype", "is_tensor", "name", "shape", "spec", "static_shape",
        "symbols",
    )  # fmt: skip

    def __init__(self, v: Value) -> None:
        self.spec = spec_of(v)
        self.name = v.name
        self.default = v.default  # an overridable initializer's value when not fed
        self.is_tensor = isinstance(v.type, TensorType) or v.type is None
        self.convert = v.convert  # a map made the row the model runs on
        t = v.type  # the form the model runs on (``spec`` may declare another)
        self.dtype = t.dtype if isinstance(t, TensorType) else None
        self.shape = t.shape if isinstance(t, TensorType) else None
        static = self.shape is not None and all(isinstance(d, int) for d in self.shape)
        self.static_shape = self.shape if static else None
        self.symbols = (
            [(i, d) for i, d in enumerate(self.shape) if isinstance(d, str)] if self.shape else []
        )

    def __call__(self, value: Any) -> np.ndarray:
        if not self.is_tensor:
            return value  # sequences, optionals: passed through to the kernels
        if self.convert is not None and type(value) is not np.ndarray:
            value = self.convert(value)
        if type(value) is np.ndarray and value.dtype == self.dtype:
            if value.shape == self.static_shape:
                return value
            self._check_shape(value)
            return value
        arr = self._convert(value)
        self._check_shape(arr)
        return arr

    def _convert(self, value: Any) -> np.ndarray:
        want = self.dtype
        if isinstance(value, np.ndarray):
            if type(value) is not np.ndarray:
                # np.matrix, masked arrays, ...: their operators and shapes are not NumPy's
                # (a matrix stays 2-D under reductions), so kernels get a plain view.
                value = np.asarray(value)
            if want is None or value.dtype == want:
                return value
            if want.kind == "O" and value.dtype.kind in "US":
                return value.astype(object)
            if np.can_cast(value.dtype, want, "safe"):
                return value.astype(want)
            raise InputError(
                f"input {self.name!r}: got dtype {value.dtype}, expected {want} "
                f"(shape {_describe(self.spec)}); cast it explicitly, e.g. x.astype(np.{want})"
            )
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as e:
            raise InputError(
                f"input {self.name!r}: cannot make an array of {type(value).__name__} ({e}); "
                f"expected {_describe(self.spec)}"
            ) from e
        if want is None or arr.dtype == want:
            return arr
        if want.kind == "O":
            if arr.dtype.kind in "US":
                return arr.astype(object)
        elif arr.dtype.kind in "biuf" and want.kind in "biuf":
            with np.errstate(all="ignore"):
                cast = arr.astype(want)
                if np.array_equal(cast.astype(arr.dtype), arr):
                    return cast
        raise InputError(
            f"input {self.name!r}: {type(value).__name__} of {arr.dtype} values cannot be "
            f"converted to {want} without loss; expected {_describe(self.spec)}"
        )

    def _check_shape(self, arr: np.ndarray) -> None:
        shape = self.shape
        if shape is None:
            return
        if arr.ndim != len(shape):
            raise InputError(
                f"input {self.name!r}: got rank {arr.ndim} (shape {tuple(arr.shape)}), "
                f"expected rank {len(shape)}: {_describe(self.spec)}"
            )
        for i, (got, want) in enumerate(zip(arr.shape, shape)):
            if isinstance(want, int) and got != want:
                raise InputError(
                    f"input {self.name!r}: dim {i} is {got}, expected {want}: got shape "
                    f"{tuple(arr.shape)}, expected {_describe(self.spec)}"
                )


class CheckedFeeds(dict[str, Any]):
    """Feeds a ``FeedChecker`` validated and converted (``FeedChecker.checked``): name ->
    array, and ``arrays`` in input order. A checker of the same inputs (the same ``Value``
    objects: the executor's of the model the serving layer checked for) returns ``arrays``
    without checking again, so a served request is validated once. Never mutated after
    ``checked`` made it; made by nothing else."""

    __slots__ = ("arrays", "inputs")

    arrays: list[Any]
    inputs: tuple[int, ...]


class FeedChecker:
    """Validates a feeds mapping against a model's inputs; returns arrays in input order.

    An input with a ``Value.default`` (an overridable initializer) may be left out: its
    default is used (unchecked: it is the model's own). Thread-safe: holds no per-call
    state.
    """

    def __init__(self, inputs: Sequence[Value]) -> None:
        #: which inputs these are (the Values' identities), for ``CheckedFeeds``
        self._inputs = tuple(id(v) for v in inputs)
        self._checks = [_InputCheck(v) for v in inputs]
        self._names = [c.name for c in self._checks]
        self._n = len(self._checks)
        self._optional = [c for c in self._checks if c.default is not None]
        self._has_symbols = sum(len(c.symbols) for c in self._checks) > 1

    def checked(self, feeds: Mapping[str, Any]) -> CheckedFeeds:
        """``feeds`` checked (as a call), as a ``CheckedFeeds`` the executors of these
        inputs take without checking again."""
        arrays = self(feeds)
        out = CheckedFeeds(zip(self._names, arrays))
        out.arrays = arrays
        out.inputs = self._inputs
        return out

    def __call__(self, feeds: Mapping[str, Any]) -> list[Any]:
        if feeds.__class__ is CheckedFeeds and feeds.inputs == self._inputs:
            return feeds.arrays
        if not isinstance(feeds, Mapping):
            raise InputError(
                f"feeds must be a dict of input name -> array, got {type(feeds).__name__}; "
                f"inputs are {self._names}"
            )
        out = []
        try:
            for c in self._checks:
                out.append(c(feeds[c.name]))
        except KeyError:
            if not self._optional:
                raise InputError(self._missing(feeds)) from None
            return self._with_defaults(feeds)
        if len(feeds) != self._n:
            raise InputError(self._unknown(feeds))
        if self._has_symbols:
            self._check_symbols(out)
        return out

    def _missing(self, feeds: Mapping[str, Any]) -> str:
        missing = [c.name for c in self._checks if c.name not in feeds and c.default is None]
        return f"missing input(s) {missing}; the model's inputs are " + ", ".join(
            str(c.spec) for c in self._checks if c.default is None
        )

    def _unknown(self, feeds: Mapping[str, Any]) -> str:
        extra = [k for k in feeds if k not in self._names]
        return f"unknown input(s) {extra}; the model's inputs are " + ", ".join(
            str(c.spec) for c in self._checks
        )

    def _with_defaults(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The slow path when a feed is missing: defaults for overridable initializers."""
        out, fed = [], 0
        for c in self._checks:
            if c.name in feeds:
                out.append(c(feeds[c.name]))
                fed += 1
            elif c.default is not None:
                out.append(c.default)
            else:
                raise InputError(self._missing(feeds))
        if len(feeds) != fed:
            raise InputError(self._unknown(feeds))
        if self._has_symbols:
            self._check_symbols(out)
        return out

    def _check_symbols(self, arrays: list[Any]) -> None:
        seen: dict[str, tuple[int, str]] = {}
        for c, arr in zip(self._checks, arrays):
            for i, sym in c.symbols:
                size = arr.shape[i]
                prev = seen.setdefault(sym, (size, c.name))
                if prev[0] != size:
                    raise InputError(
                        f"input {c.name!r}: dim {i} ({sym!r}) is {size}, but input "
                        f"{prev[1]!r} has {sym!r} = {prev[0]}"
                    )


def concat_prefixes(graph: Any) -> dict[int, tuple[int, int]]:
    """Output index -> (input index, axis) for each graph output made by a Concat whose
    first operand is a graph input -- a KV cache's ``present = Concat(past, new)`` -- or
    that is a com.microsoft GroupQueryAttention's present (output 1 or 2) of its past
    (input 3 or 4) (axis 2: it grows its past by the new keys or values). Such an output's
    buffer may hold that feed as its prefix (``check_output_buffers``)."""
    inputs = {id(v): i for i, v in enumerate(graph.inputs)}
    found = {}
    for k, v in enumerate(graph.outputs):
        node = v.producer
        if node is None or len(node.inputs) < 2:
            continue
        if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
            slot = next((i for i, o in enumerate(node.outputs) if o is v), 0)
            past = node.inputs[slot + 2] if slot in (1, 2) and len(node.inputs) > slot + 2 else None
            if past is not None and id(past) in inputs:
                found[k] = (inputs[id(past)], 2)
            continue
        if node.op_type != "Concat" or node.domain:
            continue
        first = node.inputs[0]
        if first is not None and id(first) in inputs and "axis" in node.attrs:
            found[k] = (inputs[id(first)], int(node.attrs["axis"]))
    return found


def is_prefix(buf: np.ndarray, feed: np.ndarray, axis: int) -> bool:
    """``feed`` is exactly ``buf``'s first positions along ``axis``: the same memory from
    the same address, with the same strides."""
    if buf.ndim != feed.ndim or buf.dtype != feed.dtype or buf.strides != feed.strides:
        return False
    ax = axis % buf.ndim
    same = all(a == b for i, (a, b) in enumerate(zip(buf.shape, feed.shape)) if i != ax)
    start = buf.__array_interface__["data"][0]
    return same and feed.shape[ax] <= buf.shape[ax] and start == feed.__array_interface__["data"][0]


def check_output_buffers(
    outputs: Mapping[str, Any],
    names: Sequence[str],
    feeds: Sequence[Any],
    prefixes: Mapping[int, tuple[int, int]] | None = None,
) -> list[Any]:
    """Validate the caller's ``run(feeds, outputs=)`` buffers; returns one entry per output
    name (None where no buffer was given).

    InputError for a name that is not an output, a buffer that is not a writeable ndarray,
    and a buffer that overlaps a feed or another buffer: kernels write outputs while later
    kernels still read feeds (a fused ``Relu(x*W)+x``), so an overlap would give wrong
    results; refusing it is cheaper than planning around it. Overlap is checked exactly
    (``np.shares_memory``) only when the bounds overlap (``np.may_share_memory``).

    The one overlap allowed: ``prefixes`` (``concat_prefixes``) names outputs made by
    ``Concat(feed, ...)``, whose buffer may start with that very feed (a KV cache grown in
    place: the Concat writes only what follows it, and the feed's values never change)."""
    unknown = [k for k in outputs if k not in names]
    if unknown:
        raise InputError(f"outputs: unknown output(s) {unknown}; outputs are {list(names)}")
    bufs = [outputs.get(n) for n in names]
    arrays = [(k, f, _owner(f)) for k, f in enumerate(feeds) if isinstance(f, np.ndarray)]
    given: list[tuple[str, np.ndarray, Any]] = []
    for i, (name, b) in enumerate(zip(names, bufs)):
        if b is None:
            continue
        if not (isinstance(b, np.ndarray) and b.flags.writeable):
            what = type(b).__name__ if not isinstance(b, np.ndarray) else "a read-only array"
            raise InputError(f"outputs[{name!r}] must be a writeable numpy array, got {what}")
        owner = _owner(b)
        allowed = prefixes.get(i) if prefixes else None
        for k, f, f_owner in arrays:
            if _apart(owner, f_owner):
                continue
            if allowed is not None and allowed[0] == k and is_prefix(b, f, allowed[1]):
                continue
            if not _overlap(b, f):
                continue
            raise InputError(
                f"outputs[{name!r}] shares memory with feed #{k}: outputs are written "
                "while feeds are still read; pass a separate buffer"
            )
        for other, ob, ob_owner in given:
            if not _apart(owner, ob_owner) and _overlap(b, ob):
                raise InputError(f"outputs[{name!r}] shares memory with outputs[{other!r}]")
        given.append((name, b, owner))
    return bufs


def _owner(a: np.ndarray) -> np.ndarray | None:
    """The array that allocated ``a``'s memory, or None when something else owns it (a
    bytes object, an mmap, a foreign buffer)."""
    while True:
        base = a.base
        if base is None:
            return a if a.flags.owndata else None
        if not isinstance(base, np.ndarray):
            return None
        a = base


def _apart(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Two arrays that allocated their own memory are two allocations: they cannot
    overlap (one identity test in place of a memory-bounds test per pair)."""
    return a is not None and b is not None and a is not b


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.may_share_memory(a, b):
        return False
    try:
        # A bound on the work (the exact problem is NP-hard for odd strides); NumPy's stubs
        # only admit -1/0 here, the runtime takes any bound.
        return bool(np.shares_memory(a, b, max_work=1 << 20))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True  # cannot tell cheaply: treat as overlapping


def fill_outputs(
    results: dict[str, np.ndarray],
    outputs: Mapping[str, Any],
    feeds: Sequence[Any] = (),
    prefixes: Mapping[int, tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Copy ``results`` into the caller's ``outputs`` buffers (``run(feeds, outputs=)`` on
    executors that do not write into them directly); InputError as
    ``check_output_buffers``, or for a buffer whose shape or dtype does not match."""
    check_output_buffers(outputs, list(results), feeds, prefixes)
    for name, buf in outputs.items():
        got = np.asarray(results[name])
        if buf.shape != got.shape or buf.dtype != got.dtype:
            raise InputError(
                f"outputs[{name!r}]: buffer is {buf.dtype}{list(buf.shape)}, "
                f"the output is {got.dtype}{list(got.shape)}"
            )
        np.copyto(buf, got)
        results[name] = buf
    return results


#: A warm-up feed made from a shape may hold at most this many elements.
WARMUP_MAX_ELEMENTS = 1 << 28


def warmup_feeds(inputs: Sequence[TensorSpec], item: Any) -> dict[str, Any]:
    """The feeds of one ``warmup`` item (input name -> shape or example array): arrays as
    given; a shape becomes zeros (float inputs) or ones (integer and bool inputs: ids in
    range, masks that attend). InputError for anything else."""
    if not isinstance(item, Mapping):
        raise InputError(
            f"warmup: each item maps input names to shapes or arrays, got {type(item).__name__}"
        )
    specs = {s.name: s for s in inputs}
    feeds: dict[str, Any] = {}
    for name, v in item.items():
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"warmup: unknown input {name!r}; inputs are {list(specs)}")
        if isinstance(v, (tuple, list)) and all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in v
        ):
            shape = tuple(int(d) for d in v)
            if any(d < 0 for d in shape) or np.prod(shape, dtype=float) > WARMUP_MAX_ELEMENTS:
                raise InputError(f"warmup: input {name!r}: shape {shape} is negative or too big")
            dt = spec.dtype if spec.dtype is not None else np.dtype(np.float32)
            if dt.kind == "O":
                raise InputError(f"warmup: input {name!r} is a string tensor: give an array")
            feeds[name] = np.full(shape, 0 if dt.kind in "fc" else 1, dt)
        else:
            feeds[name] = v
    return feeds
