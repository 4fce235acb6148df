"""The anchor latency models M1-M4 as test cases: the very models ``benchmarks/`` times
(``benchmarks/anchor_models.py``, fixed seeds), checked here against onnxruntime."""

from __future__ import annotations

from benchmarks.anchor_models import ANCHORS as BENCH_ANCHORS

from .builders import ModelCase

__all__ = ["m1", "m2", "m2b", "m3", "m4"]


def _case(key: str) -> ModelCase:
    anchor = BENCH_ANCHORS[key]()
    return ModelCase(f"anchor_{key.lower()}", anchor.model, (anchor.feeds,))


def m1() -> ModelCase:
    return _case("M1")


def m2() -> ModelCase:
    return _case("M2")


def m2b() -> ModelCase:
    return _case("M2b")


def m3() -> ModelCase:
    return _case("M3")


def m4() -> ModelCase:
    return _case("M4")
