"""Split kernels on native threads (numba ``prange`` on TBB, ``concurrency.native_threads``):
they run there when the layer is ready, compute what the serial kernels compute, survive
concurrent callers and a fork, and step aside (the Python pool's path) when switched off."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

from tests.support.jit_paths import spying_jitted
from tfrt_py.concurrency import native_threads
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.lib import gemm
from tfrt_py.kernels.nn import conv_depthwise as cdw
from tfrt_py.kernels.nn import conv_pointwise
from tfrt_py.kernels.nn.conv_direct import Epilogue

numba = pytest.importorskip("numba", reason="native threads are numba's parallel loops")
pytestmark = pytest.mark.skipif(
    not native_threads.ready(),
    reason="numba's TBB threading layer is not available here (it needs a numba built with "
    "it, e.g. PyPI's wheels from 0.63 -- 0.62's have none -- and the tbb package: Linux x86-64)",
)

F32 = np.dtype(np.float32)


@pytest.fixture(autouse=True)
def two_threads() -> object:
    configure(2)
    yield
    configure(None)


def _depthwise_case(n: int, c: int, h: int, k: int, s: int, epi: Epilogue, seed: int = 0):
    rng = np.random.default_rng(seed)
    p = (k - 1) // 2
    oh = (h + 2 * p - k) // s + 1
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    res = rng.standard_normal((n, c, oh, oh)).astype(np.float32) if epi.residual else None
    plan = cdw.plan_depthwise(x.shape, w.shape, (n, c, oh, oh), (s, s), (p, p, p, p), (1, 1),
                              epi, F32)  # fmt: skip
    assert plan is not None
    return plan, x, w, b, res, (n, c, oh, oh)


@pytest.mark.parametrize(
    ("n", "c", "h", "k", "s", "epi"),
    [
        (1, 96, 56, 3, 1, Epilogue()),
        (1, 144, 56, 3, 2, Epilogue(act="Relu")),
        (1, 576, 14, 3, 2, Epilogue(act="Clip", alpha=0.0, beta=6.0)),
        (1, 240, 28, 5, 1, Epilogue(residual=True)),
        (3, 64, 28, 3, 1, Epilogue(act="HardSwish", residual=True)),  # image blocks
    ],
)
@pytest.mark.compiles
def test_a_split_depthwise_conv_runs_on_native_threads_and_matches_one_thread(
    n: int, c: int, h: int, k: int, s: int, epi: Epilogue
) -> None:
    plan, x, w, b, res, out_shape = _depthwise_case(n, c, h, k, s, epi)
    assert plan.split and plan.par is not None
    got = cdw.run_depthwise(plan, x, w, b, np.empty(out_shape, np.float32), res, epi)
    serial = plan._replace(split=False, par=None)
    want = cdw.run_depthwise(serial, x, w, b, np.empty(out_shape, np.float32), res, epi)
    np.testing.assert_array_equal(got, want)  # the same loop per channel: bit for bit
    assert numba.threading_layer() == "tbb"


def test_switched_off_the_split_takes_the_python_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_threads.ENV_NATIVE_THREADS, "0")
    plan, x, w, b, res, out_shape = _depthwise_case(1, 144, 56, 3, 1, Epilogue())
    assert plan.split and plan.par is None
    got = cdw.run_depthwise(plan, x, w, b, np.empty(out_shape, np.float32), res, Epilogue())
    monkeypatch.delenv(native_threads.ENV_NATIVE_THREADS)
    plan2, *_ = _depthwise_case(1, 144, 56, 3, 1, Epilogue())
    want = cdw.run_depthwise(plan2, x, w, b, np.empty(out_shape, np.float32), res, Epilogue())
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("m", "k", "n"), [(256, 96, 196), (197, 192, 768), (960, 160, 49)])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_product_in_native_blocks_matches_numpy(m: int, k: int, n: int, transposed: bool) -> None:
    """Row and column blocks; ``transposed``: ``b`` is the transpose of a C-contiguous
    (n, k) array, as a Gemm's transB weights are."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if transposed:
        b = np.ascontiguousarray(b.T).T
        assert not b.flags.c_contiguous
    out = np.full((m, n), np.nan, np.float32)
    assert gemm.native_blocks(a, b, out, 2)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    out = np.full((m, n), np.nan, np.float32)
    assert gemm.native_blocks(a, b, out, 2, cols=True) == (n >= 128)  # 64 columns a block
    if n < 128:
        return
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    out2 = np.full((m, n), np.nan, np.float32)
    gemm.matmul_cols_into(a, b, out2)
    np.testing.assert_allclose(out2, a @ b, rtol=1e-5, atol=1e-4)


