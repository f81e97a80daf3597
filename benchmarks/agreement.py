"""How far each backend and precision answers from float32: agreement, not speed.

    python -m benchmarks.agreement                    # both models, every installed backend
    python -m benchmarks.agreement --models default   # the trained default model only
    python -m benchmarks.agreement --measure score    # POST /score's agreement only
    python -m benchmarks.agreement --models default --engines "openvino int8,torch bfloat16"

For each model (the trained default model; a random model of bert-base's shape) the float32
``transformers.pipeline("fill-mask")`` answers two kinds of texts, and each engine answers the
same texts: ``natural``, the sentences of masked_sentences.py, each masked at several words, most
of them long enough that context decides the word; ``short``, the short everyday sentences of
short_sentences.py, one mask each, whose answers spread over many likely words (the kind where a
reduced precision swaps the first two most often). Per engine and kind:
top-1 agreement (the same first token), top-5 overlap (the share of the pipeline's five tokens
among the engine's five) and the largest difference between the two scores of any of the
pipeline's five tokens. The report starts with the CPU's flags: bfloat16's figures depend on
whether AMX or AVX-512 BF16 computed them.

``--measure score`` does the same for ``POST /score`` (score-agreement.md): every natural sentence
of masked_sentences.py, unmasked, is scored as ``/score`` scores it (its masked copies, metric
``original``), and each engine's per-token log-probabilities and sentence scores are set against
torch float32's: the largest and the median per-token difference, the largest sentence difference,
and the Spearman rank correlation of the sentences' mean log-probability per token (what ranks
sentences by how natural the model finds them, whatever their length).

On random weights every distribution is nearly flat, so the bert-base shape shows how rounding
moves scores of that size, not what a user would see; the trained model shows that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from maskserve.config.cpus import available_cpus
from maskserve.engine import BackendUnavailable, FillMaskEngine, load_engine
from maskserve.engine.cpu import cpu_flags, describe_features, int8_in_effect, isa_cap_in_effect, precision_in_effect
from maskserve.model_api import ModelSpec, Query, TextPredictions
from maskserve.tasks.pseudo_likelihood import TextScore, masked_copies, text_scores
from maskserve.tasks.windows import Layout

from . import offline
from .masked_sentences import SENTENCES, masked_texts
from .models import CACHE_DIR, BenchModel, bert_base_model, default_model
from .run import cpu_model
from .short_sentences import short_texts

RESULTS = Path(__file__).resolve().parent / "results" / "agreement.md"
SCORE_RESULTS = RESULTS.with_name("score-agreement.md")
EXPORT_CACHE = CACHE_DIR / "maskserve-cache"
TOP_K = 5
BATCH = 32
# The kinds of texts measured: each kind's texts for a mask token.
KINDS: dict[str, Callable[[str], list[str]]] = {"natural": masked_texts, "short": short_texts}

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


@dataclass(frozen=True)
class ScoreAgreement:
    """One engine's ``/score`` answers against the reference's, over ``sentences`` sentences."""

    sentences: int
    tokens: int  # scored tokens, over all sentences
    largest_token_difference: float  # |log-probability difference| of any one token
    median_token_difference: float
    largest_sentence_difference: float  # |score difference| of any one sentence
    rank_correlation: float  # Spearman, of the sentences' mean log-probability per token


def engine_scores(engine: FillMaskEngine, texts: Sequence[str]) -> list[TextScore]:
    """Each text's score as ``POST /score`` computes it (metric ``original``), in batches of copies."""
    layout = Layout.of(engine)
    per_text = [
        masked_copies(engine.encode_words(text), engine.mask_token_id, "original", layout).copies for text in texts
    ]
    copies = [copy for text_copies in per_text for copy in text_copies]
    answers: list[TextPredictions] = []
    for start in range(0, len(copies), BATCH):
        answers += engine.predict(copies[start : start + BATCH])
    return text_scores(per_text, answers)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation: the Pearson correlation of the ranks (ties ranked by order)."""
    ranks_a = np.argsort(np.argsort(np.asarray(a))).astype(float)
    ranks_b = np.argsort(np.argsort(np.asarray(b))).astype(float)
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def measure_score_agreement(
    engine: FillMaskEngine, texts: Sequence[str], reference: Sequence[TextScore]
) -> ScoreAgreement:
    """``engine``'s ``/score`` answers to ``texts`` against ``reference`` (:func:`engine_scores`)."""
    own = engine_scores(engine, texts)
    differences = [
        abs(mine["score"] - ref["score"])
        for text_own, text_ref in zip(own, reference, strict=True)
        for mine, ref in zip(text_own.tokens, text_ref.tokens, strict=True)
    ]

    def per_token(scores: Sequence[TextScore]) -> list[float]:
        return [s.score / len(s.tokens) for s in scores]

    return ScoreAgreement(
        sentences=len(texts),
        tokens=len(differences),
        largest_token_difference=max(differences),
        median_token_difference=float(np.median(differences)),
        largest_sentence_difference=max(abs(a.score - b.score) for a, b in zip(own, reference, strict=True)),
        rank_correlation=spearman(per_token(own), per_token(reference)),
    )


