"""The read-rows last layer, with and without, on every backend and precision: forward time, in one run.

    python -m benchmarks.read_rows                          # both models, every variant installed
    python -m benchmarks.read_rows --models default --variants torch,onnxruntime,openvino --rounds 7

Each variant is loaded twice in this process: as maskserve serves it (the last layer at the read
rows only, where its probe keeps it) and with the whole last layer (torch: the shortcut dropped;
the graph backends: the whole-layer graph, today's main's graph, from its own cache entry). Two
workloads, each in batches as maskserve's packing forms them at high concurrency (sorted by
length, ``--max-batch-size`` 32): fill-mask, the benchmark sentences with one mask each; and
``/score``, every token of each sentence masked in a copy of its own (metric ``original``), each
copy read at its one row. What is timed is the forward passes alone (the logits at the read rows,
as ``predict`` computes them before its top-k and decoding, which the saving does not touch).
Rounds alternate between the two engines of a variant, starting with the other each round, and
each ratio is taken inside one round. Answers are compared too: the saving
must not move them beyond its precision's bound.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from maskserve.config.cpus import available_cpus
from maskserve.engine import FillMaskEngine, load
from maskserve.engine.base import answered_masks, pad_batch
from maskserve.engine.cpu import native_bf16
from maskserve.model_api import ModelSpec, Query
from maskserve.tasks.pseudo_likelihood import masked_copies
from maskserve.tasks.windows import Layout

from .agreement import cpu_line
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .sentences import make_sentences

RESULTS = Path(__file__).resolve().parent / "results" / "read-rows.md"
EXPORT_CACHE = CACHE_DIR / "maskserve-cache"
BATCH = 32  # maskserve's default --max-batch-size


@dataclass(frozen=True)
class Variant:
    """One backend and precision, as maskserve's flags ask for it."""

    name: str
    flags: str
    options: dict[str, Any]


VARIANTS = {
    "torch": Variant("torch float32", "", {"backend": "torch"}),
    "torch-bf16": Variant("torch bfloat16", "--dtype bfloat16", {"backend": "torch", "dtype": "bfloat16"}),
    "torch-int8": Variant("torch int8", "--quantize int8", {"backend": "torch", "quantize": "int8"}),
    "onnxruntime": Variant("onnxruntime float32", "--backend onnxruntime", {"backend": "onnxruntime"}),
    "openvino": Variant("openvino float32", "--backend openvino", {"backend": "openvino"}),
    "openvino-bf16": Variant(
        "openvino bfloat16", "--backend openvino --dtype bfloat16", {"backend": "openvino", "dtype": "bfloat16"}
    ),
    "openvino-int8": Variant(
        "openvino int8", "--backend openvino --quantize int8", {"backend": "openvino", "quantize": "int8"}
    ),
}


def _whole_last_layer(backend: str) -> contextlib.AbstractContextManager[Any]:
    """Loads inside this make the whole-layer graph, as if no model's layout allowed the saving
    (torch's shortcut is dropped from its engine instead, by :func:`load_pair`)."""
    if backend == "torch":
        return contextlib.nullcontext()
    from maskserve.engine import graph

    return mock.patch.object(graph, "read_rows_refusal", lambda _model: "off for this benchmark's baseline")


def load_pair(variant: Variant, model: BenchModel, threads: int) -> tuple[FillMaskEngine, FillMaskEngine]:
    """(with the saving, without it) for ``variant``."""
    spec = ModelSpec(model=str(model.path), cache_dir=EXPORT_CACHE, threads=threads, **variant.options)
    saving = load(spec)
    if saving.describe().get("read_rows_last_layer") != "yes":
        raise SystemExit(f"{variant.name}: the saving is not in use ({saving.describe().get('read_rows_last_layer')})")
    with _whole_last_layer(spec.backend):
        whole = load(spec)
    if spec.backend == "torch":
        whole._last_layer = None  # type: ignore[attr-defined]
        whole._read_rows_refusal = "off for this benchmark's baseline"  # type: ignore[attr-defined]
    if not str(whole.describe().get("read_rows_last_layer")).startswith("no: off for this benchmark"):
        raise SystemExit(f"{variant.name}: the baseline still reads rows only")
    return saving, whole


def fill_mask_work(engine: FillMaskEngine, sentences: Sequence[str]) -> list[list[Query]]:
    queries = sorted((Query(engine.encode(s), 5) for s in sentences), key=lambda q: q.n_tokens)
    return [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]


def score_work(engine: FillMaskEngine, sentences: Sequence[str]) -> list[list[Query]]:
    layout = Layout.of(engine)
    queries = [
        copy
        for text in sentences
        for copy in masked_copies(engine.encode_words(text), engine.mask_token_id, "original", layout).copies
    ]
    queries.sort(key=lambda q: q.n_tokens)
    return [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]


Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def forward_inputs(engine: FillMaskEngine, work: list[list[Query]]) -> list[Inputs]:
    """Each batch as the engine's forward pass takes it: padded ids, attention, the rows it reads."""
    inputs = []
    for batch in work:
        ids, attention = pad_batch([q.input_ids for q in batch], engine.pad_token_id)
        rows, cols = np.nonzero(ids == engine.mask_token_id)
        inputs.append((ids, attention, *answered_masks(batch, rows, cols)))
    return inputs


