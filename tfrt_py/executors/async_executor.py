"""The async executor as a model's Executor: feeds checked, the dataflow executor run on
the host, outputs made the caller's own.

``DataflowExecutor`` (``dataflow.py``) runs validated inputs and returns raw values; this
adds what every executor owes the caller: feed validation (``FeedChecker``), ``outputs=``
buffers, outputs that share memory with no feed, constant or other output
(``owned_outputs``), and a ``CallContext`` for deadlines and cancellation. A call to
``run_async`` always gets a context when the model iterates (Loop/Scan), so cancelling the
awaiting task stops a running Loop at its next iteration.

Threading: immutable after construction; any number of calls at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..calls import CallContext
from ..concurrency import HostContext, default_host
from ..feeds import FeedChecker, check_output_buffers, concat_prefixes, fill_outputs
from ..ir import Node
from ..kernels import KernelRegistry
from .base import Executor, yield_if_due
from .dataflow import DataflowExecutor
from .program import Program, constant_ids, owned_outputs

__all__ = ["AsyncExecutor"]

_ITERATING = frozenset({"Loop", "Scan", "SequenceMap"})


class AsyncExecutor(Executor):
    """Executor "async": the dataflow executor over ``program`` on ``host`` (None: the
    default host). ``expensive(node)`` is the cost model's classification; ``loop_budget``
    bounds the inline work on an event loop's thread (``DataflowExecutor``)."""

    name = "async"
    inline_why = "cheap kernels on the loop's thread, expensive ones on the host's pool"

    def __init__(
        self,
        program: Program,
        registry: KernelRegistry,
        check: FeedChecker,
        expensive: Callable[[Node], bool],
        host: HostContext | None = None,
        loop_budget: tuple[Callable[[Node], float], float] | None = None,
    ) -> None:
        graph = program.graph
        self.dataflow = DataflowExecutor(
            program, registry, expensive=expensive, loop_budget=loop_budget
        )
        self.host = host
        self._check = check
        self._out_names = [v.name for v in graph.outputs]
        self._out_types = [v.type for v in graph.outputs]
        self._prefixes = concat_prefixes(graph)  # outputs whose buffer may hold their feed
        self._const_ids = constant_ids(graph)
        self._iterates = any(n.op_type in _ITERATING for n in graph.walk())

    def run(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, Any]:
        return self._run(feeds, outputs, None)

    def run_call(
        self, feeds: Mapping[str, Any], outputs: Mapping[str, np.ndarray] | None, call: CallContext
    ) -> dict[str, Any]:
        return self._run(feeds, outputs, call)

    def _run(
        self,
        feeds: Mapping[str, Any],
        outputs: Mapping[str, np.ndarray] | None,
        call: CallContext | None,
    ) -> dict[str, Any]:
        args = self._check(feeds)
        if outputs is not None:
            check_output_buffers(outputs, self._out_names, args, self._prefixes)
        results = self.dataflow.run(args, self.host or default_host(), call)
        out = self._to_user(results, args)
        return out if outputs is None else fill_outputs(out, outputs, args, self._prefixes)

    async def run_async(
        self,
        feeds: Mapping[str, Any],
        call: CallContext | None = None,
        outputs: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Cheap kernels on this loop's thread, expensive ones on the pool, async kernels
        as tasks of this loop; ``outputs`` as ``run``'s."""
        args = self._check(feeds)
        if outputs is not None:
            check_output_buffers(outputs, self._out_names, args, self._prefixes)
        own = call is None and self._iterates
        if own:
            call = CallContext()
        try:
            results = await self.dataflow.run_async(args, self.host or default_host(), call)
        finally:
            if own:
                assert call is not None
                call.finish()
        await yield_if_due(self.call_us, self.loop_slice_us)  # if it ran inline, in part
        out = self._to_user(results, args)
        return out if outputs is None else fill_outputs(out, outputs, args, self._prefixes)

    def _to_user(self, results: list[Any], args: list[Any]) -> dict[str, Any]:
        values = owned_outputs(results, self._out_types, args, self._const_ids)
        return dict(zip(self._out_names, values))

    def describe_lines(self) -> list[str]:
        return [f"  executor: async ({self.why}; {self.dataflow.describe()})"]
