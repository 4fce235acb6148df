"""The ``tfrt-py`` command: run, inspect, profile, bench, serve.

Every failure a user can cause (missing file, bad model, bad input) prints one line on
stderr and exits non-zero; tracebacks are for bugs.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click
import numpy as np
from click.core import ParameterSource

from .errors import TfrtError

if TYPE_CHECKING:
    from .serving import ModelRepository, ModelServer

__all__ = ["main"]

EXECUTOR_CHOICE = click.Choice(["auto", "sync", "async", "native"])


def _fail(msg: str) -> NoReturn:
    click.echo(f"tfrt-py: error: {msg}", err=True)
    sys.exit(2)


def _need(module: str, what: str, extra: str, alternative: str = "") -> None:
    """Fail before any work when ``what`` needs ``module`` and it is not installed."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        more = f", {alternative}" if alternative else ""
        _fail(f"{what} needs {module}, which is not installed: pip install '{extra}'{more}")


def _load(path: str, executor: str = "auto", **options: Any) -> Any:
    import tfrt_py

    try:
        return tfrt_py.load(path, executor=executor, **options)
    except (TfrtError, ValueError) as e:
        _fail(str(e))


def _parse_signature(text: str, models: set[str]) -> tuple[str | None, Any]:
    """``--warmup``'s ``[MODEL:]NAME=DIMS[,NAME=DIMS...]`` (DIMS like 1x128) -> (the model
    it is for, or None: every model with those inputs; input name -> shape), or
    ``[MODEL:]generate`` -> (the model or None: every decoder; a ``GenerationWarmup``)."""
    from .serving.served import GenerationWarmup

    model, sep, rest = text.partition(":")
    if not sep or model not in models or "=" in model:
        model, rest = None, text  # type: ignore[assignment]
    if rest.strip() == "generate":
        return model, GenerationWarmup(named=model is not None)
    out: dict[str, Any] = {}
    for part in rest.split(","):
        name, sep, dims = part.strip().partition("=")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            shape = (-1,)
        if not sep or not name or any(d < 0 for d in shape):
            _fail(f"--warmup {text!r}: expected NAME=DIMS[,NAME=DIMS...] with DIMS like 1x128")
        out[name] = shape
    return model, out


def _parse_inputs(model: Any, items: tuple[str, ...]) -> dict[str, np.ndarray]:
    from .bench.runners import random_feeds

    feeds = random_feeds(model)
    for item in items:
        name, sep, file = item.partition("=")
        if not sep:
            _fail(f"--input takes name=file.npy, got {item!r}")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            _fail(f"--input {name}: cannot read {file!r}: {e}")
    return feeds


@click.group()
@click.version_option(package_name="tfrt-py")
def main() -> None:
    """tfrt-py: load an ONNX model once, run it fast."""


