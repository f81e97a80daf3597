"""``--backend openvino --quantize int8``: the float32 graph quantized by NNCF, cached beside it.

Post-training static quantization: NNCF runs the float32 graph of ``openvino_export.py`` on a
small calibration set, records the range of every activation, and rewrites the encoder's matrix
products to take int8 weights and int8 activations, which a CPU with VNNI (AVX-512 VNNI, AVX-VNNI)
or AMX multiplies several times faster than float32. Answers move: agreement with float32 is
measured by ``benchmarks/agreement.py`` and shown in the docs, so int8 is opt-in.

The masked-LM head stays in float32. It ranks every vocabulary token against the others at each
mask, so its rounding changes the top tokens most; and it runs on the mask rows only, a small
share of a forward pass. So does the last layer at the read rows (its query, attention, output and
feed-forward; its keys and values read every row and are int8): on short texts, whose answers
are flat, its rounding decided most of int8's changed answers, and at a few rows it costs little.

The calibration texts are built in (below): varied English sentences of a few to about fifty
tokens, each with the model's own mask token, padded into batches as maskserve forms them. A
model of another language still gets every activation's range from them, less tightly.

The recipe depends on the CPU that serves (:func:`recipe_for`). Without VNNI or AMX, a CPU
multiplies int8 through 16-bit partial sums that saturate: NNCF's overflow fix stores the weights in
7 bits so that they cannot, and there the products that write into the residual stream stay in
float32 as well. ``benchmarks/int8_recipe.py`` measures what each part of the recipe gains, on
each class of CPU.

The quantized graph is a cache entry of its own, keyed on the float32 graph's key, NNCF's version,
the recipe and the calibration texts, with the float32 entry's guarantees
(``export_cache.export_to_cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from maskserve.engine.base import pad_batch
from maskserve.engine.cpu import int8_fast
from maskserve.engine.export_cache import key_of
from maskserve.engine.onnx_export import feeds
from maskserve.engine.openvino_export import MODEL_FILE

log = logging.getLogger(__name__)
# Bump when the quantization's recipe (its options, the ignored head, the batching) changes.
QUANTIZE_FORMAT = 3
# Calibration batches hold this many texts: several lengths padded together, as in serving.
CALIBRATION_BATCH = 4

# {m} is the model's mask token. Varied subjects, lengths and mask positions, a few with two masks:
# each activation's range must cover what served texts bring, long ones and padding included.
CALIBRATION_TEXTS = (
    "Paris is the {m} of France.",
    "The {m} barked at the mailman.",
    "She poured a cup of {m} and sat down.",
    "He {m} the ball across the field.",
    "Water boils at one hundred degrees {m}.",
    "The meeting was moved to {m} afternoon.",
    "Please {m} the door when you leave.",
    "I would like a {m} of bread, please.",
    "The cat is sleeping on the {m}.",
    "Our flight to {m} was delayed by two hours.",
    "The {m} rises in the east and sets in the west.",
    "My brother works as a {m} at the local hospital.",
    "The children played in the {m} until it got dark.",
    "She read the {m} before signing the contract.",
    "A {m} of wolves was seen near the village.",
    "The price of {m} has risen sharply this year.",
    "He forgot his {m} at home and could not get in.",
    "The museum is open every day except {m}.",
    "They planted {m} trees along the river.",
    "The {m} of the company announced record profits.",
    "Mix the flour with two {m} and a cup of milk.",
    "The train leaves the {m} at seven in the morning.",
    "Do not forget to {m} your teeth before bed.",
    "The {m} scored in the last minute of the match.",
    "The server returned an {m} when the disk was full.",
    "Restart the {m} after installing the update.",
    "The function returns {m} if the list is empty.",
    "Add a {m} to the database table for the new field.",
    "The patient was given {m} for the pain.",
    "The court ruled that the law was {m}.",
    "Interest {m} were raised by a quarter of a point.",
    "The novel was first {m} in eighteen fifty one.",
    "Mountains covered in {m} rose above the valley.",
    "The {m} was so loud that nobody could sleep.",
    "She speaks English, French and {m} fluently.",
    "The recipe calls for fresh {m} and a pinch of salt.",
    "{m} is the largest planet in the solar system.",
    "The {m} of the story is that honesty pays.",
    "He {m} his keys and had to call a locksmith.",
    "We {m} dinner at a small restaurant by the sea.",
    "The {m} and the {m} met at the corner of the street.",
    "A {m} day is better for a walk than a {m} one.",
    "The committee, after a long debate that lasted well into the night, finally {m} to postpone "
    "the vote until the next session, when more members would be present.",
    "Although the weather forecast had promised sunshine for the whole weekend, heavy {m} began "
    "to fall on Saturday morning, and the outdoor concert had to be moved into the old town hall.",
    "The research team collected samples from more than forty lakes across the region and found "
    "that the concentration of {m} had doubled in the last decade, mostly because of farming.",
    "When the old bridge was finally closed for repairs, drivers had to take a long detour "
    "through the {m}, which added almost an hour to their daily commute into the city.",
    "In the first chapter of the book, the author describes her childhood in a small fishing "
    "village, where her father repaired {m} and her mother sold bread at the market every week.",
    "To configure the service, copy the example settings file, set the {m} of the database and "
    "the port to listen on, then start the server and open the address in a web browser.",
)


@dataclass(frozen=True)
class Int8Recipe:
    """How the float32 graph is quantized: chosen by the int8 kernels of the CPU that serves."""

    name: str
    # Weights in 7 bits in every layer (NNCF's overflow fix; its default fixes the first layer
    # only), so that AVX2's 16-bit partial sums cannot saturate. VNNI and AMX sum in 32 bits and
    # never saturate: there the weights keep their eighth bit past the first layer, which moves
    # fewer near-ties on short texts (benchmarks/precision_parts.py).
    overflow_fix: bool
    # SmoothQuant's migration strength for matrix products: how much of the activations' outliers
    # move into the weights. Below NNCF's transformer default, so that 7-bit weights are not the
    # ones left with the outliers. None: NNCF's default.
    smooth_quant_alpha: float | None
    # The attention-output and feed-forward-output products, which write into the residual
    # stream, kept in float32: the residual sums carry the widest outliers, and without VNNI an
    # int8 product gains no speed over float32 to pay for the lost agreement.
    residual_products_in_float32: bool
    # NNCF's full bias correction instead of its fast one: slower to quantize (once per model),
    # no slower to serve; it gains agreement on short texts where the weights keep 8 bits.
    full_bias_correction: bool = False
    # The last layer's products at the read rows (its query, attention, attention output and
    # feed-forward: what the read-rows last layer computes at the asked rows only) kept in float32.
    # They decide near-ties between the first answers, and at a few rows they cost little.
    read_rows_in_float32: bool = False
    # Node-name patterns (NNCF's ignored-scope regular expressions) kept in float32 besides: for
    # benchmarks/precision_parts.py, which measures what each part of the graph costs in int8.
    float32_patterns: tuple[str, ...] = ()


# With VNNI or AMX: int8 everywhere but the head and the last layer's read rows, at full speed.
VNNI_RECIPE = Int8Recipe(
    "vnni",
    overflow_fix=False,
    smooth_quant_alpha=0.8,
    residual_products_in_float32=False,
    full_bias_correction=True,
    read_rows_in_float32=True,
)
# Without them: agreement first, since int8 cannot be fast there anyway.
AVX2_RECIPE = Int8Recipe(
    "avx2", overflow_fix=True, smooth_quant_alpha=0.8, residual_products_in_float32=True, read_rows_in_float32=True
)


def recipe_for(flags: frozenset[str] | None = None) -> Int8Recipe:
    """The recipe for this CPU (or one with ``flags``)."""
    return VNNI_RECIPE if int8_fast(flags) else AVX2_RECIPE


def calibration_texts(mask_token: str) -> list[str]:
    return [text.format(m=mask_token) for text in CALIBRATION_TEXTS]


def calibration_digest() -> str:
    return hashlib.sha256("\n".join(CALIBRATION_TEXTS).encode()).hexdigest()[:16]


def quantized_key(float32_parts: dict[str, Any], recipe: Int8Recipe) -> tuple[str, dict[str, Any]]:
    """The cache key of the int8 graph made from the float32 graph of ``float32_parts``."""
    import nncf

    parts = {
        **float32_parts,
        "quantize": "int8",
        "quantize_format": QUANTIZE_FORMAT,
        "nncf": nncf.__version__,
        "calibration": calibration_digest(),
        "recipe": asdict(recipe),
    }
    return key_of(parts), parts


def calibration_batches(tokenizer: Any) -> list[dict[str, np.ndarray]]:
    """The calibration texts as the graph's inputs: length-sorted, padded batches."""
    encoded = sorted(
        (
            tokenizer(text, return_attention_mask=False, return_token_type_ids=False)["input_ids"]
            for text in calibration_texts(tokenizer.mask_token)
        ),
        key=len,
    )
    return graph_batches(encoded, tokenizer, CALIBRATION_BATCH)


