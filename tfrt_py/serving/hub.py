"""ModelServer: the models an app serves, their policies, loading, swapping and readiness.

Who owns what: a ModelServer owns its ServedModels (by name, the version it serves), the
set of model-call tasks in flight (``calls``, across versions swapped out), the metrics
(``metrics``), ``DECODE_THREADS`` threads that decode large request bodies and encode
large responses (``body``), and the request limits (``limits``: body and decoded bytes,
the deadline, concurrency and queue per model). Models may be given loaded
(``tfrt_py.Model``: load before forking workers, gunicorn ``--preload`` style, and the
weights stay shared), as sources, or found in a ``ModelRepository`` (a directory).

Lifecycle: ``start()`` (a thread; once) loads, picks each policy and warms each model with
one call; ``ready`` is true when every model not unloaded is warmed. ``load_model`` /
``unload_model`` (the repository API, on the event loop) load or drop one model while the
others serve: a new version is loaded and warmed on a thread, then swapped in with one
dict store, so new requests go to it while requests already holding the old one finish
on it. ``drain()`` (on the loop, at shutdown) waits ``close_timeout`` for model calls in
flight, then cancels the rest; ``close()`` (any thread) stops the decode threads.
``get`` is safe from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ..records import record
from .batching import MODES, choose_policy
from .errors import RequestError
from .limits import (
    CLOSE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_QUEUE,
    DEFAULT_TIMEOUT_S,
    decoded_limit,
)
from .metrics import ServerMetrics, share_across_workers
from .repository import ModelRepository, check_name
from .served import GenerationWarmup, ServedModel

__all__ = [
    "DECODE_THREADS",
    "DEFAULT_MAX_BODY_BYTES",
    "MODEL_CONTROL",
    "ModelConfig",
    "ModelServer",
]

#: ``model_control``: "none" (the repository API may not load or unload: a stranger could
#: unload every model, or make the server load them over and over) or "explicit" (it may),
#: as Triton's --model-control-mode.
MODEL_CONTROL = ("none", "explicit")

#: Threads decoding large bodies / encoding large responses: bounds how many decoded
#: bodies are in memory at once.
DECODE_THREADS = 2


@record(frozen=True)
class ModelConfig:
    """One model to serve: ``source`` (a path, bytes, ONNX proto or a loaded
    ``tfrt_py.Model``), the ``version`` it is served as, and per-model overrides of the
    server's batching defaults (``batching``: "auto" | "on" | "off"; None: the server's)."""

    source: Any
    batching: str | None = None
    max_batch: int | None = None
    max_wait_us: int | None = None
    executor: str = "auto"
    version: str = "1"


class ModelServer:
    """The served models by name. ``models`` maps names to ModelConfigs or bare sources;
    ``repository`` (a directory or ModelRepository) adds the models found there and lets
    the repository API load and unload them.

    Request limits: ``max_body_bytes`` (413 over it), ``max_decoded_bytes`` (arrays decoded
    from one body; default ``DECODED_BYTES_FACTOR`` times the body limit), ``timeout``
    (seconds per request: 408 for a body that does not arrive in time, 504 for a model that
    does not answer in time; None: no deadline), ``max_concurrency`` (model calls in flight
    per model; models the server loads get it as ``load(max_concurrency=)``) and
    ``max_queue`` (requests waiting per model; one more is a 503 with Retry-After).
    ``load_options`` go to every ``tfrt_py.load`` the server makes (``custom_kernels``,
    ``host``, ``optimize``, ``executor``...; they win over a ModelConfig's).
    ``model_control="explicit"`` lets the repository API load and unload models (off by
    default: 403). ``warmup``: (model name or None for every model with those inputs,
    input signature) pairs each model runs (``Model.warmup``) before it is ready; a
    ``GenerationWarmup`` in place of a signature prepares a decoder's generation."""

    def __init__(
        self,
        models: Mapping[str, Any] | None = None,
        *,
        repository: str | ModelRepository | None = None,
        batching: str = "auto",
        max_batch: int | None = None,
        max_wait_us: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_decoded_bytes: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_queue: int = DEFAULT_MAX_QUEUE,
        load_options: Mapping[str, Any] | None = None,
        model_control: str = "none",
        log: Callable[[str], object] | None = None,
        close_timeout: float = CLOSE_TIMEOUT_S,
        warmup: Sequence[tuple[str | None, Mapping[str, Any] | GenerationWarmup]] = (),
    ) -> None:
        self._log = log or (lambda _msg: None)
        self.repository = (
            repository
            if repository is None or isinstance(repository, ModelRepository)
            else ModelRepository(repository)
        )
        configs = {
            n: c if isinstance(c, ModelConfig) else ModelConfig(c)
            for n, c in (models or {}).items()
        }
        if self.repository is not None:
            found, problems = self.repository.scan()
            for problem in problems:
                self._log(f"tfrt-py serve: repository: skipped: {problem}")
            for name, entry in found.items():
                configs.setdefault(name, ModelConfig(entry.path, version=entry.version))
        if not configs:
            raise ValueError("ModelServer needs at least one model")
        for name in configs:
            try:
                check_name(name)
            except RequestError as e:
                raise ValueError(e.message) from None
        if batching not in MODES:
            raise ValueError(f"batching must be one of {MODES}, got {batching!r}")
        self.configs = configs
        self.defaults = (batching, max_batch, max_wait_us)
        self.max_body_bytes = int(max_body_bytes)
        self.max_decoded_bytes = decoded_limit(self.max_body_bytes, max_decoded_bytes)
        if self.max_body_bytes < 1 or self.max_decoded_bytes < 1:
            raise ValueError("max_body_bytes and max_decoded_bytes must be >= 1")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (or None), got {timeout!r}")
        if int(max_concurrency) < 1 or int(max_queue) < 0:
            raise ValueError(
                f"max_concurrency must be >= 1 and max_queue >= 0, got "
                f"{max_concurrency!r}, {max_queue!r}"
            )
        self.timeout = None if timeout is None else float(timeout)
        self.max_concurrency = int(max_concurrency)
        self.max_queue = int(max_queue)
        if model_control not in MODEL_CONTROL:
            raise ValueError(f"model_control must be one of {MODEL_CONTROL}, got {model_control!r}")
        self.model_control = model_control
        self.load_options = dict(load_options or {})
        self.close_timeout = float(close_timeout)
        #: (model name or None, input signature): what each model runs (``Model.warmup``)
        #: before it is ready; an item without a name goes to every model that has every
        #: input it names
        self.warmup = [(m, item if isinstance(item, GenerationWarmup) else dict(item))
                       for m, item in warmup]  # fmt: skip
        self.models: dict[str, ServedModel] = {}
        self.errors: dict[str, str] = {}
        self.unloaded: set[str] = set()
        self.calls: set[asyncio.Task[Any]] = set()
        self.metrics = self._new_metrics(None)
        self.decode_pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="tfrt_py-decode")
        self._started = False
        self._lock = threading.Lock()
        self._loading: asyncio.Lock | None = None  # one load or unload at a time

    @property
    def error(self) -> str | None:
        """Why the server is not ready (the first model that failed), or None."""
        for name, message in self.errors.items():
            if name not in self.unloaded:
                return message
        return None

    def index(self) -> list[dict[str, Any]]:
        """The repository index: every configured model by name, READY or UNAVAILABLE
        with the reason (the v2 repository extension's and gRPC's RepositoryIndex)."""
        index = []
        for name in sorted(self.configs):
            m = self.get(name)
            entry: dict[str, Any] = {"name": name, "version": m.version if m else ""}
            if m is not None and m.warmed:
                entry["state"] = "READY"
            else:
                entry["state"] = "UNAVAILABLE"
                entry["reason"] = (
                    "unloaded" if name in self.unloaded else self.errors.get(name, "loading")
                )
            index.append(entry)
        return index

    def say(self, message: str) -> None:
        """Log ``message`` where the server logs (its ``log``)."""
        self._log(message)

    def _new_metrics(self, shared_dir: str | None) -> ServerMetrics:
        return ServerMetrics(lambda: self.models.values(), lambda: self.ready, shared_dir)

    def share_metrics(self, directory: str) -> None:
        """A pre-forked worker, before it serves: its counters and histograms go to the
        workers' shared ``directory`` and a scrape answers their sum (``metrics``); every
        served model's recorder is made anew there."""
        share_across_workers(directory)
        self.metrics = self._new_metrics(directory)
        for m in self.models.values():
            m.metrics = self.metrics.for_model(m.name, m.version)

    @property
    def ready(self) -> bool:
        """Every model not unloaded is loaded and warmed."""
        return (
            self._started
            and self.error is None
            and all(
                n in self.models and self.models[n].warmed
                for n in self.configs
                if n not in self.unloaded
            )
        )

    def get(self, name: str) -> ServedModel | None:
        return self.models.get(name)

    def start(self) -> None:
        """Load (where needed), choose policies and warm every model; synchronous and slow:
        call it in a thread from async code. A failure is kept in ``errors`` (not ready)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for name, cfg in list(self.configs.items()):
                try:
                    served = self._make(name, cfg)
                except Exception as e:  # noqa: BLE001 - reported by /readyz
                    self.errors[name] = f"model {name!r}: {e}"
                    self._log(f"tfrt-py serve: {self.errors[name]}")
                    continue
                self.models[name] = served
                if served.warm_error:
                    self.errors[name] = served.warm_error
                self._log(self._loaded_line(served))

    def _loaded_line(self, served: ServedModel) -> str:
        return (
            f"tfrt-py serve: {served.name}: executor {served.model.executor}, "
            f"batching {served.policy.why}, version {served.version}"
        )

    def _make(self, name: str, cfg: ModelConfig) -> ServedModel:
        """A ServedModel for ``cfg``, loaded (unless given loaded) and warmed; runs on a
        thread (slow)."""
        import tfrt_py

        model = cfg.source
        if not isinstance(model, tfrt_py.Model):
            options = {"executor": cfg.executor, "max_concurrency": self.max_concurrency}
            model = tfrt_py.load(model, **{**options, **self.load_options})
        mode, mb, mw = self.defaults
        policy = choose_policy(
            model,
            cfg.batching or mode,
            cfg.max_batch if cfg.max_batch is not None else mb,
            cfg.max_wait_us if cfg.max_wait_us is not None else mw,
        )
        served = ServedModel(
            name,
            model,
            policy,
            version=cfg.version,
            timeout=self.timeout,
            max_concurrency=self.max_concurrency,
            max_queue=self.max_queue,
            calls=self.calls,
            metrics=self.metrics.for_model(name, cfg.version),
            warmup=[
                w
                for m, w in self.warmup
                if m == name
                or (
                    m is None
                    and (
                        isinstance(w, GenerationWarmup) or set(w) <= {s.name for s in model.inputs}
                    )
                )
            ],
        )
        served.warm()
        return served

    # -- the repository API (event loop) --------------------------------------------------
    async def load_model(self, name: str) -> ServedModel:
        """Load (or reload) ``name`` -- from the repository: its newest version; else from
        its configured source -- warm it on a thread, then swap it in. One load or unload
        at a time. RequestError: 403 unless ``model_control`` is "explicit", 400 for an
        invalid name or a model that fails to load or warm (the version served before, if
        any, stays), 404 for a name found nowhere."""
        self._check_control(name)
        async with self._lock_loads():
            cfg = await asyncio.to_thread(self._config_for, name)
            try:
                served = await asyncio.to_thread(self._make, name, cfg)
            except Exception as e:  # noqa: BLE001 - answered 400, naming the model
                raise RequestError(400, f"model {name!r}: cannot load: {e}") from None
            if served.warm_error:
                raise RequestError(400, served.warm_error)
            self.configs[name] = cfg
            self.models[name] = served  # the swap: new requests get the new version
            self.errors.pop(name, None)
            self.unloaded.discard(name)
            self._log(self._loaded_line(served))
            return served

    def _check_control(self, name: str) -> None:
        check_name(name)
        if self.model_control != "explicit":
            raise RequestError(
                403,
                "loading and unloading models is off; start the server with "
                "--model-control-mode explicit (ModelServer(model_control='explicit'))",
            )

    def _lock_loads(self) -> asyncio.Lock:
        if self._loading is None:
            self._loading = asyncio.Lock()
        return self._loading

    def _config_for(self, name: str) -> ModelConfig:
        old = self.configs.get(name)
        if self.repository is not None:
            try:
                entry = self.repository.locate(name)
            except RequestError:
                if old is None:
                    raise
            else:
                base = old or ModelConfig(entry.path)
                return replace(base, source=entry.path, version=entry.version)
        if old is None:
            raise RequestError(404, f"unknown model {name!r}; models: {sorted(self.configs)}")
        return old

    async def unload_model(self, name: str) -> None:
        """Stop serving ``name`` (requests in flight finish); 403 unless ``model_control``
        is "explicit", 404 for an unknown name."""
        self._check_control(name)
        if name not in self.configs:
            raise RequestError(404, f"unknown model {name!r}; models: {sorted(self.configs)}")
        async with self._lock_loads():
            self.models.pop(name, None)
            self.unloaded.add(name)
            self._log(f"tfrt-py serve: {name}: unloaded")

    # -- shutdown -------------------------------------------------------------------------
    async def drain(self) -> None:
        """On the loop, at shutdown: wait up to ``close_timeout`` for model calls in flight,
        then cancel the rest (the runtime stops their work at the next kernel or
        iteration) and say so."""
        calls = set(self.calls)
        if not calls:
            return
        _, pending = await asyncio.wait(calls, timeout=self.close_timeout)
        if pending:
            self._log(
                f"tfrt-py serve: {len(pending)} model call(s) still running after "
                f"{self.close_timeout:g} s; cancelling them"
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=self.close_timeout)

    def close(self) -> None:
        """Stop the decode threads (queued work is cancelled; running decodes finish on
        their own). Never waits on a model."""
        self.decode_pool.shutdown(wait=False, cancel_futures=True)
        self._log(f"tfrt-py serve: stopped ({', '.join(self.configs)})")
