"""The seed's own server design, rebuilt from its description (shared/seed/README.md).

A Starlette app whose ``POST /`` puts ``(body text, reply queue)`` on an ``asyncio.Queue``; one
``server_loop`` task, created at start-up, loads ``pipeline("fill-mask")`` once and answers each
item by calling the pipeline *on the event loop*, one request at a time. That is the design the
benchmark compares maskserve against, kept as printed; the only change is torch's thread count,
set to the CPUs this process may use as maskserve does, so that the two differ only in design.

Run: ``python -m benchmarks.seed_server --model DIR --port 8001`` (served by uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import pipeline

from maskserve.config.cpus import available_cpus

Item = tuple[str, "asyncio.Queue[Any]"]


async def homepage(request: Request) -> JSONResponse:
    payload = await request.body()
    string = payload.decode("utf-8")
    response_q: asyncio.Queue[Any] = asyncio.Queue()
    await request.app.state.model_queue.put((string, response_q))
    output = await response_q.get()
    return JSONResponse(output)


async def server_loop(q: asyncio.Queue[Item], model: str) -> None:
    pipe = pipeline(task="fill-mask", model=model)
    while True:
        (string, response_q) = await q.get()
        out = pipe(string)  # on the event loop, as in the seed: nothing else runs meanwhile
        await response_q.put(out)


def create_app(model: str) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Starlette 1.x has no on_event("startup"); a lifespan does the same job.
        q: asyncio.Queue[Item] = asyncio.Queue()
        app.state.model_queue = q
        task = asyncio.create_task(server_loop(q, model))
        yield
        task.cancel()

    return Starlette(routes=[Route("/", homepage, methods=["POST"])], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    torch.set_num_threads(available_cpus())
    uvicorn.run(create_app(args.model), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
