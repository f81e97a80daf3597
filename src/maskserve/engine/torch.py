"""The torch backend: any model, device, dtype or ``--quantize``; threads sized per batch."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from maskserve.engine.base import FillMaskEngine, probe_texts
from maskserve.engine.cpu import describe_features, precision_in_effect
from maskserve.engine.last_layer import ReadRowsLastLayer
from maskserve.engine.pretrained import (
    ModelLoadError,
    default_model_dir,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    split_mlm_head,
)
from maskserve.engine.threads import ThreadPolicy, encoder_flops_per_token

log = logging.getLogger(__name__)


class TorchFillMaskEngine(FillMaskEngine):
    """The torch backend: any model, device, dtype or ``--quantize``; threads sized per batch."""

    backend = "torch"

    def __init__(
        self,
        tokenizer: Any,
        model: PreTrainedModel,
        *,
        name: str,
        device: torch.device,
        threads: ThreadPolicy | None = None,
    ) -> None:
        self.model = model.eval()  # type: ignore[no-untyped-call]
        super().__init__(
            tokenizer,
            model.config,
            name=name,
            device=device,
            threads=threads or ThreadPolicy(torch.get_num_threads(), False, encoder_flops_per_token(model)),
            architecture=type(model).__name__,
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        )
        self._split_head = self._find_split_head()
        self.float32_head = False
        if self._split_head is not None and self.dtype == "bfloat16" and device.type == "cpu":
            # bfloat16 keeps 8 bits of each logit's mantissa, and the top tokens of a mask are
            # often closer than that: they swap. The head runs on the mask rows only, so a float32
            # copy of it costs little time and brings top-1 agreement with float32 back up
            # (benchmarks/agreement.py measures it). The encoder, nearly all the work, stays bf16.
            base, head = self._split_head
            self._split_head = (base, Float32Head(head))
            self.float32_head = True
        self._last_layer = self._find_read_rows_last_layer()

    def _describe_backend(self) -> dict[str, str | int | float]:
        return {
            "torch_threads": self.threads.max_threads,
            "thread_policy": "one thread for small batches" if self.threads.adaptive else "fixed",
            "mask_only_head": ("yes, in float32" if self.float32_head else "yes") if self._split_head else "no",
            "read_rows_last_layer": "yes" if self._last_layer else "no",
        }

    def _mask_logits(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> torch.Tensor:
        wanted = self.threads.threads_for(input_ids.size)
        if wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)
        return self._torch_mask_logits(
            input_ids, attention_mask, rows, cols, split=self._split_head, last_layer=self._last_layer
        )

    def _torch_mask_logits(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        rows: np.ndarray,
        cols: np.ndarray,
        *,
        split: tuple[torch.nn.Module, torch.nn.Module] | None,
        last_layer: ReadRowsLastLayer | None = None,
    ) -> torch.Tensor:
        ids = torch.from_numpy(input_ids).to(self.device)
        attention = torch.from_numpy(attention_mask).to(self.device)
        at_rows, at_cols = torch.from_numpy(rows).to(self.device), torch.from_numpy(cols).to(self.device)
        if split is not None and last_layer is not None:
            read: torch.Tensor = split[1](last_layer(ids, attention, at_rows, at_cols))
            return read
        if split is not None:
            base, head = split
            hidden = base(input_ids=ids, attention_mask=attention)[0]
            logits: torch.Tensor = head(hidden[at_rows, at_cols])
            return logits
        full: torch.Tensor = self.model(input_ids=ids, attention_mask=attention).logits
        return full[at_rows, at_cols]

    def _find_split_head(self) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        """(encoder, MLM head) if running the head on mask rows only gives the full model's logits.

        That skips a (hidden x vocabulary) projection at every other position. It is kept only if
        it agrees with the full model on a probe batch.
        """
        split = split_mlm_head(self.model)
        if split is None:
            return None
        if not self._agrees_on_probe(split=split):
            log.info("mask-only MLM head disagrees with the full model; using the full model")
            return None
        return split

    def _find_read_rows_last_layer(self) -> ReadRowsLastLayer | None:
        """The last layer at the read rows only, if the encoder has a known layout and it gives
        the full model's logits on a probe batch (within float32's rounding of a different batch
        shape; a lower precision rounds further, and keeps the whole last layer).
        """
        if self._split_head is None or self.dtype != "float32":
            return None
        last_layer = ReadRowsLastLayer.find(self._split_head[0])
        if last_layer is None:
            return None
        if not self._agrees_on_probe(split=self._split_head, last_layer=last_layer):
            log.info("the last layer at the read rows disagrees with the full model; computing it whole")
            return None
        return last_layer

    def _agrees_on_probe(
        self, *, split: tuple[torch.nn.Module, torch.nn.Module], last_layer: ReadRowsLastLayer | None = None
    ) -> bool:
        """Whether these shortcuts give the full model's mask logits on a probe batch, within 1e-4;
        any failure of theirs is a no."""
        ids, attention = self._pad(probe_texts(self.tokenizer))
        rows, cols = np.nonzero(ids == self.mask_token_id)
        with torch.inference_mode():
            full = self._torch_mask_logits(ids, attention, rows, cols, split=None)
            try:
                short = self._torch_mask_logits(ids, attention, rows, cols, split=split, last_layer=last_layer)
            except Exception:  # noqa: BLE001 - any failure means: without the shortcut
                return False
        return short.shape == full.shape and torch.allclose(short, full, atol=1e-4)


class Float32Head(torch.nn.Module):
    """A float32 copy of a reduced-precision MLM head: it takes the encoder's rows in any dtype."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = copy.deepcopy(head).float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(hidden.float())
        return logits


