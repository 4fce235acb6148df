"""``ElementwiseChain(head, extra...)`` / ``ElementwiseChainShared``: a fused chain of
elementwise ops (``compiler/fuse_elementwise.py`` makes them).

Attribute ``steps`` (``domain.Step``) is applied in order, each step writing the running
result (the accumulator) into the output. The plain chain is registered ``inplace`` (its
output may reuse ``head``'s buffer): the fusion pass only makes one when ``head`` is read
by the first step alone; otherwise it makes the Shared one. Both support ``out=`` and offer
an inline form (``base.Inline``): the steps' NumPy calls as statements of the sync
interpreter's generated code, so a planned call pays no Python frame for the chain. Only
chains of at most ``MAX_INLINE_STEPS`` steps: past that one frame is nothing against the
steps' NumPy calls, and a chain of thousands of steps made the generated code (and its
compile, on a first call) as long as the chain.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import Cost, Inline, KernelContext, KernelFlags
from ..registry import KernelRegistry
from .domain import DOMAIN, Step
from .steps import build_step, step_code

__all__ = ["MAX_INLINE_STEPS", "register_kernels"]

#: Longer chains are called, not inlined into the sync interpreter's generated code.
MAX_INLINE_STEPS = 64


def _chain(registry: KernelRegistry) -> Any:
    def build(ctx: KernelContext) -> Any:
        steps: list[Step] = list(ctx.attr("steps"))
        fns = [build_step(ctx, registry, s) for s in steps]
        plan = [(fn, s[3]) for fn, s in zip(fns, steps)]

        def chain(*xs: Any, out: np.ndarray | None = None) -> np.ndarray:
            acc = xs[0]
            for fn, refs in plan:
                acc = fn(*[acc if r < 0 else xs[r] for r in refs], out=out)
                if out is None and type(acc) is not np.ndarray:
                    acc = np.asarray(acc)  # a 0-d result came back as a NumPy scalar
                out = acc
            return acc

        def inline(in_shapes: list[Any], out_shape: Any, dtype: Any) -> Inline | None:
            env: dict[str, Any] = {}
            lines: list[str] = []
            for i, (s, fn) in enumerate(zip(steps, fns)):
                acc = "{in0}" if i == 0 else "{out}"
                args = [acc if r < 0 else f"{{in{r}}}" for r in s[3]]
                lines += step_code(s[0], fn, args, "{out}", dtype, env, f"step{i}")
            return Inline(lines, env)

        if len(steps) <= MAX_INLINE_STEPS:
            ctx.offer_inline(inline)
        return chain

    return build


def _chain_cost(
    ctx: KernelContext, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]
) -> Cost:
    y = float(np.prod(outs[0])) if outs else 0.0
    n = len(ctx.attr("steps", []))
    return Cost(n * y, 4.0 * (sum(float(np.prod(s)) for s in ins) + y))


def register_kernels(registry: KernelRegistry) -> None:
    """Register the chains into ``registry``; their steps are built from ``registry``."""
    registry.add(
        "ElementwiseChain",
        _chain(registry),
        domain=DOMAIN,
        flags=KernelFlags(supports_out=True, inplace=True),
        cost=_chain_cost,
    )
    registry.add(
        "ElementwiseChainShared",
        _chain(registry),
        domain=DOMAIN,
        flags=KernelFlags(supports_out=True),
        cost=_chain_cost,
    )
