"""The compile server's child compiles at ``CHILD_OPT`` (numba's level 2: the same code
as level 3 for what the lowering writes, in ~60% of the time; measured in
``compile_server.CHILD_OPT``'s comment), unless the user chose a level."""

from __future__ import annotations

import pytest

from tfrt_py.native.runtime import compile_server


def test_the_child_compiles_at_level_2_unless_the_user_chose_a_level(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("NUMBA_OPT", raising=False)
    env = compile_server._environment()
    assert env["NUMBA_OPT"] == compile_server.CHILD_OPT == "2"
    # the setting is part of what a running child was started with: a change restarts it
    assert ("NUMBA_OPT", "2") in compile_server._compile_settings(env)
    monkeypatch.setenv("NUMBA_OPT", "1")
    assert compile_server._environment()["NUMBA_OPT"] == "1"
