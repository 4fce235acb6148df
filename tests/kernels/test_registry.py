"""KernelRegistry lookups: a missing op's UnsupportedOpError says what is registered instead
(nearest names of the domain, the domains that have the op, the opsets it is served at);
kernel modules added lazily load on the first lookup of one of their ops, once, also
under racing threads, and never over a kernel registered in their place."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import TensorProto, helper

import tfrt_py
from tests.support.paths import ROOT
from tfrt_py.errors import UnsupportedOpError
from tfrt_py.kernels import ComputeFn, KernelContext, KernelRegistry, default_registry
from tfrt_py.kernels.registry import Register


def _identity(ctx: KernelContext) -> ComputeFn:
    return lambda x: x


def _lookup_error(reg: KernelRegistry, domain: str, op: str, opset: int) -> str:
    with pytest.raises(UnsupportedOpError) as info:
        reg.lookup(domain, op, opset, "n")
    assert info.value.op_type == op and info.value.opset == opset
    return str(info.value)


@pytest.mark.parametrize(
    ("op", "first"),
    [("Rellu", "Relu"), ("relu", "Relu"), ("MatMull", "MatMul"), ("Softmaxx", "Softmax")],
)
def test_missing_op_suggests_the_nearest_names(op: str, first: str) -> None:
    msg = _lookup_error(default_registry(), "", op, 17)
    m = re.search(r"no kernel for this op; did you mean (.+)\?$", msg)
    assert m is not None, msg
    names = m.group(1).split(", ")
    assert names[0] == first and 1 <= len(names) <= 3
    assert set(names) <= {name for _, name in default_registry().ops("")}


def test_suggestions_stay_in_the_domain() -> None:
    msg = _lookup_error(default_registry(), "ai.onnx.ml", "Scalar", 1)
    assert msg.endswith("did you mean Scaler?")


def test_an_op_of_another_domain_says_which() -> None:
    msg = _lookup_error(default_registry(), "", "LabelEncoder", 17)
    assert "it is registered in domain 'ai.onnx.ml'" in msg


def test_an_unknown_domain_lists_the_registered_ones() -> None:
    msg = _lookup_error(default_registry(), "com.example", "FusedMatMul", 1)
    assert "no kernels are registered in domain 'com.example'" in msg
    assert "'ai.onnx', 'ai.onnx.ml'" in msg and "'com.microsoft'" in msg


def test_nothing_close_adds_nothing() -> None:
    msg = _lookup_error(default_registry(), "", "Xyzzy", 17)
    assert msg.endswith("at node 'n': no kernel for this op")


def test_opset_outside_the_registered_ranges() -> None:
    reg = default_registry()
    assert _lookup_error(reg, "", "Attention", 22).endswith(
        "kernels are registered for opsets 23+ only"
    )
    # Scan has one kernel for opset 8 and one from 9: shown as one range.
    assert _lookup_error(reg, "", "Scan", 7).endswith("registered for opsets 8+ only")
    own = KernelRegistry()
    own.add("Op", _identity, since=1, until=5)
    own.add("Op", _identity, since=7, until=7)
    own.add("Op", _identity, since=9, until=12)
    own.add("Op", _identity, since=13)
    assert _lookup_error(own, "", "Op", 6).endswith("registered for opsets 1..5, 7, 9+ only")
    only = KernelRegistry()
    only.add("Op", _identity, since=3, until=3)
    assert _lookup_error(only, "ai.onnx", "Op", 4).endswith("registered for opset 3 only")
    assert only.lookup("ai.onnx", "Op", 3).since == 3


def test_load_reports_the_suggestion_naming_the_node() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("Rellu", ["x"], ["y"], name="act")
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(UnsupportedOpError, match=r"Rellu .*'act'.*did you mean Relu"):
        tfrt_py.load(model.SerializeToString())
    fixed = helper.make_node("Relu", ["x"], ["y"], name="act")
    model.graph.ClearField("node")
    model.graph.node.append(fixed)
    out = tfrt_py.load(model.SerializeToString()).run({"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["y"], [0.0, 2.0])


# --- lazy kernel modules: imported the first time one of their ops is looked up ----------

_FRESH = """
import json, sys
import numpy as np
import tfrt_py
m = tfrt_py.load({model!r}, executor="sync")
x = np.ones((1, m.inputs[0].shape[1]), np.float32)
m.run({{m.inputs[0].name: x}})
print(json.dumps(sorted(k for k in sys.modules if k.startswith("tfrt_py.kernels."))))
"""


def test_a_model_imports_only_the_kernel_modules_its_ops_use() -> None:
    """The bundled MLP (Gemm, Relu, Softmax; fused into Linear) imports those kernel
    modules in a fresh process, not the convolution stack, the contrib ops or the trees
    (all of them were imported by every ``load()`` before)."""
    model = str(ROOT / "tfrt_py" / "examples" / "mlp_small.onnx")
    env = {k: v for k, v in os.environ.items() if k != "TFRT_PY_COLD_START"}
    out = subprocess.run([sys.executable, "-c", _FRESH.format(model=model)], capture_output=True,
                         text=True, cwd=str(ROOT), env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"tfrt_py.kernels.linalg.matmul", "tfrt_py.kernels.fused.linear"} <= loaded
    for unused in ("nn.conv", "nn.pool", "fused.vision", "contrib.quantized", "ml.tree_ops",
                   "image.resize", "reduce.reductions", "misc.strings"):  # fmt: skip
        assert f"tfrt_py.kernels.{unused}" not in loaded, unused


def _loader_counting(calls: list[str], name: str, op: str) -> Callable[[], Register]:
    def load() -> Register:
        calls.append(name)

        def register(reg: KernelRegistry) -> None:
            reg.add(op, _identity)

        return register

    return load


def test_a_lazy_module_loads_once_on_first_lookup_and_listing_loads_the_rest() -> None:
    calls: list[str] = []
    reg = KernelRegistry()
    reg.add_lazy("a", [("", "OpA")], _loader_counting(calls, "a", "OpA"))
    reg.add_lazy("b", [("ai.onnx", "OpB")], _loader_counting(calls, "b", "OpB"))
    assert calls == []
    assert reg.has("", "OpA", 1) and reg.lookup("", "OpA", 1).op_type == "OpA"
    assert reg.lookup("", "OpA", 2).op_type == "OpA"
    assert calls == ["a"]
    assert reg.ops() == [("", "OpA"), ("", "OpB")]
    assert calls == ["a", "b"]


def test_a_kernel_added_over_a_lazy_one_wins_even_before_the_lazy_one_loads() -> None:
    """A custom kernel registered into a copy of the default registry replaces the built-in
    one for its op; the built-in module, loaded by that ``add``, cannot overwrite it later."""
    calls: list[str] = []
    reg = KernelRegistry()
    reg.add_lazy("m", [("", "Op"), ("", "Other")], _loader_counting(calls, "m", "Op"))
    mine = reg.copy()

    def custom(ctx: KernelContext) -> ComputeFn:
        return lambda x: x + 1

    mine.add("Op", custom)
    assert mine.lookup("", "Op", 1).build is custom
    assert not mine.has("", "Other", 1)  # the module (loaded by add) registered only Op
    assert mine.lookup("", "Op", 1).build is custom
    assert reg.lookup("", "Op", 1).build is _identity  # the original loads its own, untouched
    assert calls == ["m", "m"]


def test_threads_looking_up_a_pending_module_all_find_its_kernels() -> None:
    """Lookups racing a lazy module's first load wait for it instead of reporting the op
    missing, and the module is loaded once."""
    calls: list[str] = []
    started = threading.Event()

    def slow_loader() -> Register:
        calls.append("slow")
        started.set()

        def register(reg: KernelRegistry) -> None:
            for i in range(200):
                reg.add(f"Op{i}", _identity)
                time.sleep(0.0005)  # let the other threads run mid-registration

        return register

    reg = KernelRegistry()
    reg.add_lazy("slow", [("", f"Op{i}") for i in range(200)], slow_loader)
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda i: reg.lookup("", f"Op{199 - i}", 1).op_type, range(64)))
    assert found == [f"Op{199 - i}" for i in range(64)]
    assert calls == ["slow"]


def test_a_lazy_module_that_fails_to_load_says_so_and_is_tried_again() -> None:
    attempts: list[int] = []

    def broken() -> Register:
        attempts.append(1)
        raise ImportError("no such kernel module")

    reg = KernelRegistry()
    reg.add_lazy("broken", [("", "Op")], broken)
    for _ in range(2):
        with pytest.raises(ImportError, match="no such kernel module"):
            reg.lookup("", "Op", 1)
    assert len(attempts) == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_module_loads_can_load_it_itself() -> None:
    """A prefork server's master may fork while a background thread (the cold start's
    warm-up) loads a kernel module under the registry's lock: the child's lookups must
    not wait for a thread that does not exist there."""
    inside, release = threading.Event(), threading.Event()

    def loader() -> Register:
        def register(reg: KernelRegistry) -> None:
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                release.wait(30)
            reg.add("Op", _identity)

        return register

    reg = KernelRegistry()
    reg.add_lazy("slow", [("", "Op")], loader)
    loading = threading.Thread(target=reg.lookup, args=("", "Op", 1))
    loading.start()
    assert inside.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: its lookup loads the module on this (main) thread
        code = 0 if reg.lookup("", "Op", 1).op_type == "Op" else 1
        os._exit(code)
    try:
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung on the registry's lock")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        loading.join(30)
