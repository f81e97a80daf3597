"""``--backend openvino --quantize int8``: the float32 graph quantized by NNCF, cached beside it.

Post-training static quantization: NNCF runs the float32 graph of ``openvino_export.py`` on a
small calibration set, records the range of every activation, and rewrites the encoder's matrix
products to take int8 weights and int8 activations, which a CPU with VNNI (AVX-512 VNNI, AVX-VNNI)
or AMX multiplies several times faster than float32. Answers move: agreement with float32 is
measured by ``benchmarks/agreement.py`` and shown in the docs, so int8 is opt-in.

The masked-LM head stays in float32. It ranks every vocabulary token against the others at each
mask, so its rounding changes the top tokens most; and it runs on the mask rows only, a small
share of a forward pass.

The calibration texts are built in (below): varied English sentences of a few to about fifty
tokens, each with the model's own mask token, padded into batches as maskserve forms them. A
model of another language still gets every activation's range from them, less tightly.

The quantized graph is a cache entry of its own, keyed on the float32 graph's key, NNCF's version
and the calibration texts, with the float32 entry's guarantees (``onnx_export.export_to_cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from .base import pad_batch
from .onnx_export import INPUTS, key_of
from .openvino_export import MODEL_FILE

log = logging.getLogger(__name__)
# Bump when the quantization's recipe (its options, the ignored head, the batching) changes.
QUANTIZE_FORMAT = 1
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


def calibration_texts(mask_token: str) -> list[str]:
    return [text.format(m=mask_token) for text in CALIBRATION_TEXTS]


def calibration_digest() -> str:
    return hashlib.sha256("\n".join(CALIBRATION_TEXTS).encode()).hexdigest()[:16]


def quantized_key(float32_parts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cache key of the int8 graph made from the float32 graph of ``float32_parts``."""
    import nncf

    parts = {
        **float32_parts,
        "quantize": "int8",
        "quantize_format": QUANTIZE_FORMAT,
        "nncf": nncf.__version__,
        "calibration": calibration_digest(),
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
    batches = []
    for start in range(0, len(encoded), CALIBRATION_BATCH):
        ids, attention = pad_batch(encoded[start : start + CALIBRATION_BATCH], tokenizer.pad_token_id)
        rows, cols = np.nonzero(ids == tokenizer.mask_token_id)
        mask_index = (rows * ids.shape[1] + cols).astype(np.int64)
        batches.append(dict(zip(INPUTS, (ids, attention, mask_index))))
    return batches


def head_matmuls(model: Any) -> list[str]:
    """The matrix products downstream of the mask gather: the head, which stays float32.

    Found by the graph's data flow, not by layer names, so that any architecture's head is.
    """
    (mask_index,) = [p for p in model.get_parameters() if "mask_index" in p.output(0).get_names()]
    downstream = {mask_index.get_friendly_name()}
    found = []
    for op in model.get_ordered_ops():  # topological order: producers before consumers
        if any(value.get_node().get_friendly_name() in downstream for value in op.input_values()):
            downstream.add(op.get_friendly_name())
            if op.get_type_name() == "MatMul":
                found.append(op.get_friendly_name())
    return found


def quantize_graph(model: Any, folder: Path, tokenizer: Any) -> dict[str, Any]:
    """Quantize the float32 graph ``model`` (read, not compiled) to int8 and save it in ``folder``.

    Returns what was done, for meta.json. NNCF runs the graph on an OpenVINO Core of its own,
    started and ended inside this call, after the process's shared one (see openvino.shared_core).
    """
    import nncf
    import openvino

    started = time.perf_counter()
    head = head_matmuls(model)
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
                ignored_scope=nncf.IgnoredScope(names=head),
            )
    finally:
        nncf.set_log_level(nncf_level)
    log.debug("NNCF: %s", chatter.getvalue())
    openvino.save_model(quantized, str(folder / MODEL_FILE), compress_to_fp16=False)
    return {
        "float32_head_matmuls": len(head),
        "calibration_batches": len(batches),
        "quantize_seconds": round(time.perf_counter() - started, 3),
    }
