"""The optional peer runtimes of benchmarks/peers.py compute the anchor models M1 and M3.

Each installed peer's outputs must agree with the hand-written NumPy baseline; a peer whose
package is not installed is skipped, naming the package.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from benchmarks import peers
from benchmarks.anchor_models import ANCHORS

PEER_PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(package) is None, reason=f"{package} is not installed"
        ),
        id=name,
    )
    for name, package in peers.PEERS.items()
]


@pytest.fixture(scope="module", params=["M1", "M3"])
def anchor(request: pytest.FixtureRequest) -> object:
    return ANCHORS[request.param]()


def _assert_agree(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32, what
        # tolerance relative to the output's scale: M1's outputs are ~1e-13
        scale = float(np.abs(w).max())
        assert scale > 0, what
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=what)


@pytest.mark.parametrize("peer", PEER_PARAMS)
def test_peer_agrees_with_numpy(peer: str, anchor) -> None:
    timed, outputs = peers.peer_runners(anchor, (peer,), threads=1)
    assert list(outputs) == [peer]
    want = [w.copy() for w in anchor.numpy_fresh()]
    _assert_agree(outputs[peer](), want, f"{peer} on {anchor.name}")
    timed[peer]()  # the timed path runs too, and does not disturb the next answer
    _assert_agree(outputs[peer](), want, f"{peer} on {anchor.name}, second call")


@pytest.mark.parametrize("peer", PEER_PARAMS)
def test_peer_sees_its_input(peer: str) -> None:
    """A runner that ignored its feeds (e.g. constant-folded them) would fail here."""
    anchor = ANCHORS["M3"]()
    _, outputs = peers.peer_runners(anchor, (peer,), threads=1)
    before = outputs[peer]()[0].copy()
    for value in anchor.feeds.values():  # feeds are held by reference, like the baselines'
        value *= 0.5
    after = outputs[peer]()[0]
    assert not np.allclose(before, after)
    _assert_agree([after], [anchor.numpy_fresh()[0].copy()], f"{peer} on halved feeds")


def test_missing_names_only_absent_packages() -> None:
    absent = peers.missing()
    for package in peers.PEERS.values():
        assert (package in absent) == (importlib.util.find_spec(package) is None)