def graph_batches(encoded: Sequence[Sequence[int]], tokenizer: Any, size: int) -> list[dict[str, np.ndarray]]:
    """Token ids as the graph's inputs: padded batches of ``size`` in their order, read at their masks."""
    batches = []
    for start in range(0, len(encoded), size):
        ids, attention = pad_batch(encoded[start : start + size], tokenizer.pad_token_id)
        rows, cols = np.nonzero(ids == tokenizer.mask_token_id)
        batches.append(feeds(ids, attention, rows, cols))
    return batches


def head_matmuls(model: Any) -> list[str]:
    """The matrix products downstream of the gather of the asked rows (``read_index``): the head,
    which stays float32.

    Found by the graph's data flow, not by layer names, so that any architecture's head is. The
    last layer's products at the read rows come before that gather (they read ``read_columns``:
    :func:`read_rows_matmuls`).
    """
    return _matmuls_downstream_of(model, "read_index")


def _matmuls_downstream_of(model: Any, input_name: str) -> list[str]:
    """The matrix products that the graph input ``input_name`` flows into, in graph order."""
    (start,) = [p for p in model.get_parameters() if input_name in p.output(0).get_names()]
    downstream = {start.get_friendly_name()}
    found = []
    for op in model.get_ordered_ops():  # topological order: producers before consumers
        if any(value.get_node().get_friendly_name() in downstream for value in op.input_values()):
            downstream.add(op.get_friendly_name())
            if op.get_type_name() == "MatMul":
                found.append(op.get_friendly_name())
    return found


