"""What the native tier knows of one op: one record per (domain, op type).

An ``OpLowering`` carries everything the tier's passes ask of an op: how to emit its code
(``emit``), whether rows mode may loop over a dynamic batch through it (``rows``), whether
it is a view (its output is its input's memory: no code), whether its code may call BLAS
(``product``: rows mode's tiles), whether its code for many rows beats its row body without
BLAS (``grouped``: rows mode's tiles too) and its weight in the compile budget's lower bound
(``weight``). An elementwise op's scalar form is not a field: fused chains need it by op
name for steps that are no node of the graph, so it stays ``scalar.SCALAR_OPS``, the one
table, which ``ops`` registers every elementwise op from. The ops
modules (``ops``, ``ops_tx``, ``ops_ml``) each register theirs with
``register_lowerings(registry)``; ``registry.lowerings()`` collects them once. Adding an
op is one ``add`` call next to its emitter.

Load time; the records are immutable once collected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...ir import Node
from ...records import record

__all__ = ["Emitter", "OpLowering", "Registry", "RowRule"]

#: ``emit(cx, node) -> lines``: the node's numba code (``context.NodeContext``).
Emitter = Callable[[Any, Node], list[str]]
#: ``rule(node, rank, batched) -> bool``: whether each output row depends only on the same
#: row of the inputs, given which inputs are batched (``rowwise.check_rows``).
RowRule = Callable[[Node, int, list[bool]], bool]


@record(frozen=True, slots=True)
class OpLowering:
    """One op's lowering. ``emit`` is None for a view. ``rows`` None: rows mode declines
    a graph that runs the op on batched values. ``weight``: compile units the op needs at
    least (``budget.precheck``): an int, or a function of the node."""

    emit: Emitter | None
    rows: RowRule | None = None
    view: bool = False
    product: bool = False
    weight: int | Callable[[Node], int] = 1
    grouped: bool = False

    def units(self, node: Node) -> int:
        """The op's lower bound in compile units for ``node``."""
        return self.weight if isinstance(self.weight, int) else self.weight(node)


class Registry:
    """(domain, op type) -> ``OpLowering``; ``add`` refuses a second record for an op."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], OpLowering] = {}

    def add(
        self,
        domain: str,
        op_type: str,
        emit: Emitter | None = None,
        *,
        rows: RowRule | None = None,
        view: bool = False,
        product: bool = False,
        weight: int | Callable[[Node], int] = 1,
        grouped: bool = False,
    ) -> None:
        key = (domain, op_type)
        if key in self._records:
            raise ValueError(f"a native lowering for {domain}::{op_type} is registered twice")
        if (emit is None) != view:
            raise ValueError(f"{domain}::{op_type}: a view has no emitter, any other op one")
        self._records[key] = OpLowering(emit, rows, view, product, weight, grouped)

    def get(self, domain: str, op_type: str) -> OpLowering | None:
        return self._records.get((domain, op_type))

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._records

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._records)
