"""Admission: whether a request may come in now, decided once for every route that queues work.

Plain class, no HTTP. It is load shedding, not a circuit breaker's open and closed states: each
request is weighed against the queue's bound and the wait the measured cost predicts, twice.

- **At the door**, before the body is read (the circuit-breaking stage, and the demo page's form):
  refused at once when the server drains, the queue is full, or the wait ahead already exceeds the
  request's deadline. Refusing there is cheap and honest: the client learns at once that it must
  come back, with a ``Retry-After`` computed from the work ahead, instead of waiting for a 504
  that also cost the server a forward pass.
- **Once parsed**, on the request's whole cost (its forward passes and the post-processing of its
  predictions): one that could never finish in time is refused for what it is (422 or 504), one
  that could but not behind the work queued now is told when to come back (503).
"""

from __future__ import annotations

from collections import Counter

from maskserve.errors import DeadlineExceeded, Overloaded, RequestTooCostly, ServiceUnavailable, ShuttingDown
from maskserve.serving.batcher import Batcher
from maskserve.serving.costs import ONE_TEXT, Work

# A request is admitted on its own cost only with this much to spare: the cost model follows the
# recent passes, and a long request's passes on a busy machine run over it. The model is linear in
# padded tokens, while attention grows with each text's length, so the passes of a long text's
# scoring copies (each as long as the text) run over their prediction even on an idle machine;
# the margin covers that and a busy machine's slowdown together. One admitted at the edge of its
# deadline would pay for every pass and still time out; with the margin it ends in time, and what
# the margin refuses is told so before any work (benchmarks.costliest measures the real time of
# the costliest request admitted against its prediction).
OWN_COST_MARGIN = 1.5


class Admission:
    """Decides admission from the batcher's queue and measured cost; counts what it refuses."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        # Refusals by reason: queue_full, predicted_timeout, shutting_down.
        self.refused: Counter[str] = Counter()

    def at_door(self, time_left: float) -> None:
        """Raise 503 if a request with ``time_left`` seconds should not come in now (504 if already late)."""
        if time_left <= 0:
            # Already late at the door (a tiny X-Request-Timeout): retrying cannot help, so this
            # is the request's own timeout, not a 503 with Retry-After.
            raise DeadlineExceeded("the request's deadline passed before it could be queued")
        self._refuse_if_shed(time_left, ONE_TEXT)

    def admit(self, work: Work, time_left: float, request_timeout: float) -> None:
        """Raise unless a parsed request of ``work`` may be queued now, with ``time_left`` seconds.

        The door let it in on the cost of one text; now its whole cost is known, answers
        included. One that cannot finish in time even alone is refused for what it is: 422 when
        no deadline this server allows would do (change the request), 504 when only the client's
        own shorter one is too short. One that could, but not behind the work already queued, is
        told to come back when that work is done (503, Retry-After).
        """
        own = self.batcher.forecast.seconds_for(work)
        needed = own * OWN_COST_MARGIN
        if needed > time_left:
            if needed > request_timeout:
                raise RequestTooCostly(
                    f"this request would take about {own:.1f}s on this server even with nothing else to do, "
                    f"too close to or past its longest deadline ({request_timeout:g}s); send fewer or shorter "
                    "texts, or ask for fewer predictions"
                )
            raise DeadlineExceeded(
                f"this request would take about {own:.1f}s, too close to or past what its deadline allows"
            )
        self._refuse_if_shed(time_left, work)

    def _refuse_if_shed(self, time_left: float, work: Work) -> None:
        refusal = self._refusal(time_left, work)
        if refusal is not None:
            self.refused[refusal.reason] += 1
            raise refusal

    def _refusal(self, time_left: float, work: Work) -> ServiceUnavailable | None:
        batcher = self.batcher
        if batcher.closed:
            return ShuttingDown("the server is shutting down and accepts no new work", retry_after=1.0)
        if batcher.is_full(work.texts):
            return Overloaded(
                f"the server is at capacity ({batcher.depth} texts queued); retry later",
                retry_after=batcher.retry_after(),
                reason="queue_full",
            )
        # At the door, its own text adds at least one more batch of work; once parsed, its whole
        # cost. The wait already ahead is known.
        predicted = batcher.predicted_wait(work)
        if predicted > time_left:
            return Overloaded(
                f"the predicted wait ({predicted:.1f}s) exceeds this request's deadline ({time_left:.1f}s)",
                retry_after=batcher.retry_after(),
                reason="predicted_timeout",
            )
        return None
