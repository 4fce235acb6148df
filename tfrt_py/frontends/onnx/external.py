"""Open an ONNX external-data file safely: the one gate every reader of external data uses.

Model files come from strangers, and a tensor's ``location`` is a path the model's author
chose. ``open_external`` opens it only when it names a regular file inside the model's
directory (``base_dir``), with rules at least as strict as onnx's own since its
CVE-2022-25882 and CVE-2024-27318 fixes (``onnx/checker.cc``,
``resolve_external_data_location`` / ``open_external_data``). Refused, as a
``ModelLoadError`` naming the tensor and the location:

- an empty location, one holding a NUL byte, an absolute one, or one containing ``..``
  anywhere (onnx refuses ``..`` in the normalized location; we refuse it in the raw text,
  which is stricter);
- a location whose last component is a symbolic link, or that resolves (through a
  symlinked directory) outside ``base_dir``;
- anything but a regular file: a directory (``.``, ``sub/``), a FIFO, a device, a socket;
- a file with more than one hard link (onnx: "potential hardlink attack");
- a file that changed between the checks and the open (the opened descriptor and the
  checked path must be the same inode).

The open itself uses ``O_NOFOLLOW | O_NONBLOCK`` so neither a last-moment symlink nor a
FIFO can redirect or block it. Thread-safe (no shared state); used at load by
``tensors.external_ref``/``to_array`` and at run time by the streaming transfer kernel,
which re-opens the weights file and so re-checks it.
"""

from __future__ import annotations

import os
import stat

from ...errors import ModelLoadError

__all__ = ["check_base_dir", "open_external"]

_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def check_base_dir(base_dir: str) -> str:
    """``base_dir`` as an absolute path; ModelLoadError unless it is an existing directory."""
    if "\0" in base_dir:
        raise ModelLoadError(f"base directory {base_dir!r} contains a NUL byte")
    path = os.path.abspath(base_dir)
    if not os.path.isdir(path):
        raise ModelLoadError(f"base directory for external data is not a directory: {path}")
    return path


def open_external(base_dir: str, location: str, tensor: str) -> tuple[int, str]:
    """Open ``location`` (relative to ``base_dir``) read-only for tensor ``tensor``.

    Returns ``(fd, path)``: a descriptor of a regular file inside ``base_dir`` (the caller
    closes it) and its absolute path. Raises ModelLoadError naming the tensor and the
    location for every refused form listed in the module docstring, and when the file
    cannot be opened.
    """
    path = _checked_path(base_dir, location, tensor)
    where = f"tensor {tensor!r}: external data location {location!r}"
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise ModelLoadError(f"{where}: file not found: {path}") from None
    except OSError as e:  # ELOOP: a symlink swapped in after the check, EACCES, ...
        raise ModelLoadError(f"{where}: cannot open {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelLoadError(f"{where}: {path} is not a regular file")
        if st.st_nlink > 1:
            raise ModelLoadError(
                f"{where}: {path} has {st.st_nlink} hard links; refused (a hard link can "
                "expose a file from outside the model's directory)"
            )
        real = os.stat(os.path.realpath(path))
        if (real.st_dev, real.st_ino) != (st.st_dev, st.st_ino):
            raise ModelLoadError(f"{where}: {path} changed while it was being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd, path


def _checked_path(base_dir: str, location: str, tensor: str) -> str:
    """The absolute path ``location`` names inside ``base_dir``, or ModelLoadError."""
    where = f"tensor {tensor!r}: external data location {location!r}"
    if not location:
        raise ModelLoadError(f"tensor {tensor!r}: external data without a location")
    if "\0" in location:
        raise ModelLoadError(f"{where} contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or _has_drive(location):
        raise ModelLoadError(
            f"{where} is an absolute path; external data must be a relative path inside "
            "the model's directory"
        )
    if ".." in location:
        raise ModelLoadError(
            f"{where} contains '..'; external data must stay inside the model's directory"
        )
    base = check_base_dir(base_dir)
    path = os.path.join(base, os.path.normpath(location))
    if os.path.islink(path):
        raise ModelLoadError(f"{where}: {path} is a symbolic link; refused")
    real_base = os.path.realpath(base)
    real = os.path.realpath(path)
    if real == real_base:
        raise ModelLoadError(f"{where} names the model's directory itself, not a file")
    if os.path.commonpath([real, real_base]) != real_base:
        raise ModelLoadError(
            f"{where} resolves to {real}, outside the model's directory {real_base} "
            "(through a symbolic link?)"
        )
    return path


def _has_drive(location: str) -> bool:
    """``C:...``: a drive-qualified path, absolute or drive-relative on Windows."""
    return len(location) >= 2 and location[1] == ":" and location[0].isalpha()
