"""The typed keys of everything the app and a request share. Declared here, once."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass

from aiohttp import web

from .batcher import Answer, Batcher
from .breaker import CircuitBreaker
from .errors import MaskserveError
from .lifecycle import Lifecycle
from .metrics import Metrics, Peers
from .model_api import FillMaskModel
from .oip_schemas import InferRequestParser
from .schemas import RequestParser
from .settings import Settings
from .traces import RequestTrace


@dataclass(frozen=True)
class RouteRoles:
    """What the route table (routes.py) says of its routes, for the stages that treat some apart.

    Handed down on the app's state, so no middleware imports the module that wires the app.
    """

    # Route names that queue work for the model: the circuit breaker may refuse these, and only these.
    inference: frozenset[str] = frozenset()
    # Route names answered without an API key (probes, the demo page's GETs).
    public: frozenset[str] = frozenset()


SETTINGS_KEY = web.AppKey("settings", Settings)
ROUTE_ROLES_KEY = web.AppKey("route_roles", RouteRoles)
# Draining or not: set by the runner on a stop signal, read by /readyz and every response.
LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)
MODEL_KEY = web.AppKey("model", FillMaskModel)
BATCHER_KEY = web.AppKey("batcher", Batcher)
PARSER_KEY = web.AppKey("parser", RequestParser)
# The Open Inference Protocol's infer request parser (oip_schemas.py), with the same limits.
OIP_PARSER_KEY = web.AppKey("oip_parser", InferRequestParser)
BREAKER_KEY = web.AppKey("breaker", CircuitBreaker)
METRICS_KEY = web.AppKey("metrics", Metrics)
# With --workers: the other worker processes, so that /metrics reports the whole server.
METRICS_PEERS_KEY = web.AppKey("metrics_peers", Peers)
# The active middleware chain's stage names, outermost first (for /info).
MIDDLEWARE_CHAIN_KEY: web.AppKey[tuple[str, ...]] = web.AppKey("middleware_chain")
# The thread that tokenizes long texts, off the event loop (views.to_queries).
TOKENIZER_KEY = web.AppKey("tokenizer", Executor)
# The batch loop's task, so /livez can tell when it died.
BATCH_LOOP_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("batch_loop")

REQUEST_ID_KEY = web.RequestKey("request_id", str)
# Set by the error middleware on failed requests, for the access log line.
ERROR_KIND_KEY = web.RequestKey("error_kind", str)
# The error a request was answered with (set by the error middleware), for the tracing stage.
ERROR_KEY = web.RequestKey("error", MaskserveError)
# Set by the tracing stage (maskserve[otel]) when tracing is on: the request's trace for the
# handlers (read it with traces.request_trace), and its trace id for the access log.
TRACE_KEY = web.RequestKey("trace", RequestTrace)
TRACE_ID_KEY = web.RequestKey("trace_id", str)
# The request's deadline on the event loop's clock, once computed (see deadlines.py).
DEADLINE_KEY = web.RequestKey("deadline", float)
# Set by the fill-mask view: how each text was served, for the queue-wait metric.
ANSWERS_KEY: web.RequestKey[list[Answer]] = web.RequestKey("answers")
