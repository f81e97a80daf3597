"""Whether a model folder holds a whole model: a config, complete weights and a tokenizer.

A folder being copied into the model repository shows up before its last byte lands; loading it
then would fail deep inside the engine, or worse, load a truncated file. These checks read only
names, sizes and a few bytes (a safetensors file's header, a zip's directory), so the repository
index can run them on every listing. Standard library only.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

CONFIG_FILE = "config.json"
# Tokenizer files, any one of which (or set of which) lets transformers build the model's tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
TOKENIZER_PAIRS = (("vocab.json", "merges.txt"),)
# Weight shards are named by an index file beside them when a model is saved in several files.
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# A safetensors header larger than this is not one: the format caps it well below.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024

# Every file whose presence makes a folder look like a model, complete or not.
MODEL_FILES = (CONFIG_FILE, *TOKENIZER_FILES, *WEIGHT_INDEXES, "vocab.json", "merges.txt")


def looks_like_model(folder: Path) -> bool:
    """Whether ``folder`` holds any of a model's files (a model, or one still being copied)."""
    try:
        return any((folder / name).is_file() for name in MODEL_FILES) or bool(_weight_files(folder))
    except OSError:
        return False


def missing_parts(folder: Path) -> list[str]:
    """What ``folder`` lacks to be loaded, each part named with the files that would supply it;
    empty for a whole model."""
    missing = []
    config = folder / CONFIG_FILE
    if not _is_json_object(config):
        missing.append(f"{CONFIG_FILE} (absent or not a JSON object)")
    missing.extend(_weights_missing(folder))
    if not _has_tokenizer(folder):
        pairs = " or ".join(" + ".join(pair) for pair in TOKENIZER_PAIRS)
        missing.append(f"a tokenizer ({', '.join(TOKENIZER_FILES)} or {pairs})")
    return missing


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" or _is_torch_weights(p))


def _is_torch_weights(path: Path) -> bool:
    return path.suffix == ".bin" and path.name.startswith("pytorch_model")


def _weights_missing(folder: Path) -> list[str]:
    for index_name in WEIGHT_INDEXES:
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return [f"{index_name} (unreadable)"]
            return [f"{shard} (absent or incomplete)" for shard in shards if not _whole_weights(folder / str(shard))]
    weights = _weight_files(folder)
    if not weights:
        return ["weights (model.safetensors or pytorch_model.bin)"]
    return [f"{path.name} (incomplete)" for path in weights if not _whole_weights(path)]


def _whole_weights(path: Path) -> bool:
    """Whether a weights file is all there: a safetensors file is exactly as long as its header says
    its tensors end; a torch file saved as a zip has its directory at the very end."""
    try:
        if path.suffix == ".safetensors":
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    return False
                (length,) = struct.unpack("<Q", head)
                if length > MAX_SAFETENSORS_HEADER:
                    return False
                header = json.loads(f.read(length))
            ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
            return bool(path.stat().st_size == 8 + length + max(ends, default=0))
        # A zip is checked by its end record; an old pickle-only file has none to check.
        return path.stat().st_size > 0 and (zipfile.is_zipfile(path) or not _starts_as_zip(path))
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return False


def _starts_as_zip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _has_tokenizer(folder: Path) -> bool:
    if any(_non_empty(folder / name) for name in TOKENIZER_FILES):
        return True
    return any(all(_non_empty(folder / name) for name in pair) for pair in TOKENIZER_PAIRS)


def _non_empty(path: Path) -> bool:
    """A file with something in it; a JSON one must also end as JSON does (a copy cut short does not)."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return False
        if path.suffix != ".json":
            return True
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 64))
            return f.read().rstrip().endswith(b"}")
    except OSError:
        return False


def _is_json_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False
