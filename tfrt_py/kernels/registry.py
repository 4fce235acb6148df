"""The kernel registry: (domain, op type, opset range) -> kernel builder.

Family subpackages register explicitly (``register_kernels(registry)``, as TFRT's static
registration); ``families.default_registry()`` builds the full registry once, on first use.
A kernel module can be added *lazily* (``add_lazy``): the registry knows which ops it
serves and imports it, and runs its ``register_kernels``, the first time one of them is
looked up, so a process that loads an MLP never imports the convolution kernels.
This module imports only ``base`` and ``errors``: the families import it, never the reverse.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable

from ..errors import UnsupportedOpError
from ..records import record
from .base import Cost, KernelBuilder, KernelContext, KernelFlags

__all__ = ["CostFn", "KernelDef", "KernelRegistry"]

_PURE = KernelFlags()

CostFn = Callable[[KernelContext, list[tuple[int, ...]], list[tuple[int, ...]]], Cost]
#: A kernel module's or family's ``register_kernels``: adds its kernels to the registry given.
Register = Callable[["KernelRegistry"], None]


@record(frozen=True, slots=True)
class KernelDef:
    """One registered kernel: serves ``op_type`` in ``domain`` for opsets since..until."""

    domain: str
    op_type: str
    since: int
    until: int | None
    build: KernelBuilder
    flags: KernelFlags
    cost: CostFn | None = None

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


class KernelRegistry:
    """Maps (domain, op_type) to kernel defs.

    Thread-safety: filled at start-up (``add``, ``add_lazy``) by one thread, read by many
    after. The only mutation after that is a lazy unit's first use (``_load``), which
    registers it under ``_lock`` before its ops stop being pending, so a reader
    sees an op either pending (and waits for the lock) or fully registered. A child forked
    while another thread of its parent loaded a unit gets a fresh lock, and loads that unit
    again on its first use (registering is idempotent)."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, str], list[KernelDef]] = {}
        #: (domain, op_type) -> the name of the lazy unit (``add_lazy``) serving it, until loaded.
        self._pending: dict[tuple[str, str], str] = {}
        #: lazy unit -> (its ops, its ``register_kernels`` loader), until loaded.
        self._lazy: dict[str, tuple[tuple[tuple[str, str], ...], Callable[[], Register]]] = {}
        self._loading: set[str] = set()  # the lazy units whose register_kernels runs now
        self._lock = threading.RLock()
        _REGISTRIES.add(self)

    def add_lazy(
        self, name: str, ops: Iterable[tuple[str, str]], loader: Callable[[], Register]
    ) -> None:
        """Register kernels lazily under ``name``: they serve exactly ``ops`` ((domain,
        op_type)), and ``loader()`` (importing their module) returns the
        ``register_kernels`` that is called the first time one of ``ops`` is looked up or
        the registry is listed. It must register nothing outside ``ops``
        (``tests/architecture`` checks the built-in index)."""
        keys = tuple(_key(d, op) for d, op in ops)
        self._lazy[name] = (keys, loader)
        for key in keys:
            self._pending[key] = name

    def reset_lazy(
        self, name: str, ops: Iterable[tuple[str, str]], loader: Callable[[], Register]
    ) -> None:
        """Drop the defs of ``ops`` and add them lazily again (``add_lazy``), so that their
        builders bind to this registry when next used (a copy with custom kernels
        re-registers the fused ops, whose steps resolve against the registry they are
        registered into)."""
        keys = tuple(_key(d, op) for d, op in ops)
        with self._lock:
            for key in keys:
                self._defs.pop(key, None)
        self.add_lazy(name, keys, loader)

    def _load(self, key: tuple[str, str]) -> None:
        """Load the lazy unit serving ``key``, if one is pending: once, under ``_lock``
        (reentrant: its ``register_kernels`` calls ``add`` on this registry, whose builders
        may keep it). Its ops stay pending until every one is registered, so a thread
        looking one up waits here instead of finding it missing."""
        with self._lock:
            name = self._pending.get(key)
            if name is None or name in self._loading:
                return
            keys, loader = self._lazy[name]
            self._loading.add(name)
            try:
                loader()(self)
            finally:
                self._loading.discard(name)
            for k in keys:
                del self._pending[k]
            del self._lazy[name]

    def _load_all(self) -> None:
        while self._pending:
            self._load(next(iter(self._pending)))

    def add(
        self,
        op_type: str,
        build: KernelBuilder,
        *,
        domain: str = "",
        since: int = 1,
        until: int | None = None,
        flags: KernelFlags = _PURE,
        cost: CostFn | None = None,
    ) -> None:
        """Register ``build`` for ``op_type``. A later registration for an overlapping
        opset range of the same op replaces the earlier one (custom kernels override)."""
        key = _key(domain, op_type)
        if key in self._pending:
            self._load(key)  # so that this registration overrides the built-in
        new = KernelDef(key[0], op_type, since, until, build, flags, cost)
        defs = self._defs.setdefault(key, [])
        defs[:] = [d for d in defs if not _overlaps(d, new)]
        defs.append(new)
        defs.sort(key=lambda d: d.since)

    def lookup(self, domain: str, op_type: str, opset: int, node_name: str = "") -> KernelDef:
        """The def serving this op at this opset. Otherwise an UnsupportedOpError that says
        what is registered instead: the opset range(s) of the op, the domain(s) that have
        it, or the nearest op names of the domain ("did you mean ...")."""
        key = _key(domain, op_type)
        domain = key[0]
        defs = self._defs.get(key)
        if not defs and key in self._pending:
            self._load(key)
            defs = self._defs.get(key)
        if not defs:
            raise UnsupportedOpError(
                op_type, domain, opset, node_name, self._missing(domain, op_type)
            )
        for d in defs:
            if d.covers(opset):
                return d
        ranges = _ranges(defs)
        word = "opset" if ranges.isdigit() else "opsets"
        raise UnsupportedOpError(
            op_type, domain, opset, node_name, f"kernels are registered for {word} {ranges} only"
        )

    def _missing(self, domain: str, op_type: str) -> str:
        """Why nothing serves ``op_type`` in ``domain``, with what comes closest."""
        self._load_all()
        detail = "no kernel for this op"
        elsewhere = sorted(d for d, op in self._defs if op == op_type)
        if elsewhere:
            named = ", ".join(repr(d or "ai.onnx") for d in elsewhere)
            detail += f"; it is registered in domain {named}"
        names = [op for d, op in self._defs if d == domain]
        close = _close_names(op_type, names)
        if close:
            detail += "; did you mean " + ", ".join(close) + "?"
        elif not names:
            domains = sorted({d for d, _ in self._defs})
            detail += f"; no kernels are registered in domain {domain or 'ai.onnx'!r} (domains: "
            detail += ", ".join(repr(d or "ai.onnx") for d in domains) + ")"
        return detail

    def has(self, domain: str, op_type: str, opset: int) -> bool:
        """Whether a kernel serves ``op_type`` at ``opset``."""
        key = _key(domain, op_type)
        if key in self._pending:
            self._load(key)
        return any(d.covers(opset) for d in self._defs.get(key, ()))

    def ops(self, domain: str | None = None) -> list[tuple[str, str]]:
        """Every (domain, op_type) registered, optionally of one domain, sorted."""
        self._load_all()
        return sorted(k for k in self._defs if domain is None or k[0] == domain)

    def copy(self) -> KernelRegistry:
        """An independent registry with the same kernels; what is still lazy here stays
        lazy there (each registry loads it into itself)."""
        other = KernelRegistry()
        with self._lock:
            other._defs = {k: list(v) for k, v in self._defs.items()}
            other._pending = dict(self._pending)
            other._lazy = dict(self._lazy)
        return other


