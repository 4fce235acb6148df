"""A FastAPI app for pre-forked workers: gunicorn ``--preload`` with the uvicorn worker.

Run it (docs/scale.md)::

    TFRT_PY_MODEL=model.onnx gunicorn --preload -w 4 -k uvicorn_worker.UvicornWorker \\
        -c gunicorn.conf.py tfrt_py.examples.prefork_app:app

with a ``gunicorn.conf.py`` whose ``post_fork`` hook sets each worker's threads::

    from tfrt_py.serving.prefork import configure_worker
    def post_fork(server, worker):
        configure_worker(server.cfg.workers)

What it shows: the model is loaded at import, which ``--preload`` does once in gunicorn's
master, and ``share_weights`` moves its weights to shared, file-backed memory before the
fork (external data is memory-mapped already; embedded weights go to a private cache
file), so N workers hold one copy; ``freeze_for_fork`` then keeps the workers' garbage
collections from copying the master's pages. tfrt_py's pools restart in each worker on
first use.
``POST /predict`` takes an .npy body for the model's one input and answers the first
output as .npy (header ``x-tfrt-py-worker``: the worker's pid); ``GET /readyz`` answers
200. ``await model.run_async`` runs small calls inline and heavy ones on the worker's pool.
"""

from __future__ import annotations

import io
import os

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response

import tfrt_py
from tfrt_py.errors import InputError
from tfrt_py.serving.prefork import freeze_for_fork
from tfrt_py.sharing import share_weights

MODEL = tfrt_py.load(os.environ.get("TFRT_PY_MODEL", ""))
SHARED = share_weights(MODEL)  # in gunicorn's master, before the fork (--preload)
freeze_for_fork()  # last: the workers' garbage collections leave the master's pages shared
INPUT = MODEL.inputs[0].name
OUTPUT = MODEL.outputs[0].name

app = FastAPI(title="tfrt_py pre-forked")


@app.post("/predict")
async def predict(request: Request) -> Response:
    try:
        x = np.load(io.BytesIO(await request.body()), allow_pickle=False)
        y = (await MODEL.run_async({INPUT: x}))[OUTPUT]
    except (InputError, ValueError, OSError) as e:
        raise HTTPException(400, str(e)) from None
    buf = io.BytesIO()
    np.save(buf, y, allow_pickle=False)
    headers = {"x-tfrt-py-worker": str(os.getpid())}
    return Response(buf.getvalue(), media_type="application/x-npy", headers=headers)


@app.get("/readyz")
async def readyz() -> Response:
    return Response("ready", headers={"x-tfrt-py-worker": str(os.getpid())})
