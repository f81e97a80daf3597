"""observability/request_trace.py: with tracing off, a request's trace links nothing, its steps
change nothing, and what it is told is dropped."""

from __future__ import annotations

import pytest

from maskserve.observability.request_trace import NO_TRACE
from maskserve.serving.work_queue import Answer


def test_the_untraced_request_gives_its_texts_no_link() -> None:
    assert NO_TRACE.link is None


def test_a_step_of_an_untraced_request_runs_its_body() -> None:
    ran: list[str] = []
    with NO_TRACE.step("maskserve.parse"):
        ran.append("parsed")
    assert ran == ["parsed"]


def test_a_step_of_an_untraced_request_lets_its_error_through() -> None:
    with pytest.raises(ValueError, match="bad body"), NO_TRACE.step("maskserve.parse"):
        raise ValueError("bad body")


def test_what_an_untraced_request_is_told_is_dropped() -> None:
    answers = [Answer(predictions=[], queued_s=0.1, inference_s=0.2, batch_size=3, started_ns=5, batch_number=1)]
    assert NO_TRACE.served(answers, 1) is None
    assert answers == [
        Answer(predictions=[], queued_s=0.1, inference_s=0.2, batch_size=3, started_ns=5, batch_number=1)
    ]
