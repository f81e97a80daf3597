"""What the graph backends (onnxruntime, openvino) share: the engine around a graph, and its loading.

A graph backend runs ``onnx_export``'s graph (logits at the read positions only) on the CPU beside
one torch thread, which takes the softmax and top-k of a few rows. Its loader refuses what it
cannot run, then :meth:`GraphLoad.begin` reads the model once through the torch backend's checks
and prepares the probe its graph must pass; the backend finds or makes its graph
(``export_cache.open_or_make``) through :func:`with_read_rows`, which tries the graph whose last
layer reads rows only first, builds its engine, and :meth:`GraphLoad.finish` times and logs it.
The torch model is dropped once the loader returns: only the graph and the tokenizer stay.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from maskserve.engine.base import FillMaskEngine
from maskserve.engine.cpu import describe_features
from maskserve.engine.export_cache import CachedExport, ExportFailed, one_line
from maskserve.engine.onnx_export import feeds, read_rows_refusal
from maskserve.engine.pretrained import BackendUnavailable, LoadedModel, default_model_dir, load_pretrained
from maskserve.engine.probe import Probe
from maskserve.engine.threads import ThreadPolicy, encoder_flops_per_token

log = logging.getLogger(__name__)

Engine = TypeVar("Engine", bound="GraphFillMaskEngine")
Opened = TypeVar("Opened")


def require_cpu(backend: str, device: str) -> None:
    """Refuse ``--device cuda``: the graph backends run on the CPU only."""
    if device == "cuda":
        raise BackendUnavailable(f"--backend {backend} runs on the CPU only; use --backend torch for --device cuda")


def with_read_rows(
    load: GraphLoad, make: Callable[[bool], tuple[CachedExport, Opened]]
) -> tuple[CachedExport, Opened, str]:
    """``make(read_rows)``'s graph and what ``/info`` says of its last layer ("yes", "no: why").

    The graph whose last layer reads rows only is tried first, where the model's layout has one;
    ``make`` checks it against the whole model on the probe, at the bound of the precision it
    runs in. Refused (it disagreed, or could not be made), the whole-layer graph is made instead:
    slower, never wrong. Each has its own cache key, so neither is ever taken for the other.
    """
    refusal = read_rows_refusal(load.loaded.model)
    if refusal is None:
        try:
            export, opened = make(True)
            return export, opened, "yes"
        except ExportFailed as exc:
            refusal = f"its read-rows graph was refused ({one_line(exc)})"
            log.warning("the last layer at the read rows only: %s; computing it whole", refusal)
    export, opened = make(False)
    return export, opened, f"no: {refusal}"


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

    def finish(self, engine: Engine, runs_on: str, entry: str, read_rows: str) -> Engine:
        """``engine``, timed from the start of its load and announced (``entry``: what the cache
        holds; ``read_rows``: whether its last layer reads rows only, from :func:`with_read_rows`)."""
        engine.source = self.loaded.source
        engine.read_rows_last_layer = read_rows
        engine.load_seconds = time.perf_counter() - self.started
        export = engine.export
        log.info(
            "model ready in %.2fs on %s (%s %s %s): %s, mask token %s, up to %d tokens, mask-only head: %s, "
            "read-rows last layer: %s",
            engine.load_seconds,
            runs_on,
            "cached" if export.reused else "new",
            entry,
            export.folder,
            engine.architecture,
            engine.mask_token,
            engine.max_tokens,
            bool(export.meta.get("mask_only_head")),
            read_rows,
        )
        return engine


class GraphFillMaskEngine(FillMaskEngine):
    """A graph backend's engine: the graph of one cache entry on the CPU, a fixed thread count."""

    # How the backend's runtime uses its threads, for /info.
    thread_policy: str
    # Whether the graph's last layer reads rows only ("yes", or "no: why"), for /info.
    read_rows_last_layer: str = "no: not loaded through GraphLoad"

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
        return torch.from_numpy(self._run_graph(feeds(input_ids, attention_mask, rows, cols)))

    def _run_graph(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's logits at the read positions of ``inputs`` (onnx_export.feeds), one row each."""
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
            "read_rows_last_layer": self.read_rows_last_layer,
            # The backend is named after its runtime's package.
            f"{self.backend}_version": str(importlib.import_module(self.backend).__version__),
            "export_cache_key": self.export.key,
            "export_path": str(self.export.model_file),
            **self._describe_graph(),
        }
