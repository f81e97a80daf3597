"""task.py: the Task protocol's four steps (each task module has them, with the same parameters),
the Plan every task makes, Ran's record, and the type variables' variance."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from maskserve.serving.work_queue import Answer
from maskserve.tasks import task
from maskserve.tasks.fill_mask import FillMask, FillMaskPlan
from maskserve.tasks.score import Score, ScorePlan
from maskserve.tasks.task import Plan, Ran, Task

STEPS = ("tokenizes", "plan", "decodes", "fold")
TASKS = (FillMask, Score)


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_protocol_is_the_four_steps_every_surface_calls() -> None:
    members = {name for name, value in vars(Task).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert members == set(STEPS)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("cls", TASKS, ids=lambda cls: cls.__name__)
def test_every_task_module_has_each_step_with_the_protocols_parameters(cls: type, step: str) -> None:
    assert parameters(getattr(cls, step)) == parameters(getattr(Task, step))


@pytest.mark.parametrize("cls", [FillMaskPlan, ScorePlan], ids=lambda cls: cls.__name__)
def test_every_tasks_plan_offers_its_queries(cls: type) -> None:
    fields = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    assert "queries" in fields or isinstance(inspect.getattr_static(cls, "queries", None), property)
    assert isinstance(inspect.getattr_static(Plan, "queries"), property)


def test_ran_is_a_frozen_record_of_the_request_its_result_and_every_rows_answer() -> None:
    rows = [Answer(predictions=[], queued_s=0.1, inference_s=0.2, batch_size=3)]
    ran: Ran[str, int] = Ran(request="a [MASK]", result=7, rows=rows)
    assert (ran.request, ran.result, ran.rows) == ("a [MASK]", 7, rows)
    assert ran == Ran("a [MASK]", 7, list(rows))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ran.result = 8  # type: ignore[misc]


def test_a_task_takes_any_request_it_can_read_and_gives_what_it_promises() -> None:
    assert task.AskT.__contravariant__ and not task.AskT.__covariant__
    assert task.ResultT.__covariant__ and not task.ResultT.__contravariant__
    assert task.PlanT.__bound__ is Plan


def test_the_functions_that_run_any_task_use_invariant_variables() -> None:
    for variable in (task.RequestT, task.AnswerT):
        assert not variable.__covariant__ and not variable.__contravariant__ and variable.__bound__ is None
