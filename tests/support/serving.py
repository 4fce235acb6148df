"""Shared pieces of the serving security tests (tests/security/test_serving_*.py): small
models, hostile bodies (.npy headers, zip bombs), `tfrt-py serve` as a subprocess, and
how to tell that two responses came over the same keep-alive connection."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import onnx
from numpy.lib import format as npformat
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tfrt_py.examples import make_models

TFRT_PY = os.path.join(os.path.dirname(sys.executable), "tfrt-py")
EXAMPLES = Path(tfrt_py.__file__).parent / "examples"
MLP = str(EXAMPLES / "mlp_small.onnx")  # x float32[1, 64] -> probs float32[1, 10]
X = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
GOOD = {"inputs": {"x": X.tolist()}}
NPY = {"content-type": "application/x-npy"}
NPZ = {"content-type": "application/x-npz"}


def mlp() -> tfrt_py.Model:
    return tfrt_py.load(make_models.mlp_small())


def assert_good_answer(r: httpx.Response) -> None:
    """``r`` is the right answer of mlp_small to ``GOOD``."""
    assert r.status_code == 200, r.text
    want = tfrt_py.load(MLP).run({"x": X})["probs"]
    np.testing.assert_allclose(r.json()["outputs"]["probs"], want, rtol=1e-6, atol=1e-7)


def client_port(r: httpx.Response) -> int:
    """The client-side port of the connection ``r`` came over (one per connection)."""
    addr = r.extensions["network_stream"].get_extra_info("client_addr")
    return int(addr[1])


# -- models ---------------------------------------------------------------------------------


def loop_model() -> onnx.ModelProto:
    """y = x + n: a Loop adding 1 to x float32[4] ``n`` times, n an int64 scalar feed --
    any trip count a client sends, 2**62 included."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["x_in", "one"], ["x_out"]),
        ],
        "add_one",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [4]),
        ],
        [numpy_helper.from_array(np.ones(4, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "runaway",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rowsum_model() -> onnx.ModelProto:
    """y[N, 1] = sum of x[N, 64] over its rows: a batch dim and next to no compute, so a
    big body is all decoding."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        "rowsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# -- bodies ---------------------------------------------------------------------------------


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A valid .npy 1.0 header declaring ``shape`` of ``descr``, and no data."""
    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def zip_bomb(
    name: str, header: bytes, zero_bytes: int, method: int = zipfile.ZIP_DEFLATED
) -> bytes:
    """An .npz whose member ``name`` is ``header`` followed by ``zero_bytes`` zeros,
    compressed (deflate level 9 inflates ~1000x)."""
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", method, compresslevel=9) as zf,
        zf.open(name, "w", force_zip64=True) as f,
    ):
        f.write(header)
        chunk = bytes(1 << 20)
        left = zero_bytes
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    return buf.getvalue()


# -- `tfrt-py serve` as a subprocess --------------------------------------------------------


@contextmanager
def serve_process(args: list[str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`tfrt-py serve ARGS --port 0` running, its URL once bound (stderr to ``log``);
    killed at exit if still running."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [TFRT_PY, "serve", *args, "--port", "0"], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        yield proc, wait_for_url(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def wait_for_url(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The URL `tfrt-py serve` printed to ``log`` once it bound (AssertionError if it exited)."""
    for _ in range(1200):
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if m:
            return m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"tfrt-py serve did not bind (exit {proc.poll()}):\n{log.read_text()}")


def wait_ready(c: httpx.Client) -> None:
    for _ in range(1200):
        try:
            if c.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("tfrt-py serve never became ready")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert m, status
    return int(m.group(1)) / 1024


def read_response(s: socket.socket) -> bytes:
    """One HTTP/1.1 response (head and Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)content-length: *(\d+)", head)
    while m and len(body) < int(m.group(1)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
