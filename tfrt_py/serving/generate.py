"""Triton's generate extension over a served KV-cache decoder (``Model.generate_async``):

* ``POST /v2/models/{name}[/versions/{v}]/generate`` -- one JSON answer;
* ``POST /v2/models/{name}[/versions/{v}]/generate_stream`` -- server-sent events, one
  ``data: {...}`` event per generated token.

Request: ``{"id"?, "input_ids": [ints] | [[ints], ...], "text_input"?: str | [str],
"parameters"?: {...}}``; top-level keys other than these count as parameters, as the
extension says. Parameters: ``max_tokens`` (or ``max_new_tokens``; default 16),
``temperature``, ``top_k``, ``top_p``, ``seed`` (any of these samples unless ``do_sample``
is false), ``do_sample``, ``end_id``/``eos_token_id``, ``pad_id``/``pad_token_id``,
``exclude_input_in_output``, ``timeout`` (µs, as ``/infer``'s), ``stream`` (ignored: the
route decides). Text in and out needs the ``tokenizers`` package and a ``tokenizer.json``
in the model file's directory (read once, at most ``TOKENIZER_MAX_BYTES``).

Answer: ``{"id"?, "model_name", "model_version", "output_ids": [...], "text_output"?}``
(``output_ids`` a list per row for a batch); each stream event has the step's token(s)
(and the text they add: a line's tokens are decoded together, so each event costs the
line, not the whole text). At most ``MAX_GENERATIONS`` run per model at once (then 503
with Retry-After). Errors before the first token are 4xx/5xx ``{"error": ...}``
(400 for anything ``generate`` refuses, naming it); an error after it is a last event
``{"error": ...}`` (the status line went out with the first). A client that hangs up
cancels its generation at the step in flight: no step runs for a reader that is gone.
Each request has the server's deadline (or the tighter ``timeout``): 504 before the first
token, an error event after.

Runs on the event loop, in the request's task; each step is a ``run_async`` of the model.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..errors import DeadlineExceeded, InputError, TfrtError
from ..generation import start
from .codec import load_json
from .errors import RequestError
from .gen_batching import GenerationBatcher
from .handling import Deadline, counted, errors_as_json, json_response, read_in_time, served_model
from .hub import ModelServer
from .served import ServedModel

__all__ = ["MAX_GENERATIONS", "TOKENIZER_MAX_BYTES", "generate_routes"]

#: The largest ``tokenizer.json`` read beside a model.
TOKENIZER_MAX_BYTES = 64 << 20
DEFAULT_MAX_TOKENS = 16
_PARAMETER_NAMES = {
    "max_tokens": "max_new_tokens", "max_new_tokens": "max_new_tokens",
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed",
    "do_sample": "do_sample", "end_id": "eos_token_id", "eos_token_id": "eos_token_id",
    "pad_id": "pad_token_id", "pad_token_id": "pad_token_id",
}  # fmt: skip
_SAMPLING = {"temperature", "top_k", "top_p", "seed"}
_IGNORED = {"stream", "exclude_input_in_output", "timeout"}
#: The most generations one served model runs at once: each holds a cache of up to
#: ``generation.MAX_CACHE_BYTES``, so a stranger's requests must not add them unbounded
#: (more wait for a 503's Retry-After).
MAX_GENERATIONS = 64
_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_batchers: weakref.WeakKeyDictionary[Any, GenerationBatcher] = weakref.WeakKeyDictionary()
_live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # per served model


def generate_routes(server: ModelServer) -> list[Route]:
    """The generate and generate_stream routes, with and without a version."""

    async def generate(request: Request) -> Response:
        job = await _Job.read(server, request)
        made = [tok async for tok in job.tokens()]
        return json_response(job.answer(made))

    async def generate_stream(request: Request) -> Response:
        job = await _Job.read(server, request)
        return StreamingResponse(job.events(), media_type="text/event-stream; charset=utf-8")

    one = counted(server, "generate", errors_as_json(generate))
    stream = counted(server, "generate", errors_as_json(generate_stream))
    routes = []
    for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes.append(Route(base + "/generate", one, methods=["POST"]))
        routes.append(Route(base + "/generate_stream", stream, methods=["POST"]))
    return routes


class _Job:
    """One checked generate request: the model, its prompt, its options, its deadline."""

    def __init__(
        self,
        model: ServedModel,
        doc: dict[str, Any],
        prompt: Any,
        tokenizer: Any,
        options: dict[str, Any],
        deadline: Deadline,
        keep_input: bool,
    ) -> None:
        self.model = model
        self.doc = doc
        self.prompt = prompt
        self.tokenizer = tokenizer
        self.deadline = deadline
        self.keep_input = keep_input
        self.flat = not prompt or not isinstance(prompt[0], list)
        left = deadline.remaining()
        if left is not None and left <= 0:
            raise RequestError(504, f"the deadline of {deadline.timeout or 0:g} s passed "
                                    "before the generation started")  # fmt: skip
        if _live.get(model, 0) >= MAX_GENERATIONS:
            raise RequestError(503, f"model {model.name!r} runs {MAX_GENERATIONS} generations "
                                    "already; retry later", {"Retry-After": "1"})  # fmt: skip
        try:  # everything generate refuses is refused here, before a status line goes out
            self.stream = _generations(model, prompt, left, options)
        except (InputError, TypeError) as e:
            raise RequestError(400, f"model {model.name!r}: {e}") from None
        _live[model] = _live.get(model, 0) + 1  # given back when the job goes (_release)
        self._release = weakref.finalize(self, _release, weakref.ref(model))

    @classmethod
    async def read(cls, server: ModelServer, request: Request) -> _Job:
        model = served_model(server, request, request.path_params.get("version"))
        refused = model.overloaded()
        if refused is not None:
            raise refused
        deadline = Deadline(server.timeout)
        doc = load_json(await read_in_time(request, server, deadline), "generate request")
        if not isinstance(doc, dict):
            raise RequestError(400, "the generate request must be a JSON object")
        params = doc.get("parameters", {})
        if not isinstance(params, dict):
            raise RequestError(400, "parameters must be a JSON object")
        extra = {k: v for k, v in doc.items()
                 if k not in ("id", "input_ids", "text_input", "parameters")}  # fmt: skip
        params = {**extra, **params}
        unknown = sorted(set(params) - set(_PARAMETER_NAMES) - _IGNORED)
        if unknown:
            raise RequestError(400, f"unknown parameters {unknown[:8]!r:.200}; known: "
                                    f"{sorted(set(_PARAMETER_NAMES) | _IGNORED)}")  # fmt: skip
        timeout = params.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
                raise RequestError(400, "parameters.timeout must be a positive integer (µs)")
            deadline.tighten(timeout / 1e6)
        options = {_PARAMETER_NAMES[k]: v for k, v in params.items() if k in _PARAMETER_NAMES}
        options.setdefault("max_new_tokens", DEFAULT_MAX_TOKENS)
        if "do_sample" not in options and _SAMPLING & set(params):
            options["do_sample"] = True
        tokenizer = None
        if "text_input" in doc:
            if "input_ids" in doc:
                raise RequestError(400, "give input_ids or text_input, not both")
            tokenizer = _tokenizer(model)
            prompt = _encode(tokenizer, doc["text_input"])
        elif "input_ids" in doc:
            prompt = doc["input_ids"]
        else:
            raise RequestError(400, "the generate request needs input_ids or text_input")
        keep = not bool(params.get("exclude_input_in_output", False))
        return cls(model, doc, prompt, tokenizer, options, deadline, keep)

    async def tokens(self) -> AsyncIterator[Any]:
        """The generation's tokens; its errors as RequestErrors (504 for the deadline).
        Its slot among the model's ``MAX_GENERATIONS`` is given back when it ends."""
        try:
            async for tok in self.stream:
                yield tok
        except DeadlineExceeded:
            limit = self.deadline.timeout or 0
            msg = f"did not finish generating within the deadline of {limit:g} s"
            raise RequestError(504, f"model {self.model.name!r} {msg}") from None
        except InputError as e:
            raise RequestError(400, f"model {self.model.name!r}: {e}") from None
        except TfrtError as e:
            msg = f"failed on this input: {e}"
            raise RequestError(422, f"model {self.model.name!r} {msg}") from None
        finally:
            self._release()

    def _head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"model_name": self.model.name, "model_version": self.model.version}
        if isinstance(self.doc.get("id"), str):
            head = {"id": self.doc["id"][:256], **head}
        return head

    def answer(self, made: list[Any]) -> dict[str, Any]:
        """The /generate answer for the tokens ``made``."""
        if self.flat:
            new = [int(t) for t in made]
            ids = (list(self.prompt) if self.keep_input else []) + new
        else:
            rows = [[int(step[r]) for step in made] for r in range(len(self.prompt))]
            ids = [(list(p) if self.keep_input else []) + r for p, r in zip(self.prompt, rows)]
        out = {**self._head(), "output_ids": ids}
        if self.tokenizer is not None:
            out["text_output"] = (self.tokenizer.decode(ids) if self.flat
                                  else [self.tokenizer.decode(r) for r in ids])  # fmt: skip
        return out

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE body: one event per step; an error event ends a failed generation."""
        head = self._head()
        try:
            if self.flat and self.tokenizer is None:  # the usual event: its head made once
                start = b"data: " + json.dumps(head)[:-1].encode() + b', "output_ids": ['
                async for tok in self.tokens():
                    yield b"%s%d]}\n\n" % (start, tok)
                return
            window: list[int] = []  # the tokens since the last newline, decoded together
            text = ""  # what they decoded to
            async for tok in self.tokens():
                event: dict[str, Any] = {**head, "output_ids": [int(tok)] if self.flat
                                         else [int(t) for t in tok]}  # fmt: skip
                if self.tokenizer is not None and self.flat:
                    window.append(int(tok))
                    now = self.tokenizer.decode(window)
                    event["text_output"], text = now[len(text) :], now
                    if now.endswith("\n"):  # as transformers' TextStreamer: a line is done
                        window, text = [], ""
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
        except RequestError as e:
            yield b"data: " + json.dumps({**head, "error": e.message}).encode() + b"\n\n"


def _release(model: weakref.ref[Any]) -> None:
    """A job's slot given back (once: ``weakref.finalize`` runs its function once)."""
    m = model()
    if m is not None and _live.get(m, 0) > 0:
        _live[m] -= 1


