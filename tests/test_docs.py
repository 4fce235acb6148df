"""Every ```python block in README.md and docs/ runs (issue 33: the README tour used ``x``
and ``batches`` it never defined, the GraphBuilder snippet lacked its imports, and
docs/serving.md's example failed).

Each block runs as a script in a fresh process, in a directory holding the files the docs
name (``model.onnx``, ``mlp_small.onnx``, ``wide.onnx``, ``big.onnx``, a ``models/``
repository, ``decoder.onnx``: a KV-cache decoder with optimum's names; all made here,
nothing downloaded), with top-level ``await`` and ``async for`` allowed (the README shows
calls from async code). An HTML comment right above a block says how to run it:

* ``<!-- doc-test: continues -->``: after the block before it in the same file, as one
  script;
* ``<!-- doc-test: package P -->``: as a module of package ``P`` (a template of a module
  that lives there, with relative imports);
* ``<!-- doc-test: server -->``: a server the next block talks to: started, waited for
  until ``/v2/health/ready`` answers, then the next block runs and the server is stopped;
* ``<!-- doc-test: skip REASON -->``: not run; the test skips saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLES, ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!-- doc-test: (?P<how>[^>]*?) -->\s*\n)?```python\n(?P<code>.*?)```",
                    re.S)  # fmt: skip
_RUNNER = """
import ast, asyncio, sys, types
source = open(sys.argv[1]).read()
package = sys.argv[2] if len(sys.argv) > 2 else ""
name = package + "._doc_block" if package else "__main__"
module = types.ModuleType(name)
module.__package__ = package or None
sys.modules[name] = module
code = compile(source, "<doc block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, module.__dict__)
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


@dataclass
class Block:
    doc: str
    index: int
    how: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}#{self.index}"


def _blocks() -> list[Block]:
    out = []
    for path in DOCS:
        for k, m in enumerate(_BLOCK.finditer(path.read_text()), 1):
            rel = str(path.relative_to(ROOT))
            out.append(Block(rel, k, (m.group("how") or "").strip(), m.group("code")))
    return out


BLOCKS = _blocks()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the docs name, made from the bundled examples and the test models."""
    import tests.support.scale_models as sm

    d = tmp_path_factory.mktemp("docs")
    mlp = EXAMPLES / "mlp_small.onnx"
    for name in ("model.onnx", "mlp_small.onnx"):
        shutil.copy(mlp, d / name)
    sm.wide_model(d / "wide.onnx", 1, external=False)
    sm.wide_model(d / "big.onnx", 16, external=True)  # x float32[N, 1024], weights beside it
    from tests.support.models.decoder import decoder

    (d / "decoder.onnx").write_bytes(decoder(kv_heads=2).SerializeToString())
    (d / "models" / "ads" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / "ads_normalize.onnx", d / "models" / "ads" / "1" / "model.onnx")
    return d


def _script(block: Block) -> str:
    """The block, after the blocks it continues."""
    parts = [block.code]
    k = BLOCKS.index(block)
    while BLOCKS[k].how == "continues":
        k -= 1
        parts.insert(0, BLOCKS[k].code)
    return "\n".join(parts)


def _run(script: str, workdir: Path, package: str = "", timeout: float = 300) -> None:
    path = workdir / "_block.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", _RUNNER, str(path), *([package] if package else [])]
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"the block failed:\n{script}\n{done.stderr[-3000:]}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_doc_block_runs(block: Block, workdir: Path) -> None:
    how = block.how
    if how.startswith("skip"):
        pytest.skip(f"{block.id}: {how[4:].strip()}")
    k = BLOCKS.index(block)
    if k and BLOCKS[k - 1].how == "server":
        pytest.skip(f"{block.id} runs with the server block before it")
    if how.startswith("package "):
        _run(block.code, workdir, package=how.split()[1])
    elif how == "server":
        _serve_and_call(block, BLOCKS[k + 1], workdir)
    else:
        _run(_script(block), workdir)


def _serve_and_call(server: Block, client: Block, workdir: Path) -> None:
    """``server`` (which serves on 127.0.0.1:8000) in its own process, then ``client``."""
    if not _port_free(8000):
        pytest.skip("port 8000 is taken on this host; the docs' server block listens there")
    path = workdir / "_server.py"
    path.write_text(server.code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = workdir / "_server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(path)], cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server block exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (
                    f"the server block never became ready:\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.2)
        _run(textwrap.dedent(client.code), workdir)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_every_doc_block_is_collected() -> None:
    """The pattern finds every block (a directive typo would hide one)."""
    fences = sum(p.read_text().count("```python") for p in DOCS)
    assert len(BLOCKS) == fences
    known = ("", "continues", "server")
    for b in BLOCKS:
        assert b.how in known or b.how.startswith(("skip ", "package ")), (b.id, b.how)
