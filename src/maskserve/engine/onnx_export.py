"""The graph every graph backend runs, and the onnxruntime backend's export and fusion of it.

One graph per model: the encoder, a gather of its hidden states at the mask positions, and the
masked-LM head on those rows only (inputs ``input_ids``, ``attention_mask`` and ``mask_index``, the
flat positions ``row * length + column`` of the masks, :func:`mask_index`; output ``logits``, one
row per mask). For onnxruntime it is exported with torch.onnx, then ONNX Runtime's BERT fusions
(attention, skip layer norm, GELU, embeddings) are applied, and the result is cached in
``<cache dir>/onnx/<key>/`` (``export_cache.py``). The key hashes the model's content, the versions
of torch, transformers, onnx and onnxruntime, the opset, the fusion settings, the dtype and this
module's own graph layout (:data:`EXPORT_FORMAT`).
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
from maskserve.engine.pretrained import split_mlm_head

log = logging.getLogger(__name__)

# Bump when the graph's layout (wrapper, inputs, outputs, fusion call) changes: old entries are
# then never looked up again.
EXPORT_FORMAT = 1
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "mask_index")
OUTPUT = "logits"
MODEL_FILE = "model.onnx"
# A protobuf holds at most 2 GB: larger graphs keep their weights in a side file.
EXTERNAL_DATA_BYTES = 1_500_000_000


def mask_index(input_ids: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The graph's ``mask_index``: the flat positions ``row * length + column`` of the masks at
    ``(rows, cols)`` of the padded ``input_ids``."""
    index: np.ndarray = (rows * input_ids.shape[1] + cols).astype(np.int64)
    return index


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


def export_key(model: PreTrainedModel) -> tuple[str, dict[str, Any]]:
    """The cache key of ``model``'s graph, and the parts it hashes (kept in meta.json)."""
    import onnx
    import onnxruntime

    parts: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        **model_parts(model),
        "dtype": "float32",
        "opset": OPSET,
        "fusion": fusion_settings(model),
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    return key_of(parts), parts


class MaskLogitsGraph(torch.nn.Module):
    """What is exported: the model's logits at the flat mask positions ``mask_index`` only."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.split = split_mlm_head(model)

    @property
    def mask_only_head(self) -> bool:
        return self.split is not None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_index: torch.Tensor) -> torch.Tensor:
        if self.split is not None:
            base, head = self.split
            hidden = base(input_ids=input_ids, attention_mask=attention_mask)[0]
            at_masks = hidden.reshape(-1, hidden.shape[-1]).index_select(0, mask_index)
            logits: torch.Tensor = head(at_masks)
            return logits
        full: torch.Tensor = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return full.reshape(-1, full.shape[-1]).index_select(0, mask_index)


def example_inputs(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two texts of different lengths: padding in the trace, so no branch is traced for 'no padding'."""
    pad = int(getattr(model.config, "pad_token_id", 0) or 0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, pad, pad, pad]], dtype=torch.int64)
    attention = (torch.arange(7) < torch.tensor([[7], [4]])).to(torch.int64)
    return ids, attention, torch.tensor([2, 7 + 1], dtype=torch.int64)


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


def export_graph(model: PreTrainedModel, folder: Path) -> dict[str, Any]:
    """Export and fuse ``model`` into ``folder``/model.onnx; what was done, for meta.json."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    started = time.perf_counter()
    graph = MaskLogitsGraph(model).eval()
    # The unfused graph in its own subfolder: past 2 GB the exporter writes each weight as a side
    # file next to it, and none of those belongs in the entry.
    raw = folder / "raw" / "exported.onnx"
    raw.parent.mkdir()
    dynamic = {
        "input_ids": {0: "batch", 1: "length"},
        "attention_mask": {0: "batch", 1: "length"},
        "mask_index": {0: "masks"},
        OUTPUT: {0: "masks"},
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
        "fused_operators": operators,
        "export_seconds": round(exported_s, 3),
        "fusion_seconds": round(time.perf_counter() - started - exported_s, 3),
    }
