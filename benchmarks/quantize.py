"""--quantize int8 against float32: engine throughput and top-1 agreement on the benchmark sentences.

Both engines run in this process, in alternating rounds over the same batches (batches of 32,
sorted by length as maskserve's packing would form them), so the ratio is taken inside one run.
Agreement is the share of sentences whose top answer (token) is the same under int8 as under fp32.

    python -m benchmarks.quantize            # both models
    python -m benchmarks.quantize --models default --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from maskserve.engine import FillMaskEngine, load_engine
from maskserve.model_api import Query
from maskserve.settings import available_cpus

from .models import BenchModel, bert_base_model, default_model
from .sentences import make_sentences

BATCH = 32


def batches(engine: FillMaskEngine, sentences: Sequence[str]) -> list[list[Query]]:
    queries = sorted((Query(engine.encode(s), 1) for s in sentences), key=lambda q: len(q.input_ids))
    return [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]


def rate(engine: FillMaskEngine, work: list[list[Query]]) -> float:
    started = time.perf_counter()
    for batch in work:
        engine.predict(batch)
    return sum(len(b) for b in work) / (time.perf_counter() - started)


def top1(engine: FillMaskEngine, work: list[list[Query]]) -> list[int]:
    return [answer[0][0]["token"] for batch in work for answer in engine.predict(batch)]


def measure(model: BenchModel, count: int, rounds: int) -> str:
    threads = available_cpus()
    fp32 = load_engine(str(model.path), threads=threads, adaptive_threads=True)
    int8 = load_engine(str(model.path), threads=threads, adaptive_threads=True, quantize="int8")
    sentences = make_sentences(count)
    work = batches(fp32, sentences)
    agree = sum(a == b for a, b in zip(top1(fp32, work), top1(int8, work), strict=True))
    ratios, fp32_rates, int8_rates = [], [], []
    for _ in range(rounds):
        a, b = rate(fp32, work), rate(int8, work)
        fp32_rates.append(a)
        int8_rates.append(b)
        ratios.append(b / a)
    return (
        f"| {model.name} | {len(sentences)} | {statistics.median(fp32_rates):.1f} | "
        f"{statistics.median(int8_rates):.1f} | {statistics.median(ratios):.2f}× | "
        f"{agree}/{len(sentences)} ({100 * agree / len(sentences):.0f}%) |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"torch {torch.__version__}, {available_cpus()} CPUs, batches of {BATCH}, median of {args.rounds} rounds")
    print("| model | sentences | fp32 sentences/s | int8 sentences/s | int8 / fp32 | top-1 agreement |")
    print("|---|---|---|---|---|---|")
    for key in args.models.split(","):
        if key == "default":
            print(measure(default_model(), 256, args.rounds))
        elif key == "bert-base":
            print(measure(bert_base_model(), 64, args.rounds))
        else:
            raise SystemExit(f"unknown model {key!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
