"""Load test of `tfrt-py serve` on 127.0.0.1: requests/s and p50/p99, micro-batching off/on,
the v1 JSON route against the Open Inference Protocol (v2) with binary tensors.

    python benchmarks/serve_load.py [--requests 3000] [--concurrency 32] \
        [--blas-threads default,1] [--protocols v1,v2]

Starts the real server (`tfrt-py serve ... --port 0`, uvicorn + uvloop + httptools) in
two subprocesses, one with ``--batching off`` and one with ``--batching on``, and drives each
model with a bounded number of requests from a fixed number of keep-alive connections, per
protocol:

* ``v1``: ``POST /v1/models/NAME:predict`` with JSON bodies, from a raw asyncio HTTP/1.1
  client on uvloop (less client overhead than httpx on the same 2 cores);
* ``v2``: ``POST /v2/models/NAME/infer`` through Triton's own asyncio client
  (``tritonclient.http.aio``, aiohttp) with binary tensors in and out, as a Triton user
  would send them. Its client costs more CPU per request than the raw v1 client, and
  client and server share the cores: the v2 figures include that;
* ``grpc``: the same requests over gRPC (``--grpc-port``) through
  ``tritonclient.grpc.aio``, raw contents in and out, ``concurrency`` calls in flight on
  one channel (HTTP/2 multiplexes them), as its users send them.

Every response is checked -- status 200 and outputs equal to a local ``model.run`` of the
same input -- and counted as failed otherwise; the script exits 1 if any request failed.
The two servers take turns (``--rounds`` alternations per model and protocol), so noise
from elsewhere on the machine hits both alike. Each configuration runs twice: with the
BLAS library's own threading (the default) and with one BLAS thread per server process
(OPENBLAS_NUM_THREADS=1 and friends), the usual setting for a serving process. Models:

* ``mlp_small`` -- the bundled tiny model (x[1,64], 0.17 MFLOP): no batch dim, never batched;
* ``mlp_small_dyn`` -- the same weights with a dynamic batch dim: batching forced on for a
  tiny model (what the cost model's "auto" avoids);
* ``mlp_wide`` -- x[N,256] -> 1024 -> 1024 -> 16, 2.65 MFLOP per row, built from seed 0:
  what "auto" batches.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.examples import make_models

TFRT_PY = os.path.join(os.path.dirname(sys.executable), "tfrt-py")
N_BODIES = 32  # distinct request bodies per model, cycled


def mlp_wide(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    sizes = [256, 1024, 1024, 16]
    nodes, inits, cur = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((sizes[i], sizes[i + 1])) / np.sqrt(sizes[i])).astype(np.float32)
        b = (rng.standard_normal(sizes[i + 1]) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{i}", f"B{i}"], [f"h{i}"]))
        cur = f"h{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
            cur = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp_wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["N", 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp_small_dyn() -> onnx.ModelProto:
    m = make_models.mlp_small()
    for v in (m.graph.input[0], m.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    return m


@dataclass
class Case:
    name: str
    input_name: str
    xs: list[np.ndarray]
    bodies: list[bytes]  # v1 JSON bodies of xs
    expected: list[dict[str, np.ndarray]]


def make_cases(tmp: str) -> tuple[list[str], list[Case]]:
    paths = [os.path.join(os.path.dirname(make_models.__file__), "mlp_small.onnx")]
    for name, proto in (("mlp_small_dyn", mlp_small_dyn()), ("mlp_wide", mlp_wide())):
        paths.append(os.path.join(tmp, f"{name}.onnx"))
        onnx.save(proto, paths[-1])
    rng = np.random.default_rng(1)
    cases = []
    for path in paths:
        model = tfrt_py.load(path)
        spec = model.inputs[0]
        shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape or ())
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(N_BODIES)]
        bodies = [json.dumps({"inputs": {spec.name: x.tolist()}}).encode() for x in xs]
        expected = [model.run({spec.name: x}) for x in xs]
        name = os.path.splitext(os.path.basename(path))[0]
        cases.append(Case(name, spec.name, xs, bodies, expected))
    return paths, cases


async def _request(reader: Any, writer: Any, head: bytes, body: bytes) -> tuple[int, bytes]:
    writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
    headers = await reader.readuntil(b"\r\n\r\n")
    status = int(headers[9:12])
    m = re.search(rb"(?i)content-length: *(\d+)", headers)
    return status, await reader.readexactly(int(m.group(1)) if m else 0)


def _ok(status: int, payload: bytes, expected: dict[str, np.ndarray]) -> bool:
    if status != 200:
        return False
    outputs = json.loads(payload)["outputs"]
    return all(np.allclose(outputs[k], v, rtol=1e-4, atol=1e-5) for k, v in expected.items())


async def drive(
    port: int, case: Case, requests: int, concurrency: int, protocol: str = "v1"
) -> dict[str, Any]:
    """``requests`` requests of ``protocol`` from ``concurrency`` keep-alive connections:
    seconds, latencies (ms), failed count."""
    if protocol == "v2":
        return await drive_v2(port, case, requests, concurrency)
    if protocol == "grpc":
        return await drive_grpc(port, case, requests, concurrency)
    head = (
        f"POST /v1/models/{case.name}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: "
    ).encode()
    latencies: list[float] = []
    failed = 0
    counter = iter(range(requests))

    async def client() -> None:
        nonlocal failed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in counter:
                k = i % len(case.bodies)
                t0 = time.perf_counter()
                try:
                    status, payload = await _request(reader, writer, head, case.bodies[k])
                except (OSError, asyncio.IncompleteReadError):
                    failed += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    continue
                latencies.append((time.perf_counter() - t0) * 1e3)
                if not _ok(status, payload, case.expected[k]):
                    failed += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return {
        "seconds": time.perf_counter() - t0,
        "latencies": latencies,
        "failed": failed,
        "requests": requests,
    }


async def drive_v2(port: int, case: Case, requests: int, concurrency: int) -> dict[str, Any]:
    """``drive`` for the v2 route, through tritonclient's asyncio client, binary tensors
    in and out."""
    import tritonclient.http as triton
    import tritonclient.http.aio as triton_aio

    client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}", conn_limit=concurrency)
    inputs = []
    for x in case.xs:
        t = triton.InferInput(case.input_name, list(x.shape), "FP32")
        t.set_data_from_numpy(x, binary_data=True)
        inputs.append(t)
    outputs = [triton.InferRequestedOutput(n, binary_data=True) for n in case.expected[0]]

    async def infer(k: int) -> Any:
        return await client.infer(case.name, [inputs[k]], outputs=outputs)

    return await _clients(infer, client, case, requests, concurrency)


async def drive_grpc(port: int, case: Case, requests: int, concurrency: int) -> dict[str, Any]:
    """``drive`` over gRPC (``port``: the server's gRPC port), tritonclient's asyncio
    client, ``concurrency`` calls in flight."""
    import tritonclient.grpc as tgrpc
    import tritonclient.grpc.aio as tgrpc_aio

    client = tgrpc_aio.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = []
    for x in case.xs:
        t = tgrpc.InferInput(case.input_name, list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        inputs.append(t)

    async def infer(k: int) -> Any:
        return await client.infer(case.name, [inputs[k]])

    return await _clients(infer, client, case, requests, concurrency)


async def _clients(
    infer: Any, client: Any, case: Case, requests: int, concurrency: int
) -> dict[str, Any]:
    """``requests`` calls of ``infer(body index)`` from ``concurrency`` tasks sharing
    ``client`` (closed at the end): every answer checked against ``case.expected``."""
    from tritonclient.utils import InferenceServerException

    names = list(case.expected[0])
    latencies: list[float] = []
    failed = 0
    counter = iter(range(requests))

    async def worker() -> None:
        nonlocal failed
        for i in counter:
            k = i % len(case.xs)
            t0 = time.perf_counter()
            try:
                result = await infer(k)
            except (InferenceServerException, OSError):
                failed += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)
            want = case.expected[k]
            if not all(
                np.allclose(result.as_numpy(n), want[n], rtol=1e-4, atol=1e-5) for n in names
            ):
                failed += 1

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return {
        "seconds": time.perf_counter() - t0,
        "latencies": latencies,
        "failed": failed,
        "requests": requests,
    }


async def _get_json(port: int, path: str) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    headers = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"(?i)content-length: *(\d+)", headers)
    payload = await reader.readexactly(int(m.group(1)) if m else 0)
    writer.close()
    return int(headers[9:12]), json.loads(payload)


async def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(1200):
        try:
            if (await _get_json(port, "/readyz"))[0] == 200:
                return
        except (OSError, asyncio.IncompleteReadError):
            pass
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.05)
    raise SystemExit("tfrt-py serve did not become ready")


def start_server(
    paths: list[str], batching: str, log: str, extra: list[str], blas: str
) -> tuple[Any, int]:
    env = dict(os.environ)
    if blas != "default":
        env.update(
            {k: blas for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        )
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [
                TFRT_PY,
                "serve",
                *paths,
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--batching",
                batching,
                *extra,
            ],
            stderr=err,
            env=env,
        )
    for _ in range(1200):
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", _read(log))
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"tfrt-py serve did not start:\n{_read(log)}")


def grpc_port(log: str) -> int:
    """The gRPC port a started server printed (once its app is up)."""
    for _ in range(1200):
        m = re.search(r"GRPCInferenceService\) on 127\.0\.0\.1:(\d+)", _read(log))
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    raise SystemExit(f"tfrt-py serve printed no gRPC port:\n{_read(log)}")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


async def run_pair(
    paths: list[str], cases: list[Case], blas: str, a: Any, tmp: str
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Both servers (--batching off and on) up at once; per model and protocol,
    ``a.rounds`` rounds alternating between them (so load from elsewhere on the machine
    hits both alike)."""
    extra = []
    if a.max_batch is not None:
        extra += ["--max-batch", str(a.max_batch)]
    if a.max_wait_us is not None:
        extra += ["--max-wait-us", str(a.max_wait_us)]
    modes = ("off", "on")
    servers = {
        m: start_server(paths, m, os.path.join(tmp, f"{m}-{blas}.log"), extra, blas) for m in modes
    }
    rows = []
    try:
        for proc, port in servers.values():
            await wait_ready(port, proc)
        grpc = {m: grpc_port(os.path.join(tmp, f"{m}-{blas}.log")) for m in modes}
        per_round = max(1, a.requests // a.rounds)
        for case in cases:
            for proto in a.protocols.split(","):
                runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
                before = {}
                for m, (_, port) in servers.items():
                    at = grpc[m] if proto == "grpc" else port
                    await drive(at, case, min(300, a.requests), a.concurrency, proto)  # warm-up
                    before[m] = (await _get_json(port, f"/v1/models/{case.name}"))[1]["batching"]
                for k in range(a.rounds):
                    for m in modes if k % 2 == 0 else modes[::-1]:
                        port = grpc[m] if proto == "grpc" else servers[m][1]
                        runs[m].append(await drive(port, case, per_round, a.concurrency, proto))
                for m, (_, port) in servers.items():
                    after = (await _get_json(port, f"/v1/models/{case.name}"))[1]["batching"]
                    rows.append((case.name, m, proto, _summary(runs[m], before[m], after)))
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return rows


def _summary(runs: list[dict[str, Any]], before: Any, after: Any) -> dict[str, Any]:
    lat = np.asarray([x for r in runs for x in r["latencies"]])
    n_req = sum(r["requests"] for r in runs)
    n = after["batched_requests"] - before["batched_requests"]
    b = after["batches"] - before["batches"]
    return {
        "rps": n_req / sum(r["seconds"] for r in runs),
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "failed": sum(r["failed"] for r in runs),
        "batching": "on" if after["enabled"] else "off",
        "mean_batch": n / b if b else 1.0,
        "batched_share": n / n_req,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-batch", type=int)
    ap.add_argument("--max-wait-us", type=int)
    ap.add_argument("--rounds", type=int, default=4, help="alternations of off/on per model")
    ap.add_argument(
        "--protocols",
        default="v1,v2",
        help="v1 (JSON, raw client), v2 (binary tensors, tritonclient), grpc (tritonclient)",
    )
    ap.add_argument(
        "--blas-threads",
        default="default,1",
        help="server's BLAS threads, one run each: 'default' (the library's) or N",
    )
    a = ap.parse_args()
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
    except ImportError:
        new_loop = asyncio.new_event_loop
    print(
        f"tfrt-py serve on 127.0.0.1, {a.requests} requests per row, "
        f"{a.concurrency} keep-alive connections, {os.cpu_count()} cores shared by client "
        f"and server\n"
    )
    print(
        "| BLAS threads | model | --batching | batching | protocol | requests/s | p50 ms "
        "| p99 ms | mean batch | batched | failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        paths, cases = make_cases(tmp)
        for blas in a.blas_threads.split(","):
            loop = new_loop()
            try:
                rows = loop.run_until_complete(run_pair(paths, cases, blas, a, tmp))
            finally:
                loop.close()
            for name, batching, proto, r in rows:
                failed += r["failed"]
                print(
                    f"| {blas} | {name} | {batching} | {r['batching']} | {proto} "
                    f"| {r['rps']:,.0f} "
                    f"| {r['p50']:.2f} | {r['p99']:.2f} | {r['mean_batch']:.1f} | "
                    f"{r['batched_share']:.0%} | {r['failed']} |"
                )
    print(f"\nfailed requests: {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
