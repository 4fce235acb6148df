"""Exceptions raised by tfrt_py.

Every error says what was wrong and where: the input name with the expected dtype and
shape, the node name and op type that failed, the op/domain/opset that is not supported.
Each subclasses ``ValueError`` or ``RuntimeError`` so callers that catch the builtin
families keep working. A failed call never leaves a model unusable.
"""

from __future__ import annotations

__all__ = [
    "DeadlineExceeded",
    "ExecutionError",
    "GraphError",
    "InputError",
    "ModelLoadError",
    "TfrtError",
    "UnsupportedOpError",
]


class TfrtError(Exception):
    """Base class of every tfrt_py error."""


class ModelLoadError(TfrtError, ValueError):
    """The model file or proto could not be read or is malformed (raised by ``load``)."""


class GraphError(ModelLoadError):
    """The graph is structurally invalid: a value used before it is defined, a cycle,
    a duplicate name, a missing output. Raised by the verifier at load time."""


class UnsupportedOpError(ModelLoadError):
    """The model uses an op, opset or attribute combination tfrt_py has no kernel for.

    Raised at load time, never at the first call.
    """

    def __init__(
        self,
        op_type: str,
        domain: str,
        opset: int,
        node_name: str,
        detail: str = "",
    ) -> None:
        self.op_type = op_type
        self.domain = domain or "ai.onnx"
        self.opset = opset
        self.node_name = node_name
        msg = f"unsupported op {self.domain}::{op_type} (opset {opset}) at node {node_name!r}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class InputError(TfrtError, ValueError):
    """A feed is missing, extra, or of the wrong dtype or shape. Raised before any kernel
    runs, so the model's state is untouched."""


class ExecutionError(TfrtError, RuntimeError):
    """A kernel failed while running. Names the node and op; the original exception is
    chained as ``__cause__``."""

    def __init__(self, node_name: str, op_type: str, cause: BaseException) -> None:
        self.node_name = node_name
        self.op_type = op_type
        super().__init__(f"node {node_name!r} ({op_type}) failed: {type(cause).__name__}: {cause}")


class DeadlineExceeded(TfrtError, TimeoutError):
    """A call ran past its deadline (``run(feeds, timeout=s)``, ``run_async(..., timeout=s)``
    or the model's default). ``node_name``/``op_type`` name the kernel that was running or
    about to run when the deadline was noticed (None when it was noticed outside a kernel,
    e.g. while waiting for a slot). The model stays usable."""

    def __init__(
        self, timeout: float, node_name: str | None = None, op_type: str | None = None
    ) -> None:
        self.timeout = timeout
        self.node_name = node_name
        self.op_type = op_type
        where = f" at node {node_name!r} ({op_type})" if node_name is not None else ""
        super().__init__(f"deadline of {timeout:g} s exceeded{where}")
