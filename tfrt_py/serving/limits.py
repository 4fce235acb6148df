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
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_PRIORITY",
    "DEFAULT_TIMEOUT_S",
    "DRAIN_TIMEOUT_S",
    "EXIT_GRACE_S",
    "INLINE_DECODE_BYTES",
    "INLINE_ENCODE_BYTES",
    "JSON_MAX_FLOAT_CHARS",
    "JSON_MAX_INT_DIGITS",
    "MAX_HEAD_BYTES",
    "MAX_NAMES_IN_ERRORS",
    "MAX_PRIORITY",
    "MAX_RETRY_AFTER_S",
    "MAX_TENSOR_RANK",
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

#: Model calls of one model in flight at once (``max_concurrency`` / ``--max-concurrency``;
#: a loaded model's own ``load(max_concurrency=)`` wins). One: heavy calls are BLAS calls
#: and BLAS already uses the cores (4 concurrent 1-row calls of a 2.6 MFLOP MLP ran 7x
#: slower than 1 at a time on 2 cores); cheap calls run inline on the loop anyway.
DEFAULT_MAX_CONCURRENCY = 1

#: Requests of one model waiting for a slot (or in its micro-batcher's queue) at most; one
#: more is refused at once with 503 and ``Retry-After`` (``max_queue`` / ``--max-queue``).
DEFAULT_MAX_QUEUE = 128

#: The priority level of a request that names none (or priority 0), as Triton's clients
#: send it: lower levels run first, 1 is the highest; so 1..99 go ahead of requests
#: without a priority and 101.. after them.
DEFAULT_PRIORITY = 100

#: The largest priority a request may name (Triton's field is a uint64).
MAX_PRIORITY = 2**64 - 1

#: A 503's ``Retry-After`` (seconds): the estimated wait for the queue ahead, at least 1
#: and at most this.
MAX_RETRY_AFTER_S = 60

#: A tensor in a v2 request has at most this many dims (NumPy's own limit).
MAX_TENSOR_RANK = 64

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
