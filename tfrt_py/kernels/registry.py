"""The kernel registry: (domain, op type, opset range) -> kernel builder.

Family subpackages register explicitly (``register_kernels(registry)``, as TFRT's static
registration); ``families.default_registry()`` builds the full registry once, on first use.
This module imports only ``base`` and ``errors``: the families import it, never the reverse.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import UnsupportedOpError
from .base import Cost, KernelBuilder, KernelContext, KernelFlags

__all__ = ["CostFn", "KernelDef", "KernelRegistry"]

_PURE = KernelFlags()

CostFn = Callable[[KernelContext, list[tuple[int, ...]], list[tuple[int, ...]]], Cost]


@dataclass(frozen=True, slots=True)
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
    """Maps (domain, op_type) to kernel defs. Filled at start-up, read-only after; lookups
    are thread-safe because nothing mutates the registry once built."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, str], list[KernelDef]] = {}

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
        domain = "" if domain == "ai.onnx" else domain
        new = KernelDef(domain, op_type, since, until, build, flags, cost)
        defs = self._defs.setdefault((domain, op_type), [])
        defs[:] = [d for d in defs if not _overlaps(d, new)]
        defs.append(new)
        defs.sort(key=lambda d: d.since)

    def lookup(self, domain: str, op_type: str, opset: int, node_name: str = "") -> KernelDef:
        """The def serving this op at this opset. Otherwise an UnsupportedOpError that says
        what is registered instead: the opset range(s) of the op, the domain(s) that have
        it, or the nearest op names of the domain ("did you mean ...")."""
        domain = "" if domain == "ai.onnx" else domain
        defs = self._defs.get((domain, op_type))
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
        defs = self._defs.get(("" if domain == "ai.onnx" else domain, op_type), ())
        return any(d.covers(opset) for d in defs)

    def ops(self, domain: str | None = None) -> list[tuple[str, str]]:
        """Every (domain, op_type) registered, optionally of one domain, sorted."""
        return sorted(k for k in self._defs if domain is None or k[0] == domain)

    def copy(self) -> KernelRegistry:
        other = KernelRegistry()
        other._defs = {k: list(v) for k, v in self._defs.items()}
        return other


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
    by_lower: dict[str, str] = {}
    for n in sorted(names):
        by_lower.setdefault(n.lower(), n)
    hits = difflib.get_close_matches(op_type.lower(), list(by_lower), n=3, cutoff=0.6)
    return [by_lower[h] for h in hits]


def _overlaps(a: KernelDef, b: KernelDef) -> bool:
    a_hi = a.until if a.until is not None else 10**9
    b_hi = b.until if b.until is not None else 10**9
    return a.since <= b_hi and b.since <= a_hi
