"""Does maskserve's resident memory stay flat over a long mixed-length run?

    python -m benchmarks.memory_soak                    # 600 s on the default model
    python -m benchmarks.memory_soak --duration 120 --model DIR
    python -m benchmarks.memory_soak --flags "--backend openvino --quantize int8"

Starts maskserve as a subprocess, warms it up with one pass over the mix, then keeps a closed
loop of clients busy with the mixed-length sentences for ``--duration`` seconds (bounded by a
request count as well), sampling VmRSS every ``--interval`` seconds. torch's CPU allocator can
grow with every new tensor shape, and mixed lengths make many shapes: growth shows up here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from maskserve.config.cpus import available_cpus

from . import offline
from .load import LoadResult, run_load
from .models import CACHE_DIR, default_model
from .sentences import make_sentences
from .servers import RssSampler, Server, free_port, maskserve_argv, rss_bytes

MIB = 1024 * 1024


@dataclass(frozen=True)
class SoakReport:
    after_start: int  # bytes, model loaded, no traffic yet
    first: int  # bytes, after the warm-up pass: the baseline for growth
    last: int
    max: int
    samples: list[tuple[float, int]]
    load: LoadResult

    @property
    def growth(self) -> float:
        """Growth from the first sample after warm-up to the last, as a fraction."""
        return (self.last - self.first) / self.first

    def render(self) -> str:
        lines = [
            f"requests {self.load.sent}, correct {self.load.correct}, wrong {self.load.wrong}, "
            f"statuses {dict(self.load.statuses)}, {self.load.rps:.1f} req/s over {self.load.duration_s:.0f} s",
            f"RSS after start {self.after_start / MIB:.0f} MiB; after warm-up (first) {self.first / MIB:.0f} MiB; "
            f"last {self.last / MIB:.0f} MiB; max {self.max / MIB:.0f} MiB; growth {self.growth:+.1%} "
            f"(max {(self.max - self.first) / self.first:+.1%})",
            "samples (s: MiB): " + ", ".join(f"{t:.0f}: {b / MIB:.0f}" for t, b in self.samples),
        ]
        return "\n".join(lines)


def soak(
    model: Path,
    *,
    duration_s: float,
    interval_s: float,
    concurrency: int,
    mix: int,
    log_path: Path,
    flags: Sequence[str] = (),
) -> SoakReport:
    """Run the soak against a fresh maskserve subprocess serving ``model``."""
    torch.set_num_threads(available_cpus())
    pipe = offline.load_pipeline(str(model))
    sentences = make_sentences(mix)
    expected, _ = offline.reference_answers(pipe, sentences)
    del pipe  # the reference answers are all this process needs from the model
    with Server("maskserve", maskserve_argv(model, port := free_port(), *flags), port, log_path) as server:
        after_start = rss_bytes(server.pid)
        asyncio.run(
            run_load(server.url, sentences, expected, concurrency=concurrency, requests=mix, time_cap_s=duration_s)
        )
        sampler = RssSampler(server.pid, interval_s).start()
        # Bounded twice: by the duration, and by a request count no 2-core machine reaches in it.
        load = asyncio.run(
            run_load(
                server.url,
                sentences,
                expected,
                concurrency=concurrency,
                requests=int(duration_s * 5000),
                time_cap_s=duration_s,
            )
        )
        samples = sampler.stop()
    values = [b for _, b in samples]
    return SoakReport(after_start, values[0], values[-1], max(values), samples, load)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the default model)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mix", type=int, default=256, help="distinct sentences in the mix")
    parser.add_argument("--flags", default="", help='maskserve flags, e.g. "--backend openvino --quantize int8"')
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    model = args.model or default_model().path
    report = soak(
        model,
        duration_s=args.duration,
        interval_s=args.interval,
        concurrency=args.concurrency,
        mix=args.mix,
        log_path=CACHE_DIR / "logs" / "memory-soak.log",
        flags=args.flags.split(),
    )
    print(report.render())
    # Only float32 answers equal the pipeline's: int8 and bfloat16 differ in a few answers.
    exact = not any(flag in args.flags for flag in ("--quantize", "bfloat16"))
    return 0 if report.load.wrong == 0 or not exact else 1


if __name__ == "__main__":
    sys.exit(main())
