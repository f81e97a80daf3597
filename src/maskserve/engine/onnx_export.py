"""The graph every graph backend runs, and the onnxruntime backend's export and fusion of it.

One graph per model: the encoder, its last layer at the read positions only where the model's
layout allows (``last_layer.py``), and the masked-LM head on those rows only. Its inputs are
``input_ids``, ``attention_mask``, and the read positions as ``read_rows.ReadRows`` lays them out
(``read_columns``, each row's read columns, padded; ``read_index``, each asked position's place
among them); its output ``logits``, one row per asked position (:func:`feeds` builds the inputs).
Without the read-rows last layer (another layout, or a graph that disagreed with the whole
model), the whole last layer is computed and the same inputs pick its rows: one format either way.

For onnxruntime it is exported with torch.onnx, then ONNX Runtime's BERT fusions (attention, skip
layer norm, GELU, embeddings) are applied, and the result is cached in ``<cache dir>/onnx/<key>/``
(``export_cache.py``). The key hashes the model's content, the versions of torch, transformers,
onnx and onnxruntime, the opset, the fusion settings, the dtype, whether the last layer reads
rows only, and this module's own graph layout (:data:`EXPORT_FORMAT`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from maskserve.engine.export_cache import key_of, model_parts
from maskserve.engine.last_layer import ReadRowsLastLayer, rows_at
from maskserve.engine.pretrained import split_mlm_head
from maskserve.engine.read_rows import ReadRows

log = logging.getLogger(__name__)

# Bump when the graph's layout (wrapper, inputs, outputs, fusion call) changes: old entries are
# then never looked up again.
EXPORT_FORMAT = 2
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "read_columns", "read_index")
OUTPUT = "logits"
MODEL_FILE = "model.onnx"
# A protobuf holds at most 2 GB: larger graphs keep their weights in a side file.
EXTERNAL_DATA_BYTES = 1_500_000_000


def feeds(
    input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> dict[str, np.ndarray]:
    """The graph's inputs for the padded batch ``input_ids`` read at ``(rows, cols)``."""
    reads = ReadRows.at(len(input_ids), rows, cols)
    return dict(zip(INPUTS, (input_ids, attention_mask, reads.columns, reads.index)))


def fusion_settings(model: PreTrainedModel) -> dict[str, Any]:
    """How onnxruntime.transformers.optimizer is called; part of the key."""
    return {
        "model_type": "bert",
        "num_heads": int(getattr(model.config, "num_attention_heads", 0) or 0),
        "hidden_size": int(getattr(model.config, "hidden_size", 0) or 0),
        # Python fusions only: ONNX Runtime's own graph optimizations run when a session opens,
        # so the file stays independent of this CPU's instruction set.
        "opt_level": 0,
    }


def export_key(model: PreTrainedModel, read_rows: bool) -> tuple[str, dict[str, Any]]:
    """The cache key of ``model``'s graph, with or without the read-rows last layer, and the parts
    it hashes (kept in meta.json)."""
    import onnx
    import onnxruntime

    parts: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        **model_parts(model),
        "dtype": "float32",
        "read_rows_last_layer": read_rows,
        "opset": OPSET,
        "fusion": fusion_settings(model),
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    return key_of(parts), parts


def read_rows_refusal(model: PreTrainedModel) -> str | None:
    """Why ``model``'s graph cannot compute its last layer at the read rows only; None when it can."""
    split = split_mlm_head(model)
    if split is None:
        return "the model is not an encoder and a head apart"
    if ReadRowsLastLayer.find(split[0]) is None:
        return f"{type(model).__name__}'s last layer is not of a layout it knows"
    return None


