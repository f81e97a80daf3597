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

from maskserve.config.model_source import ModelLoadError
from maskserve.engine.base import FillMaskEngine, probe_texts
from maskserve.engine.cpu import describe_features, precision_in_effect
from maskserve.engine.last_layer import ReadRowsLastLayer
from maskserve.engine.pretrained import (
    default_model_dir,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    split_mlm_head,
)
from maskserve.engine.probe import SHORTCUT_HIDDEN_BOUNDS, shortcut_score_bound
from maskserve.engine.read_rows import ReadRows
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
        quantize: str = "none",
    ) -> None:
        self.model = model.eval()  # type: ignore[no-untyped-call]
        self.quantize = quantize
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
        self._last_layer, self._read_rows_refusal = self._find_read_rows_last_layer()

    def _describe_backend(self) -> dict[str, str | int | float]:
        return {
            "torch_threads": self.threads.max_threads,
            "thread_policy": "one thread for small batches" if self.threads.adaptive else "fixed",
            "mask_only_head": ("yes, in float32" if self.float32_head else "yes") if self._split_head else "no",
            "read_rows_last_layer": "yes" if self._last_layer else f"no: {self._read_rows_refusal}",
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
        if split is not None and last_layer is not None:
            reads = ReadRows.at(len(input_ids), rows, cols)
            columns, index = (
                torch.from_numpy(reads.columns).to(self.device),
                torch.from_numpy(reads.index).to(self.device),
            )
            read: torch.Tensor = split[1](last_layer(ids, attention, columns, index))
            return read
        at_rows, at_cols = torch.from_numpy(rows).to(self.device), torch.from_numpy(cols).to(self.device)
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

    def _find_read_rows_last_layer(self) -> tuple[ReadRowsLastLayer | None, str]:
        """The last layer at the read rows only, if the encoder has a known layout and it gives
        the whole model's scores on a probe batch, within the bound of the precision it runs in
        (probe.shortcut_score_bound); else None and why not.
        """
        if self._split_head is None:
            return None, "the mask-only head is not in use"
        last_layer = ReadRowsLastLayer.find(self._split_head[0])
        if last_layer is None:
            return None, f"{self.architecture}'s last layer is not of a layout it knows"
        agrees = self._agrees_on_probe(split=self._split_head, last_layer=last_layer)
        if not agrees or (self.precision != "float32" and not self._rows_agree(last_layer)):
            log.info("the last layer at the read rows disagrees with the full model; computing it whole")
            return None, "it disagreed with the whole model on the probe"
        return last_layer, ""

    def _rows_agree(self, last_layer: ReadRowsLastLayer) -> bool:
        """Whether ``last_layer``'s rows are the whole encoder's on a probe batch, each within the
        precision's relative bound (probe.SHORTCUT_HIDDEN_BOUNDS).

        A lower precision's score bound alone cannot tell a wrong layer on a model whose scores
        are all small (a tiny or barely trained one): its hidden rows can, whatever the scores.
        """
        assert self._split_head is not None
        ids, attention = self._pad(probe_texts(self.tokenizer))
        rows, cols = np.nonzero(ids == self.mask_token_id)
        reads = ReadRows.at(len(ids), rows, cols)
        at = [torch.from_numpy(a).to(self.device) for a in (ids, attention, reads.columns, reads.index)]
        with torch.inference_mode():
            whole = self._split_head[0](input_ids=at[0], attention_mask=at[1])[0]
            whole = whole[torch.from_numpy(rows).to(self.device), torch.from_numpy(cols).to(self.device)].float()
            try:
                read = last_layer(*at).float()
            except Exception:  # noqa: BLE001 - any failure means: the whole layer
                return False
        if read.shape != whole.shape:
            return False
        deviation = float(((read - whole).norm(dim=-1) / whole.norm(dim=-1)).max())
        return deviation <= SHORTCUT_HIDDEN_BOUNDS[self.precision]

    def _agrees_on_probe(
        self, *, split: tuple[torch.nn.Module, torch.nn.Module], last_layer: ReadRowsLastLayer | None = None
    ) -> bool:
        """Whether these shortcuts give the full model's answers on a probe batch; any failure of
        theirs is a no. In float32, the logits within 1e-4; in a lower precision, the scores within
        its bound (probe.shortcut_score_bound): it rounds sums differently at another row count,
        and int8 quantizes each product's activations by the range of the rows it is given.
        """
        ids, attention = self._pad(probe_texts(self.tokenizer))
        rows, cols = np.nonzero(ids == self.mask_token_id)
        with torch.inference_mode():
            full = self._torch_mask_logits(ids, attention, rows, cols, split=None)
            try:
                short = self._torch_mask_logits(ids, attention, rows, cols, split=split, last_layer=last_layer)
            except Exception:  # noqa: BLE001 - any failure means: without the shortcut
                return False
        if short.shape != full.shape:
            return False
        if self.precision == "float32":
            return torch.allclose(short, full, atol=1e-4)
        worst = float((short.float().softmax(-1) - full.float().softmax(-1)).abs().max())
        return worst <= shortcut_score_bound(self.precision)

    @property
    def precision(self) -> str:
        """What the encoder computes in: its dtype, or 'int8' when quantized."""
        return "int8" if self.quantize == "int8" else self.dtype


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
    engine = TorchFillMaskEngine(
        loaded.tokenizer, served, name=loaded.name, device=target_device, threads=policy, quantize=quantize
    )
    engine.source = loaded.source
    engine.load_seconds = time.perf_counter() - started
    log.info(
        "model ready in %.2fs: %s%s, mask token %s, up to %d tokens, mask-only head: %s, read-rows last layer: %s",
        engine.load_seconds,
        type(served).__name__,
        " (int8)" if quantize == "int8" else "",
        engine.mask_token,
        engine.max_tokens,
        engine._split_head is not None,
        engine.describe()["read_rows_last_layer"],
    )
    return engine
