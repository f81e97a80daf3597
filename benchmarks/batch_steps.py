"""The measured steps of benchmarks/batch.py: BLiMP's sentences, a ``maskserve batch`` command as a
user runs it (whole, killed half-way, on Ray), minicons in this process and ``POST /score`` at c=8."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import math
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp

from maskserve.batch.parts import parts_folder

from .load import is_loopback

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "benchmarks" / "data" / "blimp-sample.jsonl"
EXAMPLE = ROOT / "examples" / "blimp.py"
# The job's own summary line: "batch: N rows: R results, E errors, in S s -> OUTPUT".
SUMMARY = re.compile(
    r"batch: (\d+) rows(?:, (\d+) of them finished by an earlier run)?: (\d+) results, (\d+) errors, in ([\d.]+) s"
)
# How often the kill step looks for the job's parts: a small share of one part's time.
POLL_S = 0.02


def example() -> ModuleType:
    """examples/blimp.py as a module: the benchmark's accuracies are the example's own."""
    spec = importlib.util.spec_from_file_location("blimp_example", EXAMPLE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_pairs(pairs: Sequence[dict[str, Any]], per_paradigm: int) -> list[dict[str, Any]]:
    """The first ``per_paradigm`` pairs of each paradigm, in file order: a deterministic subset that
    keeps every paradigm (and so an overall accuracy over all of them)."""
    taken: dict[str, int] = defaultdict(int)
    subset = []
    for pair in pairs:
        if taken[pair["UID"]] < per_paradigm:
            taken[pair["UID"]] += 1
            subset.append(pair)
    return subset


def sentences_of(pairs: Sequence[dict[str, Any]], blimp: ModuleType) -> tuple[list[str], list[str]]:
    """Each row's id and text, in the order of the job's input (good then bad, pair by pair)."""
    ids = [blimp.row_id(pair, side) for pair in pairs for side in blimp.SIDES]
    texts = [pair[f"sentence_{side}"] for pair in pairs for side in blimp.SIDES]
    return ids, texts


@dataclass
class Command:
    """One ``maskserve batch`` command: its wall time (process start to exit) and what it printed."""

    wall_s: float
    rows: int
    results: int
    errors: int
    job_s: float  # the job's own time, as its summary line gives it (after the model is loaded)

    @property
    def rate(self) -> float:
        """Rows/s as the job reports it."""
        return self.rows / self.job_s if self.job_s > 0 else math.nan

    @property
    def whole_rate(self) -> float:
        """Rows/s of the whole command: Python's start, imports and the model's load included."""
        return self.rows / self.wall_s


def batch_argv(blimp: ModuleType, input_path: Path, output: Path, metric: str, model: Path, *extra: str) -> list[str]:
    return blimp.batch_command(input_path, output, metric, str(model), ["--quiet", *extra])  # type: ignore[no-any-return]


def run_batch(argv: Sequence[str], env: dict[str, str]) -> Command:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    found = SUMMARY.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return command_of(found, wall)


def command_of(found: re.Match[str], wall_s: float) -> Command:
    rows, results, errors = (int(found[k]) for k in (1, 3, 4))
    return Command(wall_s, rows, results, errors, float(found[5]))


@dataclass
class Resumed:
    """A job killed with SIGKILL once half its parts exist, then the same command run again."""

    parts_at_kill: int
    parts: int
    first_s: float  # the killed run's wall time
    second: Command
    resumed_rows: int


def kill_half_way(argv: Sequence[str], env: dict[str, str], output: Path, rows: int, part_rows: int) -> Resumed:
    parts = math.ceil(rows / part_rows)
    folder = parts_folder(output)
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    found = 0
    while process.poll() is None:
        found = len(list(folder.glob("part-*.jsonl"))) if folder.is_dir() else 0
        if found >= parts / 2:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(POLL_S)
    process.wait()
    first = time.perf_counter() - started
    if process.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the job ended ({process.returncode}) before half its parts existed")
    again = [arg for arg in argv if arg != "--overwrite"]
    started = time.perf_counter()
    done = subprocess.run(again, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    summary = SUMMARY.search(done.stderr)
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"the resumed job exited with {done.returncode}: {done.stderr[-2000:]}")
    return Resumed(found, parts, first, command_of(summary, wall), int(summary[2] or 0))


def read_output(path: Path) -> dict[str, Any]:
    """Each output row's id and its result or error, as written."""
    with path.open(encoding="utf-8") as lines:
        return {row["id"]: row.get("result", row.get("error")) for row in map(json.loads, lines)}


def largest_difference(one: dict[str, Any], other: dict[str, Any]) -> tuple[bool, float]:
    """Whether two outputs hold the same ids with the same errors, and the largest score difference."""
    same = one.keys() == other.keys() and all(
        ("score" in one[k]) == ("score" in other[k]) and ("score" in one[k] or one[k] == other[k]) for k in one
    )
    differences = [abs(one[k]["score"] - other[k]["score"]) for k in one if "score" in one[k] and k in other]
    return same, max(differences, default=math.nan)


def minicons_pass(scorer: Any, texts: Sequence[str], batch_size: int, metric: str) -> tuple[float, list[float]]:
    """minicons' ``sequence_score`` over ``texts`` in batches: sentences/s, and each score."""
    scores: list[float] = []
    started = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        batch = list(texts[start : start + batch_size])
        scores += scorer.sequence_score(batch, reduction=lambda x: x.sum(0).item(), PLL_metric=metric)
    return len(texts) / (time.perf_counter() - started), scores


async def score_requests(
    url: str, texts: Sequence[str], *, concurrency: int, per_request: int, metric: str
) -> tuple[float, dict[int, float]]:
    """Every text once to ``url`` (``.../score``), ``per_request`` texts a JSON request, from
    ``concurrency`` closed-loop clients: sentences/s, and each text's score by its index."""
    host = url.split("//", 1)[-1].split(":", 1)[0]
    if not is_loopback(host):
        raise ValueError(f"load goes to loopback only, not {host!r}")
    chunks = [range(k, min(k + per_request, len(texts))) for k in range(0, len(texts), per_request)]
    counter = itertools.count()
    scores: dict[int, float] = {}

    async def client(session: aiohttp.ClientSession) -> None:
        while (n := next(counter)) < len(chunks):
            body = {"inputs": [texts[k] for k in chunks[n]], "parameters": {"metric": metric}}
            async with session.post(url, json=body) as response:
                answer = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"POST /score answered {response.status}: {answer}")
            for k, item in zip(chunks[n], answer, strict=True):
                scores[k] = item["score"]

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return len(scores) / elapsed, scores
