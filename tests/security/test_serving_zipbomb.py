"""Zip bombs against `tfrt-py serve` (a real subprocess, 2 MiB body limit, so 8 MiB of
decoded arrays): a ~1 MB .npz that inflates to 1 GiB is refused from its .npy header
before anything is inflated, and so is a member whose header lies (more data than it
declares) or that uses a compression that cannot be inflated in bounded steps (bzip2).
The server's peak resident memory (VmHWM) shows nothing was inflated, it answers a good
request afterwards, and it still stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.serving import (
    GOOD,
    MLP,
    NPZ,
    assert_good_answer,
    npy_header,
    peak_rss_mb,
    serve_process,
    wait_ready,
    zip_bomb,
)

GIB = 1 << 30
LIMIT = 2 << 20  # --max-body-bytes; decoded arrays: 4x that


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, httpx.Client]]:
    log = tmp_path_factory.mktemp("zipbomb") / "serve.log"
    with serve_process([MLP, "--max-body-bytes", str(LIMIT)], log) as (proc, url):
        with httpx.Client(base_url=url, timeout=120) as c:
            wait_ready(c)
            assert_good_answer(c.post("/v1/models/mlp_small:predict", json=GOOD))
            yield proc.pid, c
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        assert code == -signal.SIGTERM, Path(log).read_text()


def _post_bomb(c: httpx.Client, body: bytes) -> httpx.Response:
    assert len(body) <= LIMIT  # the body itself is legal
    return c.post("/v1/models/mlp_small:predict", content=body, headers=NPZ)


def test_an_npz_bomb_is_refused_from_its_header(server: tuple[int, httpx.Client]) -> None:
    pid, c = server
    before = peak_rss_mb(pid)
    bomb = zip_bomb("x.npy", npy_header((GIB // 4,)), GIB)  # 1 GiB of float32, honestly
    r = _post_bomb(c, bomb)
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert "'x'" in error and "declares" in error and str(4 * LIMIT) in error
    assert peak_rss_mb(pid) - before < 128, "the server inflated the bomb"
    assert_good_answer(c.post("/v1/models/mlp_small:predict", json=GOOD))


def test_an_npz_member_with_more_data_than_its_header_is_refused(
    server: tuple[int, httpx.Client],
) -> None:
    pid, c = server
    before = peak_rss_mb(pid)
    bomb = zip_bomb("x.npy", npy_header((1, 64)), GIB)  # declares 256 bytes, holds 1 GiB
    r = _post_bomb(c, bomb)
    assert r.status_code == 400, r.text
    assert "more data than the header declares" in r.json()["error"]
    assert peak_rss_mb(pid) - before < 128, "the server inflated the bomb"
    assert_good_answer(c.post("/v1/models/mlp_small:predict", json=GOOD))


def test_a_bzip2_member_is_refused_before_it_is_inflated(
    server: tuple[int, httpx.Client],
) -> None:
    """zipfile inflates a bzip2 member's whole compressed chunk at once (no max_length):
    ~100 bytes of it are 256 MiB. Only stored and deflate members are accepted."""
    pid, c = server
    before = peak_rss_mb(pid)
    bomb = zip_bomb("x.npy", npy_header((1, 64)), GIB // 4, method=zipfile.ZIP_BZIP2)
    r = _post_bomb(c, bomb)
    assert r.status_code == 400, r.text
    assert "compression method" in r.json()["error"]
    assert peak_rss_mb(pid) - before < 128, "the server inflated the bomb"
    assert_good_answer(c.post("/v1/models/mlp_small:predict", json=GOOD))
