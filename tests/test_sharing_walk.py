"""``sharing._arrays_of`` (which arrays a model holds) walks any object graph: a weak proxy
whose referent is gone, or a numba dispatcher, is passed over, not an error."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from tfrt_py.sharing import _arrays_of


class _Gone:
    pass


def test_dead_weak_proxies_are_passed_over() -> None:
    a = np.arange(6.0)
    a.flags.writeable = False
    gone = _Gone()
    holder = {"weights": a, "proxy": weakref.proxy(gone), "ref": weakref.ref(gone)}
    del gone
    gc.collect()
    found = list(_arrays_of([holder, [holder["proxy"]]]))
    assert len(found) == 1 and found[0] is a
