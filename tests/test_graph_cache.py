"""The imported-graph cache (``frontends.graph_cache``, ``frontends.graph_codec``): a later
load of the same ONNX bytes reads the importer's graph back instead of importing ``onnx``.

What must hold: the graph read back equals the one imported (every node, attribute, type,
constant and the sharing of Values, nested graphs included) over onnx's node cases and the
zoo files; a fresh process's second load imports no onnx and computes the same outputs;
every damaged, foreign or unsafe entry is a miss that reimports; what the codec cannot
write (external data) and loads the cache must not serve (custom kernels, a streamed
load, a ModelProto) never touch it. The suite runs with the cache off (conftest's
SUITE_ENV); these tests turn it on in their own cache dir.
"""

from __future__ import annotations

import glob
import io
import math
import os
import random
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tfrt_py
from tests.support.paths import DATA, EXAMPLES, ROOT
from tfrt_py.frontends import graph_cache
from tfrt_py.frontends.graph_codec import MAGIC, Unsupported, decode, encode
from tfrt_py.frontends.onnx import import_model
from tfrt_py.frontends.onnx.tensor_meta import uses_external_data
from tfrt_py.ir import Graph, Node, Value
from tfrt_py.kernels import default_registry
from tfrt_py.metadata import ModelMetadata, from_proto

MLP = str(EXAMPLES / "mlp_small.onnx")
REPO_ROOT = str(ROOT)


@pytest.fixture
def cache_on(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The cache turned on, in a private directory of its own; its graphs directory."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(d))
    monkeypatch.delenv(graph_cache.ENV, raising=False)
    return os.path.join(str(d), "graphs")


def _entries(graphs_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(graphs_dir, "*.tgraph")))


def _round_trip(graph: Graph, meta: ModelMetadata) -> tuple[Graph, ModelMetadata]:
    data = b"".join(bytes(c) for c in encode(graph, meta))
    return decode(io.BytesIO(data), len(data))


# -- equality of two IR graphs, Value sharing included -------------------------------------


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    if type(b) is not np.ndarray or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "O":
        return a.tolist() == b.tolist()
    return a.tobytes() == b.tobytes()


class _Same:
    """Walks two graphs in step; ``pairs`` maps each Value of the first to the second's."""

    def __init__(self) -> None:
        self.pairs: dict[int, Value] = {}

    def value(self, a: Value | None, b: Value | None) -> None:
        if a is None or b is None:
            assert a is None and b is None
            return
        seen = self.pairs.get(id(a))
        if seen is not None:
            assert seen is b, f"value {a.name!r} is shared in one graph, not in the other"
            return
        assert b not in self.pairs.values(), f"{b.name!r} stands for two values"
        self.pairs[id(a)] = b
        assert (a.name, a.type) == (b.name, b.type), (a, b)
        for x, y in ((a.const, b.const), (a.default, b.default)):
            assert (x is None) == (y is None), a.name
            if x is not None:
                assert _same_array(x, y), a.name  # type: ignore[arg-type]

    def attr(self, a: Any, b: Any) -> None:
        if isinstance(a, Graph):
            self.graph(a, b)
        elif isinstance(a, np.ndarray):
            assert _same_array(a, b)
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                self.attr(x, y)
        elif isinstance(a, float) and math.isnan(a):
            assert type(b) is float and math.isnan(b)
        else:
            assert type(a) is type(b) and a == b, (a, b)

    def node(self, a: Node, b: Node) -> None:
        assert (a.op_type, a.domain, a.name, a.opset) == (b.op_type, b.domain, b.name, b.opset)
        assert len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs)
        for x, y in zip(a.inputs + a.outputs, b.inputs + b.outputs, strict=True):
            self.value(x, y)
        for v in b.outputs:
            assert v is None or v.producer is b
        assert list(a.attrs) == list(b.attrs), a.name
        for k in a.attrs:
            self.attr(a.attrs[k], b.attrs[k])

    def graph(self, a: Graph, b: Graph) -> None:
        assert a.name == b.name and a.opsets == b.opsets
        for xs, ys in ((a.inputs, b.inputs), (a.constants, b.constants)):
            assert len(xs) == len(ys)
            for x, y in zip(xs, ys, strict=True):
                self.value(x, y)
        assert len(a.nodes) == len(b.nodes)
        for na, nb in zip(a.nodes, b.nodes, strict=True):
            self.node(na, nb)
        assert len(a.outputs) == len(b.outputs)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            self.value(x, y)


