"""Where a reduced precision's agreement goes, per part of the graph; what keeping a part exact buys.

    python -m benchmarks.precision_parts                       # default model, bert-base's speed
    python -m benchmarks.precision_parts --blimp /tmp/blimp-data --no-speed

Three tables, all on the openvino graph (read-rows last layer, mask-only head) of the default model:

1. **Error per part**: the same rows (each text's mask) run in float32 and in a reduced precision
   (bfloat16; int8 by the `vnni` recipe before and after the read rows were kept in float32): the
   mean relative error ``|x - x32| / |x32|`` of the hidden state after the embeddings, after each
   encoder layer and after the head's transform, and the logits' top-1 agreement, per kind of text
   (``natural``: masked_sentences.py; ``short``: short_sentences.py; ``blimp``: BLiMP's grammatical
   sentences with one word masked, when ``--blimp`` names a folder of its ``.jsonl`` files, as
   ``git --git-dir=<a clone of alexwarstadt/blimp> show HEAD:data/<paradigm>.jsonl`` gives them).
   The median float32 margin between the first two logits shows how flat each kind's answers are.
   The embeddings are not quantized: int8's figure there is what the runtime's fusion of
   SmoothQuant's scale into the block's output shows at that probe, a floor for the later ones.
2. **int8 variants**: the `vnni` recipe before, with one part of the graph left in float32 through
   NNCF's ignored scope (each encoder layer's products in turn; the last layer's products at the
   read rows only; the last layer's keys and values; the residual products), then the options
   added to the read rows in float32, up to today's `vnni` recipe: top-1 agreement per kind.
3. **bfloat16 variants**: the whole graph in bfloat16, and the graph as served (the last layer and
   the head in float32, engine/openvino_split.py): top-1 agreement per kind. These run the graphs
   as served, with no probe. A probe is an output added to the graph, and it changes a bfloat16
   graph: on the same batches, table 1's bfloat16 top-1 runs higher than the graph served (most
   likely because OpenVINO keeps a graph output's tensor in float32, so each block's output goes
   on unrounded). Table 1 shows where bfloat16's error grows; this table, what a user gets.
4. **Speed** on bert-base's shape (random weights) of the candidates against float32: batches of
   32 length-sorted sentences, the graph alone (no tokenizing, no top-k), alternating rounds in one
   process, the median round's ratio.

Top-1 here is the logits' argmax against the float32 graph's, which gives the float32 pipeline's
answers (benchmarks/agreement.py); the variants kept are checked there too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from maskserve.config.cpus import available_cpus

from .agreement import cpu_line
from .masked_sentences import masked_texts
from .models import bert_base_model, default_model
from .sentences import make_sentences
from .short_sentences import short_texts

RESULTS = Path(__file__).resolve().parent / "results" / "precision-parts.md"
BATCH = 32
ROUNDS = 5
SPEED_SENTENCES = 64
# BLiMP's sentences taken from each paradigm: these, not its first ones, on which the variants
# were first compared, so that the figures reported are not those the choice was made on.
BLIMP_FIRST, BLIMP_PER_FILE = 200, 15


def blimp_texts(folder: Path, mask: str) -> list[str]:
    """BLiMP's grammatical sentences, ``BLIMP_PER_FILE`` of each paradigm, one word masked each
    (the i-th sentence at its word 3i + 1 modulo its length, so that every position is met)."""
    texts = []
    for path in sorted(folder.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()[BLIMP_FIRST : BLIMP_FIRST + BLIMP_PER_FILE]
        for i, line in enumerate(lines):
            words = json.loads(line)["sentence_good"].split()
            position = (3 * i + 1) % len(words)
            word = words[position]
            tail = word[len(word.rstrip(".,?!")) :]
            texts.append(" ".join([*words[:position], mask + tail, *words[position + 1 :]]))
    return texts


def batches(tokenizer: Any, texts: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """``texts`` as the graph's inputs, in batches of ``BATCH`` in their order, read at their masks."""
    from maskserve.engine.openvino_quantize import graph_batches

    return graph_batches([tokenizer(text)["input_ids"] for text in texts], tokenizer, BATCH)


def probes(model: Any) -> list[tuple[str, Any]]:
    """(label, node) of each hidden state compared: every LayerNorm that ends a block (the
    embeddings, each layer's output, the head's transform), in graph order."""
    found = []
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        if op.get_type_name() == "Add" and name.endswith("LayerNorm/aten::layer_norm/Add"):
            if ".attention." in name:
                continue
            part = name.split("/")[0].removeprefix("__module.model.")
            label = part.replace("bert.", "").replace(".LayerNorm", "").replace(".output", "")
            found.append((label, op))
    return found


