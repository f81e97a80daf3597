"""BLiMP with ``maskserve batch``: every minimal pair's two sentences scored, accuracy per paradigm.

    python examples/blimp.py PATH/TO/blimp/data                     # all 67 paradigms, both metrics
    python examples/blimp.py benchmarks/data/blimp-sample.jsonl --metrics original
    python examples/blimp.py DATA --model bert-base-cased -- --threads 8 --dtype bfloat16

DATA is BLiMP's ``data/`` folder (its 67 ``*.jsonl`` files) or one JSON Lines file of its pairs.
A pair counts as right when the model scores its good sentence higher than its bad one; a paradigm's
accuracy is the share of its pairs that are right, and the overall accuracy the mean over the
paradigms, as BLiMP reports it.

The scoring is the command a user runs, ``maskserve batch INPUT OUTPUT --task score --parameters
'{"metric": M}'``, one job per metric over one input (each row's id ``UID/pairID/good|bad``). The
jobs write to ``--work``: run the same command again after a crash or Ctrl-C and each job goes on
from its last finished part. Flags after ``--`` go to ``maskserve batch`` as they are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

METRICS = ("original", "within_word_l2r")
SIDES = ("good", "bad")


def read_pairs(data: Path) -> list[dict[str, Any]]:
    """BLiMP's pairs from its ``data/`` folder (files in name order) or one ``.jsonl`` file."""
    files = sorted(data.glob("*.jsonl")) if data.is_dir() else [data]
    if not files:
        raise SystemExit(f"{data}: no *.jsonl files (give BLiMP's data/ folder or one of its files)")
    pairs = []
    for path in files:
        with path.open(encoding="utf-8") as lines:
            pairs += [json.loads(line) for line in lines if line.strip()]
    return pairs


def write_input(pairs: Sequence[dict[str, Any]], path: Path) -> int:
    """One row per sentence, ``{"id": "UID/pairID/good", "text": ...}``; the number of rows.

    Written only when its content changed, so that a job resumed over it finds its input as it was.
    """
    rows = "".join(
        json.dumps({"id": row_id(pair, side), "text": pair[f"sentence_{side}"]}) + "\n"
        for pair in pairs
        for side in SIDES
    )
    if not path.exists() or path.read_text(encoding="utf-8") != rows:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rows, encoding="utf-8")
    return 2 * len(pairs)


def row_id(pair: dict[str, Any], side: str) -> str:
    return f"{pair['UID']}/{pair['pairID']}/{side}"


def batch_command(input_path: Path, output: Path, metric: str, model: str | None, extra: Sequence[str]) -> list[str]:
    """The ``maskserve batch`` command of one metric's job."""
    command = [sys.executable, "-m", "maskserve", "batch", str(input_path), str(output), "--task", "score"]
    command += ["--parameters", json.dumps({"metric": metric})]
    return command + (["--model", model] if model else []) + list(extra)


def read_scores(output: Path) -> Iterator[tuple[str, float | None]]:
    """Each output row's id and score (``None`` for an error row)."""
    with output.open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            yield row["id"], row["result"]["score"] if "result" in row else None


def accuracies(pairs: Sequence[dict[str, Any]], scores: dict[str, float | None]) -> tuple[dict[str, float], int]:
    """Per paradigm, the percentage of its pairs whose good sentence scores higher; and how many
    pairs were left out because a sentence of theirs has an error instead of a score."""
    right: dict[str, list[bool]] = defaultdict(list)
    left_out = 0
    for pair in pairs:
        good, bad = (scores.get(row_id(pair, side)) for side in SIDES)
        if good is None or bad is None:
            left_out += 1
            continue
        right[pair["UID"]].append(good > bad)
    return {uid: 100.0 * sum(hits) / len(hits) for uid, hits in right.items()}, left_out


def overall(per_paradigm: dict[str, float]) -> float:
    """BLiMP's overall accuracy: the mean over the paradigms (each weighs the same)."""
    return statistics.fmean(per_paradigm.values())


def table(pairs: Sequence[dict[str, Any]], results: dict[str, dict[str, float]]) -> str:
    """A Markdown table: a row per paradigm, a row per phenomenon (BLiMP's ``linguistics_term``,
    the mean of its paradigms) and the overall row, a column per metric."""
    metrics = list(results)
    count: dict[str, int] = defaultdict(int)
    term: dict[str, str] = {}
    for pair in pairs:
        count[pair["UID"]] += 1
        term[pair["UID"]] = pair.get("linguistics_term", "")
    head = ["| paradigm | pairs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    lines = head + [
        f"| {uid} | {count[uid]} | " + " | ".join(f"{results[m].get(uid, float('nan')):.1f}" for m in metrics) + " |"
        for uid in sorted(count)
    ]
    lines += ["", "| phenomenon | paradigms | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for name in sorted(set(term.values())):
        uids = [uid for uid in count if term[uid] == name]
        means = [statistics.fmean(results[m][u] for u in uids if u in results[m]) for m in metrics]
        lines.append(f"| {name} | {len(uids)} | " + " | ".join(f"{value:.1f}" for value in means) + " |")
    totals = " | ".join(f"**{overall(results[m]):.1f}**" for m in metrics)
    lines.append(f"| **overall** (mean of {len(count)} paradigms, {len(pairs)} pairs) | {len(count)} | {totals} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    extra = args_list[args_list.index("--") + 1 :] if "--" in args_list else []
    own = args_list[: args_list.index("--")] if "--" in args_list else args_list
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="BLiMP's data/ folder, or one .jsonl file of its pairs")
    parser.add_argument("--model", default=None, help="maskserve's --model [default: maskserve's default model]")
    parser.add_argument("--metrics", nargs="+", choices=METRICS, default=list(METRICS))
    parser.add_argument("--work", type=Path, default=Path("blimp-work"), help="the jobs' input and outputs")
    args = parser.parse_args(own)
    pairs = read_pairs(args.data)
    input_path = args.work / "sentences.jsonl"
    rows = write_input(pairs, input_path)
    print(f"{len(pairs)} pairs, {rows} sentences -> {input_path}", file=sys.stderr, flush=True)
    results: dict[str, dict[str, float]] = {}
    for metric in args.metrics:
        output = args.work / f"scores-{metric}.jsonl"
        done = subprocess.run(batch_command(input_path, output, metric, args.model, extra), check=False)
        if done.returncode != 0:
            print(f"maskserve batch exited with {done.returncode}: run the same command again", file=sys.stderr)
            return done.returncode
        results[metric], left_out = accuracies(pairs, dict(read_scores(output)))
        if left_out:
            print(f"{metric}: {left_out} pairs left out (an error row; see {output})", file=sys.stderr)
    print(table(pairs, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