def test_native_blocks_decline_what_they_were_not_built_for() -> None:
    a = np.ones((128, 8), np.float32)
    b = np.ones((8, 16), np.float32)
    assert not gemm.native_blocks(a, b[:, ::2], np.empty((128, 8), np.float32), 2)  # strided
    assert not gemm.native_blocks(a, b.astype(np.float64), np.empty((128, 16), np.float32), 2)
    assert not gemm.native_blocks(a[:40], b, np.empty((40, 16), np.float32), 2)  # one block
    assert not gemm.native_blocks(a, b, np.empty((128, 16), np.float32), 2, cols=True)


def test_concurrent_callers_each_get_their_own_result() -> None:
    """Two Python threads launching parallel loops at once (an executor's workers, a
    server's threads): TBB is thread-safe; each call's blocks use the caller's scratch."""
    cases = [_depthwise_case(1, 192, 28, 3, 1, Epilogue(act="Relu"), seed=i) for i in range(2)]
    wants = []
    for plan, x, w, b, res, shape in cases:
        serial = plan._replace(split=False, par=None)
        wants.append(cdw.run_depthwise(serial, x, w, b, np.empty(shape, np.float32), res,
                                       Epilogue(act="Relu")))  # fmt: skip
    errors: list[str] = []

    def worker(i: int) -> None:
        plan, x, w, b, res, shape = cases[i]
        for _ in range(40):
            got = cdw.run_depthwise(plan, x, w, b, np.empty(shape, np.float32), res,
                                    Epilogue(act="Relu"))  # fmt: skip
            if not np.array_equal(got, wants[i]):
                errors.append(f"thread {i}")
                return

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