@torch.inference_mode()
def forward_seconds(engine: FillMaskEngine, inputs: list[Inputs]) -> float:
    """The forward passes alone (the logits at the read rows), as predict() runs them."""
    started = time.perf_counter()
    for ids, attention, rows, cols in inputs:
        engine._mask_logits(ids, attention, rows, cols)
    return time.perf_counter() - started


def largest_score_difference(a: FillMaskEngine, b: FillMaskEngine, work: list[list[Query]]) -> float:
    """The largest difference between the two engines' top scores, over every answered row."""
    largest = 0.0
    for batch in work:
        for text_a, text_b in zip(a.predict(batch), b.predict(batch), strict=True):
            for mask_a, mask_b in zip(text_a, text_b, strict=True):
                largest = max(largest, abs(mask_a[0]["score"] - mask_b[0]["score"]))
    return largest


def measure(
    model: BenchModel,
    variants: Sequence[Variant],
    counts: tuple[int, int],
    rounds: int,
    log: Callable[[str], None],
) -> list[str]:
    """One table row per variant and workload; ``counts``: sentences filled, sentences scored."""
    threads = available_cpus()
    sentences = make_sentences(max(counts))
    rows = []
    for variant in variants:
        log(f"{model.name}: {variant.name}")
        saving, whole = load_pair(variant, model, threads)
        workloads = {
            "fill-mask": fill_mask_work(saving, sentences[: counts[0]]),
            "/score": score_work(saving, sentences[: counts[1]]),
        }
        for workload, work in workloads.items():
            inputs = forward_inputs(saving, work)
            for engine in (saving, whole):  # warm-up: shapes and caches of both
                forward_seconds(engine, inputs)
            times: dict[str, list[float]] = {"saving": [], "whole": []}
            ratios = []
            for i in range(rounds):
                pair = [("saving", saving), ("whole", whole)]
                measured = {
                    name: forward_seconds(engine, inputs) for name, engine in (pair if i % 2 == 0 else pair[::-1])
                }
                for name, value in measured.items():
                    times[name].append(value)
                ratios.append(measured["saving"] / measured["whole"])
            rows_read = sum(len(q.answer_positions or (0,)) for batch in work for q in batch)
            differs = largest_score_difference(saving, whole, work)
            ratio = statistics.median(ratios)
            rows.append(
                f"| {variant.name} | {workload} | {rows_read} | {statistics.median(times['whole']):.2f} | "
                f"{statistics.median(times['saving']):.2f} | {ratio:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) | "
                f"{100 * (ratio - 1):+.0f}% | {differs:.1e} |"
            )
        del saving, whole
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.read_rows", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--sentences", type=int, default=64, help="sentences filled, one mask each")
    # A sentence scored is a copy per token: a few dozen rows each, so fewer of them.
    parser.add_argument("--score-sentences", type=int, default=16, help="sentences scored, every token")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(args_list)
    keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if not native_bf16():
        # OpenVINO refuses bfloat16 without AMX or AVX-512 BF16; torch emulates it (slowly).
        keys = [k for k in keys if k != "openvino-bf16"]
    makers = {"default": default_model, "bert-base": bert_base_model}

    def log(line: str) -> None:
        print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {line}", file=sys.stderr, flush=True)

    report = [
        "# The read-rows last layer: with it and without, per backend and precision",
        "",
        f"- command: `{' '.join(['python -m benchmarks.read_rows', *args_list])}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; "
        f"machine: {platform.processor() or platform.machine()}, {available_cpus()} threads, "
        f"Python {platform.python_version()}, torch {torch.__version__}",
        f"- {cpu_line()}",
        f"- work: fill-mask: {args.sentences} benchmark sentences, one mask each, top 5; /score: "
        f"{args.score_sentences} of them, a copy per token (metric original), one row read each; "
        f"batches of {BATCH} sorted by length; {args.rounds} rounds, "
        "the two engines taking turns; time: median seconds of the workload's forward passes; ratio: median of the "
        "per-round ratios (with / without), min–max; forward time: the change the saving makes; "
        "score difference: largest |top score with − without|",
        "",
    ]
    for key in [k.strip() for k in args.models.split(",") if k.strip()]:
        model = makers[key]()
        report += [
            f"## {model.name}",
            "",
            "| variant | workload | rows read | s, whole last layer | s, read rows only | time ratio | forward time "
            "| largest score difference |",
            "|---|---|---|---|---|---|---|---|",
            *measure(model, [VARIANTS[k] for k in keys], (args.sentences, args.score_sentences), args.rounds, log),
            "",
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report) + "\n", encoding="utf-8")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
