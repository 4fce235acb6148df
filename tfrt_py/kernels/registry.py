"""The kernel registry: (domain, op type, opset range) -> kernel builder.

Family subpackages register explicitly (``register_kernels(registry)``, as TFRT's static
registration); ``families.default_registry()`` builds the full registry once, on first use.
This module imports only ``base`` and ``errors``: the families import it, never the reverse.
"""

from __future__ import annotations

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
        """The def serving this op at this opset; UnsupportedOpError names what is missing."""
        domain = "" if domain == "ai.onnx" else domain
        defs = self._defs.get((domain, op_type))
        if not defs:
            raise UnsupportedOpError(op_type, domain, opset, node_name, "no kernel for this op")
        for d in defs:
            if d.covers(opset):
                return d
        ranges = ", ".join(f"{d.since}..{d.until or ''}" for d in defs)
        raise UnsupportedOpError(
            op_type, domain, opset, node_name, f"kernels exist for opsets {ranges}"
        )

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


def _overlaps(a: KernelDef, b: KernelDef) -> bool:
    a_hi = a.until if a.until is not None else 10**9
    b_hi = b.until if b.until is not None else 10**9
    return a.since <= b_hi and b.since <= a_hi
