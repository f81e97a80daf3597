"""The check every exported graph passes before it is served: torch's scores on a probe batch.

Two shapes with padding (two texts, the shorter padded; the shorter alone), each mask's scores
compared with the full torch model's. A graph that answers otherwise is refused, not served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from maskserve.engine.base import pad_batch, probe_texts
from maskserve.engine.cpu import int8_kernels
from maskserve.engine.export_cache import ExportFailed
from maskserve.engine.onnx_export import feeds

# How far a shortcut (the read-rows last layer) may move the scores of the whole model in the same
# precision, on the probe: float32's rounding of another batch shape; for the lower precisions,
# their own agreement floors with float32 (the bounds their fidelity tests hold the default model
# to; int8's per class of int8 kernels, cpu.int8_kernels), so a shortcut may round as the precision
# does, and a broken one (scores unrelated to the model's) is still told apart.
SHORTCUT_SCORE_BOUNDS = {"float32": 1e-4, "float16": 0.02, "bfloat16": 0.02}
INT8_SHORTCUT_SCORE_BOUNDS = {"AMX": 0.08, "AVX-512 VNNI": 0.08, "AVX-VNNI": 0.08, "AVX2": 0.03}


# And how far, relatively, the read rows' hidden states may move from the whole layer's in a lower
# precision (the norm of the difference over the row's own norm): as far as its rounding of a
# layer's sums, or int8's activation ranges taken over other rows, move them; a wrong layer (rows
# swapped, features shifted or scaled) moves them by half their norm or more.
SHORTCUT_HIDDEN_BOUNDS = {"float16": 0.05, "bfloat16": 0.05, "int8": 0.1}


def shortcut_score_bound(precision: str) -> float:
    """The bound for a shortcut in ``precision`` ('float32', 'bfloat16', 'float16' or 'int8') on this CPU."""
    if precision == "int8":
        return INT8_SHORTCUT_SCORE_BOUNDS[int8_kernels()]
    return SHORTCUT_SCORE_BOUNDS[precision]


# The graph's inputs (onnx_export.feeds) -> logits at the masks, one row per mask.
RunGraph = Callable[[dict[str, np.ndarray]], np.ndarray]


class Probe:
    """The probe batches and torch's full-model scores at their masks, to check a graph against."""

    def __init__(self, tokenizer: Any, model: PreTrainedModel) -> None:
        texts = probe_texts(tokenizer)
        self.batches = [pad_batch(texts, tokenizer.pad_token_id), pad_batch(texts[1:], tokenizer.pad_token_id)]
        self.mask_token_id: int = tokenizer.mask_token_id
        self.expected: list[torch.Tensor] = []
        with torch.inference_mode():
            for ids, attention in self.batches:
                rows, cols = np.nonzero(ids == self.mask_token_id)
                logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attention)).logits
                self.expected.append(logits[torch.from_numpy(rows), torch.from_numpy(cols)].float().softmax(-1))

    def check(self, run: RunGraph, tolerance: float) -> float:
        """The largest score difference from torch's; raises :class:`ExportFailed` past ``tolerance``."""
        largest = 0.0
        for (ids, attention), expected in zip(self.batches, self.expected):
            rows, cols = np.nonzero(ids == self.mask_token_id)
            got = torch.from_numpy(np.asarray(run(feeds(ids, attention, rows, cols))))
            if got.shape != expected.shape:
                raise ExportFailed(f"the exported graph answers shape {tuple(got.shape)}, not {tuple(expected.shape)}")
            worst = float((got.float().softmax(-1) - expected).abs().max())
            if not worst <= tolerance:
                raise ExportFailed(
                    f"the exported graph's scores differ from torch's by up to {worst:.3g} on a probe "
                    f"(more than {tolerance:g})"
                )
            largest = max(largest, worst)
        return largest
