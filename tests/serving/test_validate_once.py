"""A served request's feeds are validated once: the serving layer checks them (a 4xx names
the input before admission) and the model's executor takes the checked arrays as they are.

The count is of the real per-input check (``feeds._InputCheck.__call__``, wrapped, still
run); the model, executor and event loop are real. Checked feeds of another model's inputs
are checked again, so the shortcut cannot let unchecked arrays through.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import tfrt_py
from tfrt_py import feeds as feeds_module
from tfrt_py.errors import InputError
from tfrt_py.feeds import CheckedFeeds, FeedChecker
from tfrt_py.ir import GraphBuilder
from tfrt_py.serving.batching import BatchPolicy
from tfrt_py.serving.served import ServedModel

UNBATCHED = BatchPolicy(enabled=False, max_batch=1, max_wait_us=0, why="off in this test")


def two_input_model(name: str = "x") -> tfrt_py.Model:
    b = GraphBuilder("two", opset=17)
    x = b.input(name, np.float32, ("N", 3))
    w = b.input("w", np.float32, (1, 3))
    b.output(b.op("Add", x, w), "y")
    return tfrt_py.load(b.build())


@pytest.fixture
def input_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the inputs checked, in order, from the real check."""
    seen: list[str] = []
    real = feeds_module._InputCheck.__call__

    def counted(self: Any, value: Any) -> Any:
        seen.append(self.name)
        return real(self, value)

    monkeypatch.setattr(feeds_module._InputCheck, "__call__", counted)
    return seen


@pytest.mark.parametrize("executor", ["sync", "async"])
def test_a_served_request_is_validated_once(executor: str, input_checks: list[str]) -> None:
    model = tfrt_py.load(two_input_model().graph, executor=executor)
    served = ServedModel("two", model, UNBATCHED)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.ones((1, 3), np.float32)
    out = asyncio.run(served.predict({"x": x, "w": w}))
    np.testing.assert_array_equal(out["y"], x + w)
    assert input_checks == ["x", "w"]


def test_a_bad_served_request_fails_before_running(input_checks: list[str]) -> None:
    served = ServedModel("two", two_input_model(), UNBATCHED)
    with pytest.raises(InputError, match="'w'"):
        asyncio.run(served.predict({"x": np.zeros((2, 3), np.float32), "w": np.zeros((2, 2))}))
    assert served.model.run({"x": np.zeros((2, 3), np.float32), "w": np.ones((1, 3), np.float32)})


def test_checked_feeds_of_other_inputs_are_checked_again() -> None:
    other = two_input_model("z")
    model = two_input_model()
    checked = FeedChecker(other.graph.inputs).checked(
        {"z": np.zeros((2, 3), np.float32), "w": np.zeros((1, 3), np.float32)}
    )
    assert isinstance(checked, CheckedFeeds)
    with pytest.raises(InputError, match="missing input"):
        model.run(checked)
    with pytest.raises(InputError, match="missing input"):
        asyncio.run(model.run_async(checked))
