"""Where the server is in its life after a stop signal. Plain state, no HTTP: the runner sets it,
the readiness probe and the responses read it.

    serving ──SIGTERM/SIGINT──▶ draining ──drain delay, or a second signal──▶ stopping

While *draining*, new requests are still accepted and answered, but ``/readyz`` fails and every
response asks its client to close the connection, so that load balancers and Kubernetes
endpoints stop sending here before the listener closes. *Stopping* is the batcher's own
``closed`` flag: the listener is closed, and what was accepted is answered within the drain
timeout.
"""

from __future__ import annotations

import time


class Lifecycle:
    """Whether the server is draining, and since when (monotonic seconds)."""

    def __init__(self) -> None:
        self.draining_since: float | None = None

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def start_draining(self) -> bool:
        """Enter the draining phase; False when already in it."""
        if self.draining_since is not None:
            return False
        self.draining_since = time.monotonic()
        return True
