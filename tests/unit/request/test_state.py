"""request/state.py: a new request's record says nothing has happened to it yet, and no two
records share what they collect."""

from __future__ import annotations

from maskserve.observability.request_trace import NO_TRACE
from maskserve.request.state import RequestState
from maskserve.serving.work_queue import Answer


def test_a_new_record_has_no_id_deadline_error_or_model_yet() -> None:
    state = RequestState()
    assert (state.id, state.deadline, state.kind, state.error) == ("-", None, None, None)
    assert (state.served, state.model, state.answers, state.close_after) == (None, "", [], None)


def test_a_new_record_is_untraced() -> None:
    state = RequestState()
    assert state.trace is NO_TRACE and state.trace_id is None


def test_records_do_not_share_their_answers() -> None:
    first, second = RequestState(), RequestState()
    first.answers.append(Answer(predictions=[], queued_s=0.0, inference_s=0.0, batch_size=1))
    assert second.answers == []
