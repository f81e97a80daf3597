"""What one model's work will take, by the cost its own passes measure: seconds for queued work,
the costliest batch the limits admit, and the stall budget that no admitted batch can trip."""

from __future__ import annotations

from maskserve.config.settings import Settings
from maskserve.serving.costs import CostModel, Work

# The stall budget is this many times the longest batch the limits admit: a pass that runs past
# it is not slow, it is stuck.
STALL_MULTIPLE = 4.0
# ... or this many times the longest pass seen so far, which a busy machine may stretch.
STALL_OBSERVED_MULTIPLE = 2.0


class Forecast:
    """One model's predictions, from its :class:`~maskserve.serving.costs.CostModel` and its limits."""

    def __init__(self, settings: Settings, max_tokens: int, cost: CostModel) -> None:
        self.settings = settings
        # The longest text the model reads: a batch of one such text passes any token budget.
        self.max_tokens = max_tokens
        self.cost = cost
        # The longest batch the limits admit as predicted when warm-up measured the model, and
        # the longest pass seen since: floors of the stall budget that recent short batches,
        # which the cost model follows, cannot wear down.
        self.calibrated_longest_s = 0.0
        self.longest_pass_s = 0.0

    def seconds_for(self, work: Work) -> float:
        """Predicted seconds to answer ``work`` from an idle model: its passes and its post-processing."""
        if work.texts == 0:
            return 0.0
        settings = self.settings
        # At least as many passes as the size and the token budget each require (a lower
        # bound: padding needs more), and never fewer than one.
        batches = max(-(-work.texts // settings.max_batch_size), -(-work.tokens // settings.max_batch_tokens), 1)
        return self.cost.predict(work.tokens, batches=batches) + self.cost.post_processing(work)

    def longest_batch_s(self) -> float:
        """Predicted seconds of the costliest batch the limits admit: a full token budget in one
        pass, then the most predictions each of its texts may ask for, decoded at full length."""
        settings = self.settings
        texts = settings.max_batch_size
        tokens = max(settings.max_batch_tokens, self.max_tokens)
        # A window of a long text may hold all of its masks: each text's most predictions at full length.
        per_text = settings.text_predictions(self.max_tokens)
        worst = Work(texts, tokens, texts * per_text, per_text * tokens)
        return self.cost.predict(tokens) + self.cost.post_processing(worst)

    def stall_budget(self, floor: float) -> float:
        """Seconds one batch may hold the inference thread before it counts as stuck: a multiple
        of the longest batch the limits admit (and of the longest seen), never less than ``floor``.

        No admitted request can then trip it, on any machine: it is measured here.
        """
        longest = max(self.calibrated_longest_s, self.longest_batch_s())
        return max(floor, STALL_MULTIPLE * longest, STALL_OBSERVED_MULTIPLE * self.longest_pass_s)

    def calibrate(self) -> None:
        """After warm-up measured the model: the longest batch as now predicted becomes a floor."""
        self.calibrated_longest_s = self.longest_batch_s()
        self.longest_pass_s = 0.0  # the cold pass is no measure of a stall

    def observe_pass(self, seconds: float) -> None:
        """A forward pass took ``seconds`` (on the inference thread; a float store, read on the loop)."""
        self.longest_pass_s = max(self.longest_pass_s, seconds)
