"""The onnxruntime backend's graph: export, fusion, and a disk cache that never serves a stale one.

One graph per model: the encoder, a gather of its hidden states at the mask positions, and the
masked-LM head on those rows only (inputs ``input_ids``, ``attention_mask`` and ``mask_index``, the
flat positions ``row * length + column`` of the masks; output ``logits``, one row per mask). It is
exported with torch.onnx, then ONNX Runtime's BERT fusions (attention, skip layer norm, GELU,
embeddings) are applied, and the result lives in ``<cache dir>/onnx/<key>/`` with a ``meta.json``.

The key hashes everything the graph depends on: the model's configuration and weights, the
versions of torch, transformers, onnx and onnxruntime, the opset, the fusion settings, the dtype
and this module's own graph layout (:data:`EXPORT_FORMAT`). An entry is written in a temporary
folder and renamed into place, so two processes starting together never read a half-written
one; an entry whose files no longer match their recorded hashes is deleted and exported again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import transformers
from transformers import PreTrainedModel

from .base import BackendUnavailable, split_mlm_head

log = logging.getLogger(__name__)

# Bump when the graph's layout (wrapper, inputs, outputs, fusion call) changes: old entries are
# then never looked up again.
EXPORT_FORMAT = 1
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "mask_index")
OUTPUT = "logits"
MODEL_FILE = "model.onnx"
META_FILE = "meta.json"
# Unfinished exports of a process that died are removed once this old.
STALE_TEMP_S = 24 * 3600.0
# A protobuf holds at most 2 GB: larger graphs keep their weights in a side file.
EXTERNAL_DATA_BYTES = 1_500_000_000

T = TypeVar("T")


class ExportFailed(BackendUnavailable):
    """The model could not be exported, fused or cached, or the export disagrees with torch."""


@dataclass(frozen=True)
class CachedExport:
    """One cache entry: a fused graph and what it was made from."""

    key: str
    folder: Path
    reused: bool
    meta: dict[str, Any]
    model_name: str = MODEL_FILE  # the file a backend opens (the openvino backend's is model.xml)

    @property
    def model_file(self) -> Path:
        return self.folder / self.model_name


def one_line(exc: BaseException) -> str:
    """An exception as one short line for the operator's log: never a multi-line dump."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip() if lines else ""
    return (text[:300] + " ...") if len(text) > 300 else (text or type(exc).__name__)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes (a fraction of a second for bert-base).

    The content, not the files' sizes and dates: the key then follows what is exported whether
    the model came from a local folder or the hub, as safetensors or .bin, and a weight edited in
    place (or a backup restored with its old mtime) can never reuse an old graph.
    """
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(memoryview(tensor.detach().cpu().contiguous().view(torch.uint8).numpy()))
    return digest.hexdigest()


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


def model_parts(model: PreTrainedModel) -> dict[str, Any]:
    """What any backend's graph of ``model`` depends on: its content, torch and transformers."""
    config = model.config.to_dict()
    # Where the model was read from and which transformers wrote its config do not change the
    # graph (transformers' own version is a part below).
    for volatile in ("_name_or_path", "_commit_hash", "transformers_version"):
        config.pop(volatile, None)
    config_json = json.dumps(config, sort_keys=True, default=str)
    return {
        "architecture": type(model).__name__,
        "config_sha256": hashlib.sha256(config_json.encode()).hexdigest(),
        "weights_sha256": weights_digest(model),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def key_of(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


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


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _problem(folder: Path, key: str, model_name: str = MODEL_FILE) -> str | None:
    """Why the entry in ``folder`` cannot be used, or None when every file is as written."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        files: dict[str, dict[str, Any]] = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {META_FILE} ({one_line(exc)})"
    if meta.get("key") != key or model_name not in files:
        return f"{META_FILE} describes another export"
    for name, recorded in files.items():
        path = folder / name
        try:
            if path.stat().st_size != recorded["bytes"] or _file_sha256(path) != recorded["sha256"]:
                return f"{name} differs from the file that was written"
        except OSError as exc:
            return f"{name}: {one_line(exc)}"
    return None


def find_export(root: Path, key: str, model_name: str = MODEL_FILE) -> CachedExport | None:
    """The intact entry for ``key``, or None; a corrupt entry is deleted so it is exported again."""
    folder = root / key
    if not folder.is_dir():
        return None
    problem = _problem(folder, key, model_name)
    if problem is not None:
        log.warning("the cached export %s is unusable (%s); exporting again", folder, problem)
        discard(folder)
        return None
    meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    return CachedExport(key, folder, True, meta, model_name)


def open_cached(
    root: Path, key: str, check: Callable[[Path], T], model_name: str = MODEL_FILE
) -> tuple[CachedExport, T] | None:
    """The intact entry for ``key`` and what ``check(model file)`` returned, or None.

    An entry that fails ``check`` (it disagrees with torch) is discarded, so it is made again.
    """
    export = find_export(root, key, model_name)
    if export is None:
        return None
    try:
        return export, check(export.model_file)
    except ExportFailed as exc:
        log.warning("the cached graph %s fails its check (%s); making it again", export.folder, exc)
        discard(export.folder)
        return None


def discard(folder: Path) -> None:
    """Remove an entry: first renamed out of its key's place, so no reader finds it half deleted."""
    trash = folder.parent / f".trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        folder.rename(trash)
    except OSError:
        return  # already gone (another process discarded or replaced it)
    shutil.rmtree(trash, ignore_errors=True)


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


def _export_graph(model: PreTrainedModel, folder: Path) -> dict[str, Any]:
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


def _remove_stale_temporaries(root: Path) -> None:
    now = time.time()
    for stale in root.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(stale, ignore_errors=True)


def export_to_cache(
    model: PreTrainedModel,
    root: Path,
    key: str,
    parts: dict[str, Any],
    check: Callable[[Path], T],
    *,
    build: Callable[[PreTrainedModel, Path], dict[str, Any]] | None = None,
    model_name: str = MODEL_FILE,
    what: str = "ONNX",
) -> tuple[CachedExport, T]:
    """Export ``model`` into the cache under ``key``, atomically; ``check(model file)`` runs first.

    ``build(model, folder)`` writes the graph as ``model_name`` and returns what it did, for
    meta.json (default: the ONNX export and fusion). ``check`` opens and verifies the new graph
    (raising :class:`ExportFailed` if it disagrees with torch) before anything is published, so a
    bad export never enters the cache. Returns the entry and what ``check`` returned. When another
    process published the same key meanwhile, its entry is kept and this one dropped: both were
    made from the same inputs. Only the entry's files are recorded and checked: a subfolder
    (a backend's own compiled cache) is the backend's to keep.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(root)
        temporary = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    except OSError as exc:
        raise ExportFailed(f"cannot write the export cache in {root}: {exc.strerror or one_line(exc)}") from exc
    try:
        try:
            done = (build or _export_graph)(model, temporary)
        except Exception as exc:  # any exporter or fusion failure stops start-up the same way
            raise ExportFailed(f"could not export the model to {what}: {one_line(exc)}") from exc
        checked = check(temporary / model_name)
        files = {
            path.name: {"bytes": path.stat().st_size, "sha256": _file_sha256(path)}
            for path in sorted(temporary.iterdir())
            if path.is_file()
        }
        meta = {"key": key, "parts": parts, "files": files, **done, "created": time.time()}
        (temporary / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        temporary.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        folder = root / key
        try:
            temporary.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
            log.info("another process cached the same export at %s first; using it", folder)
            return CachedExport(key, folder, True, meta, model_name), checked
        return CachedExport(key, folder, False, meta, model_name), checked
    except OSError as exc:
        raise ExportFailed(f"cannot write the export cache in {root}: {exc.strerror or one_line(exc)}") from exc
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
