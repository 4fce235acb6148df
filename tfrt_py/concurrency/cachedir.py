"""The private cache directory, and whether to trust it.

The native tier's generated modules, numba's cache for them (whose index and data files
are pickles: loading one runs code) and the packed gemms' machine code
(``llvm_jit.compile_ir_cached``) live in one directory. It is trusted only if nobody but
this user can put files there: ``cache_dir()`` creates it with mode 0700 and
``check_dir`` refuses, with ``UnsafeCacheDir`` naming the problem, a directory that is not
ours, is writable by group or others, or sits below a directory others may write without
the sticky bit (they could rename ours away and put their own in its place). The owners of
the directories above are not checked (only their modes). Stat calls only; thread-safe.
"""

from __future__ import annotations

import os
import stat

from ..errors import TfrtError

__all__ = ["CACHE_ENV", "UnsafeCacheDir", "cache_dir", "check_dir", "make_private"]

CACHE_ENV = "TFRT_PY_CACHE_DIR"


class UnsafeCacheDir(TfrtError, PermissionError):
    """The cache dir could be written by someone else: nothing there is loaded."""


def cache_dir() -> str:
    """The directory for generated modules and numba's cache: created with mode 0700 when
    missing, then checked (``check_dir``; UnsafeCacheDir if it fails)."""
    d = os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "tfrt_py", "native"
    )
    make_private(d)
    check_dir(d)
    return d


def make_private(d: str) -> None:
    """Create ``d`` (mode 0700, whatever the umask) and its parents if missing; an
    existing ``d`` is left as it is (``check_dir`` judges it)."""
    parent = os.path.dirname(os.path.abspath(d))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        return
    os.chmod(d, 0o700)  # whatever the umask


def check_dir(d: str) -> None:
    """Raise UnsafeCacheDir unless only this user can change what is in ``d``: ``d`` is a
    directory owned by us, not writable by group or others, and every directory above it
    is either not writable by group or others or sticky (like /tmp)."""
    how = f"; use a private directory (chmod 700) or point ${CACHE_ENV} at one"
    real = os.path.realpath(d)
    try:
        st = os.stat(real)
    except OSError as e:
        raise UnsafeCacheDir(f"native cache dir {d!r}: {e}") from e
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheDir(f"native cache dir {d!r} is not a directory{how}")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UnsafeCacheDir(
            f"native cache dir {d!r} is owned by uid {st.st_uid}, not by this user "
            f"(uid {os.geteuid()}): it could hold someone else's code{how}"
        )
    if st.st_mode & 0o022:
        raise UnsafeCacheDir(
            f"native cache dir {d!r} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):#o}): anyone could plant code there{how}"
        )
    if not os.access(real, os.W_OK | os.X_OK):
        raise UnsafeCacheDir(f"native cache dir {d!r} is not writable by this user{how}")
    up = os.path.dirname(real)
    while True:
        st = os.stat(up)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafeCacheDir(
                f"native cache dir {d!r} is inside {up!r}, which group or others may write "
                f"(mode {stat.S_IMODE(st.st_mode):#o}, not sticky): anyone could swap the "
                f"cache dir{how}"
            )
        if os.path.dirname(up) == up:
            return
        up = os.path.dirname(up)
