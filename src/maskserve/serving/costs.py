"""What work costs: the quantities a batch is measured by, and the cost model fitted on them.

:class:`Work` counts texts (the rows of a forward pass), tokens and predictions; :class:`CostModel` learns from each
:class:`BatchReport` what a forward pass and its post-processing take on this machine, so that
admission, ``Retry-After`` and the stall budget go by measured costs rather than guesses. Pure
arithmetic: no queue, no thread, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from maskserve.model_api import Query


@dataclass(frozen=True)
class Work:
    """How much a set of texts costs to answer: the quantities the cost model is fitted on."""

    texts: int = 0
    tokens: int = 0
    predictions: int = 0
    # Predictions x their text's tokens: decoding each prediction's ``sequence`` costs its length.
    prediction_tokens: int = 0

    @classmethod
    def of(cls, queries: Sequence[Query]) -> Work:
        if len(queries) == 1:  # the common case, once per text queued: no generators
            query = queries[0]
            return cls(1, query.n_tokens, query.predictions, query.prediction_tokens)
        return cls(
            texts=len(queries),
            tokens=sum(q.n_tokens for q in queries),
            predictions=sum(q.predictions for q in queries),
            prediction_tokens=sum(q.prediction_tokens for q in queries),
        )

    def __add__(self, other: Work) -> Work:
        return Work(
            self.texts + other.texts,
            self.tokens + other.tokens,
            self.predictions + other.predictions,
            self.prediction_tokens + other.prediction_tokens,
        )

    def __sub__(self, other: Work) -> Work:
        return Work(
            self.texts - other.texts,
            self.tokens - other.tokens,
            self.predictions - other.predictions,
            self.prediction_tokens - other.prediction_tokens,
        )


# Nothing: what an idle queue holds.
NO_WORK = Work()
# One text of one token: the least a request adds to the queue, for the check at the door.
ONE_TEXT = Work(texts=1)


@dataclass(frozen=True)
class BatchReport:
    """What one forward pass did; sent to every listener (metrics, the cost estimate)."""

    size: int
    real_tokens: int
    padded_tokens: int
    seconds: float
    failed: int
    # When the pass began (epoch nanoseconds), its number (1, 2, ...), and the contexts of the
    # items it served that carried one (WorkItem.context), each once.
    started_ns: int = 0
    number: int = 0
    contexts: tuple[object, ...] = ()
    # Of ``seconds``, the forward pass's own (None: all of it), and the post-processing the rest
    # spent on the texts it finished: their predictions, and predictions x tokens.
    forward_seconds: float | None = None
    predictions: int = 0
    prediction_tokens: int = 0


class LinearCost:
    """Seconds as ``a x f1 + b x f2`` (both coefficients >= 0), fitted by exponentially weighted
    least squares over recent observations, so that it follows the model, the machine and the load
    as they change. Until something is observed it predicts 0: never refuse on a guess.

    Recent traffic is often all alike (short sentences, a few predictions each): it says well what
    such work costs, and nothing of how the cost grows with length. :meth:`anchor` keeps what has
    been observed so far (warm-up's passes, of very different lengths) as a prior that never
    fades, with the weight of a couple of observations: it settles the directions recent traffic
    leaves open, and yields to it in the others. When nothing tells the two features apart
    (always the same ratio), everything is charged to ``f1``.
    """

    # The prior's weight, in observations: enough to fix what recent traffic cannot, little
    # enough that a machine that got slower under load is followed.
    PRIOR_WEIGHT = 2.0

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        # Weighted sums: count, f1 f1, f1 f2, f2 f2, f1 y, f2 y; recent ones, and the prior's.
        self._sums = [0.0] * 6
        self._prior = [0.0] * 6
        # The fit, solved once per change: every request asks for predictions several times.
        self._fit: tuple[float, float] | None = None

    def observe(self, f1: float, f2: float, seconds: float) -> None:
        d = self.decay
        for i, value in enumerate((1.0, f1 * f1, f1 * f2, f2 * f2, f1 * seconds, f2 * seconds)):
            self._sums[i] = d * self._sums[i] + value
        self._fit = None

    def anchor(self) -> None:
        """Keep what has been observed so far as the prior (see the class docstring)."""
        if self._sums[0] > 0:
            scale = self.PRIOR_WEIGHT / self._sums[0]
            self._prior = [value * scale for value in self._sums]
        self._fit = None

    @property
    def measured(self) -> bool:
        return self._sums[0] + self._prior[0] > 0

    def coefficients(self) -> tuple[float, float]:
        if self._fit is None:
            self._fit = self._solve()
        return self._fit

    def _solve(self) -> tuple[float, float]:
        n, s11, s12, s22, s1y, s2y = (a + b for a, b in zip(self._sums, self._prior))
        if n <= 0 or s11 + s22 <= 0:
            return 0.0, 0.0
        det = s11 * s22 - s12 * s12
        if det <= 1e-9 * s11 * s22 or s11 == 0:
            if s11 > 0:
                return max(0.0, s1y / s11), 0.0
            return 0.0, max(0.0, s2y / s22)
        a = (s1y * s22 - s2y * s12) / det
        b = (s2y * s11 - s1y * s12) / det
        if b < 0:  # the second feature adds nothing: refit on the first alone
            return max(0.0, s1y / s11), 0.0
        if a < 0:
            return 0.0, max(0.0, s2y / s22)
        return a, b

    def predict(self, f1: float, f2: float) -> float:
        a, b = self.coefficients()
        return a * f1 + b * f2


class CostModel:
    """Seconds a batch takes: its forward pass as ``fixed + per_token x padded tokens``, and its
    post-processing as ``per_prediction x predictions + per_decoded_token x predictions x tokens``.

    It predicts how long queued work will take (for Retry-After, admission, the stall budget and
    dropping requests that cannot make their deadline) and weighs a split into sub-batches against
    one padded batch.
    """

    def __init__(self, decay: float = 0.9) -> None:
        self.forward = LinearCost(decay)  # f1 = passes, f2 = padded tokens
        self.post = LinearCost(decay)  # f1 = predictions, f2 = prediction tokens

    def observe(self, report: BatchReport) -> None:
        forward = report.seconds if report.forward_seconds is None else report.forward_seconds
        self.forward.observe(1.0, float(report.padded_tokens), forward)
        if report.predictions > 0:
            post = max(0.0, report.seconds - forward)
            self.post.observe(float(report.predictions), float(report.prediction_tokens), post)

    @property
    def measured(self) -> bool:
        return self.forward.measured

    def coefficients(self) -> tuple[float, float]:
        """The forward pass's (fixed seconds per pass, seconds per padded token), both >= 0."""
        return self.forward.coefficients()

    def predict(self, padded_tokens: int, batches: int = 1) -> float:
        """Seconds of forward passes over ``padded_tokens`` in ``batches`` passes."""
        return self.forward.predict(batches, padded_tokens)

    def post_processing(self, work: Work) -> float:
        """Seconds of picking, decoding and encoding ``work``'s predictions."""
        return self.post.predict(work.predictions, work.prediction_tokens)
