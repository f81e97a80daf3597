"""batch/job.py: a job's rows equal the API's answers, error rows stand in place, and a job stopped
part-way is finished by the next run without redoing a finished part."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from maskserve.batch.formats import read_rows
from maskserve.batch.job import Job, JobOptions
from maskserve.batch.parts import JobMismatch, metadata_path, parts_folder
from maskserve.config.bounds import settings_from
from maskserve.config.model_configs import model_configs
from maskserve.engine import FillMaskEngine
from maskserve.model_api import FillMaskModel, Query, TextPredictions
from tests.conftest import HAS_ONNXRUNTIME, HAS_OPENVINO, NO_ONNXRUNTIME, NO_OPENVINO, ClientFactory
from tests.unit.api.test_views import SCORE_TOLERANCE

LONG = " ".join(["the cat sat on the mat."] * 60) + " the [MASK] sat."
FILL_ROWS: list[dict[str, Any]] = [
    {"id": "plain", "text": "paris is the [MASK] of france."},
    {"id": "top_k", "text": "the [MASK] sat on the mat.", "parameters": {"top_k": 2}},
    {"id": "targets", "text": "the [MASK] sat.", "parameters": {"targets": ["cat", "dog"]}},
    {"id": "two masks", "text": "the [MASK] sat on the [MASK]."},
    {"id": "again", "text": "paris is the [MASK] of france."},
    {"id": "long", "text": LONG},
    {"id": "whole words", "text": "the [MASK] sat on the mat.", "parameters": {"whole_words": True, "top_k": 3}},
    {"id": "whole words, long", "text": LONG, "parameters": {"whole_words": True, "max_word_pieces": 2}},
    {"id": "no mask", "text": "no mask here."},
    {"id": "bad top_k", "text": "the [MASK].", "parameters": {"top_k": "many"}},
    {"id": "no text", "parameters": {"top_k": 2}},
]
SCORE_ROWS: list[dict[str, Any]] = [
    {"id": 1, "text": "the cat sat on the mat."},
    {"id": 2, "text": "the cat sat on the mat.", "parameters": {"metric": "within_word_l2r", "tokens": True}},
    {"id": 3, "text": LONG.replace("[MASK]", "dog")},
    {"id": 4, "text": "   "},
]


def assert_close(got: Any, expected: Any) -> None:
    """Equal answers: the same shape, strings and ids; every score within float noise (a text's
    batch-mates differ between the job and the server, and padding moves the last bits)."""
    if isinstance(expected, float):
        assert got == pytest.approx(expected, abs=SCORE_TOLERANCE)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), (got, expected)
        for key, value in expected.items():
            assert_close(got[key], value)
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (got, expected)
        for got_item, expected_item in zip(got, expected, strict=True):
            assert_close(got_item, expected_item)
    else:
        assert got == expected


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def output_rows(path: Path) -> list[dict[str, Any]]:
    return [row for rows in read_rows(path, 1000) for row in rows]


def run(engine: FillMaskModel, options: JobOptions, revision: str = "r1", **settings: Any) -> Any:
    config = model_configs(settings_from(settings))[0]
    return Job(options, config, engine, revision).run()


async def api_answer(client: Any, path: str, row: dict[str, Any]) -> tuple[int, Any]:
    document = {"inputs": row.get("text"), **({"parameters": row["parameters"]} if "parameters" in row else {})}
    response = await client.post(path, json=document)
    return response.status, await response.json()


@pytest.mark.parametrize(("task", "rows", "route"), [("fill-mask", FILL_ROWS, "/"), ("score", SCORE_ROWS, "/score")])
async def test_every_row_equals_the_apis_answer_for_its_text_or_its_error(
    tmp_path: Path,
    bert_engine: FillMaskEngine,
    make_client: ClientFactory,
    task: str,
    rows: list[dict[str, Any]],
    route: str,
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    output = tmp_path / "out.jsonl"
    report = run(bert_engine, JobOptions(source, output, task=task, part_rows=3))
    got = output_rows(output)
    assert [row["id"] for row in got] == [row["id"] for row in rows]
    client = await make_client()
    for row, written in zip(rows, got, strict=True):
        status, answer = await api_answer(client, route, row)
        if status == 200:
            assert "error" not in written, (row, written)
            assert_close(written["result"], answer)
        elif "text" in row:
            assert written["error"]["type"] == answer["error_type"] and written["error"]["message"] == answer["error"]
        else:  # the API refuses a body without inputs; a row without text is named so
            assert written["error"] == {
                "type": "invalid_input",
                "message": "the row has no text: its 'text' must be a string",
                "field": "text",
            }
    errors = sum("error" in row for row in got)
    assert (report.rows, report.errors, report.results) == (len(rows), errors, len(rows) - errors)
    assert not parts_folder(output).exists()
    described = json.loads(metadata_path(output).read_text())
    assert described["model"]["revision"] == "r1" and described["task"] == task
    assert described["rows"] == len(rows) and described["errors"] == errors


class StopsAfter:
    """The engine, until its ``passes``-th forward pass, which stops the job as a Ctrl-C would."""

    def __init__(self, engine: FillMaskModel, passes: int) -> None:
        self.engine, self.passes, self.calls = engine, passes, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def predict(self, queries: Sequence[Query], progress: Any = None) -> list[TextPredictions]:
        self.calls += 1
        if self.calls == self.passes:
            raise KeyboardInterrupt
        return self.engine.predict(queries)


@pytest.mark.parametrize("stop_at", [1, 4, 9])
def test_a_stopped_job_run_again_redoes_no_finished_part_and_ends_as_an_unstopped_one(
    tmp_path: Path, bert_engine: FillMaskEngine, stop_at: int
) -> None:
    rows = [{"text": f"the {word} sat on the [MASK]."} for word in ("cat", "dog", "man") * 6]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    whole = tmp_path / "whole.parquet"
    run(bert_engine, JobOptions(source, whole, part_rows=2))
    output = tmp_path / "out.parquet"
    stopping = StopsAfter(bert_engine, stop_at)
    with pytest.raises(KeyboardInterrupt):
        run(stopping, JobOptions(source, output, part_rows=2))  # type: ignore[arg-type]
    assert not output.exists()
    finished = len(list(parts_folder(output).glob("part-*.jsonl")))
    assert finished < 9
    counting = StopsAfter(bert_engine, 0)
    report = run(counting, JobOptions(source, output, part_rows=2))  # type: ignore[arg-type]
    assert report.resumed == 2 * finished and report.rows == 18
    assert counting.calls == 9 - finished  # a pass per part (two texts each), the unfinished ones only
    assert output_rows(output) == output_rows(whole)
    assert [row["id"] for row in output_rows(output)] == list(range(18))


def test_parts_of_another_model_or_other_parameters_are_refused_and_overwrite_starts_over(
    tmp_path: Path, bert_engine: FillMaskEngine
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"{i} [MASK]."} for i in range(6)])
    output = tmp_path / "out.csv"
    with pytest.raises(KeyboardInterrupt):
        run(StopsAfter(bert_engine, 2), JobOptions(source, output, part_rows=2))  # type: ignore[arg-type]
    with pytest.raises(JobMismatch, match=r"model\.revision: 'r1' -> 'r2'.*--overwrite"):
        run(bert_engine, JobOptions(source, output, part_rows=2), revision="r2")
    with pytest.raises(JobMismatch, match=r"parameters\.top_k: None -> 3"):
        run(bert_engine, JobOptions(source, output, part_rows=2, parameters={"top_k": 3}))
    with pytest.raises(JobMismatch, match=r"settings\.default_top_k: 5 -> 2"):
        run(bert_engine, JobOptions(source, output, part_rows=2), default_top_k=2)
    report = run(bert_engine, JobOptions(source, output, part_rows=2, overwrite=True), revision="r2")
    assert report.resumed == 0 and report.rows == 6


def test_a_finished_output_is_not_run_again_unless_asked_and_another_jobs_is_refused(
    tmp_path: Path, bert_engine: FillMaskEngine
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a [MASK]."}])
    output = tmp_path / "out.parquet"
    run(bert_engine, JobOptions(source, output))
    again = run(StopsAfter(bert_engine, 1), JobOptions(source, output))  # type: ignore[arg-type]
    assert again.already_complete and again.rows == 1
    with pytest.raises(JobMismatch, match="exists and was not made by this job"):
        run(bert_engine, JobOptions(source, output, task="score"))
    assert run(bert_engine, JobOptions(source, output, task="score", overwrite=True)).rows == 1


@pytest.mark.parametrize(
    ("fixture", "needed"),
    [("onnx_bert_engine", (HAS_ONNXRUNTIME, NO_ONNXRUNTIME)), ("ov_bert_engine", (HAS_OPENVINO, NO_OPENVINO))],
)
def test_a_graph_backend_answers_the_job_as_torch_does(
    tmp_path: Path, bert_engine: FillMaskEngine, request: pytest.FixtureRequest, fixture: str, needed: tuple[bool, str]
) -> None:
    if not needed[0]:
        pytest.skip(needed[1])
    graph: FillMaskModel = request.getfixturevalue(fixture)
    for task, rows in (("fill-mask", FILL_ROWS), ("score", SCORE_ROWS)):
        source = write_jsonl(tmp_path / f"{task}.jsonl", rows)
        run(bert_engine, JobOptions(source, tmp_path / f"{task}-torch.jsonl", task=task))
        run(graph, JobOptions(source, tmp_path / f"{task}-graph.jsonl", task=task))
        assert_close(output_rows(tmp_path / f"{task}-graph.jsonl"), output_rows(tmp_path / f"{task}-torch.jsonl"))