def _key(domain: str, op_type: str) -> tuple[str, str]:
    """The registry's key of an op: ONNX's default domain spelled "" (as nodes carry it)."""
    return ("" if domain == "ai.onnx" else domain, op_type)


def _ranges(defs: list[KernelDef]) -> str:
    """The opsets ``defs`` (sorted by ``since``) cover, as people write them: ``8``,
    ``1..12``, ``13+``, adjacent ranges merged (``8`` and ``9+`` read ``8+``)."""
    spans: list[list[int | None]] = []
    for d in defs:
        last = spans[-1] if spans else None
        if last is not None and last[1] is not None and d.since == last[1] + 1:
            last[1] = d.until
        else:
            spans.append([d.since, d.until])
    parts = []
    for lo, hi in spans:
        parts.append(f"{lo}+" if hi is None else str(lo) if hi == lo else f"{lo}..{hi}")
    return ", ".join(parts)


def _close_names(op_type: str, names: list[str]) -> list[str]:
    """Up to three of ``names`` nearest to ``op_type`` (case-insensitive), best first."""
    import difflib  # here, on the error path: `import tfrt_py` does not pay for it

    by_lower: dict[str, str] = {}
    for n in sorted(names):
        by_lower.setdefault(n.lower(), n)
    hits = difflib.get_close_matches(op_type.lower(), list(by_lower), n=3, cutoff=0.6)
    return [by_lower[h] for h in hits]


def _overlaps(a: KernelDef, b: KernelDef) -> bool:
    a_hi = a.until if a.until is not None else 10**9
    b_hi = b.until if b.until is not None else 10**9
    return a.since <= b_hi and b.since <= a_hi


#: Every registry, for the fork handler.
_REGISTRIES: weakref.WeakSet[KernelRegistry] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A lock held by a parent's thread that does not exist in the child is held for ever:
    give each registry a new one (a unit the parent was loading is still pending here)."""
    for reg in list(_REGISTRIES):
        reg._lock = threading.RLock()
        reg._loading = set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
