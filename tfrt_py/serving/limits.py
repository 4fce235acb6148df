"""The limits a server puts on requests from strangers: names and defaults, in one place.

Each is a constant here (the default) and, where it is per server, an argument of
``ModelServer`` / ``create_app`` and an option of ``tfrt-py serve`` (docs/security.md
lists them). Pure data: no state, thread-safe.
"""

from __future__ import annotations

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DECODED_BYTES_FACTOR",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_TIMEOUT_S",
    "DRAIN_TIMEOUT_S",
    "EXIT_GRACE_S",
    "INLINE_DECODE_BYTES",
    "INLINE_ENCODE_BYTES",
    "JSON_MAX_FLOAT_CHARS",
    "JSON_MAX_INT_DIGITS",
    "MAX_HEAD_BYTES",
    "MAX_NAMES_IN_ERRORS",
    "decoded_limit",
]

#: A request body larger than this is refused (413) before it is read (Content-Length) or
#: as soon as a chunked body passes it. ``max_body_bytes`` / ``--max-body-bytes``.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

#: The arrays decoded from one body (.npy/.npz data after decompression, as the headers
#: declare it and as it is actually read) may hold at most this many times the body limit.
#: ``max_decoded_bytes`` / ``--max-decoded-bytes`` set the product directly.
DECODED_BYTES_FACTOR = 4

#: Per-request deadline (seconds): reading the body (408 when it passes) and running the
#: model (504, naming the model). ``timeout`` / ``--timeout``.
DEFAULT_TIMEOUT_S = 30.0

#: Bodies up to this size are decoded on the event loop (a thread hop costs more); larger
#: ones on the server's decode threads, so the loop keeps answering other requests.
INLINE_DECODE_BYTES = 64 * 1024

#: Outputs (total array bytes) up to this size are encoded on the event loop; larger ones
#: on the decode threads.
INLINE_ENCODE_BYTES = 64 * 1024

#: A JSON integer with more digits than this is refused (400): no dtype holds one
#: (float64's largest finite value has 309 digits), and int() of a long one is quadratic.
JSON_MAX_INT_DIGITS = 320

#: A JSON number with a fraction or exponent longer than this many characters is refused.
JSON_MAX_FLOAT_CHARS = 400

#: The request line plus headers of one request (bytes of URL, names and values) may hold
#: at most this much; more is refused with 431 and the connection closed.
MAX_HEAD_BYTES = 64 * 1024

#: Error messages list at most this many offending names (unknown inputs, ...).
MAX_NAMES_IN_ERRORS = 8

#: On SIGTERM/SIGINT, requests in flight get this long to finish (uvicorn's graceful
#: shutdown) before they are cancelled. ``drain_timeout`` / ``--drain-timeout``.
DRAIN_TIMEOUT_S = 5.0

#: At shutdown, model calls still running (their requests already cancelled) get this long
#: to finish before the server stops waiting for them. ``ModelServer(close_timeout=)``.
CLOSE_TIMEOUT_S = 2.0

#: After the drain, this long for the app to shut down (models' threads to stop) before
#: the process exits anyway (a call stuck in a model that ignores its deadline).
EXIT_GRACE_S = 5.0


def decoded_limit(max_body_bytes: int, max_decoded_bytes: int | None) -> int:
    """The decoded-bytes limit: ``max_decoded_bytes``, or the body limit times
    ``DECODED_BYTES_FACTOR`` when it is None."""
    if max_decoded_bytes is None:
        return int(max_body_bytes) * DECODED_BYTES_FACTOR
    return int(max_decoded_bytes)
