"""How far each backend and precision answers from the float32 pipeline: agreement, not speed.

    python -m benchmarks.agreement                    # both models, every installed backend
    python -m benchmarks.agreement --models default   # the trained default model only

For each model (the trained default model; a random model of bert-base's shape) the float32
``transformers.pipeline("fill-mask")`` answers every text of masked_sentences.py (natural
sentences, each masked at several words), and each engine answers the same texts. Per engine:
top-1 agreement (the same first token), top-5 overlap (the share of the pipeline's five tokens
among the engine's five) and the largest difference between the two scores of any of the
pipeline's five tokens. The report starts with the CPU's flags: bfloat16's figures depend on
whether AMX or AVX-512 BF16 computed them.

On random weights every distribution is nearly flat, so the bert-base shape shows how rounding
moves scores of that size, not what a user would see; the trained model shows that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from maskserve.engine import FillMaskEngine, load_engine
from maskserve.engine.cpu import cpu_flags, describe_features, int8_in_effect, isa_cap_in_effect, precision_in_effect
from maskserve.model_api import ModelSpec, Query
from maskserve.settings import available_cpus

from . import offline
from .masked_sentences import masked_texts
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model

RESULTS = Path(__file__).resolve().parent / "results" / "agreement.md"
EXPORT_CACHE = CACHE_DIR / "maskserve-cache"
TOP_K = 5
BATCH = 32

# One mask's answer: (token, score) for its top tokens, best first.
Answer = list[tuple[int, float]]


@dataclass(frozen=True)
class Variant:
    """One backend and precision, as maskserve's flags would ask for it."""

    name: str
    flags: str
    load: Callable[[Path, int], FillMaskEngine]
    needs: str | None = None  # the module it needs installed


def _onnxruntime(path: Path, threads: int) -> FillMaskEngine:
    from maskserve.engine.onnxruntime import load_onnx_engine

    return load_onnx_engine(ModelSpec(model=str(path), backend="onnxruntime", cache_dir=EXPORT_CACHE, threads=threads))


def _openvino(dtype: str, quantize: str = "none") -> Callable[[Path, int], FillMaskEngine]:
    def load(path: Path, threads: int) -> FillMaskEngine:
        from maskserve.engine.openvino import load_openvino_engine

        return load_openvino_engine(
            ModelSpec(
                model=str(path),
                backend="openvino",
                cache_dir=EXPORT_CACHE,
                threads=threads,
                dtype=dtype,
                quantize=quantize,
            )
        )

    return load


VARIANTS = (
    Variant("torch float32", "", lambda p, t: load_engine(str(p), threads=t)),
    Variant("torch bfloat16", "--dtype bfloat16", lambda p, t: load_engine(str(p), threads=t, dtype="bfloat16")),
    Variant("onnxruntime float32", "--backend onnxruntime", _onnxruntime, "onnxruntime"),
    Variant("openvino float32", "--backend openvino", _openvino("float32"), "openvino"),
    Variant("openvino bfloat16", "--backend openvino --dtype bfloat16", _openvino("bfloat16"), "openvino"),
    Variant("torch int8", "--quantize int8", lambda p, t: load_engine(str(p), threads=t, quantize="int8")),
    Variant("openvino int8", "--backend openvino --quantize int8", _openvino("float32", "int8"), "nncf"),
)


@dataclass(frozen=True)
class Agreement:
    """One engine against the reference, over ``masks`` masks."""

    masks: int
    top1: int  # masks whose first token is the reference's
    top5_overlap: float  # mean share of the reference's five tokens among the engine's five
    largest_score_difference: float  # over the reference's five tokens of every mask

    @property
    def top1_share(self) -> float:
        return self.top1 / self.masks


def pipeline_answers(pipe: Any, texts: Sequence[str]) -> list[Answer]:
    """The float32 pipeline's top tokens and scores for each text (one mask each)."""
    answers = pipe(list(texts), top_k=TOP_K, batch_size=BATCH)
    return [[(p["token"], p["score"]) for p in answer] for answer in answers]


