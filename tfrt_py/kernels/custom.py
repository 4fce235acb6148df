"""The user's kernels over the built-in ones: ``load(..., custom_kernels={(domain, op_type):
fn})``.

``with_custom`` copies a registry and adds each callable as the kernel of its op, over a
built-in one of the same name (lazy or not: ``KernelRegistry.add``), then adds the fused
ops again, lazily, so that their elementwise steps resolve against the copy and a custom
kernel replaces a built-in one inside a fused chain too. Runs at load, on the caller's
thread; the registry it returns is read-only afterwards.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .base import KernelContext, KernelFlags
from .families import add_family
from .registry import KernelRegistry

__all__ = ["CustomKernels", "with_custom"]

CustomKernels = Mapping[tuple[str, str], Callable[..., Any]]


def with_custom(base: KernelRegistry, custom: CustomKernels | None) -> KernelRegistry:
    """``base`` with the user's kernels over it (``load(custom_kernels=...)``): a copy,
    ``base`` itself when there are none. ValueError for anything but a mapping of
    (domain, op_type) tuples to callables. A kernel may be a plain function (called with
    the inputs, and the node's attributes as keywords) or an ``async def`` (awaited on the
    loop by the async executor); it is impure (never folded or shared)."""
    if custom is None:
        return base
    if not isinstance(custom, Mapping):
        raise ValueError(
            "custom_kernels must be a mapping {(domain, op_type): kernel}, got a "
            f"{type(custom).__name__}"
        )
    if not custom:
        return base
    reg = base.copy()
    for key, fn in custom.items():
        if not (isinstance(key, tuple) and len(key) == 2 and callable(fn)):
            raise ValueError(
                f"custom_kernels maps (domain, op_type) tuples to callables, got {key!r}: {fn!r}"
            )
        domain, op_type = key
        is_async = inspect.iscoroutinefunction(fn)
        reg.add(
            op_type,
            _custom_builder(fn, is_async),
            domain=domain,
            flags=KernelFlags(pure=False, is_async=is_async),
        )
    add_family(reg, "fused")  # again: the fused ops' steps resolve against the custom kernels
    return reg


def _custom_builder(fn: Callable[..., Any], is_async: bool) -> Callable[[KernelContext], Any]:
    def build(ctx: KernelContext) -> Any:
        attrs = dict(ctx.attrs)
        n_out = ctx.n_outputs
        if is_async:
            if not attrs and n_out == 1:
                return fn

            async def call_async(*xs: Any) -> Any:
                r = await fn(*xs, **attrs)
                return r if n_out == 1 else tuple(r)

            return call_async
        if not attrs:
            if n_out == 1:
                return fn
            return lambda *xs: tuple(fn(*xs))

        def call(*xs: Any) -> Any:
            r = fn(*xs, **attrs)
            return r if n_out == 1 else tuple(r)

        return call

    return build