def cpu_line() -> str:
    flags = cpu_flags()
    simd = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni")))
    cap = isa_cap_in_effect()
    return (
        f"CPU: {cpu_model()}; matrix features: {describe_features()}; "
        f"bfloat16 here: {precision_in_effect('bfloat16', 'cpu')}; {int8_in_effect()}. "
        f"AVX-512/AMX flags: {', '.join(simd) or 'none'}"
        + (
            f". Kernels held to `ONEDNN_MAX_CPU_ISA={cap}` on a CPU with more"
            if cap
            else ". Kernels not held to an ISA (the CPU's own)"
        )
    )


def measure_model(model: BenchModel, variants: Sequence[Variant], threads: int) -> list[str]:
    pipe = offline.load_pipeline(str(model.path))
    kinds = {kind: texts(pipe.tokenizer.mask_token) for kind, texts in KINDS.items()}
    references = {kind: pipeline_answers(pipe, texts) for kind, texts in kinds.items()}
    rows = []
    for variant in variants:
        try:
            engine = variant.load(model.path, threads)
        except BackendUnavailable as exc:  # bfloat16 on OpenVINO without AMX or AVX-512 BF16
            print(f"{variant.name}: not measured: {exc}", flush=True)
            continue
        name = f"{variant.name} (`{variant.flags}`)" if variant.flags else variant.name
        for kind, texts in kinds.items():
            result = measure_agreement(engine, texts, references[kind])
            rows.append(
                f"| {model.name} | {name} | {kind} | {result.top1}/{result.masks} ({100 * result.top1_share:.1f}%) | "
                f"{100 * result.top5_overlap:.1f}% | {result.largest_score_difference:.2g} |"
            )
            print(rows[-1], flush=True)
        del engine
    return rows


def measure_model_scores(model: BenchModel, variants: Sequence[Variant], threads: int) -> list[str]:
    """``/score``'s agreement rows of ``model``: the first variant (torch float32) is the reference."""
    reference: list[TextScore] = []
    rows = []
    for variant in variants:
        try:
            engine = variant.load(model.path, threads)
        except BackendUnavailable as exc:  # bfloat16 on OpenVINO without AMX or AVX-512 BF16
            print(f"{variant.name}: not measured: {exc}", flush=True)
            continue
        if not reference:
            reference = engine_scores(engine, SENTENCES)
        result = measure_score_agreement(engine, SENTENCES, reference)
        name = f"{variant.name} (`{variant.flags}`)" if variant.flags else variant.name
        rows.append(
            f"| {model.name} | {name} | {result.largest_token_difference:.2g} | "
            f"{result.median_token_difference:.2g} | {result.largest_sentence_difference:.2g} | "
            f"{result.rank_correlation:.4f} |"
        )
        print(rows[-1], flush=True)
        del engine
    return rows


