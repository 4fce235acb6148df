"""A Flask app that embeds a tfrt_py model: the bundled ads_normalize (18 scalar features
f0..f17 -> a click probability), served from threads.

Run it::

    flask --app tfrt_py.examples.flask_app run --with-threads --port 8000
    curl -s localhost:8000/score -H 'content-type: application/json' \\
         -d '{"features": {"f0": 12.5, "f1": 3, ..., "f17": 0.5}}'

What it shows: the model is loaded once, at import (so a pre-forking server such as
``gunicorn --preload`` shares it with its workers), and ``model.run`` is called from
many request threads at once (a Model is thread-safe; each call gets its own arena).
JSON numbers are converted with ``tfrt_py.serving.json_feeds`` (explicitly to each
input's dtype, refusing strings, booleans and out-of-range values with a message naming
the input); a wrong feed is a 400 with tfrt_py's message; bodies over 1 MiB are 413.
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify, request

import tfrt_py
from tfrt_py.errors import InputError
from tfrt_py.serving import RequestError, json_feeds

MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ads_normalize.onnx")


def create_app(model_path: str = MODEL_PATH) -> Flask:
    """The app; the model at ``model_path`` is loaded (and warmed) now."""
    model = tfrt_py.load(model_path)
    model.run({s.name: [[0.0]] for s in model.inputs})  # warm: plans made before traffic
    out_name = model.outputs[0].name
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 1 << 20

    def error(status: int, message: str) -> Any:
        return jsonify(error=message), status

    @app.post("/score")
    def score() -> Any:
        body = request.get_json(silent=True)
        features = body.get("features") if isinstance(body, dict) else None
        if not isinstance(features, dict):
            return error(400, 'the body must be JSON {"features": {"f0": number, ...}}')
        try:
            feeds = json_feeds({k: [[v]] for k, v in features.items()}, model.inputs)
            out = model.run(feeds)
        except RequestError as e:
            return error(e.status, e.message)
        except InputError as e:
            return error(400, str(e))
        return jsonify(score=float(out[out_name][0, 0]))

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify(status="alive")

    @app.errorhandler(413)
    def too_large(_e: Exception) -> Any:
        return error(413, f"request body over {app.config['MAX_CONTENT_LENGTH']} bytes")

    return app


app = create_app()
