"""The contrib family's activations, FusedMatMul and fused normalizations against
onnxruntime's CPU provider (one-node com.microsoft models, sync and async executors, inputs
as feeds and as initializers, two calls each)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tfrt_py
from tests.support.contrib import check_node, node_model, runtime_feeds
from tests.support.jit_paths import both_paths  # noqa: F401 - autouse: compiled and NumPy
from tfrt_py.errors import ExecutionError

_RNG = np.random.default_rng(1234)


def _f(*shape: int, dtype: type = np.float32, scale: float = 1.0) -> np.ndarray:
    return (_RNG.standard_normal(shape) * scale).astype(dtype)


# -- activations ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (2, 3, 7), (1, 1), (3, 130)])
@pytest.mark.parametrize("op", ["Gelu", "FastGelu", "QuickGelu"])
def test_unary_activations(op: str, shape: tuple[int, ...]) -> None:
    check_node(op, [_f(*shape, scale=3.0)])


def test_quick_gelu_alpha() -> None:
    check_node("QuickGelu", [_f(4, 9, scale=3.0)], {"alpha": -0.75})


@pytest.mark.parametrize("op", ["Gelu", "FastGelu", "QuickGelu"])
def test_large_inputs_do_not_overflow(op: str) -> None:
    """Saturated inputs (+-1e4 and beyond) give x or 0, with no NumPy overflow warning
    (warnings are errors in this suite)."""
    x = np.array([[-1e4, -200.0, -60.0, 60.0, 200.0, 1e4]], np.float32)
    check_node(op, [x])


@pytest.mark.parametrize("op", ["BiasGelu", "FastGelu"])
@pytest.mark.parametrize("shape", [(2, 5, 33), (33,), (1, 1, 1)])
def test_activations_with_bias(op: str, shape: tuple[int, ...]) -> None:
    check_node(op, [_f(*shape, scale=2.0), _f(shape[-1])], consts=((), (1,)))


@pytest.mark.parametrize("op", ["Gelu", "BiasGelu", "FastGelu", "QuickGelu"])
def test_activations_float16(op: str) -> None:
    x = _f(3, 17, dtype=np.float16, scale=2.0)
    ins = [x, _f(17, dtype=np.float16)] if op in ("BiasGelu", "FastGelu") else [x]
    check_node(op, ins, rtol=2e-3, atol=2e-3)


def test_fast_gelu_float64() -> None:
    check_node("FastGelu", [_f(4, 6, dtype=np.float64, scale=3.0)], rtol=1e-6, atol=1e-6)


# -- FusedMatMul ----------------------------------------------------------------------------


def _stored(logical: np.ndarray, trans: int, trans_batch: int) -> np.ndarray:
    """The array FusedMatMul must be given so that its op(.) is ``logical``."""
    x = logical.swapaxes(-1, -2) if trans and logical.ndim >= 2 else logical
    if trans_batch:
        x = np.moveaxis(x, -2, 0)
    return np.ascontiguousarray(x)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("batch_a", [0, 1])
@pytest.mark.parametrize("batch_b", [0, 1])
def test_fused_matmul_transposes(trans_a: int, trans_b: int, batch_a: int, batch_b: int) -> None:
    a = _stored(_f(3, 2, 4, 5), trans_a, batch_a)
    b = _stored(_f(3, 2, 5, 6), trans_b, batch_b)
    attrs: dict[str, Any] = {"transA": trans_a, "transB": trans_b, "transBatchA": batch_a}
    attrs |= {"transBatchB": batch_b, "alpha": 0.5}
    check_node("FusedMatMul", [a, b], attrs, consts=((), (1,)))


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((5,), (5,)),
        ((5,), (2, 5, 3)),
        ((2, 4, 5), (5,)),
        ((4, 5), (5, 3)),
        ((2, 1, 4, 5), (3, 5, 6)),
        ((1, 4, 5), (2, 3, 5, 6)),
        ((0, 4, 5), (5, 2)),
    ],
)
@pytest.mark.parametrize(("trans_a", "trans_b"), [(0, 0), (0, 1), (1, 0)])
def test_fused_matmul_broadcasting(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: int, trans_b: int
) -> None:
    logical_a, logical_b = _f(*a_shape), _f(*b_shape)
    a = _stored(logical_a, trans_a, 0)
    b = _stored(logical_b, trans_b, 0)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 2.0}
    if trans_a and len(b_shape) == 1 and len(a_shape) > 1:
        # onnxruntime 1.32 reads A as reshaped, not transposed, here: check the meaning.
        model = node_model("FusedMatMul", [a, b], attrs)
        for ex in ("sync", "async"):
            got = tfrt_py.load(model, executor=ex).run({"i0": a, "i1": b})["y0"]
            np.testing.assert_allclose(got, 2.0 * np.matmul(logical_a, logical_b), rtol=1e-5)
        return
    check_node("FusedMatMul", [a, b], attrs)


def test_fused_matmul_trans_batch_needs_equal_ranks() -> None:
    a, b = _f(4, 2, 5), _f(5, 3)
    m = tfrt_py.load(node_model("FusedMatMul", [a, b], {"transBatchA": 1}))
    with pytest.raises(ExecutionError, match="transBatch"):
        m.run({"i0": a, "i1": b})


# -- normalizations -------------------------------------------------------------------------

_B, _S, _H = 2, 3, 37


@pytest.mark.parametrize(
    "inputs",
    [
        "input skip gamma",
        "input skip gamma beta",
        "input skip gamma beta bias",
        "input skip gamma - bias",
    ],
)
@pytest.mark.parametrize("outputs", [(True,), (True, True, True, True), (True, False, False, True)])
def test_skip_layer_normalization(inputs: str, outputs: tuple[bool, ...]) -> None:
    ins: list[np.ndarray | None] = [_f(_B, _S, _H), _f(_B, _S, _H), _f(_H), _f(_H), _f(_H)]
    given = inputs.split()
    ins = [a if i < len(given) and given[i] != "-" else None for i, a in enumerate(ins)]
    check_node(
        "SkipLayerNormalization",
        ins,
        {"epsilon": 1e-5},
        outputs=outputs,
        consts=((), tuple(i for i in (2, 3, 4) if ins[i] is not None)),
    )


@pytest.mark.parametrize("skip_shape", [(1, _S, _H), (_S, _H)])
def test_skip_layer_normalization_broadcast_skip(skip_shape: tuple[int, ...]) -> None:
    check_node("SkipLayerNormalization", [_f(_B, _S, _H), _f(*skip_shape), _f(_H), _f(_H)])


def test_skip_layer_normalization_2d_and_float16() -> None:
    check_node("SkipLayerNormalization", [_f(5, 8), _f(5, 8), _f(8), _f(8)], outputs=(True,) * 4)
    h = [_f(2, 3, 8, dtype=np.float16) for _ in range(2)] + [_f(8, dtype=np.float16)] * 2
    check_node("SkipLayerNormalization", h, rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("outputs", [(True,), (True, True, True, True)])
def test_skip_simplified_layer_normalization(outputs: tuple[bool, ...]) -> None:
    ins = [_f(_B, _S, _H), _f(_B, _S, _H), _f(_H), _f(_H)]
    check_node("SkipSimplifiedLayerNormalization", ins, outputs=outputs, consts=((), (2, 3)))
    check_node("SkipSimplifiedLayerNormalization", [_f(4, 9), _f(4, 9), _f(9)])


def _spy_compiled(monkeypatch: pytest.MonkeyPatch, getter: str) -> list[int]:
    """Make ``contrib.norm.<getter>()`` (a compiled pass's getter, asked when a kernel is
    built) hand out a spy of the real pass; returns the list each call appends to. Skips
    when the compiled kernels are off in this run."""
    from tfrt_py.kernels.contrib import norm as contrib_norm

    real = getattr(contrib_norm, getter)()
    if real is None:
        pytest.skip("compiled kernels off in this run (the NumPy path: TFRT_PY_JIT=0 or no numba)")
    calls: list[int] = []

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(contrib_norm, getter, lambda: spy)
    return calls


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_norms_take_one_compiled_pass(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32, skip of the input's shape, no statistics outputs: the add, the sum output
    and the norm in one compiled pass (``norm_jit.skip_norm_rows_f32``), agreeing with
    onnxruntime."""
    calls = _spy_compiled(monkeypatch, "skip_norm_rows_f32")
    simplified = op.startswith("SkipSimplified")
    ins = [_f(_B, _S, _H), _f(_B, _S, _H), _f(_H)] + ([] if simplified else [_f(_H)]) + [_f(_H)]
    check_node(op, ins, {"epsilon": 1e-5}, outputs=(True, False, False, True),
               consts=((), tuple(range(2, len(ins)))))  # fmt: skip
    assert calls


