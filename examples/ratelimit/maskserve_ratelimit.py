"""A per-API-key token-bucket rate limiter: an example of a third-party maskserve middleware.

Every key (the bearer token, or the client's address when a request has none) owns a bucket of
``RATELIMIT_BURST`` tokens that refills at ``RATELIMIT_PER_MINUTE`` tokens a minute. A request
takes a token; one that finds its bucket empty is answered 429 ``rate_limited`` with a
``Retry-After`` saying when the next token comes. Health probes and ``/metrics`` are never limited.

Load it without installing anything (the folder on ``PYTHONPATH``)::

    PYTHONPATH=examples/ratelimit maskserve --middleware default,+maskserve_ratelimit:factory

or install it (``pip install ./examples/ratelimit``), which registers the ``ratelimit`` entry point::

    maskserve --middleware default,+ratelimit

Its factory declares ``reads_body = False``, so ``+`` places it just before the circuit breaker:
after ``auth`` (with ``--api-key`` set, a bucket belongs to a verified key, and random tokens
cannot mint fresh buckets) and before anything is queued. It raises maskserve's own
:class:`~maskserve.errors.RateLimited`, so the error sanitizer renders the 429 like any other error.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from maskserve.config.settings import Settings
from maskserve.errors import RateLimited

# Probes and scrapers must never be turned away by a client's quota.
EXEMPT_ROUTES = frozenset({"livez", "readyz", "metrics"})


class TokenBuckets:
    """One token bucket per key, at most ``max_keys`` of them. Plain class: tests drive it without HTTP."""

    def __init__(
        self,
        per_minute: float,
        burst: int,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError("per_minute must be > 0 and burst >= 1")
        self.rate = per_minute / 60.0  # tokens a second
        self.burst = burst
        self.max_keys = max_keys
        self.clock = clock
        # key -> (tokens left, when they were counted); most recently used last.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets

    def take(self, key: str) -> float:
        """Take one token for ``key``: 0.0 when there was one, else the seconds until there is."""
        now = self.clock()
        tokens, then = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        # Bounded memory: the least recently seen key goes first. It comes back with a full bucket,
        # which is the generous side to err on.
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait


def client_key(request: web.Request) -> str:
    """Whose bucket a request draws on: a digest of its bearer token (no raw key is kept), or its address."""
    scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).hexdigest()
    return f"addr:{request.remote}"


def ratelimit_middleware(buckets: TokenBuckets) -> Middleware:
    """A middleware answering 429 ``rate_limited`` when the caller's bucket is empty."""

    @web.middleware
    async def ratelimit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.route.name not in EXEMPT_ROUTES:
            wait = buckets.take(client_key(request))
            if wait > 0:
                raise RateLimited("this client sent more requests than its quota allows; retry later", wait)
        return await handler(request)

    return ratelimit


def _env_number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


class RateLimitFactory:
    """The stage factory maskserve calls with its settings; the limits come from the environment.

    A plug-in brings its own configuration: maskserve's settings only know maskserve's knobs.
    """

    # This stage reads no body, so it may sit before the circuit breaker (maskserve checks it).
    reads_body = False

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = environ

    def __call__(self, settings: Settings) -> Middleware:
        environ = os.environ if self.environ is None else self.environ
        per_minute = _env_number(environ, "RATELIMIT_PER_MINUTE", 60.0)
        burst = _env_number(environ, "RATELIMIT_BURST", 10.0)
        if burst != int(burst):
            raise ValueError(f"RATELIMIT_BURST={burst} is not a whole number")
        return ratelimit_middleware(TokenBuckets(per_minute, int(burst)))


# What ``--middleware default,+maskserve_ratelimit:factory`` and the entry point name.
factory = RateLimitFactory()
