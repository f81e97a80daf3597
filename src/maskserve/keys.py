"""The typed keys of everything the app and a request share. Declared here, once."""

from __future__ import annotations

from aiohttp import web

from .batcher import Batcher
from .breaker import CircuitBreaker
from .model_api import FillMaskModel
from .schemas import RequestParser
from .settings import Settings

SETTINGS_KEY = web.AppKey("settings", Settings)
MODEL_KEY = web.AppKey("model", FillMaskModel)
BATCHER_KEY = web.AppKey("batcher", Batcher)
PARSER_KEY = web.AppKey("parser", RequestParser)
BREAKER_KEY = web.AppKey("breaker", CircuitBreaker)

REQUEST_ID_KEY = web.RequestKey("request_id", str)
# Set by the error middleware on failed requests, for the access log line.
ERROR_KIND_KEY = web.RequestKey("error_kind", str)
# The request's deadline on the event loop's clock, once computed (see deadlines.py).
DEADLINE_KEY = web.RequestKey("deadline", float)
