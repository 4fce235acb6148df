"""The stem conv kernel (``kernels/lib/stem_ir.py``: few input channels, 3x3 at stride 2)
in every vector width this host has, and the model convs that take it (``nn/conv_stem``).

The kernel straight (ctypes) against a float64 NumPy conv on random geometries with the
edges -- planes narrower than a vector and a single pixel, pads from none to two on
either side, filters not a multiple of a group, NaN inputs -- with guard floats after
the output. Models against onnxruntime with each epilogue, checking that the kernel ran;
convs it must not take (more channels, stride 1, a residual, groups, dilation) checking
that it did not. A width the host lacks is skipped with the reason."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.jit_paths import need_lanes, spying_jitted
from tfrt_py.kernels.lib import stem_ir
from tfrt_py.kernels.lib.jit import jit_enabled, why_off
from tfrt_py.kernels.nn import conv_stem

RNG = np.random.default_rng(61)
F32 = np.float32


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, pt: int, pl: int, oh: int,
               ow: int, lo: float, hi: float) -> np.ndarray:  # fmt: skip
    c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.zeros((c, pt + 2 * oh + kh, pl + 2 * ow + kw), np.float64)
    xp[:, pt : pt + h, pl : pl + wd] = x
    y = np.zeros((m, oh, ow)) + b[:, None, None]
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i : i + 2 * oh : 2, j : j + 2 * ow : 2][:, :oh, :ow]
            y += np.einsum("mc,cpq->mpq", w[:, :, i, j].astype(np.float64), patch)
    return np.clip(y, lo, hi)


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_every_width_convolves_like_numpy(lanes: int) -> None:
    """60 random geometries a width, each with no clamp, ReLU's, Clip's and HardSwish; rows
    ``[r0, r1)`` only when asked; nothing written past the output or outside the rows."""
    need_lanes(lanes)
    engine = stem_ir.build(lanes)
    i64 = ctypes.c_int64
    fn = ctypes.CFUNCTYPE(i64, *[ctypes.c_void_p] * 5, *[i64] * 10)(
        engine.get_function_address(stem_ir.SYMBOL)
    )
    for case in range(60):
        c = int(RNG.integers(1, stem_ir.MAX_CHANNELS + 1))
        h, wd = (int(v) for v in RNG.integers(1, 70, 2))
        pt, pb, pl, pr = (int(v) for v in RNG.integers(0, 3, 4))
        oh, ow = (h + pt + pb - 3) // 2 + 1, (wd + pl + pr - 3) // 2 + 1
        if oh < 1 or ow < 1:
            continue
        m = int(RNG.integers(1, 41))
        x = RNG.standard_normal((c, h, wd)).astype(F32)
        if case % 5 == 0:
            x[RNG.random(x.shape) < 0.02] = np.nan
        w = RNG.standard_normal((m, c, 3, 3)).astype(F32)
        b = RNG.standard_normal(m).astype(F32)
        wp, bp = stem_ir.pack(w, lanes), stem_ir.pack_bias(b, m, lanes)
        r0, r1 = (0, oh) if case % 4 else (oh // 3, oh - oh // 4)
        for lo, hi, hs in (
            (-np.inf, np.inf, 0),
            (0.0, np.inf, 0),
            (0.0, 6.0, 0),
            (-np.inf, np.inf, 1),
        ):
            lohi = np.array([lo, hi, hs], F32)
            size = m * oh * ow
            buf = np.full(size + 64, 5.0, F32)
            args = (x.ctypes.data, wp.ctypes.data, bp.ctypes.data, buf.ctypes.data,
                    lohi.ctypes.data, c, h, wd, oh, ow, pt, pl, m, r0, r1)  # fmt: skip
            assert fn(*args) == 0
            got = buf[:size].reshape(m, oh, ow)
            want = _reference(x, w, b, pt, pl, oh, ow, lo, hi)
            if hs:
                want = want * np.clip(want / 6 + 0.5, 0, 1)
            where = f"{lanes} {(c, h, wd, pt, pl, m, r0, r1, lo, hi)}"
            np.testing.assert_allclose(got[:, r0:r1], want[:, r0:r1], rtol=1e-5, atol=1e-5,
                                       err_msg=where)  # fmt: skip
            assert (got[:, :r0] == 5.0).all() and (got[:, r1:] == 5.0).all(), where
            assert (buf[size:] == 5.0).all(), where


def _need_kernel() -> None:
    if not jit_enabled():
        pytest.skip(f"compiled kernels are off here ({why_off()}): the other routes run")
    if stem_ir.kernel() is None:
        pytest.skip(f"the kernel is off here ({stem_ir.describe() or 'no llvmlite'})")


def _conv_model(shape: tuple[int, ...], m: int, act: str, residual: Any = None,
                **attrs: Any) -> bytes:  # fmt: skip
    c = shape[1] // attrs.get("group", 1)
    k = attrs.get("kernel_shape", [3, 3])
    w = numpy_helper.from_array(RNG.standard_normal((m, c, *k)).astype(F32), "w")
    bias = numpy_helper.from_array(RNG.standard_normal(m).astype(F32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    out = "c"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [out], ["a"]))
    elif act == "Clip":
        lo = numpy_helper.from_array(np.array(0.0, F32), "lo")
        hi = numpy_helper.from_array(np.array(6.0, F32), "hi")
        nodes += [helper.make_node("Constant", [], ["lo"], value=lo),
                  helper.make_node("Constant", [], ["hi"], value=hi),
                  helper.make_node("Clip", [out, "lo", "hi"], ["a"])]  # fmt: skip
    elif act == "HardSwish":
        nodes.append(helper.make_node("HardSwish", [out], ["a"]))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", [out], ["s"]),
                  helper.make_node("Mul", [out, "s"], ["a"])]  # fmt: skip
    if act:
        out = "a"
    if residual is not None:  # the residual's shape: the fusion needs it to add in place
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(residual)))
        nodes.append(helper.make_node("Add", [out, "r"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "stem", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w, bias])  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _run(mp: bytes, shape: tuple[int, ...], residual: Any = None) -> tuple[Any, Any, int]:
    """tfrt_py's output, onnxruntime's and how many times the stem driver ran."""
    feeds = {"x": RNG.standard_normal(shape).astype(F32)}
    sess = ort.InferenceSession(mp, providers=["CPUExecutionProvider"])
    if residual is not None:
        feeds["r"] = RNG.standard_normal(residual).astype(F32)
    want = sess.run(None, feeds)[0]
    model = tfrt_py.load(mp, executor="sync")
    with spying_jitted(conv_stem._STEM) as one:
        if conv_stem._STEM_PAR.get() is not None:
            with spying_jitted(conv_stem._STEM_PAR) as par:
                got = model.run(feeds)["y"]
        else:
            par = []
            got = model.run(feeds)["y"]
    return got, want, len(one) + len(par)


@pytest.mark.parametrize(
    ("shape", "m", "act", "attrs"),
    [
        ((1, 3, 224, 224), 32, "SiLU", {"strides": [2, 2], "pads": [1] * 4}),  # EfficientNet
        ((1, 3, 64, 64), 32, "Clip", {"strides": [2, 2], "pads": [1] * 4}),  # MobileNetV2
        ((2, 3, 57, 45), 16, "HardSwish", {"strides": [2, 2], "pads": [1] * 4}),
        ((1, 3, 63, 63), 64, "Relu", {"strides": [2, 2]}),  # SqueezeNet's: no pads
        ((3, 1, 20, 33), 24, "", {"strides": [2, 2], "pads": [0, 1, 2, 0]}),
        ((1, 4, 9, 5), 5, "Relu", {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ],
)
def test_stem_convs_run_the_kernel(shape: Any, m: int, act: str, attrs: dict[str, Any]) -> None:
    _need_kernel()
    mp = _conv_model(shape, m, act, kernel_shape=[3, 3], **attrs)
    got, want, ran = _run(mp, shape)
    assert ran, "the stem kernel did not run"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("shape", "m", "attrs", "residual"),
    [
        ((1, 5, 32, 32), 8, {"strides": [2, 2], "pads": [1] * 4}, None),  # 5 channels
        ((1, 3, 32, 32), 8, {"strides": [1, 1], "pads": [1] * 4}, None),  # stride 1
        ((1, 4, 32, 32), 8, {"strides": [2, 2], "pads": [1] * 4, "group": 2}, None),
        ((1, 3, 32, 32), 8, {"strides": [2, 2], "dilations": [2, 2]}, None),
        ((1, 3, 32, 32), 8, {"strides": [2, 2], "pads": [1] * 4}, (1, 8, 16, 16)),  # residual
        ((1, 3, 32, 32), 8, {"strides": [2, 2], "kernel_shape": [5, 5]}, None),
    ],
)
def test_other_convs_keep_their_routes(shape: Any, m: int, attrs: dict[str, Any],
                                       residual: Any) -> None:  # fmt: skip
    _need_kernel()
    attrs = {"kernel_shape": [3, 3], **attrs}
    mp = _conv_model(shape, m, "", residual=residual, **attrs)
    got, want, ran = _run(mp, shape, residual)
    assert not ran, "the stem kernel took a conv it does not serve"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
