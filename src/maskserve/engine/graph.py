"""What the graph backends (onnxruntime, openvino) share: the engine around a graph, and its loading.

A graph backend runs ``onnx_export``'s graph (logits at the flat mask positions only) on the CPU
beside one torch thread, which takes the softmax and top-k of a few rows. Its loader refuses what
it cannot run, then :meth:`GraphLoad.begin` reads the model once through the torch backend's checks
and prepares the probe its graph must pass; the backend finds or makes its graph
(``export_cache.open_or_make``), builds its engine, and :meth:`GraphLoad.finish` times and logs it.
The torch model is dropped once the loader returns: only the graph and the tokenizer stay.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from maskserve.engine.base import FillMaskEngine
from maskserve.engine.cpu import describe_features
from maskserve.engine.export_cache import CachedExport
from maskserve.engine.onnx_export import mask_index
from maskserve.engine.pretrained import BackendUnavailable, LoadedModel, default_model_dir, load_pretrained
from maskserve.engine.probe import Probe
from maskserve.engine.threads import ThreadPolicy, encoder_flops_per_token

log = logging.getLogger(__name__)

Engine = TypeVar("Engine", bound="GraphFillMaskEngine")


def require_cpu(backend: str, device: str) -> None:
    """Refuse ``--device cuda``: the graph backends run on the CPU only."""
    if device == "cuda":
        raise BackendUnavailable(f"--backend {backend} runs on the CPU only; use --backend torch for --device cuda")


@dataclass(frozen=True)
class GraphLoad:
    """One graph backend's load under way: the model read for it, and the probe its graph must pass."""

    started: float
    root: Path
    threads: int
    loaded: LoadedModel
    flops_per_token: float
    probe: Probe

    @classmethod
    def begin(
        cls,
        backend: str,
        model: str | None,
        *,
        started: float,
        root: Path,
        threads: int,
        precision: str,
        attn_implementation: str | None = None,
    ) -> GraphLoad:
        """Read ``model`` (float32, on the CPU) for ``backend``'s graph in ``root``, once its refusals passed."""
        torch.set_num_threads(1)  # see GraphFillMaskEngine._mask_logits
        log.info(
            "loading model from %s for %s (%s, %d threads, cache %s); CPU matrix features: %s",
            model or default_model_dir(),
            backend,
            precision,
            threads,
            root,
            describe_features(),
        )
        loaded = load_pretrained(
            model, device=torch.device("cpu"), dtype=torch.float32, attn_implementation=attn_implementation
        )
        probe = Probe(loaded.tokenizer, loaded.model)
        return cls(started, root, threads, loaded, encoder_flops_per_token(loaded.model), probe)

    def finish(self, engine: Engine, runs_on: str, entry: str) -> Engine:
        """``engine``, timed from the start of its load and announced (``entry``: what the cache holds)."""
        engine.source = self.loaded.source
        engine.load_seconds = time.perf_counter() - self.started
        export = engine.export
        log.info(
            "model ready in %.2fs on %s (%s %s %s): %s, mask token %s, up to %d tokens, mask-only head: %s",
            engine.load_seconds,
            runs_on,
            "cached" if export.reused else "new",
            entry,
            export.folder,
            engine.architecture,
            engine.mask_token,
            engine.max_tokens,
            bool(export.meta.get("mask_only_head")),
        )
        return engine


class GraphFillMaskEngine(FillMaskEngine):
    """A graph backend's engine: the graph of one cache entry on the CPU, a fixed thread count."""

    # How the backend's runtime uses its threads, for /info.
    thread_policy: str

    def __init__(self, load: GraphLoad, export: CachedExport, *, dtype: str) -> None:
        loaded = load.loaded
        super().__init__(
            loaded.tokenizer,
            loaded.model.config,
            name=loaded.name,
            device=torch.device("cpu"),
            threads=ThreadPolicy(load.threads, False, load.flops_per_token),
            architecture=type(loaded.model).__name__,
            dtype=dtype,
        )
        self.export = export

    def _mask_logits(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> torch.Tensor:
        # torch only takes the softmax and top-k of a few rows here: one thread, so that no
        # spinning torch thread (another engine in this process may have set more) takes a core
        # from the graph runtime's.
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        return torch.from_numpy(self._run_graph(input_ids, attention_mask, mask_index(input_ids, rows, cols)))

    def _run_graph(self, input_ids: np.ndarray, attention_mask: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The graph's logits at the flat mask positions ``index``, one row per mask."""
        raise NotImplementedError

    def _describe_graph(self) -> dict[str, str | int | float]:
        """What this backend adds to the description every graph backend gives."""
        return {}

    def _describe_backend(self) -> dict[str, str | int | float]:
        return {
            "torch_threads": 1,
            f"{self.backend}_threads": self.threads.max_threads,
            "thread_policy": self.thread_policy,
            "mask_only_head": "yes" if self.export.meta.get("mask_only_head") else "no",
            # The backend is named after its runtime's package.
            f"{self.backend}_version": str(importlib.import_module(self.backend).__version__),
            "export_cache_key": self.export.key,
            "export_path": str(self.export.model_file),
            **self._describe_graph(),
        }