def _consumers(node: Any) -> list[Any]:
    return [target.get_node() for output in node.outputs() for target in output.get_target_inputs()]


def _fixed_nodes(model: Any) -> set[str]:
    """The nodes whose value the graph fixes (weights: constants, and what is computed from
    constants only, as an int8 graph's dequantized weights are), not its inputs."""
    fixed: set[str] = set()
    for op in model.get_ordered_ops():  # topological order: producers before consumers
        kind = op.get_type_name()
        inputs = [value.get_node().get_friendly_name() for value in op.input_values()]
        if kind == "Constant" or (kind != "Parameter" and inputs and all(name in fixed for name in inputs)):
            fixed.add(op.get_friendly_name())
    return fixed


def residual_products(model: Any) -> list[str]:
    """The weight products whose result, after its bias, is added to the residual stream: each
    layer's attention-output and feed-forward-output projections.

    Found by data flow (a product with a weight, an optional bias add, then an add of two computed
    values), not by layer names, so that any architecture's are, in a float32 or an int8 graph.
    """
    fixed = _fixed_nodes(model)

    def fixed_inputs(node: Any) -> int:
        return sum(value.get_node().get_friendly_name() in fixed for value in node.input_values())

    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or not fixed_inputs(op):
            continue
        biased = [node for node in _consumers(op) if node.get_type_name() == "Add" and fixed_inputs(node)]
        if any(
            node.get_type_name() == "Add" and not fixed_inputs(node)
            for value in biased or [op]
            for node in _consumers(value)
        ):
            found.append(op.get_friendly_name())
    return found


