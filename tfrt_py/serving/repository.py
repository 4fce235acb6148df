"""A model repository: a directory of models, ``tfrt-py serve DIR``.

Layout (Triton's, for ONNX)::

    DIR/NAME.onnx                    model NAME, version 1
    DIR/NAME/VERSION/model.onnx      model NAME, version VERSION (a positive integer);
                                     the highest version present is served

A model's external-data files sit next to its ``.onnx`` (the ONNX reader refuses paths
out of that directory). Names are 1-128 characters of ``A-Za-z0-9_.-``, not starting with
``.`` or ``-``; files and directories with other names are skipped (and reported).

Names and versions come from URLs (``POST /v2/repository/models/NAME/load``), so they never
become paths on their own word: a name must match the pattern above (so ``..``, ``/``,
``\\``, NUL and absolute paths are refused with 400 before the filesystem is touched), a
version must be digits, and the file found -- after resolving every symlink -- must lie
inside the repository's own resolved directory (a symlink out is refused, 400). Only the
``.onnx`` path found this way is handed to ``tfrt_py.load``.

Pure filesystem reads, no state but the root: thread-safe; ``locate`` and ``scan`` read
directories, so the server calls them off the event loop.
"""

from __future__ import annotations

import os
import re

from ..records import record
from .errors import RequestError

__all__ = ["Entry", "ModelRepository", "check_name"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
MODEL_FILE = "model.onnx"


def check_name(name: str) -> str:
    """``name`` if it is a valid model name, else RequestError(400) saying what is allowed."""
    if not _NAME.fullmatch(name):
        raise RequestError(
            400,
            f"invalid model name {name[:100]!r}: 1-128 characters of A-Z a-z 0-9 _ . -, "
            "not starting with '.' or '-'",
        )
    return name


@record(frozen=True)
class Entry:
    """One model of the repository: its name, the version found and the resolved path of
    its ``.onnx`` file (inside the repository)."""

    name: str
    version: str
    path: str


class ModelRepository:
    """The models under ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            raise ValueError(f"model repository {os.fspath(root)!r} is not a directory")
        self.root = real

    def _inside(self, path: str) -> str | None:
        """``path`` resolved, if that lies inside the repository; else None."""
        real = os.path.realpath(path)
        return real if os.path.commonpath([self.root, real]) == self.root else None

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def locate(self, name: str) -> Entry:
        """The model ``name``: its highest version. RequestError 400 for an invalid name or
        a file that resolves out of the repository, 404 for a model that is not there."""
        check_name(name)
        flat = os.path.join(self.root, name + ".onnx")
        tree = os.path.join(self.root, name)
        has_flat, has_tree = os.path.lexists(flat), os.path.isdir(tree)
        if has_flat and has_tree:
            raise RequestError(
                400, f"model {name!r}: both {name}.onnx and {name}/ are in the repository"
            )
        if has_flat:
            return Entry(name, "1", self._file(name, flat))
        if not has_tree:
            raise RequestError(404, f"no model {name!r} in the repository")
        if self._inside(tree) is None:
            raise RequestError(400, f"model {name!r}: {name}/ resolves outside the repository")
        versions = sorted((int(v) for v in os.listdir(tree) if _VERSION.fullmatch(v)), reverse=True)
        for v in versions:
            path = os.path.join(tree, str(v), MODEL_FILE)
            if os.path.lexists(path):
                return Entry(name, str(v), self._file(name, path))
        raise RequestError(
            404, f"model {name!r}: no {name}/VERSION/{MODEL_FILE} (VERSION a positive integer)"
        )

    def _file(self, name: str, path: str) -> str:
        real = self._inside(path)
        if real is None:
            raise RequestError(
                400, f"model {name!r}: {self._rel(path)} resolves outside the repository"
            )
        if not os.path.isfile(real):
            raise RequestError(400, f"model {name!r}: {self._rel(path)} is not a regular file")
        return real

    def scan(self) -> tuple[dict[str, Entry], list[str]]:
        """Every model found (name -> Entry) and the problems met (skipped entries), each
        one line naming the file."""
        found: dict[str, Entry] = {}
        problems: list[str] = []
        names = set()
        for entry in sorted(os.listdir(self.root)):
            if entry.startswith("."):
                continue
            full = os.path.join(self.root, entry)
            if entry.endswith(".onnx") and not os.path.isdir(full):
                names.add(entry[: -len(".onnx")])
            elif os.path.isdir(full):
                names.add(entry)
        for name in sorted(names):
            try:
                found[name] = self.locate(name)
            except RequestError as e:
                problems.append(e.message)
        return found, problems
