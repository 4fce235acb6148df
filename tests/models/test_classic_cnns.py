"""The nine classic CNNs shipped inside the onnx package (``onnx/backend/test/data/light``):
AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512.

These "light" models keep the real architectures but replace every weight with a
``ConstantOfShape`` (so the files are small). ``onnx.backend.test.runner`` feeds them one
deterministic input, ``arange(n).reshape(shape) / n`` as float32 (unknown dims -> 1), and
compares with ``light_<name>_output_<i>.pb`` next to the model, using each case's
rtol/atol from ``data/real/test_<name>/data.json``. We do the same; when a stored output
is missing we compare with onnxruntime instead.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import tfrt_py
from tests.support.classic_cnns import CLASSIC_CNNS, LIGHT_DIR

pytestmark = pytest.mark.slow

REAL_DIR = LIGHT_DIR.parent / "real"
_LIGHT_URL = "onnx/backend/test/data/light/"


#: Light squeezenet's logits are ~9.5e9, where float32's spacing is 1024, and within one
#: spacing of each other: summing in another order (another BLAS build, a matrix-vector
#: GlobalAveragePool) moves a few logits by a spacing, and the softmax of 1000 equal
#: logits (the stored uniform 1e-3) becomes 1/k on the k largest. For it the test compares
#: the softmax's input -- the logits -- with onnxruntime's instead (relative tolerance).
_SOFTMAX_OF_TIES = {"squeezenet"}


@dataclass(frozen=True)
class ClassicCase:
    name: str
    path: Path
    rtol: float
    atol: float


def classic_cases() -> list[ClassicCase]:
    """The light models the onnx backend tests run, with their tolerances."""
    cases = []
    for case_dir in sorted(REAL_DIR.glob("test_*")):
        meta_file = case_dir / "data.json"
        if not meta_file.exists():
            continue
        meta = json.loads(meta_file.read_text())
        url = meta.get("url", "")
        if not url.startswith(_LIGHT_URL):
            continue
        path = LIGHT_DIR / url[len(_LIGHT_URL) :]
        name = meta["model_name"]
        cases.append(ClassicCase(name, path, meta.get("rtol", 1e-3), meta.get("atol", 1e-7)))
    return cases


CASES = classic_cases()


def test_all_nine_found() -> None:
    names = {c.name for c in CASES}
    assert names == set(CLASSIC_CNNS)
    assert all(c.path.exists() for c in CASES)


def runner_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The inputs onnx's runner generates (``generate_dummy_data(random=False)``) for the
    graph inputs that are not initializers."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim
        )
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def expected_outputs(
    case: ClassicCase, model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """The stored outputs; onnxruntime's when any is missing."""
    stem = case.path.with_suffix("")
    files = [Path(f"{stem}_output_{i}.pb") for i in range(len(model.graph.output))]
    if all(f.exists() for f in files):
        return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def _logits_exposed(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its final Softmax's input as the graph output instead."""
    softmax = proto.graph.node[-1]
    assert softmax.op_type == "Softmax"
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.output[:]
    out.graph.output.append(onnx.helper.make_empty_tensor_value_info(softmax.input[0]))
    del out.graph.node[-1]
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_classic_cnn(case: ClassicCase) -> None:
    if case.name in _SOFTMAX_OF_TIES:
        proto = _logits_exposed(onnx.load(str(case.path)))
        feeds = runner_feeds(proto)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])  # fmt: skip
        (want,) = sess.run(None, feeds)
        (logits,) = tfrt_py.load(proto).run(feeds).values()
        np.testing.assert_allclose(logits, want, rtol=1e-5, err_msg="logits")
        return
    proto = onnx.load(str(case.path))
    feeds = runner_feeds(proto)
    want = expected_outputs(case, proto, feeds)
    model = tfrt_py.load(case.path)
    try:
        assert [s.name for s in model.inputs] == list(feeds)
        got = model.run(feeds)
        assert list(got) == [o.name for o in proto.graph.output]
        for (name, out), ref in zip(got.items(), want):
            assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype}, expected {ref.dtype}"
            assert out.shape == ref.shape, f"{name}: shape {out.shape}, expected {ref.shape}"
            np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol, err_msg=name)
    finally:
        # VGG-19 and AlexNet materialise hundreds of MB of weights; free them before the next.
        del model
        gc.collect()
