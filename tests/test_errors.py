"""Bad input gives clear errors, and the model keeps working afterwards.

Every failing call is followed by a good call on the same loaded model that must still
return the right outputs, on every executor (the ``executor`` fixture). Messages are
checked for what a user needs to fix the problem: the input's name with its expected
dtype/shape, the node's name and op type, the op, domain and opset that are not
supported, the file that could not be read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import tfrt_py
from tests.support.executors import load_on
from tests.support.models.builders import FLOAT, INT64, Net, tensor_info
from tfrt_py.errors import (
    ExecutionError,
    GraphError,
    InputError,
    ModelLoadError,
    UnsupportedOpError,
)

TABLE = np.arange(30, dtype=np.float32).reshape(10, 3) / 10 - 1.0


def _embedding_model() -> onnx.ModelProto:
    """scores[batch,3] = Relu(features[batch,3] + table[token_ids[batch]])."""
    net = Net("embedding_add", seed=0)
    emb = net.op("Gather", net.const("table", TABLE), "token_ids", axis=0, name="lookup")
    net.op("Relu", net.op("Add", "features", emb, name="add"), outputs=["scores"], name="relu")
    return net.model(
        [tensor_info("features", FLOAT, ["batch", 3]), tensor_info("token_ids", INT64, ["batch"])],
        [tensor_info("scores", FLOAT, ["batch", 3])],
    )


def _reshape_model() -> onnx.ModelProto:
    """reshaped = Reshape(values[6], target_shape[2]) with the shape fed at run time."""
    net = Net("reshape_by_feed", seed=0)
    net.op("Reshape", "values", "target_shape", outputs=["reshaped"], name="reshape_by_feed")
    return net.model(
        [tensor_info("values", FLOAT, [6]), tensor_info("target_shape", INT64, [2])],
        [tensor_info("reshaped", FLOAT, [None, None])],
    )


GOOD_FEATURES = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, -3.0]], np.float32)
GOOD_IDS = np.array([3, 7], np.int64)


def expected_scores(features: Any, ids: Any) -> np.ndarray:
    return np.maximum(np.asarray(features, np.float32) + TABLE[np.asarray(ids)], 0)


@pytest.fixture(scope="module")
def model(executor: str) -> tfrt_py.Model:
    """One model per executor shared by every test here: each failure must leave it usable."""
    return load_on(executor, _embedding_model())


def assert_still_works(model: tfrt_py.Model) -> None:
    out = model.run({"features": GOOD_FEATURES, "token_ids": GOOD_IDS})
    np.testing.assert_allclose(out["scores"], expected_scores(GOOD_FEATURES, GOOD_IDS))


# -- feeds --------------------------------------------------------------------------------


def test_good_call(model: tfrt_py.Model) -> None:
    assert_still_works(model)


def test_missing_feed(model: tfrt_py.Model) -> None:
    with pytest.raises(InputError, match="token_ids"):
        model.run({"features": GOOD_FEATURES})
    assert_still_works(model)


def test_extra_feed(model: tfrt_py.Model) -> None:
    feeds = {"features": GOOD_FEATURES, "token_ids": GOOD_IDS, "bogus_input": GOOD_IDS}
    with pytest.raises(InputError, match="bogus_input"):
        model.run(feeds)
    assert_still_works(model)


def test_feeds_not_a_mapping(model: tfrt_py.Model) -> None:
    with pytest.raises(InputError):
        model.run([GOOD_FEATURES, GOOD_IDS])  # type: ignore[arg-type]
    assert_still_works(model)


@pytest.mark.parametrize(
    ("name", "value", "expected_dtype"),
    [
        ("features", GOOD_FEATURES.astype(np.float64), "float32"),
        ("features", GOOD_FEATURES.astype(np.int64), "float32"),
        ("token_ids", GOOD_IDS.astype(np.float32), "int64"),
        ("token_ids", GOOD_IDS.astype(np.uint64), "int64"),
    ],
    ids=["float64->float32", "int64->float32", "float32->int64", "uint64->int64"],
)
def test_wrong_dtype(
    model: tfrt_py.Model, name: str, value: np.ndarray, expected_dtype: str
) -> None:
    """Arrays are never cast when the cast could lose information."""
    feeds = {"features": GOOD_FEATURES, "token_ids": GOOD_IDS, name: value}
    with pytest.raises(InputError) as info:
        model.run(feeds)
    msg = str(info.value)
    assert name in msg
    assert expected_dtype in msg
    assert str(value.dtype) in msg
    assert_still_works(model)


@pytest.mark.parametrize(
    "features",
    [GOOD_FEATURES.reshape(6), GOOD_FEATURES.reshape(2, 3, 1), np.float32(1.0)],
    ids=["rank1", "rank3", "scalar"],
)
def test_wrong_rank(model: tfrt_py.Model, features: np.ndarray) -> None:
    with pytest.raises(InputError) as info:
        model.run({"features": np.asarray(features), "token_ids": GOOD_IDS})
    msg = str(info.value)
    assert "features" in msg
    assert "rank" in msg or "shape" in msg
    assert "3" in msg  # the expected static dim is shown
    assert_still_works(model)


def test_wrong_static_dim(model: tfrt_py.Model) -> None:
    with pytest.raises(InputError) as info:
        model.run({"features": np.zeros((2, 4), np.float32), "token_ids": GOOD_IDS})
    msg = str(info.value)
    assert "features" in msg
    assert "4" in msg and "3" in msg  # what was fed and what is expected
    assert_still_works(model)


def test_inconsistent_symbolic_dim(model: tfrt_py.Model) -> None:
    """features and token_ids share the symbolic dim "batch"."""
    with pytest.raises(InputError, match="batch"):
        model.run({"features": GOOD_FEATURES, "token_ids": np.array([1, 2, 3], np.int64)})
    assert_still_works(model)


def test_dynamic_dim_accepts_any_size(model: tfrt_py.Model) -> None:
    features = np.ones((5, 3), np.float32)
    ids = np.arange(5, dtype=np.int64)
    out = model.run({"features": features, "token_ids": ids})
    np.testing.assert_allclose(out["scores"], expected_scores(features, ids))


@pytest.mark.parametrize(
    ("features", "ids"),
    [
        ([[0.5, -1.0, 2.0], [1.0, 1.0, -3.0]], [3, 7]),
        ([[1.0, 2.0, 3.0]], [0]),
        ([[1, 2, 3]], [9]),  # Python ints into float32: exact
        ((((0.25, 0.5, 0.75),)), (1,)),  # tuples
    ],
    ids=["lists", "one_row", "ints_into_float32", "tuples"],
)
def test_python_values_accepted_when_lossless(
    model: tfrt_py.Model, features: Any, ids: Any
) -> None:
    out = model.run({"features": features, "token_ids": ids})
    assert out["scores"].dtype == np.float32
    np.testing.assert_allclose(out["scores"], expected_scores(features, ids))
    assert_still_works(model)


@pytest.mark.parametrize(
    ("features", "ids", "bad_input", "expected_dtype"),
    [
        ([[1.0, 2.0, 3.0]], [0.5], "token_ids", "int64"),
        ([[1.0, 2.0, 3.0]], [2**70], "token_ids", "int64"),
        ([["a", "b", "c"]], [0], "features", "float32"),
    ],
    ids=["fraction_into_int64", "overflow_int64", "strings_into_float32"],
)
def test_python_values_rejected_when_lossy(
    model: tfrt_py.Model, features: Any, ids: Any, bad_input: str, expected_dtype: str
) -> None:
    with pytest.raises(InputError) as info:
        model.run({"features": features, "token_ids": ids})
    msg = str(info.value)
    assert bad_input in msg
    assert expected_dtype in msg
    assert_still_works(model)


@pytest.mark.asyncio
async def test_run_async_bad_feed_then_good(model: tfrt_py.Model) -> None:
    with pytest.raises(InputError, match="token_ids"):
        await model.run_async({"features": GOOD_FEATURES})
    out = await model.run_async({"features": GOOD_FEATURES, "token_ids": GOOD_IDS})
    np.testing.assert_allclose(out["scores"], expected_scores(GOOD_FEATURES, GOOD_IDS))


def test_error_families() -> None:
    """Callers catching the builtin families keep working."""
    assert issubclass(InputError, ValueError)
    assert issubclass(ModelLoadError, ValueError)
    assert issubclass(UnsupportedOpError, ModelLoadError)
    assert issubclass(GraphError, ModelLoadError)
    assert issubclass(ExecutionError, RuntimeError)


# -- kernel failure at run time -----------------------------------------------------------


def test_kernel_failure_names_node_and_op(executor: str) -> None:
    model = load_on(executor, _reshape_model())
    values = np.arange(6, dtype=np.float32)
    with pytest.raises(ExecutionError) as info:
        model.run({"values": values, "target_shape": np.array([4, 4], np.int64)})
    msg = str(info.value)
    assert "reshape_by_feed" in msg
    assert "Reshape" in msg
    assert info.value.__cause__ is not None
    # the model is still usable, with the same and with other shapes
    for shape in ([2, 3], [3, -1], [6, 1]):
        out = model.run({"values": values, "target_shape": np.array(shape, np.int64)})
        np.testing.assert_array_equal(out["reshaped"], values.reshape(shape))


# -- load-time errors ---------------------------------------------------------------------


def test_random_bytes_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(ModelLoadError, match=re.escape(path.name)):
        tfrt_py.load(path)


def test_random_bytes_object() -> None:
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(ModelLoadError):
        tfrt_py.load(data)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=re.escape(path.name)):
        tfrt_py.load(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = _embedding_model().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=re.escape(path.name)):
        tfrt_py.load(path)


def test_nonexistent_path(tmp_path: Path) -> None:
    path = tmp_path / "no_such_model.onnx"
    with pytest.raises(ModelLoadError, match=re.escape(path.name)):
        tfrt_py.load(path)
    with pytest.raises(ModelLoadError, match=re.escape(path.name)):
        tfrt_py.load(str(path))


def test_unsupported_custom_op() -> None:
    net = Net("custom_op", seed=0)
    h = net.op("Relu", "x", name="relu")
    net.op("FancyOp", h, outputs=["y"], name="fancy_node", domain="com.example.custom", mode=3)
    proto = net.model(
        [tensor_info("x", FLOAT, [2])],
        [tensor_info("y", FLOAT, [2])],
        extra_opsets={"com.example.custom": 1},
        check=False,
    )
    with pytest.raises(UnsupportedOpError) as info:
        tfrt_py.load(proto)
    err = info.value
    msg = str(err)
    for part in ("FancyOp", "com.example.custom", "fancy_node", "1"):
        assert part in msg
    assert (err.op_type, err.domain, err.opset, err.node_name) == (
        "FancyOp",
        "com.example.custom",
        1,
        "fancy_node",
    )


def test_unsupported_default_opset() -> None:
    """A default-domain opset far beyond any released one is refused at load."""
    net = Net("future_opset", seed=0)
    net.op("Relu", "x", outputs=["y"], name="future_relu")
    proto = net.model(
        [tensor_info("x", FLOAT, [2])], [tensor_info("y", FLOAT, [2])], opset=99, check=False
    )
    with pytest.raises(ModelLoadError, match="99"):
        tfrt_py.load(proto)


@pytest.mark.parametrize(
    ("op_type", "opset"),
    [("LayerNormalization", 16), ("Gelu", 17), ("Erf", 8)],
    ids=["LayerNormalization@16", "Gelu@17", "Erf@8"],
)
def test_op_at_opset_without_kernel(op_type: str, opset: int) -> None:
    """An op used at an opset older than its first version (LayerNormalization is 17+,
    Gelu 20+, Erf 9+): refused at load, naming op, opset and node."""
    net = Net("too_old", seed=0)
    inputs = ["x"]
    if op_type == "LayerNormalization":
        inputs.append(net.const("scale", np.ones(6, np.float32)))
    net.op(op_type, *inputs, outputs=["y"], name="too_old_node")
    proto = net.model(
        [tensor_info("x", FLOAT, [6])], [tensor_info("y", FLOAT, [6])], opset=opset, check=False
    )
    with pytest.raises(UnsupportedOpError) as info:
        tfrt_py.load(proto)
    msg = str(info.value)
    assert op_type in msg and "too_old_node" in msg and str(opset) in msg
    assert (info.value.op_type, info.value.opset) == (op_type, opset)


def test_undefined_value_is_a_graph_error() -> None:
    net = Net("dangling", seed=0)
    net.op("Add", "x", "never_defined", outputs=["y"], name="add_dangling")
    proto = net.model([tensor_info("x", FLOAT, [2])], [tensor_info("y", FLOAT, [2])], check=False)
    with pytest.raises(GraphError, match="never_defined"):
        tfrt_py.load(proto)
