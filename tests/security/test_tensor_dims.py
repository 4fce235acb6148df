"""Tensor dims from a stranger's model (issue 12, items 2a and 3): a negative dim, one that
overflows int64 as a byte count, or a product of dims that does, is a ModelLoadError naming
the tensor at load -- for external data (normal, async and streamed loads; a streamed
tensor used to load and then hang ``run()``), for embedded initializers, and for tensors in
Constant nodes and sparse initializers -- never a raw OverflowError/ValueError."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from sec_models import STREAM_BUDGET, external_model, save, write_weights

import tfrt_py
from tfrt_py.errors import ModelLoadError

LOADS = {
    "normal": {"executor": "sync"},
    "async": {"executor": "async"},
    "streamed": {"memory_budget": STREAM_BUDGET},
}

BAD_DIMS = {
    "negative": (-64,),
    "negative-pair": (-1, -64),
    "int64-bytes": (2**62, 4),  # 2**64 bytes: wraps to 0 in int64
    "product": (2**40, 2**40),
    "product-wraps-small": (2**61, 2**3, 2),  # 2**65 elements: the int64 product wraps
    "huge-vs-file": (2**40,),  # representable, but the file holds 256 bytes
}


@pytest.fixture(params=list(LOADS))
def load_kw(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(LOADS[str(request.param)])


@pytest.mark.parametrize("dims", list(BAD_DIMS.values()), ids=list(BAD_DIMS))
def test_bad_external_dims_fail_at_load(
    tmp_path: Any, load_kw: dict[str, Any], dims: tuple[int, ...]
) -> None:
    model_dir = str(tmp_path)
    write_weights(model_dir)
    path = save(external_model("w.bin", dims=dims), model_dir)
    with pytest.raises(ModelLoadError, match=r"tensor 'w'.*(negative dim|2\*\*63|too short)"):
        tfrt_py.load(path, **load_kw)


def _embedded_model(dims: tuple[int, ...], where: str) -> onnx.ModelProto:
    t = TensorProto()
    t.name = "w"
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.raw_data = b"\0" * 16
    inits, nodes = [], [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    if where == "initializer":
        inits.append(t)
    elif where == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], name="const", value=t))
    else:  # a sparse initializer whose values tensor has the bad dims
        idx = helper.make_tensor("w_idx", TensorProto.INT64, [4], [0, 1, 2, 3])
        t.name = "w"
        sp = helper.make_sparse_tensor(t, idx, [4])
        g = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            sparse_initializer=[sp],
        )  # fmt: skip
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("where", ["initializer", "constant", "sparse"])
@pytest.mark.parametrize("dims", [(-4,), (2**62, 4), (2**61, 2**3, 2)], ids=str)
def test_bad_embedded_dims_fail_at_load(
    load_kw: dict[str, Any], where: str, dims: tuple[int, ...]
) -> None:
    source = _embedded_model(dims, where).SerializeToString()
    with pytest.raises(ModelLoadError, match=r"tensor 'w'.*(negative dim|2\*\*63)"):
        tfrt_py.load(source, **load_kw)


def test_good_embedded_model_still_loads() -> None:
    model = tfrt_py.load(_embedded_model((4,), "initializer"))
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], x)