def read_rows_matmuls(model: Any) -> list[str]:
    """The matrix products downstream of the read rows' gather (``read_columns``) and upstream of
    the head's (``read_index``): the last layer's products at the read rows only.

    Its keys and values read every row, so they are not among them. Found by data flow, as
    :func:`head_matmuls` finds the head.
    """
    found = _matmuls_downstream_of(model, "read_columns")
    head = set(head_matmuls(model))
    return [name for name in found if name not in head]


def float32_products(model: Any, recipe: Int8Recipe, head: list[str]) -> list[str]:
    """The products ``recipe`` keeps in float32: the ``head`` always; the residual ones and the
    last layer's at the read rows if it says so."""
    kept = list(head)
    if recipe.residual_products_in_float32:
        kept += residual_products(model)
    if recipe.read_rows_in_float32:
        kept += read_rows_matmuls(model)
    return list(dict.fromkeys(kept))


def quantize_graph(model: Any, folder: Path, tokenizer: Any, recipe: Int8Recipe) -> dict[str, Any]:
    """Quantize the float32 graph ``model`` (read, not compiled) to int8 by ``recipe`` and save it
    in ``folder``.

    Returns what was done, for meta.json. NNCF runs the graph on an OpenVINO Core of its own,
    started and ended inside this call, after the process's shared one (see openvino.shared_core).
    """
    import nncf
    import openvino
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
    )

    started = time.perf_counter()
    head = head_matmuls(model)
    kept = float32_products(model, recipe, head)
    advanced = AdvancedQuantizationParameters(
        overflow_fix=OverflowFix.ENABLE if recipe.overflow_fix else OverflowFix.FIRST_LAYER,
    )
    if recipe.smooth_quant_alpha is not None:
        advanced.smooth_quant_alphas = AdvancedSmoothQuantParameters(matmul=recipe.smooth_quant_alpha)
    batches = calibration_batches(tokenizer)
    # NNCF logs and draws progress bars on stdout, in its own format: kept out of the server's
    # output (one record per line, on stderr). Its progress goes to this module's debug log; its
    # info lines (which layers it skipped) are dropped, its warnings kept.
    chatter = io.StringIO()
    nncf_level = logging.getLogger("nncf").level
    nncf.set_log_level(logging.WARNING)
    try:
        with contextlib.redirect_stdout(chatter):
            quantized = nncf.quantize(
                model,
                nncf.Dataset(batches),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(batches),
                # Names found in this graph are checked to exist; patterns may match nothing.
                ignored_scope=nncf.IgnoredScope(
                    names=kept, patterns=list(recipe.float32_patterns), validate=not recipe.float32_patterns
                ),
                advanced_parameters=advanced,
                fast_bias_correction=not recipe.full_bias_correction,
            )
    finally:
        nncf.set_log_level(nncf_level)
    log.debug("NNCF: %s", chatter.getvalue())
    openvino.save_model(quantized, str(folder / MODEL_FILE), compress_to_fp16=False)
    return {
        "recipe": recipe.name,
        "float32_head_matmuls": len(head),
        "float32_encoder_matmuls": len(kept) - len(head),
        "calibration_batches": len(batches),
        "quantize_seconds": round(time.perf_counter() - started, 3),
    }