@main.command()
@click.argument("model_path", metavar="MODEL")
@click.option("--input", "-i", "inputs", multiple=True, help="name=file.npy (repeatable)")
@click.option("--executor", type=EXECUTOR_CHOICE, default="auto", show_default=True)
@click.option(
    "--output",
    "-o",
    "output_path",
    type=click.Path(dir_okay=False),
    help="write the outputs: .npz (arrays) or .json (any output)",
)
def run(model_path: str, inputs: tuple[str, ...], executor: str, output_path: str | None) -> None:
    """Run MODEL once and summarize each output (shape, dtype, range); random inputs of
    the right shape unless --input is given (integer ids stay inside the tables they
    index; inputs named like a mask are ones)."""
    from rich.console import Console

    if output_path is not None and not output_path.endswith((".npz", ".json")):
        _fail(f"--output {output_path!r}: the file must end in .npz or .json")
    model = _load(model_path, executor)
    feeds = _parse_inputs(model, inputs)
    try:
        outputs = model.run(feeds)
    except (TfrtError, ValueError, RuntimeError) as e:
        _fail(str(e))
    console = Console(highlight=False)
    console.print(f"[bold]{_escape(model_path)}[/] executor={model.executor}")
    for name, value in outputs.items():
        console.print(f"[cyan]{_escape(name)}[/] {_escape(_summary(value))}")
    if output_path is not None:
        _write_outputs(output_path, outputs)
        console.print(f"outputs: {_escape(output_path)}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _summary(value: Any) -> str:
    """One line about an output: dtype[shape] and its range (never the whole array)."""
    if isinstance(value, list):
        return f"list of {len(value)} {type(value[0]).__name__ if value else 'items'}"
    arr = np.asarray(value)
    head = f"{arr.dtype}{list(arr.shape)}"
    if arr.size and arr.dtype.kind in "biuf":
        with np.errstate(all="ignore"):
            lo, hi = arr.min(), arr.max()
            mean = arr.mean(dtype=np.float64)
        return f"{head} min {lo:.6g} max {hi:.6g} mean {mean:.6g}"
    if arr.size:
        return f"{head} first {np.ravel(arr)[0]!r:.60}"
    return head


def _write_outputs(path: str, outputs: dict[str, Any]) -> None:
    """``outputs`` to ``path``: .npz holds arrays only (no pickles), .json anything."""
    import json

    try:
        if path.endswith(".npz"):
            arrays = {}
            for name, value in outputs.items():
                arr = np.asarray(value) if not isinstance(value, list) else None
                if arr is None or arr.dtype == object:
                    _fail(f"--output {path!r}: output {name!r} is not a numeric array; "
                          "write .json instead")  # fmt: skip
                arrays[name] = arr
            _savez(path, arrays)
        else:
            with open(path, "w") as f:
                json.dump({k: _jsonable(v) for k, v in outputs.items()}, f)
    except OSError as e:
        _fail(f"--output {path!r}: {e}")


def _savez(path: str, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` without its keyword arguments: an output may be named "allow_pickle"."""
    import zipfile

    with zipfile.ZipFile(path, "w", allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@main.command()
@click.argument("model_path", metavar="MODEL")
@click.option("--executor", type=EXECUTOR_CHOICE, default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead")
def inspect(model_path: str, executor: str, as_json: bool) -> None:
    """Inputs/outputs, op histogram, executor and why."""
    model = _load(model_path, executor)
    if not as_json:
        click.echo(model.describe())
        return
    import json

    click.echo(json.dumps(_inspect_doc(model_path, model), indent=2))


def _inspect_doc(model_path: str, model: Any) -> dict[str, Any]:
    """``inspect --json``: what ``describe()`` says, as data."""
    import collections

    def spec(s: Any) -> dict[str, Any]:
        return {"name": s.name, "type": s.type,
                "dtype": None if s.dtype is None else str(s.dtype),
                "shape": None if s.shape is None else list(s.shape)}  # fmt: skip

    ops = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.nodes
    )
    meta = model.metadata.as_dict()
    return {
        "model": model_path,
        "executor": model.executor,
        "load_seconds": round(model._load_s, 6),
        "inputs": [spec(s) for s in model.inputs],
        "outputs": [spec(s) for s in model.outputs],
        "nodes": len(model.graph.nodes),
        "ops": dict(ops.most_common()),
        "ops_as_loaded": dict(model.prepared.loaded_ops.most_common()),
        "metadata": meta,
        "describe": model.describe().splitlines(),
    }


@main.command()
@click.argument("model_path", metavar="MODEL")
@click.option("--input", "-i", "inputs", multiple=True, help="name=file.npy (repeatable)")
@click.option("--executor", type=EXECUTOR_CHOICE, default="auto", show_default=True)
@click.option("--repeat", type=click.IntRange(1, 100_000), default=20, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True,
              help="size of dynamic dims for random inputs")  # fmt: skip
@click.option("--top", type=click.IntRange(1), default=30, show_default=True)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    help="write the last call as a Chrome trace (Perfetto, chrome://tracing)",
)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="write a PNG chart")
def profile(
    model_path: str,
    inputs: tuple[str, ...],
    executor: str,
    repeat: int,
    batch: int,
    top: int,
    trace_path: str | None,
    plot_path: str | None,
) -> None:
    """Where MODEL's time goes, per node: µs, share, GOP/s, input shapes."""
    from .bench.runners import random_feeds

    if plot_path:
        _need("matplotlib", "--plot", "tfrt-py[bench]")
    model = _load(model_path, executor)
    feeds = random_feeds(model, batch=batch)
    feeds.update(_parse_inputs(model, inputs) if inputs else {})
    try:
        report = model.profile(feeds, repeat=repeat)
    except (TfrtError, ValueError, RuntimeError) as e:
        _fail(str(e))
    click.echo(report.table(top=top))
    if trace_path:
        report.save_trace(trace_path)
        click.echo(f"trace: {trace_path}")
    if plot_path:
        try:
            report.plot(plot_path, top=top)
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'tfrt-py[bench]'")
        click.echo(f"plot: {plot_path}")


@main.command()
@click.argument("model_path", metavar="MODEL")
@click.option(
    "--vs",
    multiple=True,
    type=click.Choice(["onnxruntime", "none"]),
    default=("onnxruntime",),
    show_default=True,
    help="the runtime to time against; none: tfrt_py alone",
)
@click.option("--executor", "executors", multiple=True, type=EXECUTOR_CHOICE, default=("auto",))
@click.option("--seconds", type=float, default=3.0, show_default=True)
@click.option("--batch", type=int, default=1, show_default=True, help="size of dynamic dims")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write results JSON")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="write a PNG chart")
def bench(
    model_path: str,
    vs: tuple[str, ...],
    executors: tuple[str, ...],
    seconds: float,
    batch: int,
    json_path: str | None,
    plot_path: str | None,
) -> None:
    """Latency of MODEL on tfrt_py against onnxruntime (``--vs none``: tfrt_py alone):
    interleaved, paired bursts."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from .bench import measure
    from .bench.report import plot, to_json
    from .bench.runners import check_agreement, make_runners, random_feeds

    vs = tuple(v for v in vs if v != "none")
    if "onnxruntime" in vs:
        _need("onnxruntime", "--vs onnxruntime", "tfrt-py[bench]", "or pass --vs none")
    if plot_path:
        _need("matplotlib", "--plot", "tfrt-py[bench]")
    model = _load(model_path)
    feeds = random_feeds(model, batch=batch)
    try:
        runners, outputs = make_runners(model_path, feeds, executors, vs)
        check_agreement(outputs, graph=model.graph)
    except AssertionError as e:
        _fail(f"runtimes disagree, not timing: {e}")
    except (TfrtError, ValueError, RuntimeError) as e:
        _fail(str(e))
    baseline = "onnxruntime run" if "onnxruntime run" in runners else next(iter(runners))
    with Progress(transient=True) as bar:
        task = bar.add_task("timing", total=1.0)
        results = measure(
            runners, baseline, seconds, progress=lambda f: bar.update(task, completed=f)
        )
    table = Table(title=f"{model_path} (µs per call; ratio = median of paired bursts)")
    for col in ("runtime", "median µs", "p90 µs", "p99 µs", f"ratio to {baseline}"):
        table.add_column(col, justify="right" if col != "runtime" else "left")
    for r in sorted(results.values(), key=lambda r: r.median_us):
        table.add_row(
            escape(r.name),
            f"{r.median_us:.1f}",
            f"{r.pct(0.9):.1f}",
            f"{r.pct(0.99):.1f}",
            f"{r.ratio:.2f}",
        )
    Console().print(table)
    if json_path:
        with open(json_path, "w") as f:
            f.write(to_json(results, baseline, model=model_path))
    if plot_path:
        try:
            plot(results, plot_path, model_path)
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'tfrt-py[bench]'")


@main.command()
@click.argument("model_paths", nargs=-1, required=True, metavar="MODEL... | DIR")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="0 picks a free port (printed)",
)
@click.option(
    "--batching",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="micro-batching: auto asks the cost model",
)
@click.option("--max-batch", type=click.IntRange(1), help="rows per batch [default: 32]")
@click.option("--max-wait-us", type=click.IntRange(0), help="batch wait, µs [default: 500]")
@click.option(
    "--max-body-bytes", type=click.IntRange(1), default=16 * 1024 * 1024, show_default=True
)
@click.option(
    "--max-decoded-bytes",
    type=click.IntRange(1),
    help="arrays decoded from one body (.npz inflated) [default: 4 x --max-body-bytes]",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0, min_open=True),
    default=30.0,
    show_default=True,
    help="per-request deadline, seconds: 408 body too slow, 504 model too slow",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(0),
    default=5.0,
    show_default=True,
    help="on SIGTERM, seconds for requests in flight; the process exits 5 s after that",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="model calls in flight per model",
)
@click.option(
    "--max-queue",
    type=click.IntRange(0),
    default=128,
    show_default=True,
    help="requests waiting per model; past it: 503 with Retry-After",
)
@click.option(
    "--model-control-mode",
    type=click.Choice(["none", "explicit"]),
    default="none",
    show_default=True,
    help="explicit: POST /v2/repository/models/NAME/load|unload may load and unload models",
)
@click.option("--executor", type=EXECUTOR_CHOICE, default="auto", show_default=True)
@click.option(
    "--warmup",
    "warmup",
    multiple=True,
    metavar="[MODEL:]NAME=DIMS[,...]|[MODEL:]generate",
    help="an input signature to run before /readyz answers 200 (plans checked, native "
    "code compiled), e.g. input_ids=1x128,attention_mask=1x128; MODEL:... for one model, "
    "else every model with those inputs; 'generate': a decoder's generation steps "
    "(prompts of 16 tokens, pasts up to 128, batched as the generate routes batch them); "
    "repeatable",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=8001,
    show_default=True,
    help="the protocol over gRPC too (tritonclient.grpc; needs grpcio: tfrt-py[grpc]); 0 "
    "picks a free port (printed)",
)
@click.option("--no-grpc", is_flag=True, help="serve HTTP only")
@click.option("--log-level", default="warning", show_default=True, help="uvicorn's")
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="worker processes forked after loading (weights shared; docs/scale.md)",
)
def serve(
    model_paths: tuple[str, ...],
    host: str,
    port: int,
    batching: str,
    max_batch: int | None,
    max_wait_us: int | None,
    max_body_bytes: int,
    max_decoded_bytes: int | None,
    timeout: float,
    drain_timeout: float,
    max_concurrency: int,
    max_queue: int,
    model_control_mode: str,
    executor: str,
    warmup: tuple[str, ...],
    grpc_port: int,
    no_grpc: bool,
    log_level: str,
    workers: int,
) -> None:
    """Serve MODEL... (each named by its file stem), or the model repository DIR
    (NAME.onnx or NAME/VERSION/model.onnx), over HTTP (uvicorn, uvloop): the Open
    Inference Protocol (KServe v2: /v2/models/NAME/infer, tritonclient's binary tensors,
    the repository API; over gRPC too, --grpc-port), POST /v1/models/NAME:predict, GET
    /metrics (Prometheus), /healthz, /readyz. Requests are limited in size (--max-body-bytes,
    --max-decoded-bytes), time (--timeout) and number (--max-concurrency, --max-queue)."""
    try:
        from .serving import ModelServer
    except ImportError as e:  # the serving extra is not installed
        _fail(str(e))
    models, repository = _serve_models(model_paths, executor, max_concurrency)
    server = ModelServer(
        models,
        repository=repository,
        batching=batching,
        max_batch=max_batch,
        max_wait_us=max_wait_us,
        max_body_bytes=max_body_bytes,
        max_decoded_bytes=max_decoded_bytes,
        timeout=timeout,
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        load_options={"executor": executor},
        model_control=model_control_mode,
        log=lambda msg: click.echo(msg, err=True),
        warmup=[_parse_signature(w, set(models)) for w in warmup],
    )
    # asked for by --grpc-port: it must serve; by default: logged if it cannot
    explicit = click.get_current_context().get_parameter_source("grpc_port")
    grpc = None if no_grpc else (f"{host}:{grpc_port}", explicit is ParameterSource.COMMANDLINE)
    _run_server(server, models, host, port, log_level, drain_timeout, workers, grpc)


def _serve_models(
    model_paths: tuple[str, ...], executor: str, max_concurrency: int
) -> tuple[dict[str, Any], ModelRepository | None]:
    """``serve``'s models by name, loaded, and the ModelRepository they came from (None for
    model files); a bad path or name fails the command. In a repository a model that
    fails to load does not: it is served as UNAVAILABLE with the reason (the index says
    so, readiness waits for it; ``--model-control-mode explicit`` can unload or reload
    it) and the others serve."""
    import os

    from .serving import ModelConfig, ModelRepository
    from .serving.errors import RequestError
    from .serving.repository import check_name

    models: dict[str, Any] = {}
    repository = None
    if len(model_paths) == 1 and os.path.isdir(model_paths[0]):
        repository = ModelRepository(model_paths[0])
        found, _ = repository.scan()  # the ModelServer logs what it skipped
        if not found:
            _fail(f"no models in the repository {model_paths[0]!r} (NAME.onnx, NAME/1/model.onnx)")
        import tfrt_py

        for name, entry in found.items():
            try:
                model = tfrt_py.load(entry.path, executor=executor, max_concurrency=max_concurrency)
            except (TfrtError, ValueError, OSError) as e:
                click.echo(f"tfrt-py serve: repository: model {name!r} failed to load ({e}); "
                           "it is UNAVAILABLE, the others serve", err=True)  # fmt: skip
                # the server tries it once more and keeps the reason for the index
                models[name] = ModelConfig(entry.path, executor=executor, version=entry.version)
                continue
            models[name] = ModelConfig(model, version=entry.version)
    else:
        for path in model_paths:
            if os.path.isdir(path):
                _fail(f"{path!r} is a directory: serve one repository, or model files")
            name = os.path.splitext(os.path.basename(path))[0]
            if name in models:
                _fail(f"two models named {name!r} (models are named by file stem): {path}")
            try:
                check_name(name)
            except RequestError as e:
                _fail(f"{path}: {e.message}")
            models[name] = _load(path, executor, max_concurrency=max_concurrency)
    return models, repository


def _run_server(
    server: ModelServer,
    models: dict[str, Any],
    host: str,
    port: int,
    log_level: str,
    drain_timeout: float,
    workers: int,
    grpc: tuple[str, bool] | None = None,
) -> None:
    """Serve ``server``'s app (serving ``models``) until shutdown, in ``workers``
    processes, with gRPC on ``grpc`` (address, required); a port that cannot be bound
    fails the command."""
    from .serving import create_app, run_server

    def bound(url: str) -> None:
        click.echo(f"tfrt-py serve: {', '.join(models)} on {url}", err=True)

    run: Any = run_server
    if grpc is not None and workers > 1 and grpc[0].endswith(":0"):  # one port for all
        import socket

        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
            grpc = (f"{host}:{probe.getsockname()[1]}", grpc[1])
    if workers > 1:
        from .serving.prefork import run_prefork

        run = functools.partial(run_prefork, workers=workers, log=lambda m: click.echo(m, err=True))
    try:
        run(
            create_app(
                server, grpc=grpc[0] if grpc else None, grpc_required=bool(grpc and grpc[1])
            ),
            host,
            port,
            log_level=log_level,
            on_bound=bound,
            drain_timeout=drain_timeout,
        )
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e}")


if __name__ == "__main__":
    main()
