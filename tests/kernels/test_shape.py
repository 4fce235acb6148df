"""Shape and indexing kernels: edge cases against onnxruntime (or NumPy), kernels run alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from tests.support.jit_paths import spy_served
from tfrt_py.ir import Node, TensorType, Value
from tfrt_py.kernels import KernelContext, default_registry

I64 = np.int64


def build(
    op: str,
    inputs: list[Any],
    attrs: dict[str, Any],
    opset: int,
    n_out: int = 1,
    const: tuple[int, ...] = (),
    typed: bool = False,
) -> Any:
    """Our compute function for one node; inputs listed in ``const`` become initializers."""
    vals: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            vals.append(None)
            continue
        a = np.asarray(a)
        t = TensorType(a.dtype, a.shape) if typed else None
        vals.append(Value(f"i{i}", t, const=a if i in const else None))
    node = Node(op, vals, [Value(f"o{j}") for j in range(n_out)], attrs, name="n", opset=opset)
    return default_registry().lookup("", op, opset).build(KernelContext(node))


def ours(op: str, inputs: list[Any], attrs: dict[str, Any], opset: int, **kw: Any) -> list[Any]:
    r = build(op, inputs, attrs, opset, **kw)(
        *[None if a is None else np.asarray(a) for a in inputs]
    )
    return list(r) if isinstance(r, tuple) else [r]


def ort_run(op: str, inputs: list[Any], attrs: dict[str, Any], opset: int, n_out: int = 1) -> list:
    ins, feeds, names = [], {}, []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        a = np.asarray(a)
        elem = helper.np_dtype_to_tensor_dtype(a.dtype)
        ins.append(helper.make_tensor_value_info(f"i{i}", elem, a.shape))
        feeds[f"i{i}"] = a
        names.append(f"i{i}")
    outs = [onnx.ValueInfoProto(name=f"o{j}") for j in range(n_out)]
    node = helper.make_node(op, names, [f"o{j}" for j in range(n_out)], **attrs)
    graph = helper.make_graph([node], "g", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def same(op: str, inputs: list[Any], attrs: dict[str, Any], opset: int, **kw: Any) -> None:
    n_out = kw.get("n_out", 1)
    for got, want in zip(
        ours(op, inputs, attrs, opset, **kw), ort_run(op, inputs, attrs, opset, n_out)
    ):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        np.testing.assert_array_equal(got, want)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("const", [(), (1,)])
@pytest.mark.parametrize("shape", [[0, -1], [4, 0, 2], [-1], [0, 0, 4]])
def test_reshape_zero_copies_dim(shape: list[int], const: tuple[int, ...]) -> None:
    same("Reshape", [X, np.array(shape, I64)], {}, 14, const=const)


def test_reshape_allowzero_and_views() -> None:
    z = np.zeros((0, 3), np.float32)
    (y,) = ours("Reshape", [z, np.array([3, 0], I64)], {"allowzero": 1}, 14, const=(1,))
    assert y.shape == (3, 0)
    (v,) = ours("Reshape", [X, np.array([6, 4], I64)], {}, 14, const=(1,))
    assert np.shares_memory(v, X)


@pytest.mark.parametrize("const", [(), (1, 2, 3, 4)])
@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([-100], [-200], [2], [-1]),  # start below -dim with a negative step clamps to 0
        ([10], [-10], [2], [-2]),
        ([-1], [0], [-1], [-1]),
        ([1, 0], [2**63 - 1, 3], [0, -2], [1, 2]),
    ],
)
def test_slice_clamping(
    starts: list[int], ends: list[int], axes: list[int], steps: list[int], const: tuple[int, ...]
) -> None:
    ins = [X, *(np.array(v, I64) for v in (starts, ends, axes, steps))]
    same("Slice", ins, {}, 13, const=const)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 0, 2, 1, 0], [0, -1, 2, 1, 0, -2], [3, 0, 3, 1, 4, 5]])
def test_pad_modes(mode: str, pads: list[int]) -> None:
    x = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    same("Pad", [x, np.array(pads, I64), np.array(-2.5, np.float32)], {"mode": mode}, 19)


def test_pad_axes_and_out() -> None:
    x = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    ins = [x, np.array([1, 2, 2, 0], I64), None, np.array([0, -1], I64)]
    same("Pad", ins, {"mode": "reflect"}, 19, const=(1, 3))
    fn = build("Pad", ins, {"mode": "edge"}, 19, const=(1, 3))
    out = np.empty((7, 5, 8), np.float32)
    assert fn(*ins, out=out) is out
    np.testing.assert_array_equal(out, np.pad(x, [(1, 2), (0, 0), (2, 0)], mode="edge"))


def test_split_uneven_and_sizes() -> None:
    parts = ours("Split", [np.arange(7.0)], {"num_outputs": 3}, 18, n_out=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    same("Split", [X, np.array([3, 0], I64)], {"axis": 1}, 13, n_out=2, const=(1,))
    same("Split", [X], {"axis": -1, "split": [1, 3]}, 11, n_out=2)


@pytest.mark.parametrize("axes", [[0], [-1], [3, 0], [1, -1]])
def test_unsqueeze_axes(axes: list[int]) -> None:
    same("Unsqueeze", [X, np.array(axes, I64)], {}, 13)
    same("Unsqueeze", [X, np.array(axes, I64)], {}, 13, const=(1,))
    same("Unsqueeze", [X], {"axes": axes}, 11)


def test_expand_tile_out() -> None:
    x = X[:, :1, :]
    same("Expand", [x, np.array([2, 1, 3, 1], I64)], {}, 13)
    same("Tile", [X.transpose(2, 0, 1), np.array([2, 1, 2], I64)], {}, 13, const=(1,))
    out = np.empty((4, 9, 4), np.float32)
    build("Tile", [X, np.array([2, 3, 1], I64)], {}, 13)(X, np.array([2, 3, 1]), out=out)
    np.testing.assert_array_equal(out, np.tile(X, (2, 3, 1)))
    with pytest.raises(ValueError):
        ours("Expand", [x, np.array([3, 1, 1], I64)], {}, 13)


def test_gather_family() -> None:
    for axis in (0, -1):
        same("Gather", [X, np.array(-1, I64)], {"axis": axis}, 13, const=(1,))
        same("Gather", [X, np.array([[1, -1], [0, 0]], I64)], {"axis": axis}, 13)
    small = np.array([[[1, 0, -1]]], I64)  # smaller than the data on the non-axis dims
    same("GatherElements", [X, small], {"axis": 1}, 13)
    d = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    same(
        "GatherND", [d, np.array([[[1, 2], [0, 3]], [[2, 3], [1, 0]]], I64)], {"batch_dims": 1}, 13
    )
    same("GatherND", [d, np.array([[1, 2, 3], [0, -1, 2]], I64)], {}, 13)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatters(reduction: str) -> None:
    upd = np.full((1, 1, 3), 7.0, np.float32)
    idx = np.array([[[1, 1, -1]]], I64) if reduction != "none" else np.array([[[1, 0, -1]]], I64)
    same("ScatterElements", [X, idx, upd], {"axis": 2, "reduction": reduction}, 18)
    nd_idx = np.array([[0, 1], [1, 2], [0, 1]], I64)
    if reduction == "none":
        nd_idx = nd_idx[:2]
    nd_upd = np.arange(nd_idx.shape[0] * 4, dtype=np.float32).reshape(-1, 4)
    same("ScatterND", [X, nd_idx, nd_upd], {"reduction": reduction}, 18)


@pytest.mark.parametrize(
    ("axis", "reduction"), [(0, "none"), (1, "none"), (-1, "none"), (0, "add")]
)
def test_scatter_elements_of_expanded_indices_writes_slabs(
    monkeypatch: pytest.MonkeyPatch, axis: int, reduction: str
) -> None:
    """Indices that hold one value per position along the axis (an index vector expanded,
    as torchvision's multi-scale RoiAlign writes its ROIs back) take the slab copy; data
    larger than the indices on another dim, negative indices, duplicates under "add"."""
    from tfrt_py.kernels.indexing import scatter

    slabs = spy_served(monkeypatch, scatter, "_slab_key")
    data = np.arange(5 * 6 * 4, dtype=np.float32).reshape(5, 6, 4)
    small = [1, 2, 2, 3] if axis == 1 else [3, -1, 0, 3 if reduction == "add" else 1]
    shape = [4, 3, 2] if axis != -1 else [4, 3, 4]
    shape[axis] = len(small)
    vec_shape = [1, 1, 1]
    vec_shape[axis] = len(small)
    idx = np.broadcast_to(np.array(small, I64).reshape(vec_shape), shape).copy()
    upd = np.random.default_rng(2).random(shape, dtype=np.float32)
    same("ScatterElements", [data, idx, upd], {"axis": axis, "reduction": reduction}, 18)
    assert slabs and all(slabs)
    assert scatter._slab_key(idx, axis % 3) is not None
    idx[-1, -1, -1] += 1  # no longer one value per position: the element path
    assert scatter._slab_key(idx, axis % 3) is None


def test_scatter_inplace_out() -> None:
    data = X.copy()
    fn = build("ScatterND", [data, np.array([[1]], I64), np.ones((1, 3, 4), np.float32)], {}, 18)
    r = fn(data, np.array([[1]], I64), np.ones((1, 3, 4), np.float32), out=data)
    assert r is data and data[1].sum() == 12 and np.array_equal(data[0], X[0])


def test_tensor_scatter() -> None:
    past = np.zeros((2, 1, 5, 2), np.float32)
    upd = np.arange(12, dtype=np.float32).reshape(2, 1, 3, 2) + 1
    (lin,) = ours("TensorScatter", [past, upd, np.array([0, 2], I64)], {}, 24)
    np.testing.assert_array_equal(lin[0, 0, :3], upd[0, 0])
    np.testing.assert_array_equal(lin[1, 0, 2:], upd[1, 0])
    (circ,) = ours("TensorScatter", [past, upd, np.array([4, 1], I64)], {"mode": "circular"}, 24)
    np.testing.assert_array_equal(circ[0, 0, [4, 0, 1]], upd[0, 0])
    assert not past.any()  # input untouched


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("sort", [0, 1])
def test_unique(axis: int | None, sort: int) -> None:
    u = np.array([[3, 1, 3], [2, 2, 0], [3, 1, 3], [2, 2, 0], [1, 1, 1]], np.float32)
    attrs: dict[str, Any] = {"sorted": sort}
    if axis is not None:
        attrs["axis"] = axis
    same("Unique", [u], attrs, 11, n_out=4)


def test_misc_indexing() -> None:
    same(
        "OneHot",
        [np.array([[0, 3], [-1, 7]], I64), np.array(5, I64), np.array([0, 1.5], np.float32)],
        {"axis": 1},
        11,
    )
    xs = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    same(
        "ReverseSequence", [xs, np.array([1, 3, 2, 3], I64)], {"batch_axis": 1, "time_axis": 0}, 10
    )
    for k in (None, -1, 7):
        ins = [X] if k is None else [X, np.array(k, I64)]
        same("Trilu", ins, {"upper": 0}, 14)
    same("Compress", [X, np.array([False, True])], {"axis": -1}, 11)
    same("NonZero", [X > 10], {}, 13)


def test_shape_size_dropout() -> None:
    same("Shape", [X], {"start": -2, "end": -1}, 15)
    same("Size", [X], {}, 13)
    y, mask = ours("Dropout", [X], {}, 13, n_out=2)
    assert y is X and mask.dtype == bool and mask.all()
    ratio, train = np.array(0.5, np.float32), np.array(True)
    a = ours("Dropout", [X, ratio, train], {"seed": 3}, 13, n_out=2)
    b = ours("Dropout", [X, ratio, train], {"seed": 3}, 13, n_out=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0], np.where(a[1], X * 2, 0))
    assert a[0].dtype == np.float32


def test_bitcast_and_generators() -> None:
    (b,) = ours("BitCast", [np.array([1.0, -2.0], np.float32)], {"to": onnx.TensorProto.INT32}, 26)
    np.testing.assert_array_equal(b, np.array([1.0, -2.0], np.float32).view(np.int32))
    same("Range", [np.array(5, np.int32), np.array(-7, np.int32), np.array(-3, np.int32)], {}, 11)
    (r,) = ours(
        "Range",
        [np.array(1.0, np.float16), np.array(9, np.float16), np.array(0.5, np.float16)],
        {},
        11,
    )
    assert r.dtype == np.float16 and r.shape == (16,)
    same("EyeLike", [np.zeros((4, 3), np.int32)], {"k": -1, "dtype": 1}, 9)
    value = np.array([7], np.int32)
    (c,) = ours("ConstantOfShape", [np.array([2, 3], I64)], {"value": value}, 20)
    assert c.dtype == np.int32 and c.shape == (2, 3) and (c == 7).all()
    y = np.arange(2 * 8 * 4 * 6, dtype=np.float32).reshape(2, 8, 4, 6)
    same("DepthToSpace", [y], {"blocksize": 2, "mode": "CRD"}, 13)
    same("SpaceToDepth", [y], {"blocksize": 2}, 13)
    same("CenterCropPad", [X, np.array([1, 7], I64)], {"axes": [1, 2]}, 18)
