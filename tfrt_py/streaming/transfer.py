"""The weight arena and the async transfer kernel that fills it, one stage at a time.

Who owns what: a ``StreamedProgram`` owns one ``WeightArena`` (allocated at load with
``np.empty``: no page is resident until a transfer writes it) and lends it to one pipeline
run at a time. Each run makes a ``Transfers`` schedule: step ``k`` (the k-th stage the run
executes) loads its stage into region ``k % 2`` -- region 0 starts at the arena's front,
region 1 ends at its back -- so two consecutive stages sit side by side when their bytes
fit the arena together (double buffering) and overlap otherwise.

``Transfers.request(k, stage)`` returns an AsyncValue of the step's weight views (read-only
arrays into the arena). The read runs on a HostContext worker thread (the async transfer
kernel) once (1) the previous step's transfer is done (one read at a time, in step order),
(2) the compute of step ``k - 2`` is done (its region is the one being overwritten) and
(3) when the two regions overlap, or ``overlap=False``, the compute of step ``k - 1`` is
done. The computing thread calls ``computed(k)`` when step ``k``'s weights are no longer
used: its region is released. Every step reads its stage: two consecutive stages never
hold all of a streamed model's weights (else it would not stream), so a stage is never
still resident when its turn comes again. After reading a tensor the kernel advises the OS
to drop its pages from the page cache (``POSIX_FADV_DONTNEED``; ``drop_cache``): the
weights exceed the memory the model may use, so caching them only evicts other data, and
every window's reads are then real disk reads.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from ..concurrency import AsyncValue, HostContext, run_when_ready
from ..errors import ExecutionError
from ..frontends.onnx.external import open_external
from ..frontends.onnx.external_ref import ExternalRef
from .partition import ALIGN, Stage
from .rows import pread_full

__all__ = ["TransferStats", "Transfers", "WeightArena"]

_DONTNEED: int | None = getattr(os, "POSIX_FADV_DONTNEED", None)  # None: not on this OS


class WeightArena:
    """``nbytes`` of 64-byte-aligned memory holding at most two stages' weights."""

    def __init__(self, nbytes: int) -> None:
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self.nbytes = nbytes
        self.buf = raw[start : start + nbytes]

    def base(self, region: int, stage: Stage) -> int:
        """Where ``stage`` starts in ``region`` (0: front, 1: back)."""
        return 0 if region == 0 else self.nbytes - stage.nbytes

    def views(self, region: int, stage: Stage) -> list[np.ndarray]:
        """Read-only arrays over ``stage``'s weights in ``region``, in ``stage.weights`` order."""
        base = self.base(region, stage)
        out = []
        for w in stage.weights:
            r = w.ref
            a = self.buf[base + w.offset : base + w.offset + r.nbytes].view(r.dtype)
            a = a.reshape(r.shape)
            a.flags.writeable = False
            out.append(a)
        return out

    def overlaps(self, a: Stage, b: Stage) -> bool:
        """Whether ``a`` in one region and ``b`` in the other share bytes."""
        return a.nbytes + b.nbytes > self.nbytes


