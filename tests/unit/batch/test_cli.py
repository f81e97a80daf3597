"""``maskserve batch`` as a user runs it: every format in and out, a SIGKILL at several points and
the same command again, progress on and off a terminal, and the refusals' exit codes."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from maskserve.batch.formats import read_rows
from maskserve.batch.parts import parts_folder
from tests.live_server import child_env, maskserve_command, run_maskserve

pytestmark = pytest.mark.slow

WORDS = ("cat", "dog", "man", "bird", "house", "car", "tree")


def batch(*args: str) -> subprocess.CompletedProcess[str]:
    return run_maskserve("batch", *args, "--threads", "1", timeout_s=300)


def start(*args: str) -> subprocess.Popen[bytes]:
    command = maskserve_command("batch", *args, "--threads", "1", "--quiet")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())


def texts(count: int) -> list[str]:
    return [f"the {WORDS[i % 7]} number {i} sat on the [MASK]." for i in range(count)]


def rows_of(path: Path) -> list[dict[str, object]]:
    return [row for rows in read_rows(path, 10_000) for row in rows]


def test_every_format_in_and_out_gives_the_same_rows(tmp_path: Path) -> None:
    lines = texts(5) + ["no mask here."]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(lines)))
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(6)], "text": lines}), parquet)
    csv = tmp_path / "in.csv"
    pa_csv.write_csv(pa.table({"id": [f"r{i}" for i in range(6)], "text": lines}), csv)
    outputs = {"jsonl": tmp_path / "out.parquet", "parquet": tmp_path / "out.csv", "csv": tmp_path / "out.jsonl"}
    for source, output in zip((jsonl, parquet, csv), outputs.values()):
        done = batch(str(source), str(output), "--parameters", '{"top_k": 3}')
        assert done.returncode == 0, done.stderr
        assert "batch: 6 rows: 5 results, 1 errors" in done.stderr
    as_json = {name: [(row["id"], _value(row)) for row in rows_of(path)] for name, path in outputs.items()}
    assert as_json["jsonl"] == as_json["parquet"] == as_json["csv"]
    assert [ident for ident, _ in as_json["csv"]] == [f"r{i}" for i in range(6)]
    assert as_json["csv"][5][1]["type"] == "no_mask_token"  # type: ignore[index]
    assert pq.read_schema(outputs["jsonl"]).metadata[b"maskserve"]  # Parquet keeps its description inside
    assert json.loads((tmp_path / "out.csv.meta.json").read_text())["model"]["source"] == "default"


def _value(row: dict[str, object]) -> object:
    """A row's answer or error as JSON, whichever format held it."""
    for key in ("result", "error"):
        value = row.get(key)
        if value:
            return json.loads(value) if isinstance(value, str) else value
    raise AssertionError(row)


def test_a_job_killed_at_several_points_ends_as_an_unkilled_one(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(1500)))
    whole = tmp_path / "whole.jsonl"
    assert batch(str(source), str(whole), "--part-rows", "50", "--quiet").returncode == 0
    output = tmp_path / "out.jsonl"
    parts = parts_folder(output)
    seen = 0
    for at in (1, 10, 20):  # parts written before the kill, each kill resuming the last
        job = start(str(source), str(output), "--part-rows", "50")
        deadline = time.monotonic() + 240
        while len(list(parts.glob("part-*.jsonl"))) < at and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        job.send_signal(signal.SIGKILL)
        job.wait(30)
        finished = len(list(parts.glob("part-*.jsonl")))
        assert finished >= seen  # a kill loses nothing finished
        seen = finished
    assert not output.exists() and 0 < seen < 30
    done = batch(str(source), str(output), "--part-rows", "50")
    assert done.returncode == 0, done.stderr
    assert f"1500 rows, {seen * 50} of them finished by an earlier run" in done.stderr
    assert rows_of(output) == rows_of(whole)  # each row once, in order, answered as an unkilled run
    assert not parts.exists()


def test_progress_is_a_bar_on_a_terminal_lines_elsewhere_and_nothing_when_quiet(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40)))
    plain = batch(str(source), str(tmp_path / "a.jsonl"), "--part-rows", "10")
    assert plain.returncode == 0
    assert "batch: 40/40 rows (100.0%)" in plain.stderr and "\r" not in plain.stderr
    quiet = batch(str(source), str(tmp_path / "b.jsonl"), "--quiet")
    assert quiet.returncode == 0 and quiet.stderr.strip().splitlines() == [quiet.stderr.strip().splitlines()[-1]]
    assert quiet.stderr.startswith("batch: 40 rows: 40 results, 0 errors")
    # On a terminal: tqdm's bar, redrawn in place, with rows/s.
    leader, follower = pty.openpty()
    command = maskserve_command("batch", str(source), str(tmp_path / "c.jsonl"), "--threads", "1")
    job = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=child_env())
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the job
            break
        if not chunk:
            break
        shown += chunk
    assert job.wait(120) == 0
    os.close(leader)
    assert b"\r" in shown and b"rows/s" in shown and b"40/40" in shown


def test_refusals_exit_2_or_1_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    good = tmp_path / "in.jsonl"
    good.write_text(json.dumps({"text": "a [MASK]."}) + "\n")
    no_text = tmp_path / "other.jsonl"
    no_text.write_text(json.dumps({"sentence": "a [MASK]."}) + "\n")
    cases = {
        "format": ((str(good), str(tmp_path / "out.txt")), 2, "unknown format '.txt'"),
        "column": ((str(no_text), str(tmp_path / "out.jsonl")), 2, "has no 'text' column (its columns: sentence)"),
        "parameters": ((str(good), str(tmp_path / "o.jsonl"), "--parameters", "[1]"), 2, "must be a JSON object"),
        "flag": ((str(good), str(tmp_path / "o.jsonl"), "--max-batch-size", "0"), 2, "--max-batch-size"),
        "unknown": ((str(good), str(tmp_path / "o.jsonl"), "--no-such-flag"), 2, "No such option '--no-such-flag'"),
        "model": ((str(good), str(tmp_path / "o.jsonl"), "--model", str(tmp_path / "none")), 1, "no such folder"),
    }
    for name, (args, code, says) in cases.items():
        done = batch(*args)
        assert done.returncode == code, (name, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)


def test_help_prints_the_options_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    from maskserve.batch.cli import main

    # In-process: click, out of its standalone mode, answers --help with a return value, not an exception.
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "Usage: maskserve batch [OPTIONS] INPUT OUTPUT" in shown and "--ray ADDRESS" in shown