def assert_same_graph(a: Graph, b: Graph) -> None:
    _Same().graph(a, b)


# -- the codec -----------------------------------------------------------------------------


def _model_with_everything() -> onnx.ModelProto:
    """Subgraphs capturing outer values, string/bfloat16/int4 constants, every attribute
    kind the importer makes, symbolic dims, an overridable initializer, metadata."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 3])],
    )  # fmt: skip
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["x", "w"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 3])],
    )  # fmt: skip
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s0", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
        helper.make_node(
            "Constant", [], ["k"], value=numpy_helper.from_array(np.arange(6, dtype=np.int64))
        ),
        helper.make_node("Identity", ["words"], ["words_out"]),
        helper.make_node("Cast", ["bf"], ["bf32"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["i4"], ["i4_8"], to=TensorProto.INT8),
        helper.make_node("LeakyRelu", ["w"], ["lr"], alpha=float("nan")),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="ünïcode"),
        # not UTF-8: the importer keeps it with surrogate escapes
        helper.make_node("Identity", ["w"], ["idn"], tag=b"\xff\x00x", tags=[b"a", b"\xfe"]),
    ]
    inits = [
        numpy_helper.from_array(np.linspace(-1, 1, 3, dtype=np.float32).reshape(1, 3), "w"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array([1.5], np.float32), "s0"),
        numpy_helper.from_array(np.array(["a", "é", ""], dtype=object), "words"),
        helper.make_tensor("bf", TensorProto.BFLOAT16, [2], [1.0, -2.5]),
        helper.make_tensor("i4", TensorProto.INT4, [4], [-8, 7, 0, 3]),
    ]
    g = helper.make_graph(
        nodes, "everything",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
         for n in ("y", "k", "words_out", "bf32", "i4_8", "lr", "wt", "s", "idn")],
        inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], producer_name="me")
    m.ir_version = 10
    m.doc_string = "a doc"
    helper.set_model_props(m, {"k": "v", "ключ": "значение"})
    return m


def test_the_codec_gives_back_the_graph_the_importer_made() -> None:
    model = _model_with_everything()
    graph = import_model(model, None, default_registry().has)
    meta = from_proto(model)
    back, meta_back = _round_trip(graph, meta)
    assert_same_graph(graph, back)
    assert meta_back == meta
    assert meta_back.metadata_props["ключ"] == "значение"
    # the captured outer value is the same object inside the branch and outside
    if_node = next(n for n in back.nodes if n.op_type == "If")
    x = back.inputs[0]
    assert if_node.attrs["then_branch"].nodes[0].inputs[0] is x
    tagged = next(n for n in back.nodes if "tag" in n.attrs)
    assert tagged.attrs["tag"] == "\udcff\x00x" and tagged.attrs["tags"] == ["a", "\udcfe"]
    # arrays are writable, separate buffers
    w = back.constants[0].const
    assert w is not None and w.flags.writeable and w.base is None


def test_the_comparison_itself_sees_a_changed_weight_and_a_lost_share() -> None:
    model = _model_with_everything()
    graph = import_model(model, None, default_registry().has)
    back, _ = _round_trip(graph, from_proto(model))
    back.constants[0].const[0, 0] += 1  # type: ignore[index]
    with pytest.raises(AssertionError):
        assert_same_graph(graph, back)
    back, _ = _round_trip(graph, from_proto(model))
    if_node = next(n for n in back.nodes if n.op_type == "If")
    if_node.attrs["then_branch"].nodes[0].inputs[0] = Value("x")
    with pytest.raises(AssertionError, match="shared"):
        assert_same_graph(graph, back)


def test_what_the_codec_cannot_write_is_refused_not_written_wrong(tmp_path: Any) -> None:
    odd = Graph("g")
    odd.nodes.append(Node("Custom", [], [Value("o")], {"x": object()}))
    mapped_file = tmp_path / "w.bin"
    mapped_file.write_bytes(bytes(16))
    mapped = np.memmap(mapped_file, dtype=np.float32, mode="r", shape=(4,))
    for const in (np.arange(4.0).view(np.matrix), mapped, mapped.reshape(2, 2)):
        g = Graph("c")
        g.constants.append(Value("c", const=const))
        with pytest.raises(Unsupported):
            encode(g, ModelMetadata())
    with pytest.raises(Unsupported):
        encode(odd, ModelMetadata())


def test_every_damaged_byte_is_a_miss_or_the_same_graph() -> None:
    model = _model_with_everything()
    graph = import_model(model, None, default_registry().has)
    meta = from_proto(model)
    data = bytearray(b"".join(bytes(c) for c in encode(graph, meta)))
    rng = random.Random(0)
    caught = 0
    for trial in range(400):
        bad = bytearray(data)
        if trial % 4 == 0:
            bad = bad[: rng.randrange(len(bad))]  # truncated
        else:
            pos = rng.randrange(len(bad))
            bad[pos] ^= 1 << rng.randrange(8)
        try:
            back, meta_back = decode(io.BytesIO(bytes(bad)), len(bad))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            caught += 1
            continue
        assert_same_graph(graph, back)  # a flip in padding changes nothing
        assert meta_back == meta
    assert caught > 300


# -- every node case and zoo file ----------------------------------------------------------


def _zoo_files() -> list[str]:
    return [*sorted(glob.glob(os.path.join(DATA, "**", "*.onnx"), recursive=True)), MLP]


def _check_round_trips(models: list[tuple[str, onnx.ModelProto]]) -> int:
    has = default_registry().has
    checked = 0
    for name, model in models:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                graph = import_model(model, None, has)
            except Exception:  # noqa: BLE001 - models the importer refuses are not the point
                continue
        try:
            back, _ = _round_trip(graph, from_proto(model))
        except Unsupported:
            continue
        try:
            assert_same_graph(graph, back)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
        checked += 1
    return checked


def test_the_zoo_files_round_trip() -> None:
    files = _zoo_files()
    assert _check_round_trips([(f, onnx.load(f)) for f in files]) == len(files)


@pytest.mark.slow
def test_every_onnx_node_case_and_shipped_model_round_trips() -> None:
    """onnx's 1,884 node cases and 140 test models (1.23), and the benchmark zoo's real
    exports where ``make bench-zoo`` made them (not on CI's clean clone)."""
    from tests.support.node_cases import all_cases

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    shipped = sorted(glob.glob(os.path.join(root, "**", "model.onnx"), recursive=True))
    zoo = sorted(glob.glob(str(ROOT / "benchmarks" / "models" / "**" / "*.onnx"), recursive=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [(c.name, c.model) for c in all_cases()]
        models += [(p, onnx.load(p, load_external_data=False)) for p in shipped + zoo]
    assert _check_round_trips(models) >= 1900 + len(zoo)


# -- loads through the cache ---------------------------------------------------------------


def _feeds(m: tfrt_py.Model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for s in m.inputs:
        shape = [d if isinstance(d, int) else 2 for d in s.shape or ()]
        feeds[s.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_a_second_load_reads_the_graph_back_and_serves_the_same(cache_on: str) -> None:
    first = tfrt_py.load(MLP)
    assert "kept in the import cache" in first.describe()
    assert len(_entries(cache_on)) == 1
    second = tfrt_py.load(MLP)
    assert "read from the import cache" in second.describe()
    feeds = _feeds(first)
    np.testing.assert_array_equal(first.run(feeds)["probs"], second.run(feeds)["probs"])
    assert second.metadata == first.metadata
    with open(MLP, "rb") as f:  # bytes are the same model to the cache
        assert "read from the import cache" in tfrt_py.load(f.read()).describe()


def test_a_fresh_process_second_load_imports_no_onnx(cache_on: str) -> None:
    """Nor ml_dtypes (its dtypes are looked up only for a model that has one)."""
    script = (
        "import sys, numpy as np, tfrt_py\n"
        f"m = tfrt_py.load({MLP!r})\n"
        "y = m.run({'x': np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)})['probs']\n"
        "print('onnx' in sys.modules or 'ml_dtypes' in sys.modules, repr(y.tolist()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != graph_cache.ENV}
    env["TFRT_PY_JIT"] = "0"  # the NumPy paths: no wait for numba (a cold cache on CI)
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=env, cwd=REPO_ROOT, check=True).stdout.split(" ", 1)
        for _ in range(2)
    ]  # fmt: skip
    assert [r[0] for r in runs] == ["True", "False"]
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip_header", "flip_weight", "garbage", "empty", "other_version"],
)
def test_a_damaged_entry_is_reimported_and_replaced(cache_on: str, damage: str) -> None:
    ref = tfrt_py.load(MLP)
    (entry,) = _entries(cache_on)
    with open(entry, "rb") as f:
        data = bytearray(f.read())
    if damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "flip_header":
        data[len(MAGIC) + 20] ^= 0x10
    elif damage == "flip_weight":
        data[-200] ^= 0x01
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "empty":
        data = bytearray()
    else:
        data[len(MAGIC) - 1] += 1
    with open(entry, "wb") as f:
        f.write(data)
    again = tfrt_py.load(MLP)
    assert "kept in the import cache" in again.describe()  # imported, entry rewritten
    feeds = _feeds(ref)
    np.testing.assert_array_equal(ref.run(feeds)["probs"], again.run(feeds)["probs"])
    assert "read from the import cache" in tfrt_py.load(MLP).describe()


def test_an_entry_whose_graph_does_not_verify_is_a_miss(cache_on: str) -> None:
    """Well-formed bytes of a malformed graph (an output nothing defines): reimported."""
    ref = tfrt_py.load(MLP)
    (entry,) = _entries(cache_on)
    bad = Graph("bad")
    bad.outputs.append(Value("defined_nowhere"))
    with open(entry, "wb") as f:
        f.writelines(encode(bad, ModelMetadata()))
    again = tfrt_py.load(MLP)
    assert "kept in the import cache" in again.describe()
    feeds = _feeds(ref)
    np.testing.assert_array_equal(ref.run(feeds)["probs"], again.run(feeds)["probs"])


def test_an_entry_that_is_a_link_is_not_followed(cache_on: str, tmp_path: Any) -> None:
    tfrt_py.load(MLP)
    (entry,) = _entries(cache_on)
    elsewhere = tmp_path / "elsewhere.tgraph"
    os.replace(entry, elsewhere)  # a valid entry, reached through a link
    os.symlink(elsewhere, entry)
    assert "kept in the import cache" in tfrt_py.load(MLP).describe()
    assert not os.path.islink(entry) and elsewhere.exists()


def test_a_different_model_never_reads_another_ones_entry(cache_on: str) -> None:
    model = onnx.load(MLP)
    tfrt_py.load(model.SerializeToString())
    w = numpy_helper.to_array(model.graph.initializer[0]).copy()
    w.flat[0] += 1.0
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, model.graph.initializer[0].name))
    other = tfrt_py.load(model.SerializeToString())
    assert "read from the import cache" not in other.describe()
    assert len(_entries(cache_on)) == 2


def test_loads_the_cache_must_not_serve_do_not_touch_it(cache_on: str, tmp_path: Any) -> None:
    model = onnx.load(MLP)
    tfrt_py.load(model)  # a ModelProto: onnx is imported already, nothing to save
    tfrt_py.load(MLP, custom_kernels={("my.domain", "Nothing"): lambda x: x})
    assert _entries(cache_on) == []
    # external data: read from files beside the model every time, never cached
    ext = tmp_path / "ext"
    ext.mkdir()
    onnx.save_model(model, str(ext / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.bin", size_threshold=0)  # fmt: skip
    a = tfrt_py.load(str(ext / "m.onnx"))
    b = tfrt_py.load(str(ext / "m.onnx"))
    assert _entries(cache_on) == []
    assert "import cache" not in b.describe()
    feeds = _feeds(a)
    np.testing.assert_array_equal(a.run(feeds)["probs"], b.run(feeds)["probs"])


def _external(source: onnx.TensorProto) -> onnx.TensorProto:
    t = onnx.TensorProto()
    t.CopyFrom(source)
    onnx.external_data_helper.set_external_data(t, location="w.bin")
    t.ClearField("raw_data")
    return t


def test_external_data_is_found_wherever_a_tensor_can_be() -> None:
    """What keeps a model out of the cache: its weights are read from their files on every
    load (a copy in the cache would go stale when the file changes). A densified sparse
    tensor is a plain array, so the graph alone cannot tell."""
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    inner = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=_external(w))],
        "inner", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    sparse = helper.make_sparse_tensor(
        _external(numpy_helper.from_array(np.ones(1, np.float32), "sv")),
        numpy_helper.from_array(np.array([0], np.int64), "si"),
        [3],
    )

    def model(nodes: list[Any], inits: Any = (), sparse_inits: Any = ()) -> Any:
        g = helper.make_graph(
            nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            list(inits), sparse_initializer=list(sparse_inits),
        )  # fmt: skip
        return helper.make_model(g)

    ident = helper.make_node("Identity", ["w"], ["y"])
    assert not uses_external_data(model([ident], [w]))
    assert uses_external_data(model([ident], [_external(w)]))
    assert uses_external_data(model([ident], [w], [sparse]))
    cond = helper.make_node("If", ["b"], ["y"], then_branch=inner, else_branch=inner)
    assert uses_external_data(model([cond]))
    attr = helper.make_node("Constant", [], ["y"], sparse_value=sparse)
    assert uses_external_data(model([attr]))
    m = model([ident], [w])
    m.functions.append(
        helper.make_function("f", "F", [], ["c"], inner.node, [helper.make_opsetid("", 17)])
    )
    assert uses_external_data(m)


def test_switched_off_nothing_is_written_or_read(
    cache_on: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(graph_cache.ENV, "0")
    tfrt_py.load(MLP)
    assert not os.path.exists(cache_on) or _entries(cache_on) == []
    monkeypatch.delenv(graph_cache.ENV)
    tfrt_py.load(MLP)
    monkeypatch.setenv(graph_cache.ENV, "0")
    assert "import cache" not in tfrt_py.load(MLP).describe()


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_cache_dir_others_may_write_is_not_used(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "shared"
    (d / "graphs").mkdir(parents=True)
    os.chmod(d, 0o777)
    monkeypatch.setenv("TFRT_PY_CACHE_DIR", str(d))
    monkeypatch.delenv(graph_cache.ENV, raising=False)
    for _ in range(2):
        m = tfrt_py.load(MLP)
        assert "import cache" not in m.describe()
    assert _entries(str(d / "graphs")) == []


def test_the_least_recently_used_entries_go(cache_on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_cache, "MAX_ENTRIES", 3)
    base = onnx.load(MLP)
    order: list[str] = []
    for i in range(5):
        base.doc_string = f"version {i}"  # other bytes, another key
        tfrt_py.load(base.SerializeToString())
        (new,) = set(_entries(cache_on)) - set(order)
        order.append(new)
        os.utime(new, (1000 + i, 1000 + i))  # used in this order
    assert _entries(cache_on) == sorted(order[2:])
    monkeypatch.setattr(graph_cache, "MAX_BYTES", 2 * os.path.getsize(order[-1]))
    base.doc_string = "version 5"
    tfrt_py.load(base.SerializeToString())  # a sixth entry: only two fit the bytes
    assert len(_entries(cache_on)) == 2 and order[-1] in _entries(cache_on)


def test_the_key_covers_the_importer_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    with open(MLP, "rb") as f:
        data = f.read()
    k = graph_cache.key(data)
    assert k == graph_cache.key(data) and k != graph_cache.key(data + b"\0")
    source = tmp_path / "importer.py"  # stands for an edited or upgraded source file
    source.write_text("v1")
    monkeypatch.setattr(graph_cache, "_SOURCES", (*graph_cache._SOURCES, str(source)))
    monkeypatch.setattr(graph_cache, "_salt", None)
    k1 = graph_cache.key(data)
    assert k1 != k
    source.write_text("v2 longer")
    monkeypatch.setattr(graph_cache, "_salt", None)
    assert graph_cache.key(data) != k1
