"""tfrt_py.serving: loaded models over HTTP (an ASGI app on Starlette, run by uvicorn).

    from tfrt_py.serving import create_app, run_server
    app = create_app({"mlp": "mlp.onnx"})          # any ASGI server can run it
    run_server(app, "127.0.0.1", 8000)             # or: tfrt-py serve mlp.onnx --port 8000

See ``app`` for the v1 routes and formats, ``v2`` for the Open Inference Protocol
(KServe v2) routes, ``metrics`` for ``GET /metrics``, ``repository`` for serving a
directory of models, ``batching`` for micro-batching and how it is chosen, ``served`` and
``admission`` for where calls run and how many at once, ``limits`` for what a request may
cost (size, decoded size, deadline, queue), and docs/serving.md and
docs/security.md.
"""

from __future__ import annotations

try:
    import starlette as _starlette  # noqa: F401 - the serving extra's presence
    import uvicorn as _uvicorn  # noqa: F401
except ImportError as _e:
    raise ImportError(
        f"tfrt_py.serving needs the serving extra ({_e.name} is missing): "
        "pip install 'tfrt-py[serve]'"
    ) from _e

from .app import create_app as create_app
from .batching import BatchPolicy as BatchPolicy
from .batching import MicroBatcher as MicroBatcher
from .batching import choose_policy as choose_policy
from .codec import RequestError as RequestError
from .codec import convert_value as convert_value
from .codec import json_feeds as json_feeds
from .hub import ModelConfig as ModelConfig
from .hub import ModelServer as ModelServer
from .repository import ModelRepository as ModelRepository
from .run import ServerThread as ServerThread
from .run import run_server as run_server
from .served import ServedModel as ServedModel

__all__ = [
    "BatchPolicy",
    "MicroBatcher",
    "ModelConfig",
    "ModelRepository",
    "ModelServer",
    "RequestError",
    "ServedModel",
    "ServerThread",
    "choose_policy",
    "convert_value",
    "create_app",
    "json_feeds",
    "run_server",
]