FORK_CHILD = r"""
import os, sys
import numpy as np
from tfrt_py.concurrency.threads import configure
from tfrt_py.kernels.nn import conv_depthwise as cdw
from tfrt_py.kernels.nn.conv_direct import Epilogue
configure(2)
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 144, 56, 56)).astype(np.float32)
w = rng.standard_normal((144, 1, 3, 3)).astype(np.float32)
b = np.zeros(144, np.float32)
plan = cdw.plan_depthwise(x.shape, w.shape, (1, 144, 56, 56), (1, 1), (1, 1, 1, 1), (1, 1),
                          Epilogue(), np.dtype(np.float32))
assert plan.par is not None
run = lambda: cdw.run_depthwise(plan, x, w, b, np.empty((1, 144, 56, 56), np.float32), None,
                                Epilogue())
want = run()  # the parent's TBB threads are running now
pid = os.fork()
if pid == 0:
    ok = all(np.array_equal(run(), want) for _ in range(5))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.fork is Linux's here")
def test_a_forked_child_runs_split_kernels_after_the_parent_did() -> None:
    """``serve --workers`` and gunicorn ``--preload`` fork after loading: TBB (unlike GNU
    OpenMP, which aborts such a child) starts its threads again in the child."""
    done = subprocess.run([sys.executable, "-c", FORK_CHILD], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child 0" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("n", [1, 2])
def test_a_1x1_conv_splits_its_filters_on_native_threads(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the packed kernels (with them, conv_cols' DIRECT blocks take 1x1 convs:
    test_conv_cols), BLAS's filter blocks with their epilogue on native threads."""
    from tfrt_py.kernels.lib import gemm_packed
    from tfrt_py.kernels.nn.conv_blocked import plan_blocked, run_blocked

    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")
    rng = np.random.default_rng(n)
    c, m, h = 96, 192, 28
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((m, c, 1, 1)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    res = rng.standard_normal((n, m, h, h)).astype(np.float32)
    epi = Epilogue(act="Relu", residual=True)
    with spying_jitted(conv_pointwise.POINTWISE_PAR) as calls:
        plan = plan_blocked(x.shape, w.shape, (n, m, h, h), (1, 1), (0, 0), (1, 1), F32, epi)
        assert plan is not None and plan.native is not None
        got = run_blocked(plan, x, w.reshape(1, m, c), b, res, None)
    assert calls == [1]  # bias, residual and Relu inside the blocks: nothing after
    want = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], x) + b[:, None, None] + res
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["SiLU", "HardSwish"])
@pytest.mark.compiles
def test_more_filters_than_pixels_split_the_filters_after_one_im2col(
    act: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ResNet's last 3x3 convs (512 filters over 7x7) and EfficientNet's 1x1s over 7x7,
    without the packed kernels (with them, conv_cols' filter blocks take the 3x3s:
    test_conv_cols): blocks of filters, each with its epilogue, over one im2col of each
    image."""
    from tfrt_py.kernels.lib import gemm_packed
    from tfrt_py.kernels.nn.conv_blocked import plan_blocked, run_blocked

    monkeypatch.setenv(gemm_packed.ENV_PACKED_GEMM, "0")

    rng = np.random.default_rng(3)
    n, c, m, h = 2, 64, 256, 7
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32) * 0.1
    b = rng.standard_normal(m).astype(np.float32)
    with spying_jitted(conv_pointwise.POINTWISE_PAR) as calls:
        plan = plan_blocked(x.shape, w.shape, (n, m, h, h), (1, 1), (1, 1), (1, 1), F32,
                            Epilogue(act=act))  # fmt: skip
        assert plan is not None and plan.native is not None and plan.im2col is not None
        got = run_blocked(plan, x, w.reshape(1, m, -1), b, None, None)
    assert calls == [1]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(
        np.einsum("mc,nchw->nmhw", w[:, :, i, j], xp[:, :, i : i + h, j : j + h])
        for i in range(3) for j in range(3)
    ) + b[:, None, None]  # fmt: skip
    if act == "SiLU":
        want = want / (1 + np.exp(-want))
    else:
        want = want * np.clip(want / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("n", "c", "m", "h", "k", "s"),
    [
        (1, 64, 64, 56, 3, 1),
        (2, 32, 48, 28, 3, 2),
        (1, 3, 32, 224, 3, 2),
        (1, 192, 32, 28, 1, 1),
        (1, 3, 64, 221, 3, 2),  # 111 output rows: blocks of 55 and 56 rows
    ],
)
@pytest.mark.compiles
def test_a_one_group_conv_runs_its_blocks_on_native_threads(
    n: int, c: int, m: int, h: int, k: int, s: int
) -> None:
    """im2col, product and epilogue per block of output rows in a prange loop (a 1x1 conv
    with few filters copies its input columns), against a direct NumPy reference."""
    from tfrt_py.kernels.nn.conv_blocked import plan_blocked, run_blocked

    rng = np.random.default_rng(c)
    p = (k - 1) // 2
    oh = (h + 2 * p - k) // s + 1
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((m, c, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    res = rng.standard_normal((n, m, oh, oh)).astype(np.float32)
    epi = Epilogue(act="Clip", alpha=-1.0, beta=2.0, residual=True)
    plan = plan_blocked(x.shape, w.shape, (n, m, oh, oh), (s, s), (p, p), (1, 1), F32, epi)
    assert plan is not None and not plan.native
    # the row blocks of the BLAS route, the "cols" route's blocks, or the "packed" route's
    # parts (a few-pixel conv: kernels/nn/conv_packed.py), split on native threads
    assert (
        (plan.route == "rows" and plan.par is not None)
        or (plan.route == "cols" and plan.cols is not None and plan.cols.parallel)
        or (plan.route == "packed" and plan.packed is not None and len(plan.packed.parts) > 1)
    ), plan.route
    got = run_blocked(plan, x, w.reshape(1, m, -1), b, res, None)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    want = np.zeros((n, m, oh, oh), np.float64)
    for i in range(k):
        for j in range(k):
            tap = xp[:, :, i : i + s * oh : s, j : j + s * oh : s]
            want += np.einsum("mc,nchw->nmhw", w[:, :, i, j], tap)
    want = np.clip(want + b[:, None, None] + res, -1.0, 2.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize(
    ("batch", "m", "k", "n"), [((1, 3), 197, 64, 197), ((3,), 197, 64, 197), ((2, 4), 64, 32, 96)]
)
def test_stacked_products_run_their_row_blocks_on_native_threads(
    batch: tuple[int, ...], m: int, k: int, n: int, trans_b: bool
) -> None:
    """Attention's per-head products (MatMul, the fused MatMulTransB)."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal((*batch, m, k)).astype(np.float32)
    b = rng.standard_normal((*batch, n, k) if trans_b else (*batch, k, n)).astype(np.float32)
    want = a @ (b.swapaxes(-1, -2) if trans_b else b)
    if batch[0] == 1:  # strided views of one projection, as attention's heads are
        a = np.ascontiguousarray(a.swapaxes(-2, -3)).swapaxes(-2, -3)
        b = np.ascontiguousarray(b.swapaxes(-2, -3)).swapaxes(-2, -3)
        assert not (a.flags.c_contiguous or b.flags.c_contiguous)
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        got = gemm.matmul_batched_into(a, b, trans_b=trans_b)
        out = np.full(want.shape, np.nan, np.float32)
        got2 = gemm.matmul_batched_into(a, b, out, trans_b=trans_b)
    assert calls == [1, 1] and got2 is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got2, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("heads", [4, 12])
def test_scores_over_a_transposed_key_view_run_on_the_kernel(heads: int, threads: int) -> None:
    """BERT's scores as torch.onnx writes them: Q a (0, 2, 1, 3) view of the projection and
    K^T one Transpose (0, 2, 3, 1) of it, whose columns (not rows) have unit stride. The
    kernel reads K^T as the transpose of its swapped view (NumPy took a strided loop at
    half speed), with the blocks on native threads from ``NATIVE_SPLIT_MIN_MACS`` and on
    the caller below it; the plan is made once per signature. One stacked matrix under the
    split size stays NumPy's single gemm."""
    configure(threads)
    rng = np.random.default_rng(heads)
    proj = rng.standard_normal((1, 64, heads, 64)).astype(np.float32)
    q, kt = proj.transpose(0, 2, 1, 3), proj.transpose(0, 2, 3, 1)
    assert kt.strides[-1] != 4 and kt.strides[-2] == 4
    want = np.ascontiguousarray(q) @ np.ascontiguousarray(kt)
    gemm._BATCHED_PLANS.clear()
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        got = gemm.matmul_batched_into(q, kt)
        out = np.full(want.shape, np.nan, np.float32)
        got2 = gemm.matmul_batched_into(q, kt, out)
        got3 = gemm.matmul_batched_into(q, kt)
    assert calls == [1, 1, 1]
    plans = [p for p in gemm._BATCHED_PLANS.values() if p is not None and p.shape == want.shape]
    assert len(plans) == 2  # without and with ``out``
    big = heads * 64**3 >= gemm.NATIVE_SPLIT_MIN_MACS
    assert all(p.trans_b and p.threads == (threads if big else 1) for p in plans)
    for g in (got, got2, got3):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-4)
    assert got2 is out
    one = rng.standard_normal((1, 1, 32, 32)).astype(np.float32)
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        got1 = gemm.matmul_batched_into(one, one)
    assert calls == []
    np.testing.assert_allclose(got1, one @ one, rtol=1e-5, atol=1e-5)


