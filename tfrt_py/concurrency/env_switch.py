"""Reading an on/off switch from the environment on a hot path.

``os.environ.get`` costs ~0.9 µs (the key is encoded and the value decoded on every
read), and ``jit.Jitted.get`` and ``native_threads.ready`` read their switches
(``$TFRT_PY_JIT``, ``$TFRT_PY_NATIVE_THREADS``) on every call of the kernels that ask per
call: ~2 µs per conv or product before any work. ``switched_off(name)`` reads
``os.environ``'s own bytes mapping instead where it has one (CPython on POSIX: the mapping
``os.environ[...] =``, ``del`` and ``monkeypatch.setenv`` write through), ~0.1 µs, and
``os.environ.get`` elsewhere. Same answer either way; any thread.
"""

from __future__ import annotations

import os

__all__ = ["switched_off"]


def switched_off(name: str) -> bool:
    """Whether ``$name`` is set to ``0`` (surrounding blanks ignored)."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        raw = data.get(name.encode())
        return raw is not None and raw.strip() == b"0"
    return os.environ.get(name, "1").strip() == "0"
