"""The native tier's compile budget: numba's compile time and memory grow faster than
linearly with the generated function (a 300-node chain took 18 s, a 1000-step fused chain
71 s and 1.9 GB; 5000 nodes never finished), so a model whose function would be too big
is not compiled.

The measure is *compile units*: one per line of code of the generated function, plus
``LIBM_UNITS`` per call of a vectorized math function (``np.exp``, ``np.tanh``, ``**``,
``kern_math.expf``, ...; each expands into a long instruction sequence LLVM then
optimizes). ``DEFAULT_BUDGET`` units compile in roughly 10 s on one core.
``$TFRT_PY_NATIVE_BUDGET`` sets another budget (a positive integer;
``executor="native"``'s error says how many units a model needs).

``precheck(graph)`` bounds the units from below without generating code (every lowered
node but a view or a Linear layer, which may join a stacked run, makes at least one line
per step) so a huge graph is declined at once; ``check(source)`` measures the generated
module. Both raise ``OverBudget`` (a ``Declined``: ``executor="auto"`` stays on the sync
interpreter and ``describe()`` says why). Pure functions; thread-safe.
"""

from __future__ import annotations

import os
import re

from ...ir import Graph
from .registry import lowerings
from .source import Declined

__all__ = ["BUDGET_ENV", "DEFAULT_BUDGET", "LIBM_UNITS", "OverBudget", "budget", "check",
           "precheck", "units"]  # fmt: skip

BUDGET_ENV = "TFRT_PY_NATIVE_BUDGET"
DEFAULT_BUDGET = 1500
LIBM_UNITS = 16
_NOT_CODE = re.compile(r"^[ \t]*(?:#[^\n]*)?$", re.M)
_LIBM = re.compile(r"np\.(?:exp|expm1|log|tanh|sin|cos)\(|\bexpf(?:_neg|_rn)?\(|\*\*")


class OverBudget(Declined):
    """The generated function would exceed the native compile budget."""


def budget() -> int:
    """The budget in compile units: ``$TFRT_PY_NATIVE_BUDGET`` or ``DEFAULT_BUDGET``
    (Declined naming the variable if it is not a positive integer)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise Declined([f"${BUDGET_ENV} must be a positive integer, got {raw!r}"])
    return value


def units(source: str) -> int:
    """The compile units of a generated module: the lines of code of its functions (from
    the first ``@njit``; comments and blank lines compile to nothing: a decoder step's
    folded shape arithmetic leaves a ``# node N: folded`` line per node) plus
    ``LIBM_UNITS`` per math-library call."""
    body = source.split("\n@njit(", 1)[-1]
    code = body.count("\n") - len(_NOT_CODE.findall(body))
    return code + LIBM_UNITS * len(_LIBM.findall(body))


def _refuse(need: str, limit: int) -> OverBudget:
    return OverBudget([
        f"over the native compile budget: the generated function needs {need} compile "
        f"units (a line each, {LIBM_UNITS} per math call), the budget is {limit} (about "
        f"10 s of numba compile; time and memory grow faster than linearly); set "
        f"${BUDGET_ENV} to raise it"
    ])  # fmt: skip


def precheck(graph: Graph, limit: int) -> None:
    """OverBudget when ``graph`` surely needs more than ``limit`` units."""
    reg = lowerings()
    low = 0
    for n in graph.nodes:
        record = reg.get(n.domain, n.op_type)
        low += 1 if record is None else record.units(n)
    if low > limit:
        raise _refuse(f"at least {low}", limit)


def check(source: str, limit: int) -> int:
    """The module's units; OverBudget when they exceed ``limit``."""
    need = units(source)
    if need > limit:
        raise _refuse(str(need), limit)
    return need