def test_a_stacked_product_planned_while_the_kernel_is_off_runs_it_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether the compiled kernel may run (a cold start's warm-up holds it back; the
    switch) is asked per call, not kept in the signature's plan: a signature first seen
    while it is off takes the kernel once it is on."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 32, 16)).astype(np.float32)
    b = rng.standard_normal((4, 16, 24)).astype(np.float32)
    gemm._BATCHED_PLANS.clear()
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        monkeypatch.setenv(native_threads.ENV_NATIVE_THREADS, "0")
        off = gemm.matmul_batched_into(a, b)
        assert calls == []
        monkeypatch.delenv(native_threads.ENV_NATIVE_THREADS)
        on = gemm.matmul_batched_into(a, b)
    assert calls == [1]
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("trans_b", [False, True])
def test_stacks_whose_batch_needs_two_strides_run_on_native_threads(trans_b: bool) -> None:
    """MobileViT's attention: Q, K and V are (patches, heads) views of one projection whose
    batch dimensions collapse into two strides, not one; the products (scores @ V, Q @
    K^T) still run in native row blocks (they took NumPy's non-BLAS loop). Three
    uncollapsible levels keep np.matmul."""
    rng = np.random.default_rng(7)
    proj = rng.standard_normal((4, 64, 3, 4, 16)).astype(np.float32)  # (p, n, qkv, heads, d)
    q, k, v = (proj[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (4, 4, 64, 16)
    assert v.strides == (12288 * 4, 16 * 4, 192 * 4, 4)
    if trans_b:
        a, b, want = q, k, np.ascontiguousarray(q) @ np.ascontiguousarray(k).swapaxes(-1, -2)
    else:
        a = rng.standard_normal((4, 4, 64, 64)).astype(np.float32)
        b, want = v, a @ np.ascontiguousarray(v)
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        got = gemm.matmul_batched_into(a, b, trans_b=trans_b)
    assert calls == [1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    six = rng.standard_normal((2, 3, 4, 5, 64, 16)).astype(np.float32)[:, :, ::2]
    six = six.transpose(1, 0, 2, 3, 4, 5)  # (3, 2, 2, 5, 64, 16): no two-stride split
    a6 = rng.standard_normal((3, 2, 2, 5, 64, 64)).astype(np.float32)
    with spying_jitted(gemm._MATMUL_BATCHED) as calls:
        got6 = gemm.matmul_batched_into(a6, six)
    assert calls == []
    np.testing.assert_allclose(got6, a6 @ np.ascontiguousarray(six), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("act", "attrs", "formula"),
    [
        ("Relu", {}, lambda v: np.maximum(v, 0)),
        ("Swish", {"alpha": 1.0}, lambda v: v / (1 + np.exp(-v))),
        ("Gelu", {}, None),
        ("Sigmoid", {}, lambda v: 1 / (1 + np.exp(-v))),
        ("HardSwish", {}, lambda v: v * np.clip(v / 6 + 0.5, 0, 1)),
        ("", {}, lambda v: v),
    ],
)
def test_a_split_linear_runs_its_bias_and_activation_inside_the_native_blocks(
    act: str, attrs: dict[str, Any], formula: Any
) -> None:
    """ViT's MLP (a product + bias + GELU) and MobileViT's (+ SiLU): the bias and the
    activation run in the native row blocks, on the thread that computed each block --
    on the weight packed for ``kernels.lib.gemm_packed`` (``linear_par.Serial.split_rows``)
    where that kernel runs here, else on NumPy's gemm."""
    import math

    from onnx import TensorProto, helper, numpy_helper

    import tfrt_py
    from tfrt_py.kernels.lib import linear_par

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 197, 192)).astype(np.float32)
    w = (rng.standard_normal((192, 256)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(256).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["y" if not act else "s"])]  # fmt: skip
    if act:
        nodes.append(helper.make_node(act, ["s"], ["y"], **attrs))
    opset = 24 if act == "Swish" else 20
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    v = x.astype(np.float64) @ w + bias
    if formula is None:
        erf = np.vectorize(math.erf)
        want = 0.5 * v * (1 + erf(v / math.sqrt(2)))
    else:
        want = formula(v)
    packed = linear_par._LINEAR_ROWS.get() is not None
    with spying_jitted(linear_par._LINEAR_ROWS if packed else linear_par._LINEAR_PAR) as calls:
        model = tfrt_py.load(m, executor="sync")  # the kernel is picked at load
        for _ in range(2):  # the probe, then the planned code
            got = model.run({"x": x})["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2


#: One of the epilogue steps ``linear_par.fused_for`` takes.
_Step = tuple[str, int, dict[str, Any], tuple[int, ...]]


def test_a_float64_gelu_keeps_the_step_kernels() -> None:
    """GELU and the logistic compile for float32 only: a float64 Linear gets no fused
    epilogue (its NumPy steps run after the product)."""
    from tfrt_py.kernels.lib import linear_par

    steps: list[_Step] = [("Gelu", 20, {}, (-1,))]
    assert linear_par.fused_for(steps, np.zeros(8), np.dtype(np.float64)) is None
    assert linear_par.fused_for(steps, np.zeros(8, np.float32), np.dtype(np.float32)) is not None
    assert linear_par.fused_for([], None, np.dtype(np.float32)) is None  # nothing to do
    two: list[_Step] = [("Relu", 14, {}, (-1,)), ("Relu", 14, {}, (-1,))]
    assert linear_par.fused_for(two, None, np.dtype(np.float32)) is None


@pytest.mark.parametrize(
    "shape",
    [
        (591, 197),  # ViT-Tiny's attention
        (1024, 64),  # MobileViT's 4x4x64x64 scores: rows past the flat loop's 32
    ],
)
def test_long_softmax_rows_split_on_native_threads(shape: tuple[int, int]) -> None:
    from tfrt_py.kernels.lib import softmax_jit

    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    fn = softmax_jit.softmax_rows_f32()
    assert fn is not None
    with spying_jitted(softmax_jit._SOFTMAX_LONG_PAR) as calls:
        y = np.full_like(x, np.nan)
        fn(x, y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert calls == [1]
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_channel_layer_norm_splits_its_pixels_on_native_threads() -> None:
    from tfrt_py.kernels.nn import norm_channel

    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 80, 56, 56)).astype(np.float32)  # ConvNeXt-Atto's first stage
    g, b = rng.standard_normal(80).astype(np.float32), rng.standard_normal(80).astype(np.float32)
    with spying_jitted(norm_channel._CHANNEL_LN_PAR) as calls:
        y = norm_channel.channel_layer_norm_fn()(x, g, b, 1e-6)
    assert calls == [1]
    d = x - x.mean(axis=1, keepdims=True)
    want = d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-6) * g[:, None, None]
    np.testing.assert_allclose(y, want + b[:, None, None], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("n", "c", "h", "pad"),
    [
        (1, 64, 112, 1),  # the ResNet stem's pool
        (3, 64, 112, 1),
        (1, 256, 27, 0),  # SqueezeNet's last: below the Python pool's split size
    ],
)
def test_a_max_pool_splits_on_native_threads(n: int, c: int, h: int, pad: int) -> None:
    from tfrt_py.kernels.lib import pool_ir
    from tfrt_py.kernels.nn import pool_direct

    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    oh = (h + 2 * pad - 3) // 2 + 1
    plan = pool_direct.plan_max_pool(x.shape, (3, 3), (n, c, oh, oh), (2, 2), (pad, pad),
                                     (1, 1), F32)  # fmt: skip
    assert plan is not None and plan.split
    # float32 3x3 stride 2: pool_ir's kernel where the host has it, else the numba loops
    ir = pool_ir.kernel() is not None
    with spying_jitted(pool_direct._MAX_POOL_IR_PAR if ir else pool_direct._MAX_POOL_PAR) as calls:
        y = pool_direct.run_max_pool(plan, x, None)
    assert calls == [1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    want = np.full((n, c, oh, oh), -np.inf, np.float32)
    for i in range(3):
        for j in range(3):
            want = np.maximum(want, xp[:, :, i : i + 2 * oh - 1 : 2, j : j + 2 * oh - 1 : 2])
    np.testing.assert_array_equal(y, want)


def test_a_large_squeeze_excite_splits_its_channels_on_native_threads() -> None:
    from tfrt_py.kernels.nn import squeeze_excite as se

    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 96, 56, 56)).astype(np.float32)
    w1 = (rng.standard_normal((24, 96, 1, 1)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((96, 24, 1, 1)) * 0.3).astype(np.float32)
    b1, b2 = rng.standard_normal(24).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    fn = se.squeeze_excite_fn(w1, b1, w2, b2, Epilogue(act="Relu"), Epilogue(act="Sigmoid"))
    with spying_jitted(se._SE_PAR) as calls:
        y = fn(x)
    assert calls == [1]
    h = np.maximum(x.mean(axis=(2, 3)) @ w1[:, :, 0, 0].T + b1, 0)
    gate = 1 / (1 + np.exp(-(h @ w2[:, :, 0, 0].T + b2)))
    np.testing.assert_allclose(y, x * gate[:, :, None, None], rtol=1e-5, atol=1e-6)


def test_block_boundaries_are_made_once_and_their_cache_is_bounded() -> None:
    """Kernels ask for their blocks' edges per call: the same array comes back (no
    allocation on the hot path), and requests of ever new sizes cannot grow the cache
    past its bound."""
    e = native_threads.edges(1000, 4)
    assert native_threads.edges(1000, 4) is e
    assert e.tolist() == [0, 250, 500, 750, 1000] and not e.flags.writeable
    for size in range(native_threads._EDGES_MAX + 10):
        native_threads.edges(size + 2, 2)
    assert len(native_threads._EDGES) <= native_threads._EDGES_MAX


def test_plane_blocks_split_one_images_channels_or_the_images() -> None:
    one = native_threads.plane_blocks(1, 10, 4)
    assert one.tolist() == [[0, 1, 0, 2], [0, 1, 2, 5], [0, 1, 5, 7], [0, 1, 7, 10]]
    assert native_threads.plane_blocks(1, 10, 4) is one
    assert native_threads.plane_blocks(3, 10, 4).tolist() == [[0, 1, 0, 10], [1, 2, 0, 10],
                                                              [2, 3, 0, 10]]  # fmt: skip
    assert native_threads.plane_blocks(1, 2, 4).tolist() == [[0, 1, 0, 1], [0, 1, 1, 2]]
