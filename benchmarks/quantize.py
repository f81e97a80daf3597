"""Engine variants against torch float32: speed and top-1 agreement on the benchmark sentences.

The variants: ``--quantize int8`` and ``--backend onnxruntime`` (float32), and on request
``--dtype bfloat16`` on torch and ``--backend openvino`` in float32 and bfloat16. All run in this
process, in alternating rounds over the same batches (sorted by length as maskserve's packing
would form them, one text at a time and in batches of 32), so every ratio is taken inside one run.
Agreement is the share of sentences whose top answer (token) is the same as torch float32's.

    python -m benchmarks.quantize                      # both models, torch int8 and onnxruntime
    python -m benchmarks.quantize --models default --rounds 5 --variants int8,onnxruntime,bf16
    python -m benchmarks.quantize --models bert-base --variants onnxruntime,openvino,bf16,openvino-bf16
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from maskserve.config.cpus import available_cpus
from maskserve.engine import FillMaskEngine, load_engine
from maskserve.engine.cpu import describe_features
from maskserve.model_api import ModelSpec, Query

from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .sentences import make_sentences

BATCH_SIZES = (1, 32)
EXPORT_CACHE = CACHE_DIR / "maskserve-cache"


@dataclass(frozen=True)
class Variant:
    """One way of running the model, as maskserve's flags would ask for it."""

    name: str
    flags: str
    load: Callable[[Path, int], FillMaskEngine]


def _onnxruntime(path: Path, threads: int) -> FillMaskEngine:
    from maskserve.engine.onnxruntime import load_onnx_engine

    return load_onnx_engine(ModelSpec(model=str(path), backend="onnxruntime", cache_dir=EXPORT_CACHE, threads=threads))


def _openvino(dtype: str) -> Callable[[Path, int], FillMaskEngine]:
    def load(path: Path, threads: int) -> FillMaskEngine:
        from maskserve.engine.openvino import load_openvino_engine

        return load_openvino_engine(
            ModelSpec(model=str(path), backend="openvino", cache_dir=EXPORT_CACHE, threads=threads, dtype=dtype)
        )

    return load


REFERENCE = Variant("torch fp32", "", lambda p, t: load_engine(str(p), threads=t, adaptive_threads=True))
VARIANTS = {
    "int8": Variant(
        "torch int8",
        "--quantize int8",
        lambda p, t: load_engine(str(p), threads=t, adaptive_threads=True, quantize="int8"),
    ),
    "onnxruntime": Variant("onnxruntime fp32", "--backend onnxruntime", _onnxruntime),
    # Opt-in: on a CPU without AVX-512 BF16 or AMX torch emulates it, and it is slow.
    "bf16": Variant(
        "torch bf16",
        "--dtype bfloat16",
        lambda p, t: load_engine(str(p), threads=t, adaptive_threads=True, dtype="bfloat16"),
    ),
    "openvino": Variant("openvino fp32", "--backend openvino", _openvino("float32")),
    # Refused (exit 2) on a CPU without AMX or AVX-512 BF16.
    "openvino-bf16": Variant("openvino bf16", "--backend openvino --dtype bfloat16", _openvino("bfloat16")),
}


def batches(engine: FillMaskEngine, sentences: Sequence[str], size: int) -> list[list[Query]]:
    queries = sorted((Query(engine.encode(s), 1) for s in sentences), key=lambda q: len(q.input_ids))
    return [queries[i : i + size] for i in range(0, len(queries), size)]


def rate(engine: FillMaskEngine, work: list[list[Query]]) -> float:
    started = time.perf_counter()
    for batch in work:
        engine.predict(batch)
    return sum(len(b) for b in work) / (time.perf_counter() - started)


def top1(engine: FillMaskEngine, work: list[list[Query]]) -> list[int]:
    return [answer[0][0]["token"] for batch in work for answer in engine.predict(batch)]


def measure(model: BenchModel, count: int, rounds: int, variants: Sequence[Variant]) -> list[str]:
    threads = available_cpus()
    engines = [(v, v.load(model.path, threads)) for v in (REFERENCE, *variants)]
    sentences = make_sentences(count)
    reference = engines[0][1]
    work = {size: batches(reference, sentences, size) for size in BATCH_SIZES}
    expected = top1(reference, work[BATCH_SIZES[-1]])
    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    for i in range(rounds):
        for size in BATCH_SIZES:
            # Take turns, starting with another engine each round: drift hits every one alike.
            order = engines[i % len(engines) :] + engines[: i % len(engines)]
            measured = {variant.name: rate(engine, work[size]) for variant, engine in order}
            for name, value in measured.items():
                rates.setdefault((name, size), []).append(value)
                ratios.setdefault((name, size), []).append(value / measured[REFERENCE.name])
    rows = []
    for variant, engine in engines:
        agree = sum(a == b for a, b in zip(expected, top1(engine, work[BATCH_SIZES[-1]]), strict=True))
        cells = []
        for size in BATCH_SIZES:
            cells += [
                f"{statistics.median(rates[variant.name, size]):.1f}",
                f"{statistics.median(ratios[variant.name, size]):.2f}×",
            ]
        name = f"{variant.name} (`{variant.flags}`)" if variant.flags else variant.name
        rows.append(
            f"| {model.name} | {name} | {' | '.join(cells)} | "
            f"{agree}/{len(sentences)} ({100 * agree / len(sentences):.0f}%) |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=0, help="override the sentences per model (256, 64)")
    parser.add_argument(
        "--variants",
        default="int8,onnxruntime",
        help=f"comma-separated, each against torch fp32: {', '.join(VARIANTS)}",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if "onnxruntime" in keys and importlib.util.find_spec("onnxruntime") is None:
        raise SystemExit("the onnxruntime variant needs pip install 'maskserve[onnx]'")
    if any(k.startswith("openvino") for k in keys) and importlib.util.find_spec("openvino") is None:
        raise SystemExit("the openvino variants need pip install 'maskserve[openvino]'")
    variants = [VARIANTS[k] for k in keys]
    print(
        f"torch {torch.__version__}, {available_cpus()} CPUs, CPU matrix features: {describe_features()}; "
        f"length-sorted batches of {' and '.join(map(str, BATCH_SIZES))}, median of {args.rounds} rounds"
    )
    header = " | ".join(f"batch {b}: sentences/s | batch {b}: × torch fp32" for b in BATCH_SIZES)
    print(f"| model | engine | {header} | top-1 agreement with torch fp32 |")
    print("|---|---|" + "---|" * (2 * len(BATCH_SIZES)) + "---|")
    plans = {"default": (default_model, 256), "bert-base": (bert_base_model, 64)}
    for key in args.models.split(","):
        if key not in plans:
            raise SystemExit(f"unknown model {key!r}")
        make, count = plans[key]
        count = args.sentences or count
        for row in measure(make(), count, args.rounds, variants):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
