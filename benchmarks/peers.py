"""Optional peer runtimes for the anchor models: TFLite (ai-edge-litert), torch.jit, jax.jit.

Each peer is the anchor model written by hand in that framework from the anchor's own
fixed-seed weights (``Anchor.kind``/``Anchor.params``), weights baked in as constants of
the compiled model (as tfrt_py, onnxruntime and the NumPy baselines have them). One call
takes the anchor's NumPy feeds and returns the outputs:

- ``tflite xnnpack``: ``ai_edge_litert.interpreter.Interpreter`` on a flatbuffer built by
  ``peers_tflite`` (default op resolver, which applies the XNNPACK delegate),
  ``num_threads`` = ``threads``; per call ``set_tensor`` per input, ``invoke``,
  ``get_tensor`` (a copy) per output; tensor indices looked up once.
- ``torch.jit freeze``: an ``nn.Module`` (weights as buffers, [out, in] for ``F.linear``)
  traced with ``torch.jit.trace``, ``eval()``, ``torch.jit.freeze``; per call
  ``torch.from_numpy`` (no copy) per input under ``torch.inference_mode()``;
  ``torch.set_num_threads(threads)``. (torch 2.13 deprecates ``torch.jit`` in favour of
  ``torch.compile``/``torch.export``; the warning is silenced here.)
- ``jax.jit``: a pure function closing over the weights as device arrays, ``jax.jit``;
  per call the NumPy feeds as arguments, ``.block_until_ready()`` on the result. With
  ``threads == 1`` and jax not yet imported, ``XLA_FLAGS`` gets
  ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` (XLA sizes its
  CPU pool once, at backend start); otherwise XLA's default pool (all cores).

``latency.py`` runs the peers with one thread each (``--peer-threads``): on a small
shared machine, interleaved bursts of several runtimes each with a spinning thread pool
oversubscribe the cores and slow whichever runtime runs next.

``peer_runners(anchor)`` returns (timed runners, output getters) for the peers whose
package is installed; ``missing()`` names the packages that are not.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PEERS", "describe", "missing", "ort_session", "peer_runners"]

Runner = Callable[[], object]
Getter = Callable[[], list[np.ndarray]]

PEERS: dict[str, str] = {
    "tflite xnnpack": "ai_edge_litert",
    "torch.jit freeze": "torch",
    "jax.jit": "jax",
}
"""Column name -> the package (import name) it needs."""


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and its feature flags from /proc/cpuinfo ("?" and none where it
    cannot be read)."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def missing() -> list[str]:
    """The peers' packages that are not installed (import names)."""
    return [pkg for pkg in PEERS.values() if not installed(pkg)]


def describe(peers: tuple[str, ...], threads: int) -> str:
    """One line: the installed peers among ``peers``, with versions and thread count."""
    from importlib import metadata

    dists = {"ai_edge_litert": "ai-edge-litert", "torch": "torch", "jax": "jax"}
    parts = []
    for name in peers:
        pkg = PEERS[name]
        if installed(pkg):
            parts.append(f"{name} ({dists[pkg]} {metadata.version(dists[pkg])})")
    if not parts:
        return "peers: none"
    return f"peers: {', '.join(parts)}; {threads} thread(s) each"


