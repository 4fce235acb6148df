"""The load-time pass pipeline: which passes run, in what order, and what each one did.

Every pass can be switched off on its own: ``load(..., optimize={...})`` names the passes
to run (``True``/``None``: all, ``False``: none), and the environment variable
``TFRT_PY_DISABLE_PASSES=fold,cse`` removes passes from whatever was asked for (read at
each ``load``). Each pass returns one line saying what it did; ``model.describe()`` shows
them.

``optimize`` works on a clone of the graph it is given, so the caller's graph is never
mutated. It runs once per load on the caller's thread.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Collection

from ..ir import Graph, verify
from ..kernels import KernelRegistry
from ..records import record
from .context import PassContext, PassFn
from .rewrite import clone_graph, drop_unused_constants

__all__ = ["ENV_DISABLE", "PASSES", "PassReport", "optimize", "select_passes"]

ENV_DISABLE = "TFRT_PY_DISABLE_PASSES"


@record(frozen=True)
class PassReport:
    """One pass's outcome: its name, whether it ran, its one-line summary, its time."""

    name: str
    ran: bool
    summary: str
    seconds: float = 0.0

    def __str__(self) -> str:
        if not self.ran:
            return f"{self.name}: off"
        return f"{self.name}: {self.summary} ({self.seconds * 1e3:.1f} ms)"


#: Each pass as (module, function), imported when it first runs: a pass module imports
#: kernels, which neither the pipeline's importers (model.py) nor a model the pass has
#: nothing to do for (``TRIGGERS``) should pay for.
_PASS_FNS = {
    "identity": ("cleanup", "remove_identities"),
    "encode_maps": ("encode_maps", "encode_maps"),
    "shapes": ("shapes", "infer_shapes"),
    "fuse_qdq": ("fuse_qdq", "fuse_qdq"),
    "fuse_dynamic_quant": ("fuse_dynamic_quant", "fuse_dynamic_quant"),
    "fold": ("fold", "fold_constants"),
    "cse": ("cleanup", "eliminate_common_subexpressions"),
    "dce": ("cleanup", "eliminate_dead_code"),
    "channels_last": ("channels_last", "channels_last"),
    "fuse_qtable": ("fuse_qtable", "fuse_qtable"),
    "hoist": ("hoist", "hoist_over_concat"),
    "merge_branches": ("merge_branches", "merge_conv_branches"),
    "fuse_conv": ("fuse_conv", "fuse_conv"),
    "fuse_transformer": ("fuse_transformer", "fuse_transformer"),
    "fuse_vision": ("fuse_vision", "fuse_vision"),
    "encode_strings": ("encode_strings", "encode_strings"),
    "fuse_text": ("fuse_text", "fuse_text"),
    "fuse_ml": ("fuse_ml", "fuse_ml"),
    "fuse_trees": ("fuse_trees", "fuse_trees"),
    "fuse_linear": ("fuse_linear", "fuse_linear"),
    "fuse_elementwise": ("fuse_elementwise", "fuse_elementwise_chains"),
}


def pass_fn(name: str) -> PassFn:
    """The function of pass ``name`` (its module imported now if it was not)."""
    module, fn = _PASS_FNS[name]
    found: PassFn = getattr(importlib.import_module(f"{__package__}.{module}"), fn)
    return found


#: Passes that only act on a graph holding one of these op types (any domain; each is
#: the pass's own first test), and what each reports when it holds none: then the pass's
#: module is not even imported (a small model's first load in a fresh process is mostly
#: imports, issue 33). tests/compiler/test_pipeline_triggers.py holds each report to the
#: pass's own on a graph without them.
TRIGGERS: dict[str, tuple[frozenset[str], str]] = {
    "encode_maps": (frozenset({"DictVectorizer"}), "nothing to encode"),
    "fuse_qdq": (frozenset({"QuantizeLinear"}), "nothing to fuse"),
    "fuse_dynamic_quant": (frozenset({"MatMulInteger"}), "nothing to fuse"),
    "channels_last": (frozenset({"QLinearConv"}), "nothing to do"),
    "fuse_qtable": (frozenset({"QLinearSigmoid", "QLinearLeakyRelu"}), "nothing to fuse"),
    "merge_branches": (frozenset({"Conv"}), "nothing to merge"),
    "fuse_conv": (frozenset({"Conv"}), "nothing to fuse"),
    "hoist": (frozenset({"Concat"}), "nothing to hoist"),
    # GELU (Erf/Tanh), LayerNorm/RMSNorm (ReduceMean), SiLU (Sigmoid); a MatMul whose B is
    # transposed, and so attention, and a scaling moved before a Transpose need a Transpose;
    # the rotary embedding a Neg
    "fuse_transformer": (
        frozenset({"Erf", "Tanh", "ReduceMean", "Sigmoid", "Transpose", "Neg"}),
        "nothing to fuse",
    ),
    "fuse_vision": (
        frozenset(
            {"LayerNormalization", "Gelu", "Mul", "InstanceNormalization", "BatchNormalization"}
        ),
        "nothing to fuse",
    ),
    "encode_strings": (
        frozenset({"OneHotEncoder", "LabelEncoder", "CategoryMapper"}),
        "nothing to encode",
    ),
    "fuse_text": (frozenset({"Tokenizer"}), "nothing to fuse"),
    "fuse_ml": (frozenset({"ArrayFeatureExtractor", "Scan"}), "nothing to fuse"),
    "fuse_trees": (frozenset({"TreeEnsembleRegressor", "Sum"}), "nothing to fuse"),
}