def _generations(model: ServedModel, prompt: Any, left: float | None,
                 options: dict[str, Any]) -> AsyncIterator[Any]:  # fmt: skip
    """The tokens of one request's generation: through the model's GenerationBatcher (its
    steps batched with the other streams') for one prompt on a decoder that fits, else
    ``generate_async`` on its own. Raises what ``generate`` refuses."""
    m = model.model
    flat = bool(prompt) and not isinstance(prompt[0], list)
    if not flat or not GenerationBatcher.fits(m):
        return m.generate_async(prompt, timeout=left, **options)
    kw: Any = {k: v for k, v in options.items() if k != "max_new_tokens"}
    kw["timeout"] = left
    steps, _, deadline = start(m, prompt, options["max_new_tokens"], kw, in_place=False)
    batcher = _batchers.get(model)
    if batcher is None:
        batcher = _batchers[model] = GenerationBatcher(m)
    return batcher.stream(steps, deadline, flat=True)


def _tokenizer(model: ServedModel) -> Any:
    """The ``tokenizers.Tokenizer`` of ``tokenizer.json`` beside the model file (cached per
    served model); 400 saying what is missing."""
    tok = _tokenizers.get(model)
    if tok is not None:
        return tok
    origin = getattr(model.model, "_origin", "")
    path = os.path.join(os.path.dirname(os.path.abspath(origin)), "tokenizer.json")
    if not origin or not os.path.isfile(origin) or not os.path.isfile(path):
        raise RequestError(400, f"model {model.name!r} has no tokenizer.json beside its file: "
                                "send input_ids")  # fmt: skip
    try:
        import tokenizers
    except ImportError:
        raise RequestError(400, "text_input needs the tokenizers package (pip install "
                                "'tfrt-py[text]'); send input_ids") from None  # fmt: skip
    if os.path.getsize(path) > TOKENIZER_MAX_BYTES:
        raise RequestError(400, f"model {model.name!r}: tokenizer.json is over "
                                f"{TOKENIZER_MAX_BYTES >> 20} MiB")  # fmt: skip
    try:
        with open(path, encoding="utf-8") as f:
            tok = tokenizers.Tokenizer.from_str(f.read())
    except Exception as e:  # noqa: BLE001 - a bad file is the request's answer, not a crash
        raise RequestError(400, f"model {model.name!r}: tokenizer.json does not load: "
                                f"{str(e)[:200]}") from None  # fmt: skip
    _tokenizers[model] = tok
    return tok


def _encode(tokenizer: Any, text: Any) -> Any:
    if isinstance(text, str):
        return tokenizer.encode(text).ids
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return [tokenizer.encode(t).ids for t in text]
    raise RequestError(400, "text_input must be a string or a list of strings")