@pytest.mark.parametrize("axis", [-1, 2, 1])
def test_simplified_layer_normalization(axis: int) -> None:
    x = _f(2, 3, 4, 5)
    scale = _f(*x.shape[axis:])
    check_node(
        "SimplifiedLayerNormalization",
        [x, scale],
        {"axis": axis},
        outputs=(True, True),
        consts=((), (1,)),
        domain="",
    )


_V, _P, _G = 13, 9, 3


def _embed_inputs(
    b: int = _B, s: int = _S, segments: bool = True, mask: bool = True
) -> list[np.ndarray | None]:
    ids = _RNG.integers(0, _V, (b, s)).astype(np.int32)
    seg = _RNG.integers(0, _G, (b, s)).astype(np.int32) if segments else None
    m = (_RNG.random((b, s)) < 0.7).astype(np.int32) if mask else None
    se = _f(_G, _H) if segments else None
    return [ids, seg, _f(_V, _H), _f(_P, _H), se, _f(_H), _f(_H), m]


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", [True, False])
def test_embed_layer_normalization(segments: bool, mask: bool) -> None:
    ins = _embed_inputs(segments=segments, mask=mask)
    consts = tuple(i for i in (2, 3, 4, 5, 6) if ins[i] is not None)
    check_node(
        "EmbedLayerNormalization",
        ins,
        {"epsilon": 1e-5},
        outputs=(True, True, True),
        consts=((), consts),
    )