def header(title: str, command: str, threads: int) -> list[str]:
    return [
        title,
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {threads} threads",
        f"- {cpu_line()}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.agreement", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,bert-base", help="comma-separated: default, bert-base")
    parser.add_argument("--measure", default="fill-mask,score", help="comma-separated: fill-mask, score")
    parser.add_argument("--engines", default="", help="comma-separated engine names (default: every installed one)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where fill-mask's Markdown table goes")
    parser.add_argument("--score-out", type=Path, default=SCORE_RESULTS, help="where /score's table goes")
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(args_list)
    models = {"default": default_model, "bert-base": bert_base_model}
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    measures = [m.strip() for m in args.measure.split(",") if m.strip()]
    if [k for k in keys if k not in models] or [m for m in measures if m not in ("fill-mask", "score")]:
        raise SystemExit(f"--models: choose from {list(models)}; --measure: from fill-mask, score")
    chosen = {e.strip() for e in args.engines.split(",") if e.strip()}
    if chosen - {v.name for v in VARIANTS}:
        raise SystemExit(f"--engines: choose from {[v.name for v in VARIANTS]}")
    variants = [v for v in VARIANTS if v.needs is None or importlib.util.find_spec(v.needs) is not None]
    if chosen:
        # torch float32 stays first where /score is measured: it is that table's reference.
        variants = [v for v in variants if v.name in chosen or (v.name == "torch float32" and "score" in measures)]
    skipped = [v.name for v in VARIANTS if v not in variants and (not chosen or v.name in chosen)]
    not_measured = f"; not installed, not measured: {', '.join(skipped)}" if skipped else ""
    threads = available_cpus()
    command = shlex.join(["python", "-m", "benchmarks.agreement", *args_list])
    if "fill-mask" in measures:
        lines = [
            *header("# Agreement with the float32 pipeline, per backend and precision", command, threads),
            f"- texts: `natural`, masked_sentences.py, {len(masked_texts('[MASK]'))} masks; `short`, "
            f"short_sentences.py, {len(short_texts('[MASK]'))} masks (one mask per text); reference: "
            f"`pipeline('fill-mask')` in float32, top {TOP_K}" + not_measured,
            "- top-5 overlap: the mean share of the pipeline's five tokens among the engine's five; score "
            "difference: the largest, over the pipeline's five tokens of every mask",
            "",
            "| model | engine | texts | top-1 agreement | top-5 overlap | largest score difference |",
            "|---|---|---|---|---|---|",
        ]
        print("\n".join(lines), flush=True)
        for key in keys:
            lines += measure_model(models[key](), variants, threads)
        write(args.out, lines)
    if "score" in measures:
        lines = [
            *header("# POST /score: agreement with torch float32, per backend and precision", command, threads),
            f"- texts: the {len(SENTENCES)} natural sentences of masked_sentences.py, unmasked, scored as "
            "`/score` scores them (metric `original`); reference: maskserve on torch float32" + not_measured,
            "- token difference: |log-probability difference| of one scored token; sentence difference: "
            "|score difference| of one sentence (the sum over its tokens); rank correlation: Spearman, of "
            "the sentences' mean log-probability per token",
            "",
            "| model | engine | largest token difference | median token difference | largest sentence "
            "difference | rank correlation |",
            "|---|---|---|---|---|---|",
        ]
        print("\n".join(lines), flush=True)
        for key in keys:
            lines += measure_model_scores(models[key](), variants, threads)
        write(args.score_out, lines)
    return 0


def write(out: Path, lines: Sequence[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join([*lines, ""]), encoding="utf-8")
    print(f"written to {out}")


if __name__ == "__main__":
    sys.exit(main())
