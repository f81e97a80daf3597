"""One model's forecast (serving/forecast.py): seconds for queued work by the measured cost, the
costliest batch the limits admit, and the stall budget no admitted batch can trip."""

from __future__ import annotations

import pytest

from maskserve.config.bounds import settings_from
from maskserve.serving.costs import BatchReport, CostModel, Work
from maskserve.serving.forecast import STALL_MULTIPLE, STALL_OBSERVED_MULTIPLE, Forecast


def measured(fixed: float, per_token: float) -> CostModel:
    """A cost model that has seen passes of ``fixed + per_token x tokens`` seconds, and no answers."""
    cost = CostModel()
    for tokens in (16, 64, 256, 16, 64, 256):
        seconds = fixed + per_token * tokens
        cost.observe(BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=seconds, failed=0))
    return cost


def forecast(fixed: float = 0.01, per_token: float = 0.001, **settings: int) -> Forecast:
    return Forecast(settings_from(settings), 512, measured(fixed, per_token))


def test_no_work_takes_no_time() -> None:
    assert forecast().seconds_for(Work(texts=0)) == 0.0


def test_work_takes_at_least_the_passes_its_size_and_token_budget_require() -> None:
    # 10 texts of 100 tokens: 3 passes by a batch size of 4, 2 by a budget of 512 tokens.
    ahead = forecast(max_batch_size=4, max_batch_tokens=512)
    assert ahead.seconds_for(Work(texts=10, tokens=1000)) == pytest.approx(3 * 0.01 + 1000 * 0.001, rel=1e-3)


def test_the_longest_batch_reads_the_full_token_budget_or_the_longest_text() -> None:
    small_budget = forecast(max_batch_tokens=128)
    assert small_budget.longest_batch_s() == pytest.approx(0.01 + 512 * 0.001, rel=1e-3)


def test_the_stall_budget_is_a_multiple_of_the_longest_batch_and_never_under_its_floor() -> None:
    ahead = forecast()
    longest = ahead.longest_batch_s()
    assert ahead.stall_budget(0.0) == pytest.approx(STALL_MULTIPLE * longest)
    assert ahead.stall_budget(1000.0) == 1000.0


def test_a_slow_pass_seen_raises_the_stall_budget_and_calibration_forgets_it() -> None:
    ahead = forecast()
    ahead.observe_pass(100.0)
    assert ahead.stall_budget(0.0) == STALL_OBSERVED_MULTIPLE * 100.0
    ahead.calibrate()  # after warm-up: its cold pass is no measure of a stall
    assert ahead.longest_pass_s == 0.0 and ahead.calibrated_longest_s == pytest.approx(ahead.longest_batch_s())


def test_what_warm_up_measured_stays_a_floor_when_recent_batches_are_cheaper() -> None:
    ahead = forecast(fixed=0.5, per_token=0.01)
    ahead.calibrate()
    calibrated = ahead.calibrated_longest_s
    for tokens in (8, 8, 8, 8, 8, 8, 8, 8):  # many short, cheap passes since
        ahead.cost.observe(BatchReport(size=1, real_tokens=tokens, padded_tokens=tokens, seconds=0.001, failed=0))
    assert ahead.stall_budget(0.0) >= STALL_MULTIPLE * calibrated
