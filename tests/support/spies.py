"""Recording the calls of a function a test wants to see taken (which plan a kernel ran
with, which weights reached a path): the function still runs; ``pick`` chooses what of
each call's arguments is kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def record_calls(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    pick: Callable[..., Any] = lambda first, *rest: first,
) -> list[Any]:
    """Replace ``module.name`` (for the test) by a wrapper that appends ``pick(*args)`` to
    the returned list, then calls the real function."""
    seen: list[Any] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(pick(*args))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen
