"""RequestError (a refused request: HTTP status and a message for the client) and helpers
for messages that stay short whatever the client sent. Pure: thread-safe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .limits import MAX_NAMES_IN_ERRORS

__all__ = ["RequestError", "names_list"]


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx, or 503 when overloaded), a message for
    the client, and extra response ``headers`` (``Retry-After`` with a 503)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def names_list(names: Sequence[str], limit: int = MAX_NAMES_IN_ERRORS) -> str:
    """``names`` as a list for an error message: at most ``limit`` of them (each cut to 100
    characters), then how many more."""
    shown = [n if len(n) <= 100 else n[:100] + "..." for n in names[:limit]]
    more = len(names) - len(shown)
    return f"{shown}" + (f" and {more} more" if more > 0 else "")
