"""What each part of the int8 recipe gains, on each class of CPU: agreement and speed.

    python -m benchmarks.int8_recipe                        # every class this CPU can stand for
    python -m benchmarks.int8_recipe --classes native,AVX2  # some of them

A class is the CPU as oneDNN runs it: ``native``, or held below what the CPU offers by oneDNN's
own ``ONEDNN_MAX_CPU_ISA`` (``AVX512_CORE_VNNI`` runs as a CPU with VNNI and no AMX, ``AVX2`` as one
with neither). Each class runs in a process of its own, since oneDNN reads the cap once. A cap
that changes nothing on this CPU (a class above it) is skipped.

Per class and recipe: the top-1 agreement of ``--backend openvino --quantize int8`` with the float32
pipeline on the default model (masked_sentences.py and short_sentences.py, as
benchmarks/agreement.py measures them), and
the speed of the same recipe on bert-base's shape against openvino float32 (batches of 32
length-sorted sentences; each round times every recipe in a pair with float32, in turn first and
second, and the median of the pairs' ratios is reported: a ratio within one run).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from maskserve.config.cpus import available_cpus
from maskserve.engine.cpu import ISA_CAP_VARIABLE, capped, int8_kernels, read_flags

from .run import cpu_model

RESULTS = Path(__file__).resolve().parent / "results" / "int8-recipe.md"
CLASSES = ("native", "AVX512_CORE_VNNI", "AVX2")
ROUNDS = 6
SPEED_SENTENCES = 64
BATCH = 32


def recipes() -> list[tuple[str, Any]]:
    """The recipes compared, each one step from the last: NNCF's defaults, then each change."""
    from maskserve.engine.openvino_quantize import AVX2_RECIPE, VNNI_RECIPE, Int8Recipe

    defaults = Int8Recipe(
        "nncf defaults", overflow_fix=False, smooth_quant_alpha=None, residual_products_in_float32=False
    )
    alpha = dataclasses.replace(defaults, overflow_fix=True, smooth_quant_alpha=0.8)
    residual = dataclasses.replace(alpha, residual_products_in_float32=True)
    return [
        ("NNCF's defaults (overflow fix on the first layer only)", defaults),
        ("+ overflow fix in every layer", dataclasses.replace(defaults, overflow_fix=True)),
        ("+ SmoothQuant alpha 0.8", alpha),
        ("+ the last layer's read rows in float32", dataclasses.replace(alpha, read_rows_in_float32=True)),
        ("+ residual products in float32", residual),
        ("+ the last layer's read rows in float32 (the `avx2` recipe)", AVX2_RECIPE),
        (
            "SmoothQuant alpha 0.8, overflow fix on the first layer only, read rows in float32, full bias "
            "correction (the `vnni` recipe)",
            VNNI_RECIPE,
        ),
    ]