def _predict(engine: FillMaskEngine, queries: Sequence[Query]) -> list[Answer]:
    answers: list[Answer] = []
    for start in range(0, len(queries), BATCH):
        for [predictions] in engine.predict(queries[start : start + BATCH]):
            answers.append([(p["token"], p["score"]) for p in predictions])
    return answers


def measure_agreement(engine: FillMaskEngine, texts: Sequence[str], reference: Sequence[Answer]) -> Agreement:
    """``engine``'s answers to ``texts`` against ``reference`` (:func:`pipeline_answers`)."""
    ids = [engine.encode(text) for text in texts]
    own = _predict(engine, [Query(i, TOP_K) for i in ids])
    # The engine's scores of the reference's own tokens, whatever their rank here.
    at_reference = _predict(
        engine, [Query(i, TOP_K, tuple(token for token, _ in ref)) for i, ref in zip(ids, reference)]
    )
    top1 = sum(mine[0][0] == ref[0][0] for mine, ref in zip(own, reference, strict=True))
    overlap = sum(
        len({t for t, _ in mine} & {t for t, _ in ref}) / len(ref) for mine, ref in zip(own, reference, strict=True)
    )
    largest = 0.0
    for mine, ref in zip(at_reference, reference, strict=True):
        scores = dict(mine)
        largest = max(largest, *(abs(scores[token] - score) for token, score in ref))
    return Agreement(len(texts), top1, overlap / len(texts), largest)


def cpu_line() -> str:
    flags = cpu_flags()
    simd = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni")))
    cap = isa_cap_in_effect()
    return (
        f"CPU matrix features: {describe_features()}; bfloat16 here: {precision_in_effect('bfloat16', 'cpu')}; "
        f"{int8_in_effect()}. AVX-512/AMX flags: {', '.join(simd) or 'none'}"
        + (f". Kernels held to `ONEDNN_MAX_CPU_ISA={cap}` on a CPU with more" if cap else "")
    )


def measure_model(model: BenchModel, variants: Sequence[Variant], threads: int) -> list[str]:
    pipe = offline.load_pipeline(str(model.path))
    texts = masked_texts(pipe.tokenizer.mask_token)
    reference = pipeline_answers(pipe, texts)
    rows = []
    for variant in variants:
        engine = variant.load(model.path, threads)
        result = measure_agreement(engine, texts, reference)
        name = f"{variant.name} (`{variant.flags}`)" if variant.flags else variant.name
        rows.append(
            f"| {model.name} | {name} | {result.top1}/{result.masks} ({100 * result.top1_share:.1f}%) | "
            f"{100 * result.top5_overlap:.1f}% | {result.largest_score_difference:.2g} |"
        )
        print(rows[-1], flush=True)
        del engine
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agreement", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the Markdown table goes")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    models = {"default": default_model, "bert-base": bert_base_model}
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    if [k for k in keys if k not in models]:
        raise SystemExit(f"--models: choose from {list(models)}")
    variants = [v for v in VARIANTS if v.needs is None or importlib.util.find_spec(v.needs) is not None]
    skipped = [v.name for v in VARIANTS if v not in variants]
    threads = available_cpus()
    lines = [
        "# Agreement with the float32 pipeline, per backend and precision",
        "",
        f"- command: `python -m benchmarks.agreement {' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip("` ")
        + "`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {threads} threads",
        f"- {cpu_line()}",
        f"- texts: masked_sentences.py, {len(masked_texts('[MASK]'))} masks (one per text); reference: "
        f"`pipeline('fill-mask')` in float32, top {TOP_K}"
        + (f"; not installed, not measured: {', '.join(skipped)}" if skipped else ""),
        "- top-5 overlap: the mean share of the pipeline's five tokens among the engine's five; score "
        "difference: the largest, over the pipeline's five tokens of every mask",
        "",
        "| model | engine | top-1 agreement | top-5 overlap | largest score difference |",
        "|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for key in keys:
        lines += measure_model(models[key](), variants, threads)
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
