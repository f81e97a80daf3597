"""The openvino backend's graph: ``openvino.convert_model`` of the mask-logits module, cached.

The graph is the onnxruntime backend's (onnx_export.MaskLogitsGraph): the encoder, its last layer
at the read positions only where the model's layout allows, and the masked-LM head on those rows. It is
converted straight from the torch module (no ONNX file in between) and saved as OpenVINO IR
(``model.xml`` and ``model.bin``, weights kept in float32) in ``<cache dir>/openvino/<key>/``,
with the ONNX cache's guarantees: a content and versions key, an atomic publish, a corrupt entry
converted again (export_cache.export_to_cache). The precision is chosen when the graph is
compiled, not here: float32 and bfloat16 share one entry.

OpenVINO keeps the compiled model of each precision and thread count in the entry's
``compiled/`` subfolder (its ``CACHE_DIR``), keyed by OpenVINO itself on the graph, the
compile settings and the CPU, so a restart skips compilation.

OpenVINO maps ``model.bin`` into memory rather than copying it, and a running server reads its
weights from that mapping: an entry's files are never rewritten in place (an entry is published
and discarded by renaming its folder), since a rewrite would change or cut a live server's weights.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from maskserve.engine.export_cache import key_of, model_parts
from maskserve.engine.onnx_export import INPUTS, OUTPUT, MaskLogitsGraph, example_inputs

# Bump when the graph's layout (wrapper, inputs, outputs, conversion options) changes.
EXPORT_FORMAT = 2
MODEL_FILE = "model.xml"
COMPILED_DIR = "compiled"


def export_key(model: PreTrainedModel, read_rows: bool) -> tuple[str, dict[str, Any]]:
    """The cache key of ``model``'s OpenVINO graph, with or without the read-rows last layer, and
    the parts it hashes (kept in meta.json)."""
    import openvino

    parts: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "backend": "openvino",
        **model_parts(model),
        "dtype": "float32",
        "read_rows_last_layer": read_rows,
        "openvino": openvino.__version__,
    }
    return key_of(parts), parts


def convert_graph(model: PreTrainedModel, folder: Path, *, read_rows: bool) -> dict[str, Any]:
    """Convert ``model``'s mask-logits graph, with or without the read-rows last layer, and save it
    in ``folder``; what was done, for meta.json."""
    import openvino

    started = time.perf_counter()
    graph = MaskLogitsGraph(model, read_rows=read_rows).eval()
    shapes = [(name, [-1] * (1 if name == "read_index" else 2), openvino.Type.i64) for name in INPUTS]
    # The tracer's warnings (Python branches it cannot follow, here on shapes that stay dynamic)
    # are expected here, and only here.
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = openvino.convert_model(graph, example_input=example_inputs(model), input=shapes)
    converted.outputs[0].get_tensor().set_names({OUTPUT})
    # compress_to_fp16 would halve the file but round every weight: float32 answers must stay
    # the pipeline's, and bfloat16 is a compile-time choice.
    openvino.save_model(converted, str(folder / MODEL_FILE), compress_to_fp16=False)
    return {
        "mask_only_head": graph.mask_only_head,
        "read_rows_last_layer": read_rows,
        "convert_seconds": round(time.perf_counter() - started, 3),
    }
