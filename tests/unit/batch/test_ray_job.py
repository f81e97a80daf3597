"""batch/ray_job.py: ``--ray local`` on a real local Ray cluster gives the same rows as a local run,
error rows included, and the public callable class answers a batch as the job does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from maskserve.batch.formats import read_rows
from maskserve.config.bounds import settings_from
from tests.live_server import run_maskserve

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'maskserve[ray]'")

pytestmark = pytest.mark.slow

LINES = [
    json.dumps({"text": "the cat sat on the [MASK]."}),
    json.dumps({"id": "own", "text": "paris is the [MASK] of france.", "parameters": {"top_k": 2}}),
    json.dumps({"id": "words", "text": "the [MASK] sat on the mat.", "parameters": {"whole_words": True, "top_k": 3}}),
    "not json",
    json.dumps({"text": "no mask."}),
    *(json.dumps({"text": f"the dog number {i} ate the [MASK]."}) for i in range(40)),
]


def batch(*args: str) -> subprocess.CompletedProcess[str]:
    return run_maskserve("batch", *args, "--threads", "1", "--quiet", timeout_s=600)


def rows_of(path: Path) -> list[dict[str, object]]:
    return [row for rows in read_rows(path, 10_000) for row in rows]


def test_ray_local_gives_the_same_rows_as_a_local_run_error_rows_included(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(LINES) + "\n")
    here, on_ray = tmp_path / "here.jsonl", tmp_path / "ray.jsonl"
    for output, extra in ((here, ()), (on_ray, ("--ray", "local", "--ray-actors", "2"))):
        done = batch(str(source), str(output), "--part-rows", "10", *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "batch: 45 rows: 43 results, 2 errors" in done.stderr
    local, remote = rows_of(here), rows_of(on_ray)
    assert [row["id"] for row in remote] == [0, "own", "words", 3, 4, *range(5, 45)]
    assert [row.get("error") for row in remote] == [row.get("error") for row in local]
    for mine, theirs in zip(local, remote, strict=True):
        if "result" in mine:  # the same answers; scores within float noise of other batch-mates
            assert [p["token_str"] for p in theirs["result"]] == [p["token_str"] for p in mine["result"]]
            assert [p["score"] for p in theirs["result"]] == pytest.approx(
                [p["score"] for p in mine["result"]], abs=1e-5
            )


def test_the_public_callable_class_answers_a_batch_as_a_job_does(bert_dir: Path) -> None:
    from maskserve.batch.ray_job import MaskserveRows

    rows = MaskserveRows(settings=settings_from({"model": (str(bert_dir),), "threads": 1}), task="score")
    answered = rows({"text": ["the cat sat.", ""], "id": ["a", None]})
    assert answered["id"] == ['"a"', "null"]
    assert json.loads(answered["result"][0])["score"] < 0 and answered["error"][0] is None
    assert answered["result"][1] is None and json.loads(answered["error"][1])["type"] == "invalid_input"


def test_ray_local_finishes_when_one_actor_holds_every_cpu_of_the_cluster(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(LINES) + "\n")
    # --threads as many as the cluster's CPUs (the default on a machine of two): the one actor holds
    # them all, and every other step of the pipeline must still run.
    cpus = str(os.cpu_count() or 1)
    done = run_maskserve(
        "batch", str(source), str(tmp_path / "out.jsonl"), "--ray", "local", "--threads", cpus, "--quiet", timeout_s=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch: 45 rows: 43 results, 2 errors" in done.stderr
