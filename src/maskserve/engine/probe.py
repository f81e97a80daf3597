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
from maskserve.engine.export_cache import ExportFailed
from maskserve.engine.onnx_export import mask_index

# (input_ids, attention_mask, flat mask positions) -> logits at the masks, one row per mask.
RunGraph = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


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
            got = torch.from_numpy(np.asarray(run(ids, attention, mask_index(ids, rows, cols))))
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