def test_embed_layer_normalization_position_ids_and_mask_values() -> None:
    ins = _embed_inputs(b=2, s=4)
    ins[7] = np.array([[1, 2, 0, 1], [1, 1, 1, 1]], np.int32)  # only ones count
    pos = np.array([[3, 0, 8, 1], [5, 4, 3, 2]], np.int32)
    check_node("EmbedLayerNormalization", [*ins, pos], outputs=(True, True, True))
    check_node("EmbedLayerNormalization", [*ins[:7], None, pos[:1]], outputs=(True, True))


def test_embed_layer_normalization_refuses_ids_out_of_range() -> None:
    ins = _embed_inputs()
    model = node_model("EmbedLayerNormalization", ins, outputs=(True, True))
    feeds = runtime_feeds(ins)
    m = tfrt_py.load(model)
    m.run(feeds)
    for bad in (_V, -1):
        feeds["i0"] = feeds["i0"].copy()
        feeds["i0"][0, 0] = bad
        with pytest.raises(ExecutionError, match="input_ids out of range"):
            m.run(feeds)
    too_long = _embed_inputs(s=_P + 1)
    m = tfrt_py.load(node_model("EmbedLayerNormalization", too_long, outputs=(True, True)))
    with pytest.raises(ExecutionError, match="exceeds"):
        m.run(runtime_feeds(too_long))


def test_embed_layer_normalization_names_the_ids_out_of_range() -> None:
    ins = _embed_inputs(b=2, s=4)
    pos = np.array([[3, 0, 8, 1], [5, 4, 3, 2]], np.int32)
    m = tfrt_py.load(node_model("EmbedLayerNormalization", [*ins, pos], outputs=(True, True)))
    feeds = runtime_feeds([*ins, pos])
    m.run(feeds)
    for name, col in (("segment_ids", "i1"), ("position_ids", "i8")):
        bad = dict(feeds)
        bad[col] = feeds[col].copy()
        bad[col][1, 2] = 10_000
        with pytest.raises(ExecutionError, match=f"{name} out of range"):
            m.run(bad)
    np.testing.assert_array_equal(m.run(feeds)["y0"], m.run(feeds)["y0"])  # still usable


def test_embed_layer_normalization_takes_one_compiled_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32 tables: the lookups, the sum output and the LayerNorm in one compiled pass
    (``norm_jit.embed_norm_rows_f32``), agreeing with onnxruntime."""
    calls = _spy_compiled(monkeypatch, "embed_norm_rows_f32")
    ins = _embed_inputs(b=2, s=4)
    check_node("EmbedLayerNormalization", ins, {"epsilon": 1e-5}, outputs=(True, True, True),
               consts=((), (2, 3, 4, 5, 6)))  # fmt: skip
    assert calls


@pytest.mark.parametrize(
    ("op", "inputs"),
    [
        ("SkipLayerNormalization", [_f(2, 4, 8), _f(2, 4, 8), _f(8), _f(8)]),
        ("SkipSimplifiedLayerNormalization", [_f(2, 4, 8), _f(2, 4, 8), _f(8)]),
    ],
)
def test_norms_do_not_read_the_environment_per_call(
    op: str, inputs: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the compiled rows run is settled at a kernel's first call of a dtype:
    later calls do not consult ``$TFRT_PY_JIT`` again (a lookup on the hot path)."""
    from tfrt_py.kernels.lib import jit

    reads: list[int] = []
    real = jit.jit_enabled

    def counting() -> bool:
        reads.append(1)
        return real()

    model = tfrt_py.load(node_model(op, inputs), executor="sync")
    feeds = runtime_feeds(inputs)
    first = model.run(feeds)
    monkeypatch.setattr(jit, "jit_enabled", counting)
    for _ in range(3):
        again = model.run(feeds)
        for k in first:
            np.testing.assert_array_equal(again[k], first[k])
    assert reads == []