class TransferStats:
    """What one run's transfers did (written by the transfer thread, read after the run)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.first_seconds = 0.0  # the first step's read: the part compute cannot hide
        self.bytes = 0
        self.reads = 0  # stage loads done


class Transfers:
    """One pipeline run's transfer schedule (see the module docstring). ``request`` and
    ``computed`` are called by the computing thread, in step order; reads run on ``host``'s
    workers. ``close()`` stops reads that have not started and returns an AsyncValue that is
    available once no read is in flight (then the files are closed)."""

    def __init__(
        self, arena: WeightArena, host: HostContext, overlap: bool, drop_cache: bool = True
    ) -> None:
        self._arena = arena
        self._host = host
        self._overlap = overlap
        self._drop_cache = drop_cache
        self._loaded: list[AsyncValue[list[np.ndarray]]] = []
        self._computed: list[AsyncValue[None]] = []
        self._stages: list[Stage] = []
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._drained: AsyncValue[None] | None = None
        self.stats = TransferStats()

    def request(self, k: int, stage: Stage) -> AsyncValue[list[np.ndarray]]:
        """Schedule step ``k``'s load of ``stage`` (``k`` = number of earlier requests)."""
        assert k == len(self._loaded), "steps are requested in order"
        av: AsyncValue[list[np.ndarray]] = AsyncValue()
        self._loaded.append(av)
        self._computed.append(AsyncValue())
        self._stages.append(stage)
        deps: list[AsyncValue[Any]] = []
        if k >= 1:
            deps.append(self._loaded[k - 1])  # one read at a time, in step order
            prev = self._stages[k - 1]
            if not self._overlap or self._arena.overlaps(prev, stage):
                deps.append(self._computed[k - 1])
        if k >= 2:
            deps.append(self._computed[k - 2])  # the region being overwritten
        run_when_ready(deps, lambda: self._start(k, stage, av))
        return av

    def _start(self, k: int, stage: Stage, av: AsyncValue[list[np.ndarray]]) -> None:
        try:
            self._host.enqueue(self._read, k, stage, k % 2, av)
        except BaseException as e:  # noqa: BLE001 - the host is closed, or worse: tell the stage
            av.set_error(_failed(stage, None, e))

    def _read(self, k: int, stage: Stage, region: int, av: AsyncValue[list[np.ndarray]]) -> None:
        """The transfer kernel: runs on a worker thread; fulfils ``av`` exactly once, with
        the stage's weight views or with an ExecutionError naming the stage and the tensor
        being read. Whatever fails in here -- opening or reading a file, a view that does not
        fit, a closed run -- reaches the waiting stage: nothing is only logged."""
        with self._lock:
            closed = self._closed
        if closed:
            av.set_error(RuntimeError("the pipeline run ended before this transfer"))
            return
        t0 = time.perf_counter()
        name: str | None = None
        try:
            base = self._arena.base(region, stage)
            buf = self._arena.buf.data
            for w in stage.weights:
                r = w.ref
                name = r.name
                fd = self._fd(r)
                pread_full(fd, buf[base + w.offset : base + w.offset + r.nbytes], r.offset, r.name)
                if self._drop_cache and _DONTNEED is not None:
                    os.posix_fadvise(fd, r.offset, r.nbytes, _DONTNEED)
                self.stats.bytes += r.nbytes
            name = None
            views = self._arena.views(region, stage)
        except BaseException as e:  # noqa: BLE001 - reported to the waiting stage
            av.set_error(_failed(stage, name, e))
            return
        finally:
            dt = time.perf_counter() - t0
            self.stats.seconds += dt
            if k == 0:
                self.stats.first_seconds = dt
        self.stats.reads += 1
        av.set(views)

    def _fd(self, ref: ExternalRef) -> int:
        """The weight file's descriptor, opened (and so checked again: inside the model's
        directory, a regular file, no symlink) on first use in this run."""
        fd = self._fds.get(ref.path)
        if fd is None:
            fd, _ = open_external(ref.base_dir, ref.location, ref.name)
            self._fds[ref.path] = fd
        return fd

    def computed(self, k: int) -> None:
        """Step ``k``'s compute is over: its weights are no longer read."""
        av = self._computed[k]
        if not av.is_available():
            av.set(None)

    def close(self) -> AsyncValue[None]:
        """End the run: unstarted reads are skipped; the result is available once no read is
        in flight and the weight files are closed. From any thread; a second call returns
        the first call's result."""
        done: AsyncValue[None] = AsyncValue()
        with self._lock:
            if self._drained is not None:
                return self._drained
            self._closed = True
            self._drained = done
        for av in self._computed:
            if not av.is_available():
                av.set(None)
        if not self._loaded:
            done.set(None)
            return done

        def finish() -> None:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            done.set(None)

        run_when_ready(self._loaded, finish)
        return done


def _failed(stage: Stage, tensor: str | None, cause: BaseException) -> ExecutionError:
    what = f"stage {stage.index} transfer"
    if tensor is not None:
        what += f" of tensor {tensor!r}"
    return ExecutionError(what, "WeightTransfer", cause)
