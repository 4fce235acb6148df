"""Models of the scale-out tests and benchmarks (tests/test_ray.py, tests/serving/test_prefork.py,
benchmarks/ray_bulk.py), each built from fixed seeds into a file:

* ``gbt_model``: scikit-learn gradient-boosted trees (3 classes, 8 features) converted with
  skl2onnx, ZipMap on (probabilities come out as {class: p} per row);
* ``mlp_model``: a 3-layer MLP made with onnx.helper (MatMul, Add, Relu, Softmax);
* ``string_model``: ai.onnx.ml LabelEncoder, strings -> int64;
* ``wide_model``: four square MatMul layers holding ``mib`` MiB of float32 weights, in an
  external-data file or embedded in the .onnx.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GBT_FEATURES = 8
MLP_IN = 16


def gbt_data(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, GBT_FEATURES)).astype(np.float32)


def gbt_model(path: Path, n_estimators: int = 30) -> Path:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier

    x, y = make_classification(
        n_samples=2000, n_features=GBT_FEATURES, n_informative=5, n_classes=3, random_state=0
    )
    clf = GradientBoostingClassifier(n_estimators=n_estimators, max_depth=3, random_state=0)
    clf.fit(x.astype(np.float32), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = to_onnx(
            clf,
            initial_types=[("features", FloatTensorType([None, GBT_FEATURES]))],
            target_opset={"": 17, "ai.onnx.ml": 3},
        )
    onnx.save(proto, str(path))
    return path


def mlp_data(rows: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, MLP_IN)).astype(np.float32)


def mlp_model(path: Path, hidden: int = 64, classes: int = 4) -> Path:
    rng = np.random.default_rng(3)
    dims = [MLP_IN, hidden, hidden, classes]
    inits, nodes, x = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"W{i}"),
            numpy_helper.from_array(rng.standard_normal(dims[i + 1]).astype(np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        ]
        x = f"a{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [x], [f"h{i}"]))
            x = f"h{i}"
    nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=-1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", MLP_IN])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


CITIES = ["berlin", "lagos", "lima", "osaka", "oslo"]


def string_model(path: Path) -> Path:
    node = helper.make_node(
        "LabelEncoder",
        ["city"],
        ["code"],
        domain="ai.onnx.ml",
        keys_strings=CITIES,
        values_int64s=list(range(10, 10 + len(CITIES))),
        default_int64=-1,
    )
    graph = helper.make_graph(
        [node],
        "cities",
        [helper.make_tensor_value_info("city", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("code", TensorProto.INT64, ["N"])],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]
    )
    onnx.save(proto, str(path))
    return path


def wide_model(path: Path, mib: int, external: bool, layers: int = 4) -> Path:
    """``layers`` D x D float32 MatMuls (D from ``mib``) with Relu between, input x [N, D]."""
    d = int(np.sqrt(mib * 2**20 / 4 / layers))
    rng = np.random.default_rng(5)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((d, d), dtype=np.float32)
        w *= np.float32(1 / np.sqrt(d))
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}"]))
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", d])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save(
            proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.stem + ".bin",
            size_threshold=0,
        )
    else:
        onnx.save(proto, str(path))
    return path