def measure_class() -> list[dict[str, Any]]:
    """This process's class: every recipe's agreement and speed."""
    from benchmarks import offline
    from benchmarks.agreement import measure_agreement, pipeline_answers
    from benchmarks.masked_sentences import masked_texts
    from benchmarks.models import bert_base_model, default_model
    from benchmarks.sentences import make_sentences
    from benchmarks.short_sentences import short_texts
    from maskserve.engine.openvino import load_openvino_engine
    from maskserve.model_api import ModelSpec, Query

    threads = available_cpus()
    default = default_model()
    pipe: Any = offline.load_pipeline(str(default.path))
    texts = masked_texts(pipe.tokenizer.mask_token)
    reference = pipeline_answers(pipe, texts)
    short = short_texts(pipe.tokenizer.mask_token)
    short_reference = pipeline_answers(pipe, short)
    base = bert_base_model()
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch)
        float32 = load_openvino_engine(
            ModelSpec(model=str(base.path), backend="openvino", cache_dir=cache / "f32", threads=threads)
        )
        queries = sorted(
            (Query(float32.encode(s), 5) for s in make_sentences(SPEED_SENTENCES, mask=float32.mask_token)),
            key=lambda q: len(q.input_ids),
        )
        batches = [queries[i : i + BATCH] for i in range(0, len(queries), BATCH)]
        engines: dict[str, Any] = {"float32": float32}
        rows = []

        def int8(model: Path, index: int, recipe: Any) -> Any:
            spec = ModelSpec(
                model=str(model), backend="openvino", cache_dir=cache / str(index), threads=threads, quantize="int8"
            )
            return load_openvino_engine(spec, int8_recipe=recipe)

        for index, (label, recipe) in enumerate(recipes()):
            small = int8(default.path, index, recipe)
            agreement = measure_agreement(small, texts, reference)
            on_short = measure_agreement(small, short, short_reference)
            rows.append(
                {
                    "recipe": label,
                    "top1": agreement.top1,
                    "masks": agreement.masks,
                    "short_top1": on_short.top1,
                    "short_masks": on_short.masks,
                    "top5": agreement.top5_overlap,
                    "largest": agreement.largest_score_difference,
                }
            )
            engines[label] = int8(base.path, index, recipe)

        def seconds(engine: Any) -> float:
            started = time.perf_counter()
            for batch in batches:
                engine.predict(batch)
            return time.perf_counter() - started

        # Each recipe is timed in a pair with float32, in turn first and second, and its speed is
        # the median of the pairs' ratios: the machine's drift (and whatever an engine just run
        # leaves behind) then weighs on both sides of every ratio alike.
        ratios: dict[str, list[float]] = {row["recipe"]: [] for row in rows}
        for round_ in range(ROUNDS):
            for name, times in ratios.items():
                if round_ % 2:
                    mine, reference_seconds = seconds(engines[name]), seconds(float32)
                else:
                    reference_seconds, mine = seconds(float32), seconds(engines[name])
                times.append(reference_seconds / mine)
    for row in rows:
        row["speed"] = statistics.median(ratios[row["recipe"]])
    return rows


def run_class(cap: str) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env.pop(ISA_CAP_VARIABLE, None)
    if cap != "native":
        env[ISA_CAP_VARIABLE] = cap
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.int8_recipe", "--one-class"],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_recipe", description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated, of {', '.join(CLASSES)}")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the Markdown report goes")
    parser.add_argument("--one-class", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.one_class:
        print(json.dumps(measure_class()))
        return 0
    flags = read_flags()
    matrix = sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512_vnni", "avx_vnni")))
    seen: set[frozenset[str]] = set()
    lines = [
        "# int8 recipes per class of CPU: agreement and speed",
        "",
        f"- command: `python -m benchmarks.int8_recipe {' '.join(sys.argv[1:] if argv is None else argv)}`".rstrip("` ")
        + "`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {available_cpus()} threads",
        f"- this CPU: {cpu_model()}; its matrix flags: {', '.join(matrix) or 'none'}",
        f"- classes below this CPU are run with oneDNN's `{ISA_CAP_VARIABLE}` cap: the same kernels an "
        "AVX2-only (or VNNI-without-AMX) CPU runs, on this CPU's cores and caches, not such a CPU itself",
        "- agreement: `--backend openvino --quantize int8` on the default model against the float32 pipeline, "
        "480 masks (masked_sentences.py), and 152 short sentences' masks (short_sentences.py); speed: the same "
        "recipe on bert-base's shape, batches of 32, "
        f"against openvino float32 in the same class (median of {ROUNDS} rounds' ratios, each timed in a pair "
        "with float32, in turn first and second)",
        "",
        "| class (`ONEDNN_MAX_CPU_ISA`) | int8 kernels | recipe | top-1 agreement | top-5 overlap "
        "| largest score difference | top-1, short sentences | speed vs float32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for cap in [c.strip() for c in args.classes.split(",") if c.strip()]:
        effective = capped(flags, None if cap == "native" else cap)
        if effective in seen:
            print(f"skipped {cap}: this CPU runs it as a class already measured", flush=True)
            continue
        seen.add(effective)
        for row in run_class(cap):
            lines.append(
                f"| {cap} | {int8_kernels(effective)} | {row['recipe']} | {row['top1']}/{row['masks']} "
                f"({100 * row['top1'] / row['masks']:.1f}%) | {100 * row['top5']:.1f}% | {row['largest']:.2g} "
                f"| {row['short_top1']}/{row['short_masks']} ({100 * row['short_top1'] / row['short_masks']:.1f}%) "
                f"| {row['speed']:.2f}× |"
            )
            print(lines[-1], flush=True)
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
