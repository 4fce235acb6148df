"""A FastAPI app that embeds a tfrt_py model: the bundled mlp_small (x[1,64] -> probs[1,10]).

Run it::

    uvicorn tfrt_py.examples.fastapi_app:app --port 8000 --loop uvloop
    curl -s localhost:8000/predict -H 'content-type: application/json' \\
         -d '{"x": [[0.1, 0.2, ...64 numbers...]]}'

What it shows: the model is loaded once per process (in the lifespan; or at import, before
``gunicorn --preload`` forks, and its memory-mapped weights stay shared) and warmed with one
call; a request body is validated by pydantic, converted *explicitly* to float32 (tfrt_py's
feed check refuses Python floats float32 cannot hold exactly, such as 0.1), and run with
``await model.run_async`` -- inline on the event loop, which is right for a model this
small. Bad feeds come back as 400 with tfrt_py's message naming the input.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import tfrt_py
from tfrt_py.errors import InputError

MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp_small.onnx")


class PredictRequest(BaseModel):
    """``x``: the model input as nested lists, shape [1, 64]."""

    x: list[list[float]]


class PredictResponse(BaseModel):
    probs: list[list[float]]
    label: int


def create_app(model_path: str = MODEL_PATH) -> FastAPI:
    """The app; the model at ``model_path`` is loaded and warmed at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = tfrt_py.load(model_path)
        model.run({"x": np.zeros((1, 64), np.float32)})  # warm: plans made before traffic
        app.state.model = model
        yield

    app = FastAPI(title="tfrt_py mlp_small", lifespan=lifespan)

    @app.post("/predict")
    async def predict(req: PredictRequest) -> PredictResponse:
        try:
            x = np.asarray(req.x, dtype=np.float32)
        except ValueError as e:
            raise HTTPException(400, f"input 'x': not a rectangular array ({e})") from None
        try:
            out = await app.state.model.run_async({"x": x})
        except InputError as e:
            raise HTTPException(400, str(e)) from None
        probs = out["probs"]
        return PredictResponse(probs=probs.tolist(), label=int(probs.argmax()))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    return app


app = create_app()
