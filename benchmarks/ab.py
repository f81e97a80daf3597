"""maskserve now against maskserve at an earlier revision, in one run: is anything slower?

    python -m benchmarks.ab --baseline 34b2f2f [--models default,bert-base] [--rounds 3]

The baseline's ``src/`` is checked out into a temporary git worktree and served with this
environment's Python (``PYTHONPATH``), so both run on the same libraries; the two servers take
turns in closed loops at each concurrency (the other paused), and every answer is checked. The
table gives each one's req/s (median of the rounds) and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import offline
from .load import run_load
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import QUICK, warm_up
from .sentences import make_sentences
from .servers import Server, free_port, maskserve_argv

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The tree at ``revision`` in a temporary worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="maskserve-ab-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def compare(model: BenchModel, key: str, baseline: Path, revision: str, rounds: int) -> list[str]:
    plan = QUICK[key]  # the quick benchmark's mix and request counts, at c=8 and c=64
    pipe = offline.load_pipeline(str(model.path))
    sentences = make_sentences(plan.mix)
    expected, _ = offline.reference_answers(pipe, sentences)
    logs = CACHE_DIR / "logs" / "ab" / key
    now = Server("now", maskserve_argv(model.path, port := free_port()), port, logs / "now.log")
    then = Server(
        revision,
        maskserve_argv(model.path, port := free_port()),
        port,
        logs / "baseline.log",
        env={"PYTHONPATH": str(baseline / "src")},
    )
    rates: dict[tuple[str, int], list[float]] = {}
    with now, then:
        for server in (now, then):
            warm_up(server, sentences, expected, plan)
            server.pause()
        for i in range(rounds):
            order = (now, then) if i % 2 == 0 else (then, now)
            for server in order:
                server.resume()
                for c, requests in plan.requests.items():
                    result = asyncio.run(
                        run_load(server.url, sentences, expected, concurrency=c, requests=requests, time_cap_s=120)
                    )
                    if result.correct != requests:
                        raise SystemExit(f"{server.name} c={c}: {result.correct}/{requests} correct")
                    rates.setdefault((server.name, c), []).append(result.rps)
                    print(f"round {i + 1} {server.name:>8} c={c:<3} {result.rps:8.1f} req/s", flush=True)
                server.pause()
    lines = [
        f"| {model.name} | concurrency | now req/s | {revision} req/s | now / {revision} |",
        "|---|---|---|---|---|",
    ]
    for c in plan.requests:
        a, b = rates["now", c], rates[revision, c]
        per_round = statistics.median(x / y for x, y in zip(a, b))
        lines.append(f"| | {c} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | {per_round:.2f}× |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ab", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--models", default="default,bert-base")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    builders = {"default": default_model, "bert-base": bert_base_model}
    with checkout(args.baseline) as baseline:
        for key in args.models.split(","):
            print("\n".join(compare(builders[key](), key, baseline, args.baseline, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
