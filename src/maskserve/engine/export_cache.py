"""The graph backends' disk cache: content-keyed entries that are never served stale.

An entry lives in ``<cache dir>/<backend>/<key>/`` with a ``meta.json``. The key hashes everything
the graph depends on: the model's configuration and weights, the versions of the libraries that
made it and will run it, and the backend's own graph layout (each backend's ``export_key``). An
entry is written in a temporary folder and renamed into place, so two processes starting together
never read a half-written one; an entry whose files no longer match their recorded hashes, or
whose graph fails its check against torch, is deleted and made again.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
import transformers
from transformers import PreTrainedModel

from maskserve.engine.pretrained import BackendUnavailable

log = logging.getLogger(__name__)

META_FILE = "meta.json"
# Unfinished exports of a process that died are removed once this old.
STALE_TEMP_S = 24 * 3600.0

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
    model_name: str  # the file a backend opens (the openvino backend's is model.xml)

    @property
    def model_file(self) -> Path:
        return self.folder / self.model_name


@dataclass(frozen=True)
class ExportRecipe(Generic[T]):
    """How one entry is made and checked: ``build(model, folder)`` writes the graph as ``model_name``
    and returns what it did, for meta.json; ``check(model file)`` opens and verifies the graph,
    raising :class:`ExportFailed` if it disagrees with torch; ``what`` names the graph's format in
    errors."""

    model: PreTrainedModel
    root: Path
    key: str
    parts: dict[str, Any]
    check: Callable[[Path], T]
    build: Callable[[PreTrainedModel, Path], dict[str, Any]]
    model_name: str
    what: str


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


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _problem(folder: Path, key: str, model_name: str) -> str | None:
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


def find_export(root: Path, key: str, model_name: str) -> CachedExport | None:
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


def open_cached(root: Path, key: str, check: Callable[[Path], T], model_name: str) -> tuple[CachedExport, T] | None:
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


def _remove_stale_temporaries(root: Path) -> None:
    now = time.time()
    for stale in root.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(stale, ignore_errors=True)


def export_to_cache(recipe: ExportRecipe[T]) -> tuple[CachedExport, T]:
    """Export the recipe's model into the cache under its key, atomically; its check runs first.

    The check runs on the new graph before anything is published, so a bad export never enters the
    cache. Returns the entry and what the check returned. When another process published the same
    key meanwhile, its entry is kept and this one dropped: both were made from the same inputs.
    Only the entry's files are recorded and checked: a subfolder (a backend's own compiled cache)
    is the backend's to keep.
    """
    root, key, model_name = recipe.root, recipe.key, recipe.model_name
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(root)
        temporary = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    except OSError as exc:
        raise ExportFailed(f"cannot write the export cache in {root}: {exc.strerror or one_line(exc)}") from exc
    try:
        try:
            done = recipe.build(recipe.model, temporary)
        except Exception as exc:  # any exporter or fusion failure stops start-up the same way
            raise ExportFailed(f"could not export the model to {recipe.what}: {one_line(exc)}") from exc
        checked = recipe.check(temporary / model_name)
        files = {
            path.name: {"bytes": path.stat().st_size, "sha256": _file_sha256(path)}
            for path in sorted(temporary.iterdir())
            if path.is_file()
        }
        meta = {"key": key, "parts": recipe.parts, "files": files, **done, "created": time.time()}
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


def open_or_make(recipe: ExportRecipe[T], *, making: str) -> tuple[CachedExport, T]:
    """The intact entry for the recipe's key that passes its check, else one made now by :func:`export_to_cache`.

    ``making`` says in the log what is done and why only once (``"exporting"``, ``"converting"``).
    """
    cached = open_cached(recipe.root, recipe.key, recipe.check, recipe.model_name)
    if cached is not None:
        return cached
    log.info("%s (once per model and versions; cache key %s)", making, recipe.key)
    return export_to_cache(recipe)