def ort_session(path: str, threads: int = 0) -> Any:
    """An onnxruntime CPU session; ``threads`` > 0: that many intra-op threads and no spinning
    between calls (a timed session that leaves the cores to the runtime it alternates with)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads > 0:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def default_threads() -> int:
    return os.cpu_count() or 1


def peer_runners(
    anchor: Any, peers: tuple[str, ...] | None = None, threads: int | None = None
) -> tuple[dict[str, Runner], dict[str, Getter]]:
    """(runners for timing, output getters) by column name, for the installed peers."""
    threads = threads or default_threads()
    builders: dict[str, Callable[[Any, int], tuple[Runner, Getter]]] = {
        "tflite xnnpack": tflite_runner,
        "torch.jit freeze": torch_runner,
        "jax.jit": jax_runner,
    }
    timed: dict[str, Runner] = {}
    outputs: dict[str, Getter] = {}
    for name in peers if peers is not None else tuple(PEERS):
        if not installed(PEERS[name]):
            continue
        timed[name], outputs[name] = builders[name](anchor, threads)
    return timed, outputs


def tflite_runner(anchor: Any, threads: int) -> tuple[Runner, Getter]:
    from ai_edge_litert.interpreter import Interpreter

    if __package__:  # imported as benchmarks.peers (tests/test_bench_peers.py)
        from .peers_tflite import build_tflite
    else:  # imported by a script in benchmarks/, whose folder is on sys.path
        from peers_tflite import build_tflite  # type: ignore[no-redef]

    interp = Interpreter(model_content=build_tflite(anchor), num_threads=threads)
    interp.allocate_tensors()
    index = {d["name"]: d["index"] for d in interp.get_input_details()}
    feeds = [(index[name], value) for name, value in anchor.feeds.items()]
    outs = [d["index"] for d in interp.get_output_details()]
    set_tensor, invoke, get_tensor = interp.set_tensor, interp.invoke, interp.get_tensor

    def run() -> list[np.ndarray]:
        for i, value in feeds:
            set_tensor(i, value)
        invoke()
        return [get_tensor(o) for o in outs]

    return run, run


def torch_runner(anchor: Any, threads: int) -> tuple[Runner, Getter]:
    import torch
    from torch.nn import functional as F

    torch.set_num_threads(threads)
    p, kind = anchor.params, anchor.kind

    def const(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    class Peer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            if kind == "matmul_chain":
                for i, w in enumerate(p["ws"]):
                    self.register_buffer(f"w{i}", const(w.T))
                self.n = len(p["ws"])
            elif kind == "mlp":
                for i, (w, b) in enumerate(zip(p["ws"], p["bs"])):
                    self.register_buffer(f"w{i}", const(w.T))
                    self.register_buffer(f"b{i}", const(b))
                self.n = len(p["ws"])
            elif kind == "ads":
                self.register_buffer("maxes", const(np.concatenate(p["maxes"], axis=1)))
                for name in ("w0", "w1"):
                    self.register_buffer(name, const(p[name].T))
                for name in ("b0", "b1"):
                    self.register_buffer(name, const(p[name]))
            else:
                raise ValueError(f"no torch peer for anchor kind {kind!r}")

        def forward(self, *xs: torch.Tensor) -> torch.Tensor:
            if kind == "matmul_chain":
                h = xs[0]
                for i in range(self.n):
                    h = torch.relu(F.linear(h, self.buffer(f"w{i}")))
                return h
            if kind == "mlp":
                h = xs[0]
                for i in range(self.n):
                    h = F.linear(h, self.buffer(f"w{i}"), self.buffer(f"b{i}"))
                    if i < self.n - 1 or p["relu_last"]:
                        h = torch.relu(h)
                return torch.softmax(h, -1) if p["softmax"] else h
            b = self.buffer
            feat = torch.cat(xs, 1) / b("maxes")
            h = torch.relu(F.linear(feat, b("w0"), b("b0")))
            return torch.sigmoid(F.linear(h, b("w1"), b("b1")))

        def buffer(self, name: str) -> torch.Tensor:
            return getattr(self, name)

    arrays = list(anchor.feeds.values())
    with torch.inference_mode(), warnings.catch_warnings():
        # torch 2.13 deprecates torch.jit (for torch.compile / torch.export); it still works
        warnings.filterwarnings("ignore", "`torch.jit", DeprecationWarning)
        example = tuple(const(a) for a in arrays)
        module = torch.jit.freeze(torch.jit.trace(Peer().eval(), example))
        for _ in range(3):  # the profiling executor specializes on the first calls
            module(*example)
    from_numpy, inference_mode = torch.from_numpy, torch.inference_mode

    if len(arrays) == 1:
        x = arrays[0]

        def run() -> torch.Tensor:
            with inference_mode():
                return module(from_numpy(x))
    else:

        def run() -> torch.Tensor:
            with inference_mode():
                return module(*[from_numpy(a) for a in arrays])

    return run, lambda: [run().numpy()]


def jax_runner(anchor: Any, threads: int) -> tuple[Runner, Getter]:
    if threads == 1 and "jax" not in sys.modules:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    import jax
    import jax.numpy as jnp

    p, kind = anchor.params, anchor.kind
    fn: Callable[..., Any]
    if kind == "matmul_chain":
        ws = [jnp.asarray(w) for w in p["ws"]]

        def chain(x: Any) -> Any:
            for w in ws:
                x = jnp.maximum(x @ w, 0)
            return x

        fn = chain
    elif kind == "mlp":
        ws = [jnp.asarray(w) for w in p["ws"]]
        bs = [jnp.asarray(b) for b in p["bs"]]
        n = len(ws)

        def mlp(x: Any) -> Any:
            for i, (w, b) in enumerate(zip(ws, bs)):
                x = x @ w + b
                if i < n - 1 or p["relu_last"]:
                    x = jnp.maximum(x, 0)
            return jax.nn.softmax(x, axis=-1) if p["softmax"] else x

        fn = mlp
    elif kind == "ads":
        maxes = jnp.asarray(np.concatenate(p["maxes"], axis=1))
        w0, b0, w1, b1 = (jnp.asarray(p[k]) for k in ("w0", "b0", "w1", "b1"))

        def ads(*fs: Any) -> Any:
            feat = jnp.concatenate(fs, axis=1) / maxes
            h = jnp.maximum(feat @ w0 + b0, 0)
            return jax.nn.sigmoid(h @ w1 + b1)

        fn = ads
    else:
        raise ValueError(f"no jax peer for anchor kind {kind!r}")

    jitted = jax.jit(fn)
    arrays = list(anchor.feeds.values())
    jitted(*arrays).block_until_ready()  # compile now, not in the first timed burst

    if len(arrays) == 1:
        x = arrays[0]

        def run() -> Any:
            return jitted(x).block_until_ready()
    else:

        def run() -> Any:
            return jitted(*arrays).block_until_ready()

    return run, lambda: [np.asarray(run())]
