"""A loaded model agrees with the same model loaded without optimization."""

from __future__ import annotations

import numpy as np

import tfrt_py
from tests.support.models import ModelCase

__all__ = ["assert_agrees_with_unoptimized"]


def assert_agrees_with_unoptimized(model: tfrt_py.Model, case: ModelCase) -> None:
    """``model`` (``case.model`` loaded with some optimization) gives, on each of the case's
    feeds and on a second run of it (its plan reused), the outputs of ``case.model`` loaded
    with ``optimize=False``."""
    plain = tfrt_py.load(case.model, optimize=False)
    for feed in case.feeds:
        want = plain.run(feed)
        for _ in range(2):
            got = model.run(feed)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
