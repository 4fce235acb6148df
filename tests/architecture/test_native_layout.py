"""The native tier's layout: three rooms and one registry of op lowerings.

The root holds only the package's ``__init__`` and the rooms. (That ``lower/`` (load time:
graph -> source) and ``kernels/`` (the numba kernels generated code imports by path) import
nothing of ``runtime/`` nor of each other is ``INNER_LAYERS["native"]``, checked by
``test_layers.py``.) Every op the tier lowers is one record of ``lowerings()``, and a
second record for an op, or a view with an emitter, is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tfrt_py.native as native_pkg
from tfrt_py.native.lower.records import Registry
from tfrt_py.native.lower.registry import VIEW_OPS, lowerings
from tfrt_py.native.lower.scalar import SCALAR_OPS

_ROOT = Path(native_pkg.__file__).parent
_ROOMS = ("lower", "kernels", "runtime")


def test_the_root_holds_only_the_package() -> None:
    files = sorted(p.name for p in _ROOT.glob("*.py"))
    assert files == ["__init__.py"]
    assert sorted(p.name for p in _ROOT.iterdir() if p.is_dir() and p.name in _ROOMS) == sorted(
        _ROOMS
    )


def test_every_lowered_op_is_one_record() -> None:
    reg = lowerings()
    records = {key: reg.get(*key) for key in reg}
    views = {op for (domain, op), r in records.items() if r is not None and r.view}
    assert views == set(VIEW_OPS)
    for op in SCALAR_OPS:  # every elementwise op lowers: as code, or as a view (Identity)
        assert ("", op) in reg, op
    for key, record in records.items():
        assert record is not None and (record.emit is None) == record.view, key
    products = {op for (_, op), r in records.items() if r is not None and r.product}
    assert products == {"Linear", "MatMul", "Gemm"}


def test_the_registry_refuses_a_second_record_and_a_view_with_code() -> None:
    reg = Registry()
    reg.add("", "Relu", lambda cx, node: [])
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("", "Relu", lambda cx, node: [])
    with pytest.raises(ValueError, match="a view has no emitter"):
        reg.add("", "Reshape", lambda cx, node: [], view=True)
