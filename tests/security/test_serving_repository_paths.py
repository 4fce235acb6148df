"""Model names and versions from URLs never become paths outside the repository directory:
``..`` (plain or percent-encoded), absolute paths, backslashes and NUL are refused by name
(400) before the filesystem is looked at; an encoded ``/`` matches no route (404); and a
model file or directory that is a symlink out of the repository is refused (400) on load
and skipped at start, while a symlink that stays inside is served. Requests go over a raw
socket, so no client normalizes the path first. Every refusal is JSON, and the server
serves afterwards."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest

from tests.support.serving import GOOD, assert_good_answer, read_response
from tfrt_py.examples import make_models
from tfrt_py.serving import ModelRepository, ModelServer, ServerThread, create_app
from tfrt_py.serving.errors import RequestError


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """repo/: mlp.onnx, inner.onnx -> mlp.onnx (inside); evil.onnx -> ../outside/evil.onnx,
    evildir -> ../outside/evil, sneaky/1/model.onnx -> ../outside/evil.onnx (all outside)."""
    base = tmp_path_factory.mktemp("paths")
    repo, outside = base / "repo", base / "outside"
    (outside / "evil" / "1").mkdir(parents=True)
    repo.mkdir()
    proto = make_models.mlp_small()
    onnx.save(proto, repo / "mlp.onnx")
    onnx.save(proto, outside / "evil.onnx")
    onnx.save(proto, outside / "evil" / "1" / "model.onnx")
    os.symlink(repo / "mlp.onnx", repo / "inner.onnx")
    os.symlink(outside / "evil.onnx", repo / "evil.onnx")
    os.symlink(outside / "evil", repo / "evildir")
    (repo / "sneaky" / "1").mkdir(parents=True)
    os.symlink(outside / "evil.onnx", repo / "sneaky" / "1" / "model.onnx")
    return repo, outside


@pytest.fixture(scope="module")
def served(layout: tuple[Path, Path]) -> Iterator[tuple[str, ModelServer, list[str]]]:
    log: list[str] = []
    server = ModelServer(repository=str(layout[0]), log=log.append, model_control="explicit")
    with ServerThread(create_app(server)) as url:
        yield url, server, log


def raw_post(url: str, path: str) -> tuple[int, dict[str, str]]:
    """POST ``path`` exactly as given (no normalization); the status and JSON body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode("latin-1"))
        reply = read_response(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), reply[:500]
    return int(head[9:12]), json.loads(body)


def test_only_the_models_inside_are_served(served: tuple[str, ModelServer, list[str]]) -> None:
    _, server, log = served
    assert sorted(server.models) == ["inner", "mlp"]
    for name in ("evil", "evildir", "sneaky"):
        assert any(f"'{name}'" in line and "outside the repository" in line for line in log), log


@pytest.mark.parametrize(
    ("name", "status", "needle"),
    [
        ("..", 400, "invalid model name"),
        ("%2e%2e", 400, "invalid model name"),
        (".", 400, "invalid model name"),
        (".hidden", 400, "invalid model name"),
        ("..%5Cevil", 400, "invalid model name"),
        ("a%00b", 400, "invalid model name"),
        ("..%2F..%2Foutside%2Fevil", 404, "no route"),
        ("%2Fetc%2Fpasswd", 404, "no route"),
        ("evil", 400, "outside the repository"),
        ("evildir", 400, "outside the repository"),
        ("sneaky", 400, "outside the repository"),
        ("nothere", 404, "no model 'nothere'"),
    ],
)
def test_names_from_urls_never_leave_the_repository(
    served: tuple[str, ModelServer, list[str]], name: str, status: int, needle: str
) -> None:
    url, server, _ = served
    got, doc = raw_post(url, f"/v2/repository/models/{name}/load")
    assert got == status and needle in doc["error"], doc
    got, doc = raw_post(url, f"/v2/repository/models/{name}/unload")
    if needle == "invalid model name":
        assert got == 400 and needle in doc["error"], doc
    else:  # not a served model (or no route): nothing to unload
        assert got == 404, doc
    assert sorted(server.models) == ["inner", "mlp"]  # nothing outside was loaded
    with httpx.Client(base_url=url, timeout=60) as c:
        assert_good_answer(c.post("/v1/models/mlp:predict", json=GOOD))


def test_a_symlink_inside_the_repository_loads(served: tuple[str, ModelServer, list[str]]) -> None:
    url, _, _ = served
    status, doc = raw_post(url, "/v2/repository/models/inner/load")
    assert status == 200 and doc["state"] == "READY", doc
    with httpx.Client(base_url=url, timeout=60) as c:
        assert_good_answer(c.post("/v1/models/inner:predict", json=GOOD))


@pytest.mark.parametrize("name", ["..", "../repo", "/etc/passwd", "a/b", "a\\b", "", "x" * 129])
def test_locate_refuses_names_before_touching_the_filesystem(
    layout: tuple[Path, Path], name: str
) -> None:
    with pytest.raises(RequestError) as info:
        ModelRepository(layout[0]).locate(name)
    assert info.value.status == 400 and "invalid model name" in info.value.message