#: Every pass, in the order they run.
PASSES = (
    "identity",
    # before shapes: the map input it makes a tensor gives its readers static shapes
    "encode_maps",
    "shapes",
    # before fold: it would make the weights' DequantizeLinear nodes float constants
    "fuse_qdq",
    # before fold and fuse_elementwise: the Cast and Muls it takes into the integer product
    "fuse_dynamic_quant",
    "fold",
    "cse",
    "dce",
    # after fuse_qdq and dce: the integer convs it made, without the DQs left unread
    "channels_last",
    # after channels_last: the pairs it makes channels-last are elementwise there too
    "fuse_qtable",
    # before fuse_conv: it would take a branch's Add as another conv's residual
    "merge_branches",
    # before hoist: hoisting Relu(a), Relu(b) -> Concat over the Concat would keep the
    # Relus out of the convs' epilogues (SqueezeNet's fire modules)
    "fuse_conv",
    "hoist",
    "fuse_transformer",
    # after fuse_transformer: it names the GELUs and LayerNorms this pass looks for
    "fuse_vision",
    "encode_strings",
    "fuse_text",
    "fuse_ml",
    # before fuse_elementwise: it folds the elementwise nodes after a tree into its leaves
    "fuse_trees",
    "fuse_linear",
    "fuse_elementwise",
)


def select_passes(optimize: bool | Collection[str] | None) -> frozenset[str]:
    """The passes to run for a ``load(optimize=...)`` argument, minus those named in
    ``$TFRT_PY_DISABLE_PASSES``. Unknown names are a ValueError listing the valid ones."""
    if optimize is None or optimize is True:
        chosen = set(PASSES)
    elif optimize is False:
        chosen = set()
    elif isinstance(optimize, str):
        raise ValueError(f"optimize takes a set of pass names, not a string: {optimize!r}")
    else:
        chosen = set(optimize)
    env = os.environ.get(ENV_DISABLE, "")
    disabled = {p.strip() for p in env.split(",") if p.strip()}
    unknown = (chosen | disabled) - set(PASSES)
    if unknown:
        where = f" (from ${ENV_DISABLE})" if unknown & disabled else ""
        raise ValueError(
            f"unknown optimization pass(es) {sorted(unknown)}{where}; "
            f"the passes are {', '.join(PASSES)}"
        )
    return frozenset(chosen - disabled)


def optimize(
    graph: Graph, registry: KernelRegistry, passes: frozenset[str]
) -> tuple[Graph, list[PassReport]]:
    """Run ``passes`` (in ``PASSES`` order) on a clone of ``graph``.

    Returns the optimized clone (verified) and one report per pass in ``PASSES``. With no
    pass enabled, returns ``graph`` itself.
    """
    if not passes:
        return graph, [PassReport(name, False, "") for name in PASSES]
    g = clone_graph(graph)
    ctx = PassContext(registry)
    reports: list[PassReport] = []
    for name in PASSES:
        if name not in passes:
            reports.append(PassReport(name, False, ""))
            continue
        t0 = time.perf_counter()
        trigger = TRIGGERS.get(name)
        if trigger is not None and not any(n.op_type in trigger[0] for n in g.nodes):
            reports.append(PassReport(name, True, trigger[1], time.perf_counter() - t0))
            continue
        summary = pass_fn(name)(g, ctx)
        reports.append(PassReport(name, True, summary, time.perf_counter() - t0))
        if name == "fold" and "shapes" in passes:
            # Folded shape inputs (Reshape targets) make more types known: infer again and
            # report the final count under "shapes".
            t0 = time.perf_counter()
            again = pass_fn("shapes")(g, ctx)
            k = PASSES.index("shapes")
            first = reports[k]
            reports[k] = PassReport("shapes", True, again, first.seconds + time.perf_counter() - t0)
    drop_unused_constants(g)
    verify(g)
    return g, reports
