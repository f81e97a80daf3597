"""costs.py: Work's arithmetic over queries, the linear fit's edge cases (nothing seen, one feature,
no negative coefficients, the anchored prior), and what CostModel reads from each BatchReport.
The fits on realistic traffic are in test_batcher.py."""

from __future__ import annotations

import pytest

from maskserve.model_api import Query
from maskserve.serving.costs import NO_WORK, ONE_TEXT, BatchReport, CostModel, LinearCost, Work


def test_work_of_one_query_counts_its_tokens_and_predictions() -> None:
    query = Query(input_ids=(101, 4, 7, 4, 102), top_k=3, n_masks=2)
    assert Work.of([query]) == Work(texts=1, tokens=5, predictions=6, prediction_tokens=30)


def test_work_of_several_queries_is_their_sum() -> None:
    queries = [
        Query(input_ids=(101, 4, 102), top_k=5),
        Query(input_ids=(101, 4, 9, 102), top_k=5, target_ids=(9, 10)),  # two targets: two predictions
        Query(input_ids=(101, 4, 9, 102), top_k=1, read_by_server=True),  # nothing decoded
    ]
    assert Work.of(queries) == Work(texts=3, tokens=11, predictions=8, prediction_tokens=5 * 3 + 2 * 4)
    assert Work.of(queries) == Work.of(queries[:1]) + Work.of(queries[1:2]) + Work.of(queries[2:])


def test_work_of_nothing_is_no_work() -> None:
    assert Work.of([]) == NO_WORK == Work()


def test_work_adds_and_subtracts_field_by_field() -> None:
    a, b = Work(1, 10, 5, 50), Work(2, 3, 4, 12)
    assert a + b == Work(3, 13, 9, 62)
    assert (a + b) - b == a
    assert Work(texts=1) == ONE_TEXT


def test_a_linear_cost_that_saw_nothing_predicts_nothing() -> None:
    cost = LinearCost()
    assert not cost.measured
    assert cost.coefficients() == (0.0, 0.0) and cost.predict(10, 1000) == 0.0


def test_a_linear_cost_recovers_two_exact_coefficients() -> None:
    cost = LinearCost()
    for f1, f2 in ((1, 10), (1, 200), (2, 50), (3, 400), (1, 80)):
        cost.observe(f1, f2, 0.5 * f1 + 0.01 * f2)
    assert cost.measured
    assert cost.coefficients() == pytest.approx((0.5, 0.01))
    assert cost.predict(2, 100) == pytest.approx(2.0)


def test_features_always_in_the_same_ratio_are_charged_to_the_first() -> None:
    cost = LinearCost()
    for scale in (1, 2, 3):
        cost.observe(scale, 10 * scale, 0.3 * scale)
    a, b = cost.coefficients()
    assert b == 0.0 and a == pytest.approx(0.3)


def test_only_the_second_feature_seen_is_charged_to_it() -> None:
    cost = LinearCost()
    cost.observe(0, 100, 1.0)
    assert cost.coefficients() == pytest.approx((0.0, 0.01))


def test_a_fit_that_would_go_negative_is_refit_on_one_feature() -> None:
    cost = LinearCost()
    # Time falls as f2 grows: a negative slope, which no work has; it is dropped.
    for f2, seconds in ((10, 1.0), (100, 0.9), (200, 0.8), (300, 0.7)):
        cost.observe(1, f2, seconds)
    a, b = cost.coefficients()
    assert b == 0.0 and a > 0
    assert cost.predict(1, 10_000) >= 0


def test_newer_observations_outweigh_older_ones() -> None:
    cost = LinearCost(decay=0.5)
    for _ in range(5):
        cost.observe(1, 0, 1.0)
    for _ in range(5):
        cost.observe(1, 0, 3.0)
    assert cost.predict(1, 0) > 2.9


def test_an_anchor_keeps_the_slope_that_recent_traffic_cannot_tell() -> None:
    cost = LinearCost(decay=0.5)
    for f2 in (10, 500, 1000):  # warm-up: lengths far apart
        cost.observe(1, f2, 0.1 + 0.001 * f2)
    cost.anchor()
    for _ in range(50):  # then only one length, long enough for the recent sums to forget the rest
        cost.observe(1, 20, 0.1 + 0.001 * 20)
    assert cost.coefficients() == pytest.approx((0.1, 0.001), rel=1e-3)


def test_anchoring_before_anything_is_seen_changes_nothing() -> None:
    cost = LinearCost()
    cost.anchor()
    assert not cost.measured and cost.coefficients() == (0.0, 0.0)


def test_a_report_without_a_forward_time_is_all_forward_pass() -> None:
    cost = CostModel()
    cost.observe(BatchReport(size=2, real_tokens=30, padded_tokens=40, seconds=0.2, failed=0, predictions=10))
    assert cost.measured
    assert cost.predict(40) == pytest.approx(0.2)
    assert cost.post_processing(Work(predictions=10, prediction_tokens=300)) == 0.0


def test_post_processing_is_learned_only_from_reports_that_decoded_something() -> None:
    cost = CostModel()
    cost.observe(BatchReport(size=1, real_tokens=8, padded_tokens=8, seconds=0.05, failed=0, forward_seconds=0.01))
    assert cost.forward.measured and not cost.post.measured
    report = BatchReport(
        size=1,
        real_tokens=8,
        padded_tokens=8,
        seconds=0.05,
        failed=0,
        forward_seconds=0.01,
        predictions=4,
        prediction_tokens=0,
    )
    cost.observe(report)
    assert cost.post.measured
    assert cost.post_processing(Work(predictions=8)) == pytest.approx(0.08)


def test_a_forward_time_longer_than_the_whole_charges_no_negative_post_processing() -> None:
    cost = CostModel()
    report = BatchReport(
        size=1, real_tokens=8, padded_tokens=8, seconds=0.01, failed=0, forward_seconds=0.02, predictions=5
    )
    cost.observe(report)
    assert cost.post_processing(Work(predictions=5)) == 0.0


def test_several_passes_each_pay_the_fixed_cost() -> None:
    cost = CostModel()
    for padded in (10, 100, 1000):
        cost.observe(
            BatchReport(size=1, real_tokens=padded, padded_tokens=padded, seconds=0.1 + 1e-4 * padded, failed=0)
        )
    assert cost.predict(1000, batches=3) - cost.predict(1000, batches=1) == pytest.approx(0.2)
