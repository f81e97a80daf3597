"""maskserve: serve a Hugging Face fill-mask model over HTTP.

The package is layered, top first. A module imports only from its own layer or below, so a
request's path reads top to bottom and a change to a low layer never reaches up. ``a | b`` are
independent siblings that never import each other; ``a : b`` are siblings that may. The
import-linter contracts in setup.cfg (``tox -e style``) hold the code to this table, and
``tests/test_layers.py`` holds the contracts to it; the docs' Architecture page is generated from it.

    layer                                                 job
    __main__                                              the entry point: argv + env -> settings -> model -> serve
    workers                                               --workers N: gunicorn's arbiter and maskserve's worker
    serve                                                 run an app: listen, follow stop signals, drain, stop
    app                                                   create_app(): the service, lifecycle, middlewares, routes
    routes                                                every route in one table, and the roles the stages read
    score_page                                            the demo page's scoring form, answered as the page
    views : page : health : agent : info : openapi : oip  handlers: API, page, probes, load agent, /info, OpenAPI, OIP
    openapi_schemas                                       the OpenAPI document's schemas and response builders
    middleware                                            the stages around every handler, one per file, and the chain
    handling : logs                                       what handlers and stages share; logging and the access line
    deadlines                                             each request's deadline
    keys                                                  the two typed keys: the service, each request's record
    request_state                                         one request's record (its served model among it)
    service                                               the one handle on the request path: the served models
    tasks                                                 each task's rows and its answer folded back: fill-mask, score
    schemas : oip_schemas : score_schemas                 request parsing and validation, response shapes
    traces : tracing                                      what handlers tell tracing; its OpenTelemetry side (extra)
    metrics                                               the Prometheus registry, fed by the batcher and a stage
    admission | connections                               may a request come in | each connection's time limits
    batcher | engine                                      one model's queue and batches (asyncio) | the model (torch)
    inference | scheduler                                 the inference thread's side of a batch | whose batch runs next
    work_queue                                            the queue's records and one model's queue of them
    costs | scoring | whole_words | models_config         what work costs | copies | whole words | models by name
    settings | errors | model_api | packing | lifecycle   plain data: knobs, errors, model protocol, phase

aiohttp is imported from the keys up, never by the service or below it; only the engine imports
torch (``app.load_model`` reaches it lazily, so no HTTP module ever does).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