def run_parts(core: Any, model_file: Path, precision: str, inputs: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Each probe's hidden state at the read rows, then the logits, over all batches."""
    model = core.read_model(str(model_file))
    labelled = probes(model)
    model.add_outputs([node.output(0) for _, node in labelled])
    compiled = core.compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": available_cpus()}
    )
    request = compiled.create_infer_request()
    parts: list[list[np.ndarray]] = [[] for _ in range(len(labelled) + 1)]
    for batch in inputs:
        result = request.infer(batch)
        values = [result[output] for output in compiled.outputs]
        ids = batch["input_ids"]
        # read_index points into the (text, read) grid of read_columns: its text, and the column read.
        columns, index = batch["read_columns"], batch["read_index"]
        rows = index // columns.shape[1]
        cols = columns.reshape(-1)[index]
        parts[-1].append(values[0])
        for i, value in enumerate(values[1:]):
            if value.ndim == 3 and value.shape[1] == ids.shape[1]:  # every row of every text
                parts[i].append(value[rows, cols])
            elif value.ndim == 3:  # the last layer's read rows
                parts[i].append(value.reshape(-1, value.shape[-1])[index])
            else:  # the head's rows
                parts[i].append(value)
    return [np.concatenate(p) for p in parts]


def whole_logits(model_file: Path, precision: str, inputs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The logits of the graph as served, whole in ``precision``: no probe added."""
    from maskserve.engine.openvino import compile_graph

    request = compile_graph(model_file, precision, available_cpus(), keep_compiled=False).create_infer_request()
    return np.concatenate([request.infer(batch)[0] for batch in inputs])


def split_logits(model_file: Path, inputs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The logits of the graph as ``--dtype bfloat16`` serves it: the last layer and head in float32."""
    from maskserve.engine.openvino import compile_bfloat16

    request = compile_bfloat16(model_file, available_cpus(), keep_compiled=False).create_infer_request()
    return np.concatenate([request.infer(batch)[0] for batch in inputs])


BF16_SPLIT = "bf16, last layer float32"


def labels_of(core: Any, model_file: Path) -> list[str]:
    return [label for label, _ in probes(core.read_model(str(model_file)))] + ["logits"]


def relative_error(value: np.ndarray, reference: np.ndarray) -> float:
    norms = np.linalg.norm(reference, axis=-1)
    return float(np.mean(np.linalg.norm(value - reference, axis=-1) / np.maximum(norms, 1e-12)))


def top1(value: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean(value.argmax(-1) == reference.argmax(-1)))


def margin(logits: np.ndarray) -> float:
    """The median gap between the first two logits: small where answers are flat."""
    ordered = np.sort(logits, axis=-1)
    return float(np.median(ordered[:, -1] - ordered[:, -2]))


def before() -> Any:
    """The `vnni` recipe before the read rows were kept in float32: the base each variant changes."""
    from maskserve.engine.openvino_quantize import Int8Recipe

    return Int8Recipe("vnni", overflow_fix=True, smooth_quant_alpha=0.8, residual_products_in_float32=False)


def int8_variants(layers: int) -> list[tuple[str, Any]]:
    """The recipe before, then each with one part left in float32 or one option changed."""
    from maskserve.engine.openvino_quantize import VNNI_RECIPE

    base, last = before(), layers - 1
    variants = [("int8, the `vnni` recipe before (7-bit weights, read rows in int8)", base)]
    for layer in range(layers):
        variants.append(
            (
                f"+ layer {layer}'s products in float32",
                dataclasses.replace(base, float32_patterns=(rf".*\.encoder\.layer\.{layer}\..*",)),
            )
        )
    read_rows = dataclasses.replace(base, read_rows_in_float32=True)
    variants += [
        (
            "+ the last layer's products at the read rows in float32 (its query, attention, output, feed-forward)",
            read_rows,
        ),
        (
            f"+ last layer's keys and values in float32 (layer {last})",
            dataclasses.replace(
                base, float32_patterns=(rf".*\.encoder\.layer\.{last}\.attention\.self\.(key|value)/.*",)
            ),
        ),
        (
            "+ residual products in float32 (the `avx2` recipe before)",
            dataclasses.replace(base, name="avx2", residual_products_in_float32=True),
        ),
        (
            "read rows in float32, 8-bit weights past the first layer (overflow fix there only)",
            dataclasses.replace(read_rows, overflow_fix=False),
        ),
        ("read rows in float32, full bias correction", dataclasses.replace(read_rows, full_bias_correction=True)),
        (
            "read rows in float32, 8-bit weights past the first layer, full bias correction: today's `vnni` recipe",
            VNNI_RECIPE,
        ),
    ]
    return variants


def quantized(core: Any, float32_file: Path, tokenizer: Any, recipe: Any, folder: Path) -> Path:
    from maskserve.engine.openvino_quantize import quantize_graph

    folder.mkdir(parents=True, exist_ok=True)
    quantize_graph(core.read_model(str(float32_file)), folder, tokenizer, recipe)
    return folder / float32_file.name


def load_float32(model: Path, cache: Path) -> Any:
    from maskserve.engine.openvino import load_openvino_engine
    from maskserve.model_api import ModelSpec

    return load_openvino_engine(ModelSpec(model=str(model), backend="openvino", cache_dir=cache, threads=1))


def measure_default(kinds_of: dict[str, Any], scratch: Path) -> tuple[list[str], list[str], dict[str, Any]]:
    """Tables 1 and 2 on the default model, and its int8 variants' recipes by label."""
    from maskserve.engine.openvino import shared_core

    engine = load_float32(default_model().path, scratch / "cache")
    core, tokenizer, float32_file = shared_core(), engine.tokenizer, engine.export.model_file
    kinds = {kind: batches(tokenizer, texts(tokenizer.mask_token)) for kind, texts in kinds_of.items()}
    reference = {kind: run_parts(core, float32_file, "f32", inputs) for kind, inputs in kinds.items()}
    labels = labels_of(core, float32_file)
    from maskserve.engine.openvino_quantize import VNNI_RECIPE

    int8_before = quantized(core, float32_file, tokenizer, before(), scratch / "int8-before")
    int8_today = quantized(core, float32_file, tokenizer, VNNI_RECIPE, scratch / "int8-today")
    errors = []
    graphs = (
        ("bfloat16", float32_file, "bf16"),
        ("int8, `vnni` before", int8_before, "f32"),
        ("int8, `vnni` today", int8_today, "f32"),
    )
    for name, file, precision in graphs:
        for kind, inputs in kinds.items():
            parts = run_parts(core, file, precision, inputs)
            cells = [f"{relative_error(p, r):.3g}" for p, r in zip(parts, reference[kind], strict=True)]
            agree = top1(parts[-1], reference[kind][-1])
            errors.append(
                f"| {name} | {kind} ({len(parts[-1])}) | {' | '.join(cells)} | {100 * agree:.1f}% "
                f"| {margin(reference[kind][-1]):.2f} |"
            )
            print(errors[-1], flush=True)
    error_table = [
        f"| precision | texts (masks) | {' | '.join(labels)} | top-1 | float32 top-2 margin |",
        "|" + "---|" * (len(labels) + 4),
        *errors,
    ]
    layers = sum(label.startswith("encoder.layer") for label in labels)
    rows, recipes = [], {}
    for index, (label, recipe) in enumerate(int8_variants(layers)):
        file = quantized(core, float32_file, tokenizer, recipe, scratch / f"int8-{index}")
        shares = []
        for kind, inputs in kinds.items():
            logits = run_parts(core, file, "f32", inputs)[-1]
            agree = top1(logits, reference[kind][-1])
            shares.append(f"{round(agree * len(logits))}/{len(logits)} ({100 * agree:.1f}%)")
        rows.append(f"| {label} | {' | '.join(shares)} |")
        recipes[label] = recipe
        print(rows[-1], flush=True)
    variant_table = [f"| int8 variant | {' | '.join(kinds)} |", "|---|" + "---|" * len(kinds), *rows]
    bf16_table = bfloat16_variants(core, float32_file, kinds, reference)
    return (
        error_table,
        [*variant_table, "", "## bfloat16 with the last layer in float32: top-1 agreement", "", *bf16_table],
        recipes,
    )


def bfloat16_variants(
    core: Any, float32_file: Path, kinds: dict[str, list[dict[str, np.ndarray]]], reference: dict[str, list[np.ndarray]]
) -> list[str]:
    """Table 3: the whole graph in bfloat16 against the graph as served (last layer and head in float32)."""
    variants: dict[str, Callable[[list[dict[str, np.ndarray]]], np.ndarray]] = {
        "bfloat16, the whole graph (before)": lambda inputs: whole_logits(float32_file, "bf16", inputs),
        "bfloat16, the last layer and the head in float32 (as served)": lambda inputs: split_logits(
            float32_file, inputs
        ),
    }
    rows = []
    for label, logits_of in variants.items():
        shares = []
        for kind, inputs in kinds.items():
            logits = logits_of(inputs)
            agree = top1(logits, reference[kind][-1])
            shares.append(f"{round(agree * len(logits))}/{len(logits)} ({100 * agree:.1f}%)")
        rows.append(f"| {label} | {' | '.join(shares)} |")
        print(rows[-1], flush=True)
    return [f"| bfloat16 variant | {' | '.join(kinds)} |", "|---|" + "---|" * len(kinds), *rows]


def measure_speed(recipes: dict[str, Any], scratch: Path) -> list[str]:
    """Table 3: each candidate's forward rate on bert-base's shape against float32's."""
    from maskserve.engine.openvino import compile_bfloat16, compile_graph, shared_core

    engine = load_float32(bert_base_model().path, scratch / "cache-base")
    core, tokenizer, float32_file = shared_core(), engine.tokenizer, engine.export.model_file
    texts = sorted(
        make_sentences(SPEED_SENTENCES, mask=tokenizer.mask_token), key=lambda t: len(tokenizer(t)["input_ids"])
    )
    inputs = batches(tokenizer, texts)
    graphs = {
        "float32": (float32_file, "f32"),
        "bfloat16": (float32_file, "bf16"),
        "bfloat16, the last layer and the head in float32 (as served)": (float32_file, BF16_SPLIT),
    }
    for index, (label, recipe) in enumerate(recipes.items()):
        graphs[label] = (quantized(core, float32_file, tokenizer, recipe, scratch / f"base-int8-{index}"), "f32")
    requests = {
        label: (
            compile_bfloat16(file, available_cpus(), keep_compiled=False)
            if precision == BF16_SPLIT
            else compile_graph(file, precision, available_cpus(), keep_compiled=False)
        ).create_infer_request()
        for label, (file, precision) in graphs.items()
    }
    seconds: dict[str, list[float]] = {label: [] for label in graphs}
    for _ in range(ROUNDS):
        for label, request in requests.items():
            started = time.perf_counter()
            for batch in inputs:
                request.infer(batch)
            seconds[label].append(time.perf_counter() - started)
    base = statistics.median(seconds["float32"])
    previous = statistics.median(seconds[next(iter(recipes))])
    rows = []
    for label, spent in seconds.items():
        median = statistics.median(spent)
        rows.append(f"| {label} | {SPEED_SENTENCES / median:.1f} | {base / median:.2f}× | {previous / median:.2f}× |")
        print(rows[-1], flush=True)
    return [
        "| graph (bert-base's shape) | sentences/s | against float32 | against int8 before |",
        "|---|---|---|---|",
        *rows,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision_parts", description=__doc__.splitlines()[0])
    parser.add_argument("--blimp", type=Path, help="a folder of BLiMP's .jsonl files: adds the `blimp` kind")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed table (bert-base's shape)")
    parser.add_argument("--speed-variants", default="0,3,8", help="int8 variants timed, by row (0: before)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the Markdown report goes")
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(args_list)
    kinds: dict[str, Any] = {"natural": masked_texts, "short": short_texts}
    if args.blimp:
        kinds["blimp"] = lambda mask: blimp_texts(args.blimp, mask)
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        error_table, variant_table, recipes = measure_default(kinds, scratch)
        speed_table: list[str] = []
        if not args.no_speed:
            chosen = [int(i) for i in args.speed_variants.split(",") if i.strip()]
            labels = list(recipes)
            speed_table = measure_speed({labels[i]: recipes[labels[i]] for i in chosen}, scratch)
    lines = [
        "# Where reduced precision's agreement goes, per part of the graph",
        "",
        f"- command: `{shlex.join(['python', '-m', 'benchmarks.precision_parts', *args_list])}`",
        f"- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {available_cpus()} threads",
        f"- {cpu_line()}",
        "- model: the default model's openvino graph (read-rows last layer, mask-only head); reference: the "
        "same graph in float32. Relative error: mean over the masks of |x - x32| / |x32| of each block's output",
        "",
        "## Error per part",
        "",
        *error_table,
        "",
        "## int8 with one part in float32: top-1 agreement",
        "",
        *variant_table,
    ]
    if speed_table:
        lines += [
            "",
            f"## Speed on bert-base's shape: {SPEED_SENTENCES} sentences in batches of {BATCH}, the graph alone, "
            f"median of {ROUNDS} alternating rounds",
            "",
            *speed_table,
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join([*lines, ""]), encoding="utf-8")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