class MaskLogitsGraph(torch.nn.Module):
    """What is exported: the model's logits at the read positions only.

    With ``read_rows``, the last layer is computed at those rows only; the model must then be one
    :func:`read_rows_refusal` accepts.
    """

    def __init__(self, model: PreTrainedModel, *, read_rows: bool) -> None:
        super().__init__()
        self.model = model
        self.split = split_mlm_head(model)
        self.last_layer = ReadRowsLastLayer.find(self.split[0]) if read_rows and self.split is not None else None
        if read_rows and self.last_layer is None:
            raise ValueError(f"no read-rows last layer: {read_rows_refusal(model)}")

    @property
    def mask_only_head(self) -> bool:
        return self.split is not None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        read_columns: torch.Tensor,
        read_index: torch.Tensor,
    ) -> torch.Tensor:
        if self.split is not None:
            base, head = self.split
            if self.last_layer is not None:
                read = self.last_layer(input_ids, attention_mask, read_columns, read_index)
            else:
                hidden = base(input_ids=input_ids, attention_mask=attention_mask)[0]
                read = _flat_rows(rows_at(hidden, read_columns), read_index)
            logits: torch.Tensor = head(read)
            return logits
        full: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return _flat_rows(rows_at(full, read_columns), read_index)


def _flat_rows(read: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(batch, reads, width) at ``index`` of its flattened rows: (asked positions, width)."""
    return read.reshape(-1, read.shape[-1]).index_select(0, index)


def example_inputs(model: PreTrainedModel) -> tuple[torch.Tensor, ...]:
    """Two texts of different lengths, read at two and one positions: padding, and a padded read
    slot, in the trace, so no branch is traced for 'no padding'."""
    pad = int(getattr(model.config, "pad_token_id", 0) or 0)
    ids = np.array([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, pad, pad, pad]], dtype=np.int64)
    attention = (np.arange(7) < np.array([[7], [4]])).astype(np.int64)
    inputs = feeds(ids, attention, np.array([0, 0, 1]), np.array([2, 5, 1]))
    return tuple(torch.from_numpy(inputs[name]) for name in INPUTS)


@contextlib.contextmanager
def _quiet_fusion_logs() -> Iterator[None]:
    """onnxruntime.transformers logs each fusion step at INFO under top-level module names
    (``onnx_model_bert``, ``fusion_attention``...); the loader logs one summary line instead."""
    names = [
        name
        for name in logging.root.manager.loggerDict
        if name.startswith(("onnx_model", "fusion_", "optimizer", "onnxruntime"))
    ]
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def export_graph(model: PreTrainedModel, folder: Path, *, read_rows: bool) -> dict[str, Any]:
    """Export and fuse ``model`` into ``folder``/model.onnx, with or without the read-rows last
    layer; what was done, for meta.json."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    started = time.perf_counter()
    graph = MaskLogitsGraph(model, read_rows=read_rows).eval()
    # The unfused graph in its own subfolder: past 2 GB the exporter writes each weight as a side
    # file next to it, and none of those belongs in the entry.
    raw = folder / "raw" / "exported.onnx"
    raw.parent.mkdir()
    dynamic = {
        "input_ids": {0: "batch", 1: "length"},
        "attention_mask": {0: "batch", 1: "length"},
        "read_columns": {0: "batch", 1: "reads"},
        "read_index": {0: "asked"},
        OUTPUT: {0: "asked"},
    }
    # The TorchScript exporter, on purpose: on torch 2.13 the dynamo exporter's graph gave ONNX
    # Runtime's fusion no Attention to fuse at all (the TorchScript one's fuses every layer), and
    # it exported several times slower. Its deprecation and tracer warnings are expected here, and
    # only here.
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            example_inputs(model),
            str(raw),
            dynamo=False,
            input_names=list(INPUTS),
            output_names=[OUTPUT],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
        )
    exported_s = time.perf_counter() - started
    settings = fusion_settings(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with _quiet_fusion_logs():
        fused = optimizer.optimize_model(
            str(raw),
            model_type=settings["model_type"],
            num_heads=settings["num_heads"],
            hidden_size=settings["hidden_size"],
            optimization_options=FusionOptions(settings["model_type"]),
            opt_level=settings["opt_level"],
        )
        fused.save_model_to_file(str(folder / MODEL_FILE), use_external_data_format=weight_bytes > EXTERNAL_DATA_BYTES)
        operators = {name: count for name, count in fused.get_fused_operator_statistics().items() if count}
    shutil.rmtree(raw.parent)
    return {
        "mask_only_head": graph.mask_only_head,
        "read_rows_last_layer": read_rows,
        "fused_operators": operators,
        "export_seconds": round(exported_s, 3),
        "fusion_seconds": round(time.perf_counter() - started - exported_s, 3),
    }