def quantize_int8(model: PreTrainedModel) -> PreTrainedModel:
    """Dynamic int8 quantization of every Linear layer: weights int8, activations quantized per batch.

    torch.ao's eager API is deprecated in favour of torchao, which would be a new dependency for
    one call; its warning is silenced here, and only here, on purpose.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        quantized: PreTrainedModel = quantize_dynamic(  # type: ignore[no-untyped-call]
            model, {torch.nn.Linear}, dtype=torch.qint8
        )
    return quantized


def load_engine(
    model: str | None,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int = 1,
    adaptive_threads: bool = False,
    quantize: str = "none",
) -> TorchFillMaskEngine:
    """Load the tokenizer and masked-LM model once, refusing any model that cannot fill masks."""
    started = time.perf_counter()
    torch.set_num_threads(threads)
    target_device = resolve_device(device)
    target_dtype = resolve_dtype(dtype, target_device)
    log.info(
        "loading model from %s on %s (%s, %d torch threads%s); CPU matrix features: %s",
        model or default_model_dir(),
        target_device,
        precision_in_effect(str(target_dtype).removeprefix("torch."), target_device.type),
        threads,
        ", one for small batches" if adaptive_threads else "",
        describe_features(),
    )
    loaded = load_pretrained(model, device=target_device, dtype=target_dtype)
    served = loaded.model
    if quantize == "int8":
        if target_device.type != "cpu":
            raise ModelLoadError("--quantize int8 runs on the CPU only; use --dtype float16 on CUDA")
        served = quantize_int8(served)
    policy = ThreadPolicy(threads, adaptive_threads, encoder_flops_per_token(served))
    engine = TorchFillMaskEngine(loaded.tokenizer, served, name=loaded.name, device=target_device, threads=policy)
    engine.source = loaded.source
    engine.load_seconds = time.perf_counter() - started
    log.info(
        "model ready in %.2fs: %s%s, mask token %s, up to %d tokens, mask-only head: %s",
        engine.load_seconds,
        type(served).__name__,
        " (int8)" if quantize == "int8" else "",
        engine.mask_token,
        engine.max_tokens,
        engine._split_head is not None,
    )
    return engine
