"""maskserve: serve a Hugging Face fill-mask model over HTTP.

The package is layered, top first. A module imports only from its own layer or below, so a
request's path reads top to bottom and a change to a low layer never reaches up. ``a | b`` are
independent siblings that never import each other; ``a : b`` are siblings that may. The
import-linter contracts in setup.cfg (``tox -e style``) hold the code to this table, and
``tests/project/test_layers.py`` holds the contracts to it; the docs' Architecture page is generated from it.

    layer                    job
    __main__                 the entry point: argv + env -> settings -> model -> serve, or a batch job
    server                   the process: one server, or several on one port under gunicorn
    http | batch             create_app(), the route table, the load agent and gRPC server the app starts | file jobs
    api | demo | rpc         HTTP surfaces: HF and raw bodies, OIP, probes, /info, OpenAPI | the forms | OIP over gRPC
    middleware               the stages around every handler, one per file, and the chain
    request                  one request's record, keys, deadline, access line; run_task, its one path
    service                  the served models behind one handle; where the server is in its life
    tasks | observability    each task's request, rows and answer | logs, metrics, traces
    serving : engine         admission, queues, batches, the inference thread | the model (torch)
    config                   every setting, and the models by name
    errors | model_api       plain data: the error tree, the model protocol

aiohttp is imported from ``request`` up, never by the service or below it, nor by ``batch``; only the
engine imports torch (``http.app.load_model`` and ``batch``'s model reach it lazily, so no HTTP module
ever does).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
