"""A decoder step's fused ops on the native tier (``native/lower/ops_dec.py``): the
scores ``Q @ K^T`` (MatMulTransB, with its scale; loops in a small box, BLAS in a big
one), the rotate-half rotary embedding (RotaryHalf) and SiLU in a Linear's epilogue
(Llama's MLP); a whole greedy generation on boxes of past lengths against onnxruntime;
and which dynamic models ``auto`` puts on the native tier."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import tfrt_py
from tests.support.models.decoder import decoder, reference_greedy
from tfrt_py.ir import Graph, GraphBuilder, Value
from tfrt_py.kernels.lib import blas
from tfrt_py.native.lower.budget import units

F32 = np.float32
RNG = np.random.default_rng(37)


def _decoder_ops() -> Graph:
    b = GraphBuilder("dec_ops")
    x = b.input("x", F32, (1, 2, "S", 8))
    cos = b.input("cos", F32, (1, 1, "S", 8))
    sin = b.input("sin", F32, (1, 1, "S", 8))

    def i64(v: list[int]) -> Value:
        return b.const(np.array(v, np.int64))

    hi = b.op("Slice", x, i64([5]), i64([8]), i64([3]))  # an uneven split: 5 | 3
    lo = b.op("Slice", x, i64([0]), i64([5]), i64([3]))
    rot = b.op("Add", b.op("Mul", x, cos), b.op("Mul", b.op("Concat", b.op("Neg", hi), lo,
                                                            axis=-1), sin))  # fmt: skip
    scaled = b.op("Mul", rot, b.const(np.array(0.5, F32)))
    b.output(b.op("MatMul", scaled, b.op("Transpose", x, perm=[0, 1, 3, 2])), "scores")
    w = b.const(RNG.standard_normal((8, 32)).astype(F32))
    h = b.op("MatMul", b.op("Reshape", x, i64([-1, 8])), w)
    b.output(b.op("Mul", h, b.op("Sigmoid", h)), "mlp")
    return b.build()


@pytest.mark.compiles
def test_the_decoder_ops_lower_and_agree_with_the_interpreter() -> None:
    g = _decoder_ops()
    native = tfrt_py.load(g, executor="native", native="eager")
    sync = tfrt_py.load(g, executor="sync")
    nodes = native.prepared.graph.nodes
    assert {"RotaryHalf", "MatMulTransB", "Linear"} <= {n.op_type for n in nodes}
    assert any(n.op_type == "Linear" and n.attrs["activation"][0][0] == "Swish" for n in nodes)
    for s in (3, 16, 17, 40, 128):
        feeds = {"x": RNG.standard_normal((1, 2, s, 8)).astype(F32),
                 "cos": RNG.standard_normal((1, 1, s, 8)).astype(F32),
                 "sin": RNG.standard_normal((1, 1, s, 8)).astype(F32)}  # fmt: skip
        got, want = native.run(feeds), sync.run(feeds)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    jobs = native.native.sigs
    assert [j.state for j in jobs.values()] == ["ready", "ready"]
    small, big = (j.lowered.source for j in jobs.values() if j.lowered is not None)
    assert "gemm_f4_ld" not in small  # loops
    # then BLAS, where NumPy's BLAS symbols can be called (kernels/lib/blas.py)
    assert ("gemm_f4_ld" in big) == blas.available()


def test_compile_units_count_code_not_comments() -> None:
    """A decoder step folds its shape arithmetic, leaving a ``# node N: folded`` line per
    node: they compile to nothing and cost no units (GPT-2's step counted 1,519 with them,
    over the budget, and 1,111 without)."""
    body = "\n".join(["    # node 7: folded"] * 50 + ["", "    y = 1", "    return y"])
    src = f"x = 1\n@njit(SIG)\ndef run():\n{body}\n"
    assert units(src) == 3


def _stack(dynamic: bool) -> Graph:
    """Three 512-wide layers: 1.6 MFLOP a row, past the tiny models' threshold."""
    b = GraphBuilder("stack")
    h = b.input("x", F32, (1, "S" if dynamic else 4, 512))
    for _ in range(3):
        w = b.const((RNG.standard_normal((512, 512)) * 0.05).astype(F32))
        h = b.op("Relu", b.op("MatMul", h, w))
    b.output(h, "y")
    return b.build()


def test_auto_puts_small_models_with_dynamic_dims_on_the_native_tier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above the tiny models' 1 MFLOP a model with a dynamic sequence still goes native
    (boxes of dims, measured against the interpreter per box); a static one does not."""
    monkeypatch.delenv("TFRT_PY_NATIVE", raising=False)
    assert tfrt_py.load(_stack(dynamic=True), native="eager").executor == "native"
    static = tfrt_py.load(_stack(dynamic=False), native="eager")
    assert static.executor == "sync" and "is not tiny" in static.describe()


@pytest.mark.slow
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_generation_runs_its_steps_on_boxes_and_matches_onnxruntime(
    kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy decoding of 20 tokens: the steps over past lengths 6..25 run on two
    compiled functions (past 2..16 and 17..128), and the tokens are onnxruntime's; with
    grouped KV heads (repeated by Tile) too. The compiled code writes each cache in place
    (``native/lower/cache.py``; the Tile reads it there): every step is handed the same
    buffers."""
    from tfrt_py.generation import steps

    onx = decoder(kv_heads=kv_heads).SerializeToString()
    model = tfrt_py.load(onx, executor="native", native="eager")
    monkeypatch.setattr(steps, "IN_PLACE_BYTES", 0)
    seen: list[object] = []
    real = model.run

    def spy(feeds: object, outputs: object = None, **kw: object) -> object:
        seen.append(outputs)
        return real(feeds, outputs, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "run", spy)
    prompt = [3, 14, 15, 9, 26, 5]
    got = model.generate(prompt, max_new_tokens=20)
    assert model.runtime.writes_concat_in_place
    assert len(seen) == 20 and all(o is not None for o in seen)
    assert len({id(o["present.1.value"].base) for o in seen}) == 1  # type: ignore[index]
    session = ort.InferenceSession(onx, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, reference_greedy(session, [prompt], 20)[0])
    ready = {k for k, j in model.native.sigs.items() if j.state == "ready"}
    assert ("box", ((0, 1), (0, 1), (1, 16))) in ready
    assert ("box", ((0, 1), (0, 1), (16, 128))) in ready
