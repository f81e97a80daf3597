"""``maskserve batch --task score`` on BLiMP's sentences against minicons and ``POST /score``, in one run.

    python -m benchmarks.batch --blimp PATH/TO/blimp/data      # a 6,700-sentence subset of BLiMP
    python -m benchmarks.batch --blimp PATH/TO/blimp/data --full-accuracy
    python -m benchmarks.batch --quick                         # the shipped sample, one round

On the default model (nothing is downloaded here). The sentences are the first pairs of each of
BLiMP's paradigms (``--sentences``; the shipped 201-pair sample without ``--blimp``), written as the
example writes them (examples/blimp.py: a row per sentence, id ``UID/pairID/good|bad``). Rounds
take turns between minicons' ``MaskedLMScorer.sequence_score`` in this process (batch 32 and 64),
``POST /score`` on a maskserve server (8 closed-loop clients, 8 texts a request; paused while the
others run) and the ``maskserve batch`` command as a user runs it; ratios are taken inside each
round. Then, once: BLiMP's accuracy from the job's output and from minicons' scores (both
metrics), the job killed (SIGKILL) once half its parts exist and run again, and the job on
``--ray local``. minicons is installed as benchmarks/score.py says.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

import maskserve
from maskserve.config.cpus import available_cpus

from .agreement import cpu_line
from .batch_steps import (
    SAMPLE,
    Command,
    Resumed,
    batch_argv,
    example,
    first_pairs,
    kill_half_way,
    largest_difference,
    minicons_pass,
    read_output,
    run_batch,
    score_requests,
    sentences_of,
)
from .models import CACHE_DIR, BenchModel, default_model
from .run import cpu_model
from .score import MINICONS_VERSION, minicons_scorer, minicons_version
from .servers import Server, free_port, maskserve_argv

RESULTS = Path(__file__).resolve().parent / "results" / "batch.md"
WORK = CACHE_DIR / "batch"
METRICS = ("original", "within_word_l2r")
BATCH_SIZES = (32, 64)
CONCURRENCY, PER_REQUEST = 8, 8
# A closed loop of 8 clients of 8 texts measures the server's rate, not its shedding: up to 64 texts of
# every masked copy wait at once.
SERVE_FLAGS = ("--max-queue", "8192", "--request-timeout", "600")
# Parts per job: the kill step stops the job once half of them exist.
PARTS = 10
# The targets.
TARGET_MINICONS, TARGET_SERVER, TARGET_POINTS, TARGET_RESUME, TARGET_RAY = 3.0, 1.3, 0.2, 0.75, 1.5
# Two runs of one job, on one machine or on Ray, score each text in batches of other shapes.
TOLERANCE = 1e-4


@dataclass
class Round:
    minicons: dict[int, float] = field(default_factory=dict)
    server: float = 0.0
    batch: Command | None = None
    resumed: Resumed | None = None  # killed half-way right after the uninterrupted run, then run again


@dataclass
class Run:
    model: BenchModel
    source: str
    pairs: list[dict[str, Any]]
    texts: list[str]
    few: list[dict[str, Any]]  # the pairs minicons scores too
    rounds: list[Round] = field(default_factory=list)
    accuracy: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric: (batch, minicons)
    server_difference: float = math.nan
    resumed_same: bool = False  # every killed job's final output is the uninterrupted one's
    ray: Command | None = None
    ray_same: tuple[bool, float] = (False, math.nan)
    full: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric: (accuracy, job's seconds)

    def batch_wall(self) -> float:
        return statistics.median(r.batch.wall_s for r in self.rounds if r.batch)


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def measure(
    blimp_dir: Path | None,
    sentences: int,
    minicons_pairs: int,
    rounds: int,
    *,
    ray: bool,
    full: bool,
    work: Path = WORK,
) -> Run:
    blimp, model, env = example(), default_model(), environment()
    all_pairs = blimp.read_pairs(blimp_dir or SAMPLE)
    paradigms = len({pair["UID"] for pair in all_pairs})
    pairs = first_pairs(all_pairs, math.ceil(sentences / (2 * paradigms))) if blimp_dir else all_pairs
    ids, texts = sentences_of(pairs, blimp)
    # minicons is an order of magnitude slower: it scores the first few pairs of each paradigm.
    few = first_pairs(pairs, minicons_pairs)
    few_ids, few_texts = sentences_of(few, blimp)
    source = f"BLiMP, the first {len(pairs) // paradigms} pairs of each of its {paradigms} paradigms"
    run = Run(model, source if blimp_dir else f"the shipped sample ({SAMPLE.name})", pairs, texts, few)
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / "sentences.jsonl"
    blimp.write_input(pairs, input_path)
    part_rows = ("--part-rows", str(math.ceil(len(texts) / PARTS)))
    local = work / "scores-original.jsonl"
    job = batch_argv(blimp, input_path, local, "original", model.path, "--overwrite", *part_rows)
    killed = work / "scores-killed.jsonl"
    killing = batch_argv(blimp, input_path, killed, "original", model.path, "--overwrite", *part_rows)
    torch.set_num_threads(available_cpus())
    scorer = minicons_scorer(model.path)
    minicons_pass(scorer, few_texts[:64], 32, "original")  # warm-up
    port = free_port()
    server = Server("maskserve", maskserve_argv(model.path, port, *SERVE_FLAGS), port, work / "server.log")
    minicons_scores: list[float] = []
    try:
        log("starting the server")
        server.start()
        url = server.url + "score"
        _, warm = asyncio.run(
            score_requests(url, texts, concurrency=CONCURRENCY, per_request=PER_REQUEST, metric="original")
        )
        server.pause()
        for number in range(rounds):
            round_ = Round()
            steps = ["minicons", "server", "batch"]
            for step in steps[number % 3 :] + steps[: number % 3]:
                if step == "minicons":
                    for size in BATCH_SIZES:
                        round_.minicons[size], minicons_scores = minicons_pass(scorer, few_texts, size, "original")
                        log(f"round {number + 1} minicons batch {size}: {round_.minicons[size]:.1f} sentences/s")
                elif step == "server":
                    server.resume()
                    round_.server, _ = asyncio.run(
                        score_requests(url, texts, concurrency=CONCURRENCY, per_request=PER_REQUEST, metric="original")
                    )
                    server.pause()
                    log(f"round {number + 1} POST /score c={CONCURRENCY}: {round_.server:.1f} sentences/s")
                else:
                    round_.batch = run_batch(job, env)
                    log(f"round {number + 1} batch: {round_.batch.rate:.1f} rows/s (job), {round_.batch.wall_s:.1f} s")
                    # Right after the uninterrupted run, so that the ratio's two sides share the machine.
                    round_.resumed = kill_half_way(killing, env, killed, len(texts), int(part_rows[1]))
                    same, largest = largest_difference(read_output(killed), read_output(local))
                    run.resumed_same = (number == 0 or run.resumed_same) and same and largest <= TOLERANCE
                    log(f"round {number + 1} killed, again: {round_.resumed.second.wall_s:.1f} s")
            run.rounds.append(round_)
    finally:
        server.stop()
    output = read_output(local)
    run.server_difference = max(abs(output[ids[k]]["score"] - score) for k, score in warm.items())
    best = max(BATCH_SIZES, key=lambda size: statistics.median(r.minicons[size] for r in run.rounds))
    for metric in METRICS:
        if metric != "original":
            out = work / f"scores-{metric}.jsonl"
            run_batch(batch_argv(blimp, input_path, out, metric, model.path, "--overwrite"), env)
            output = read_output(out)
            _, minicons_scores = minicons_pass(scorer, few_texts, best, metric)
            log(f"{metric}: scored by both")
        # On the pairs both scored.
        ours, _ = blimp.accuracies(few, {k: v.get("score") for k, v in output.items()})
        theirs, _ = blimp.accuracies(few, dict(zip(few_ids, minicons_scores, strict=True)))
        run.accuracy[metric] = (blimp.overall(ours), blimp.overall(theirs))
    if ray:
        on_ray = work / "scores-ray.jsonl"
        run.ray = run_batch(
            [*batch_argv(blimp, input_path, on_ray, "original", model.path, "--overwrite"), "--ray", "local"], env
        )
        run.ray_same = largest_difference(read_output(on_ray), read_output(local))
        log(f"--ray local: {run.ray.wall_s:.1f} s, same rows {run.ray_same}")
    if full and blimp_dir:
        blimp.write_input(all_pairs, work / "all.jsonl")
        for metric in METRICS:
            out = work / f"all-{metric}.jsonl"
            # Not --overwrite: an interrupted full run goes on from its parts.
            command = run_batch(batch_argv(blimp, work / "all.jsonl", out, metric, model.path), env)
            per_paradigm, _ = blimp.accuracies(all_pairs, {k: v.get("score") for k, v in read_output(out).items()})
            run.full[metric] = (blimp.overall(per_paradigm), command.job_s)
            log(f"full BLiMP, {metric}: {run.full[metric][0]:.2f}")
    return run


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def render(run: Run, command: str) -> str:
    rounds = [r for r in run.rounds if r.batch]
    job = [r.batch.rate for r in rounds if r.batch]
    whole = [r.batch.whole_rate for r in rounds if r.batch]
    best = [max(r.minicons.values()) for r in rounds]
    to_minicons = [r.batch.rate / max(r.minicons.values()) for r in rounds if r.batch]
    whole_to_minicons = [r.batch.whole_rate / max(r.minicons.values()) for r in rounds if r.batch]
    to_server = [r.batch.rate / r.server for r in rounds if r.batch]
    whole_to_server = [r.batch.whole_rate / r.server for r in rounds if r.batch]
    n = len(run.texts)
    lines = [
        "# maskserve batch on BLiMP against minicons and POST /score",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, nproc {available_cpus()}; "
        f"Python {platform.python_version()}, maskserve {maskserve.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, minicons {minicons_version()}, ray {ray_version()}",
        f"- {cpu_line()}",
        f"- model: {run.model.name}, the only model here (no model can be downloaded on this machine); "
        "its figures are not comparable to published BLiMP figures of real models",
        f"- sentences: {source_line(run)}",
        f"- {len(rounds)} rounds taking turns (minicons, the server, the job); figures: median of the rounds "
        "(min–max); ratios: median of the per-round ratios",
        "",
        "| system | sentences/s |",
        "|---|---|",
        *(f"| minicons `sequence_score`, batch {b} | {spread([r.minicons[b] for r in rounds])} |" for b in BATCH_SIZES),
        f"| `POST /score`, c={CONCURRENCY}, {PER_REQUEST} texts a request | {spread([r.server for r in rounds])} |",
        f"| `maskserve batch --task score`, as the job reports it | {spread(job)} |",
        f"| `maskserve batch --task score`, the whole command (start, imports, model load) | {spread(whole)} |",
        "",
        f"Largest \\|score − `POST /score`'s\\| over the {n} sentences: {run.server_difference:.2g}.",
        "",
        "| target | figure | verdict |",
        "|---|---|---|",
        f"| job ≥ {TARGET_MINICONS}× minicons' best (batch {'/'.join(map(str, BATCH_SIZES))}) | "
        f"{spread(to_minicons, '{:.2f}')}× (whole command: {spread(whole_to_minicons, '{:.2f}')}×; minicons' best "
        f"{spread(best)}/s) | {verdict(statistics.median(to_minicons) >= TARGET_MINICONS)} |",
        f"| job ≥ {TARGET_SERVER}× `POST /score` c={CONCURRENCY} | {spread(to_server, '{:.2f}')}× (whole command: "
        f"{spread(whole_to_server, '{:.2f}')}×) | {verdict(statistics.median(to_server) >= TARGET_SERVER)} |",
    ]
    for metric, (ours, theirs) in run.accuracy.items():
        lines.append(
            f"| BLiMP accuracy, `{metric}`, maskserve batch = minicons within {TARGET_POINTS} points | "
            f"{ours:.2f} against {theirs:.2f} ({abs(ours - theirs):.2f} points) | "
            f"{verdict(round(abs(ours - theirs), 6) <= TARGET_POINTS)} |"
        )
    killed = [r.resumed for r in rounds if r.resumed]
    if killed:
        shares = [r.resumed.second.wall_s / r.batch.wall_s for r in rounds if r.resumed and r.batch]
        at = ", ".join(f"{k.parts_at_kill}/{k.parts}" for k in killed)
        kept = ", ".join(str(k.resumed_rows) for k in killed)
        lines.append(
            f"| killed once half its parts existed, run again: the second run < {TARGET_RESUME}× an uninterrupted "
            f"run (the round's own) | {spread(shares, '{:.2f}')}× (second runs "
            f"{spread([k.second.wall_s for k in killed])} s; parts at the kill: {at}; rows kept: {kept}; final "
            f"output {'equal to' if run.resumed_same else 'NOT equal to'} an uninterrupted run's) | "
            f"{verdict(statistics.median(shares) < TARGET_RESUME and run.resumed_same)} |"
        )
    if run.ray:
        share = run.ray.wall_s / run.batch_wall()
        same, largest = run.ray_same
        lines.append(
            f"| `--ray local` ({available_cpus()} CPUs) within {TARGET_RAY}× the local run, cluster start included, "
            f"same rows | {share:.2f}× ({run.ray.wall_s:.1f} s against {run.batch_wall():.1f} s); ids and errors "
            f"{'the same' if same else 'DIFFERENT'}, largest score difference {largest:.2g} | "
            f"{verdict(share <= TARGET_RAY and same and largest <= TOLERANCE)} |"
        )
    if run.full:
        lines += [
            "",
            "BLiMP, all pairs, `maskserve batch` on the default model (overall: the mean over the paradigms):",
            "",
        ]
        lines += [f"- `{metric}`: {acc:.2f}% (the job took {s:.0f} s)" for metric, (acc, s) in run.full.items()]
    return "\n".join(lines) + "\n"


def source_line(run: Run) -> str:
    distinct = len(set(run.texts))
    per_paradigm = len(run.few) // len({pair["UID"] for pair in run.few})
    return (
        f"{run.source}: {len(run.pairs)} pairs, {len(run.texts)} sentences ({distinct} distinct), for the job and "
        f"the server; minicons scores the first {per_paradigm} pairs of each paradigm ({len(run.few)} pairs, "
        f"{2 * len(run.few)} sentences), and the accuracies are compared on those pairs"
    )


def ray_version() -> str:
    try:
        from importlib.metadata import version

        return version("ray")
    except Exception:  # noqa: BLE001  (not installed: --ray is skipped)
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch", description=__doc__.splitlines()[0])
    parser.add_argument("--blimp", type=Path, default=None, help="BLiMP's data/ folder [default: the shipped sample]")
    parser.add_argument("--sentences", type=int, default=6_700, help="with --blimp: about this many sentences")
    parser.add_argument(
        "--minicons-pairs", type=int, default=5, help="pairs of each paradigm minicons scores [default: 5]"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--full-accuracy", action="store_true", help="with --blimp: the job's accuracy on all pairs")
    parser.add_argument("--no-ray", action="store_true", help="leave out the --ray local step")
    parser.add_argument("--quick", action="store_true", help="the shipped sample, one round (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(args_list)
    if importlib.util.find_spec("minicons") is None:
        raise SystemExit(
            f"minicons is not installed: pip install --no-deps minicons=={MINICONS_VERSION} wonderwords pillow"
        )
    ray = not args.no_ray and importlib.util.find_spec("ray") is not None
    started = time.perf_counter()
    run = measure(
        None if args.quick else args.blimp,
        args.sentences,
        1 if args.quick else args.minicons_pairs,
        1 if args.quick else args.rounds,
        ray=ray,
        full=args.full_accuracy,
    )
    report = render(run, " ".join(["python -m benchmarks.batch", *args_list]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(report)
    log(f"written to {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
