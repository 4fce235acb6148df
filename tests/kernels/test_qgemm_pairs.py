"""``pairs256``: ``vpmaddubsw`` products for weights no pair of which can saturate.

The decision (``pairs_exact``) against pairs at its limit and one past it; the build exact
at that limit for every code, and wrong past it (so the decision is what keeps it exact);
the ``avx2`` builds handing a call with its layout to it; QLinearConv, the interpreter's
integer products (``IntegerWeights``) and the native tier's dynamic products planning it
for 7-bit weights on an ``avx2`` path and staying exact there.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfrt_py
from tests.kernels.test_qgemm import _need_kernel, _reference, _run_nchw
from tests.support.contrib import edge_codes, ort_outputs
from tfrt_py.concurrency.llvm_jit import add_symbol
from tfrt_py.kernels.lib import qgemm_packed
from tfrt_py.kernels.lib.qgemm_rows import IntegerWeights
from tfrt_py.kernels.nn import conv_qint8

RNG = np.random.default_rng(128)
PAIRS = qgemm_packed.TILES["pairs256"]


def _need_avx2() -> None:
    try:
        have = qgemm_packed.host_paths()
    except ImportError:
        pytest.skip("no llvmlite here: no integer kernel at all")
    if "avx2" not in have:
        pytest.skip(f"this CPU has no avx2 path ({', '.join(have)}): no vpmaddubsw build")


def _product(built: qgemm_packed.Built, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a`` (m x k uint8) by ``w`` (k x n) through ``built``, A in its layout."""
    tile = built.tile
    m, k = a.shape
    a2 = np.zeros((m, -(-k // tile.g) * tile.g), qgemm_packed.a_dtype(tile))
    a2[:, :k] = a
    return qgemm_packed.qgemm(built, a2, qgemm_packed.pack(w, tile), m)[:, : w.shape[1]]


def test_the_decision_is_on_each_pair_of_each_column() -> None:
    def one(*column: int) -> bool:
        return qgemm_packed.pairs_exact(np.array(column, np.int64).reshape(-1, 1))

    assert one(64, 64) and one(-64, -64) and one(127, 1) and one(-128, 0)
    assert one(127, -128) and one(100, -100, 28, 100)  # opposite signs never add up
    assert not one(65, 64) and not one(-65, -64) and not one(127, 2)
    assert one(0, 127, 1) and not one(0, 0, 127, 2)  # pairs are rows 2i, 2i + 1
    assert one(127)  # an odd K's last row pairs with the zero padding
    seven = RNG.integers(-64, 64, (577, 70))
    assert qgemm_packed.pairs_exact(seven)
    seven[300, 69], seven[301, 69] = 64, 65
    assert not qgemm_packed.pairs_exact(seven)
    assert not qgemm_packed.pairs_exact(RNG.integers(-128, 128, (64, 64)))
    assert qgemm_packed.pairs_exact(np.zeros((0, 3), np.int8))


def test_the_build_is_exact_at_the_limit_and_wrong_past_it() -> None:
    _need_avx2()
    built = qgemm_packed.build("pairs256")
    for m, k, n in [(1, 1, 1), (7, 5, 3), (9, 64, 33), (17, 577, 70), (3, 1100, 130)]:
        a = edge_codes(RNG, (m, k), np.uint8)
        a[0] = 255
        w = RNG.integers(-64, 65, (k, n))
        w[:, -1] = -64  # every pair at the limit: 255 * 128 in each int16
        if k > 1:
            w[0:2, n // 2] = (-128, 0)
        w[:, 0] = 64
        assert qgemm_packed.pairs_exact(w)
        want = a.astype(np.int64) @ w
        np.testing.assert_array_equal(_product(built, a, w), want)
        assert want[0, 0] == 255 * 64 * k
    a = np.full((2, 4), 255, np.uint8)
    w = np.full((4, 1), 127, np.int64)  # one pair: 2 * 255 * 127 = 64770 saturates
    assert not qgemm_packed.pairs_exact(w)
    assert _product(built, a, w)[0, 0] == 2 * 32767 != 4 * 255 * 127


def test_the_avx2_build_hands_the_pairs_layout_on() -> None:
    _need_avx2()
    name = "tfrt_py_test_qgemm_pairs"
    pairs = qgemm_packed.build("pairs256", name)
    add_symbol(name, pairs.engine.get_function_address(name))
    handing = qgemm_packed.build("avx2", "tfrt_py_test_qgemm_avx2_handing", pairs_symbol=name)
    plain = qgemm_packed.build("avx2", "tfrt_py_test_qgemm_avx2_plain")
    a = edge_codes(RNG, (13, 300), np.uint8)
    w = RNG.integers(-64, 64, (300, 40))
    au = np.zeros((13, 300 + 4), np.uint8)
    au[:, :300] = a
    packed = qgemm_packed.pack(w, PAIRS)
    got = qgemm_packed.qgemm(handing._replace(tile=PAIRS), au, packed, 13)[:, :40]
    np.testing.assert_array_equal(got, a.astype(np.int64) @ w)
    assert qgemm_packed.layout_code(PAIRS) not in {
        qgemm_packed.layout_code(t) for p, t in qgemm_packed.TILES.items() if p != "pairs256"
    }
    with pytest.raises(ValueError, match="another path"):
        qgemm_packed.qgemm(plain._replace(tile=PAIRS), au, packed, 13)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.compiles
def test_seven_bit_convs_take_pairs_and_stay_exact(channels_last: bool) -> None:
    _need_kernel(numba=True)
    if qgemm_packed.pairs_tile() is None:
        pytest.skip(f"this process's integer path is {qgemm_packed.path()[0]}, not avx2: "
                    "vpmaddubsw is not used (VNNI and AVX-512 sum exactly already)")  # fmt: skip
    pairs_code = qgemm_packed.layout_code(PAIRS)
    for case in range(12):
        xdt, ydt = (np.uint8, np.int8)[case % 2], (np.uint8, np.int8)[case // 2 % 2]
        c, co = int(RNG.integers(5, 40)), int(RNG.integers(1, 70))  # c past conv_qrows
        kh, kw = (1, 1) if case % 3 == 0 else (3, 3)
        sh = 1 + case % 2 if kh == 3 else 1
        pads = [kh // 2] * 4
        h = int(RNG.integers(kh, 12))
        x = edge_codes(RNG, (2, c, h, h + 1), xdt)
        seven = case != 11  # the last: full 8-bit weights, which keep the int16 kernel
        w = RNG.integers(-64 if seven else -128, 64 if seven else 128, (co, c, kh, kw))
        w[0, :2, 0, 0] = (64, 64) if seven else (127, 127)
        w = w.astype(np.int8)
        xz = np.array((np.iinfo(xdt).min, np.iinfo(xdt).max)[case // 4 % 2], xdt)
        yz, wz = np.array(3, ydt), np.zeros(co, np.int8)
        b = RNG.integers(-50000, 50000, co).astype(np.int32)
        xs, ys = np.array(0.02, np.float32), np.array(RNG.uniform(0.05, 2.0), np.float32)
        ws = RNG.uniform(0.001, 0.01, co).astype(np.float32)
        geo = (kh, kw, sh, sh, 1, 1, *pads)
        plan = conv_qint8.plan(w, ws, wz, xs, xz, ys, yz, b, geo)
        assert plan is not None
        assert (plan.layout == pairs_code) == seven, case
        got = _run_nchw(plan, x, channels_last)
        want = _reference(x, xz, w, wz, b, xs, ws, ys, yz, geo)
        assert got is not None
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}, geo {geo}")


def _need_pairs() -> None:
    _need_kernel(numba=True)
    if qgemm_packed.pairs_tile() is None:
        pytest.skip(f"this process's integer path is {qgemm_packed.path()[0]}, not avx2: "
                    "vpmaddubsw is not used")  # fmt: skip


@pytest.mark.parametrize("b_dt", [np.int8, np.uint8])
def test_seven_bit_integer_weights_take_pairs_and_stay_exact(b_dt: type) -> None:
    """``IntegerWeights`` (MatMulInteger, QGemm, MatMulIntegerToFloat): 7-bit codes (uint8
    ones 128 +- 64) take ``pairs256``, the int32 product and the scaled store exact, with
    zero points on both sides; full 8-bit codes keep the process's tile."""
    _need_pairs()
    for m, k, n in [(1, 3, 5), (16, 130, 40), (96, 700, 260)]:  # the last split over parts
        a = edge_codes(RNG, (m, k), np.uint8)
        b = RNG.integers(-64, 64, (k, n)) + (128 if b_dt == np.uint8 else 0)
        b = b.astype(b_dt)
        b_zp: np.ndarray = np.array(130 if b_dt == np.uint8 else -3, b_dt)
        plan = IntegerWeights.make(b, b_zp)
        assert plan is not None and plan.tile == PAIRS
        a_zp = np.array(255, np.uint8)
        got = plan.product(a, a_zp)
        want = (a.astype(np.int64) - 255) @ (b.astype(np.int64) - b_zp.astype(np.int64))
        assert got is not None
        np.testing.assert_array_equal(got, want)
        scale = RNG.uniform(-1e-3, 1e-3, n).astype(np.float32)
        scaled = plan.product_scaled(a, a_zp, scale, None)
        assert scaled is not None
        np.testing.assert_array_equal(scaled, want.astype(np.float32) * scale)
    full = IntegerWeights.make(RNG.integers(-128, 128, (64, 8)).astype(np.int8), None)
    built = qgemm_packed.available()
    assert full is not None and built is not None and full.tile == built.tile


def test_a_seven_bit_dynamic_product_on_the_native_tier() -> None:
    """``quantize_dynamic(..., reduce_range=True)``'s form (DynamicQuantizeLinear,
    MatMulInteger by 7-bit weights, the scales): the native tier's product on
    ``pairs256`` gives the interpreter's bits and onnxruntime's values (whose kernel does
    not saturate 7-bit weights either)."""
    _need_pairs()
    from onnx import TensorProto, helper, numpy_helper

    k, n = 300, 40
    w = RNG.integers(-64, 64, (k, n)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["mult"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "mult"], ["y"])]  # fmt: skip
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array(0.004, np.float32), "ws")]  # fmt: skip
    graph = helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [9, n])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m = tfrt_py.load(model, executor="native", native="eager")
    source = m.native.lowered.source
    assert "qmm_u8(" in source and f", {qgemm_packed.layout_code(PAIRS)}, True," in source
    x = RNG.standard_normal((9, k)).astype(np.float32)
    low, fn = m.native.lowered, m.native.compiled.fn
    got = fn(*[x for _ in low.input_names], *low.params)
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_array_equal(got, tfrt_py.load(model, executor="sync").run({"x": x})["y"])
    want = ort_outputs(model, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
