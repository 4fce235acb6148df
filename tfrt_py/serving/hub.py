"""ModelServer: the models an app serves, their batching policies, loading and readiness.

Who owns what: a ModelServer owns its ServedModels, one thread pool (``workers``
threads, 1 by default) for the heavy calls of sync-executor models (see ``served``) and
``DECODE_THREADS`` threads that decode large request bodies and encode large responses
(``body``), and the request limits (``limits``: body and decoded bytes, the deadline).
Models may be given loaded (``tfrt_py.Model``: load before forking workers, gunicorn
``--preload`` style, and the weights stay shared) or as sources loaded by ``start()``.
``start()`` loads, picks each policy, and warms each model with one call; ``ready`` is
true only when every model warmed. ``start`` runs once (later calls return at once);
``close`` shuts the pools down, waiting at most ``close_timeout`` for calls in flight (a
call stuck past its deadline must not keep the process from exiting). ``get`` is safe
from any thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .batching import MODES, choose_policy
from .limits import CLOSE_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT_S, decoded_limit
from .served import ServedModel

__all__ = ["DECODE_THREADS", "DEFAULT_MAX_BODY_BYTES", "ModelConfig", "ModelServer"]

#: Threads decoding large bodies / encoding large responses: bounds how many decoded
#: bodies are in memory at once.
DECODE_THREADS = 2


@dataclass(frozen=True)
class ModelConfig:
    """One model to serve: ``source`` (a path, bytes, ONNX proto or a loaded
    ``tfrt_py.Model``) and per-model overrides of the server's batching defaults
    (``batching``: "auto" | "on" | "off"; None: the server's)."""

    source: Any
    batching: str | None = None
    max_batch: int | None = None
    max_wait_us: int | None = None
    executor: str = "auto"


class ModelServer:
    """The served models by name. ``models`` maps names to ModelConfigs or bare sources.

    Request limits: ``max_body_bytes`` (413 over it), ``max_decoded_bytes`` (arrays decoded
    from one body; default ``DECODED_BYTES_FACTOR`` times the body limit), ``timeout``
    (seconds per request: 408 for a body that does not arrive in time, 504 for a model that
    does not answer in time; None: no deadline)."""

    def __init__(
        self,
        models: Mapping[str, Any],
        *,
        batching: str = "auto",
        max_batch: int | None = None,
        max_wait_us: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_decoded_bytes: int | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        workers: int | None = None,
        log: Callable[[str], object] | None = None,
        close_timeout: float = CLOSE_TIMEOUT_S,
    ) -> None:
        if not models:
            raise ValueError("ModelServer needs at least one model")
        for name in models:
            if not name or "/" in name or name.endswith(":predict"):
                raise ValueError(f"model name {name!r}: must be non-empty, without '/'")
        self.configs = {
            n: c if isinstance(c, ModelConfig) else ModelConfig(c) for n, c in models.items()
        }
        self.defaults = (batching, max_batch, max_wait_us)
        if batching not in MODES:
            raise ValueError(f"batching must be one of {MODES}, got {batching!r}")
        self.max_body_bytes = int(max_body_bytes)
        self.max_decoded_bytes = decoded_limit(self.max_body_bytes, max_decoded_bytes)
        if self.max_body_bytes < 1 or self.max_decoded_bytes < 1:
            raise ValueError("max_body_bytes and max_decoded_bytes must be >= 1")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds (or None), got {timeout!r}")
        self.timeout = None if timeout is None else float(timeout)
        self.close_timeout = float(close_timeout)
        self.models: dict[str, ServedModel] = {}
        self.error: str | None = None
        self._log = log or (lambda _msg: None)
        # One thread by default: heavy calls are BLAS-bound and BLAS already uses every
        # core; concurrent BLAS calls oversubscribe them (measured: 4 threads of 1-row
        # calls of a 2.6 MFLOP MLP ran 7x slower than 1 thread on 2 cores).
        self.pool = ThreadPoolExecutor(max_workers=workers or 1, thread_name_prefix="tfrt_py-serve")
        self.decode_pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="tfrt_py-decode")
        self._started = False
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """Every model loaded and warmed."""
        return (
            self._started
            and self.error is None
            and len(self.models) == len(self.configs)
            and all(m.warmed for m in self.models.values())
        )

    def get(self, name: str) -> ServedModel | None:
        return self.models.get(name)

    def start(self) -> None:
        """Load (where needed), choose policies and warm every model; synchronous and slow:
        call it in a thread from async code. A failure is kept in ``error`` (not ready)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for name, cfg in self.configs.items():
                try:
                    served = self._make(name, cfg)
                except Exception as e:  # noqa: BLE001 - reported by /readyz
                    self.error = f"model {name!r}: {e}"
                    self._log(f"tfrt-py serve: {self.error}")
                    continue
                self.models[name] = served
                served.warm()
                if served.warm_error:
                    self.error = served.warm_error
                self._log(
                    f"tfrt-py serve: {name}: executor {served.model.executor}, "
                    f"batching {served.policy.why}"
                )

    def _make(self, name: str, cfg: ModelConfig) -> ServedModel:
        import tfrt_py

        model = cfg.source
        if not isinstance(model, tfrt_py.Model):
            model = tfrt_py.load(model, executor=cfg.executor)
        mode, mb, mw = self.defaults
        policy = choose_policy(
            model,
            cfg.batching or mode,
            cfg.max_batch if cfg.max_batch is not None else mb,
            cfg.max_wait_us if cfg.max_wait_us is not None else mw,
        )
        return ServedModel(name, model, policy, self.pool, self.timeout)

    def close(self) -> None:
        """Shut the pools down: queued calls are cancelled, running ones get
        ``close_timeout`` seconds to finish (their deadlines stop them); a call still
        running then is left behind (logged), so shutdown never hangs on a model."""
        self.decode_pool.shutdown(wait=False, cancel_futures=True)
        self.pool.shutdown(wait=False, cancel_futures=True)
        running = [f for m in list(self.models.values()) for f in list(m.inflight)]
        _, stuck = concurrent.futures.wait(running, timeout=self.close_timeout)
        if stuck:
            self._log(
                f"tfrt-py serve: {len(stuck)} model call(s) still running after "
                f"{self.close_timeout:g} s; not waiting for them"
            )
        self._log(f"tfrt-py serve: stopped ({', '.join(self.configs)})")
