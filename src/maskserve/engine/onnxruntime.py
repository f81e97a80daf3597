"""The onnxruntime backend: the encoder and the mask-only head run by ONNX Runtime on the CPU.

Loading goes through the torch backend's checks (:func:`base.load_pretrained`), then the graph
of ``onnx_export.py`` is taken from the cache or exported, and checked against torch on a probe
batch before anything is served. The torch model is dropped afterwards: only the session (and the
tokenizer) stay in memory. Tokenization, targets, top-k and the answer's shape are the shared
:class:`base.FillMaskEngine`'s; this module only runs the graph.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import (
    BackendUnavailable,
    FillMaskEngine,
    ThreadPolicy,
    default_model_dir,
    encoder_flops_per_token,
    load_pretrained,
)
from .cpu import describe_features
from .onnx_export import (
    INPUTS,
    OUTPUT,
    CachedExport,
    ExportFailed,
    export_key,
    export_to_cache,
    one_line,
    open_cached,
)
from .probe import Probe

log = logging.getLogger(__name__)

# The exported graph must give torch's scores within this on the probe (the fidelity bound).
PROBE_SCORE_TOLERANCE = 1e-4


def _onnxruntime() -> Any:
    try:
        import onnx  # noqa: F401 - the export needs it; checked here to fail before loading
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailable(
            f"--backend onnxruntime needs onnxruntime and onnx ({one_line(exc)}): pip install 'maskserve[onnx]'"
        ) from exc
    return onnxruntime


def open_session(model_file: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session on ``threads`` intra-op threads that sleep when idle.

    One session, a fixed thread count: ORT fixes its pool when the session opens. Its threads
    spin by default, which costs a busy neighbour (the event loop, torch's own threads) its core;
    with spinning off, every allowed core helps at every batch size, on the default model and on
    bert-base's shape alike, so no second 1-thread session is kept (it would hold a second copy of
    the weights). Where other jobs hold the cores anyway, ``--torch-threads 1`` loses nothing and
    may serve more (the benchmark's backend runs, ``python -m benchmarks.run``, measure it).
    """
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: its warnings are about nodes left on the CPU
    try:
        return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail, InvalidGraph, ... classes
        raise ExportFailed(f"ONNX Runtime cannot load {model_file}: {one_line(exc)}") from exc


def run_graph(session: Any, input_ids: np.ndarray, attention_mask: np.ndarray, mask_index: np.ndarray) -> np.ndarray:
    feeds = dict(zip(INPUTS, (input_ids, attention_mask, mask_index)))
    (logits,) = session.run([OUTPUT], feeds)
    result: np.ndarray = logits
    return result


class OnnxFillMaskEngine(FillMaskEngine):
    """The onnxruntime backend: one fused graph on the CPU, float32, a fixed intra-op thread count."""

    backend = "onnxruntime"

    def __init__(
        self,
        tokenizer: Any,
        config: Any,
        session: Any,
        export: CachedExport,
        *,
        name: str,
        threads: ThreadPolicy,
        architecture: str,
    ) -> None:
        super().__init__(
            tokenizer,
            config,
            name=name,
            device=torch.device("cpu"),
            threads=threads,
            architecture=architecture,
            dtype="float32",
        )
        self.session = session
        self.export = export

    def _mask_logits(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> torch.Tensor:
        # torch only takes the softmax and top-k of a few rows here: one thread, so that no
        # spinning torch thread (another engine in this process may have set more) takes a core
        # from ORT's.
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        mask_index = (rows * input_ids.shape[1] + cols).astype(np.int64)
        return torch.from_numpy(run_graph(self.session, input_ids, attention_mask, mask_index))

    def _describe_backend(self) -> dict[str, str | int | float]:
        import onnxruntime

        fused = self.export.meta.get("fused_operators", {})
        return {
            "torch_threads": 1,
            "onnxruntime_threads": self.threads.max_threads,
            "thread_policy": "fixed, onnxruntime threads sleep when idle",
            "mask_only_head": "yes" if self.export.meta.get("mask_only_head") else "no",
            "onnxruntime_version": onnxruntime.__version__,
            "export_cache_key": self.export.key,
            "export_path": str(self.export.model_file),
            "fused_operators": ", ".join(f"{name} {count}" for name, count in sorted(fused.items())) or "none",
        }


def load_onnx_engine(
    model: str | None,
    *,
    cache_dir: Path,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int = 1,
    quantize: str = "none",
) -> OnnxFillMaskEngine:
    """Load ``model``, reuse or make its fused graph under ``cache_dir``/onnx, check it, serve it.

    Raises :class:`ModelLoadError` for a model no backend can serve (exit 1), and
    :class:`BackendUnavailable` (exit 2) when this backend cannot serve it as asked.
    """
    started = time.perf_counter()
    if device == "cuda":
        raise BackendUnavailable("--backend onnxruntime runs on the CPU only; use --backend torch for --device cuda")
    if dtype not in ("auto", "float32"):
        # bfloat16 on the CPU is the openvino and torch backends' (docs: Backends and precision).
        other = "--backend openvino or --backend torch" if dtype == "bfloat16" else "--backend torch"
        raise BackendUnavailable(f"--backend onnxruntime runs float32 only, not --dtype {dtype}; use {other} for it")
    if quantize != "none":
        raise BackendUnavailable(f"--quantize {quantize} runs on --backend torch only")
    _onnxruntime()
    torch.set_num_threads(1)  # see OnnxFillMaskEngine._mask_logits
    root = cache_dir / "onnx"
    log.info(
        "loading model from %s for onnxruntime (float32, %d threads, cache %s); CPU matrix features: %s",
        model or default_model_dir(),
        threads,
        root,
        describe_features(),
    )
    # Eager attention: it is what ONNX Runtime's attention fusion recognises in the traced graph.
    loaded = load_pretrained(model, device=torch.device("cpu"), dtype=torch.float32, attn_implementation="eager")
    flops_per_token = encoder_flops_per_token(loaded.model)
    key, parts = export_key(loaded.model)
    probe = Probe(loaded.tokenizer, loaded.model)

    def open_checked(model_file: Path) -> Any:
        session = open_session(model_file, threads)
        probe.check(lambda *inputs: run_graph(session, *inputs), PROBE_SCORE_TOLERANCE)
        return session

    cached = open_cached(root, key, open_checked)
    if cached is not None:
        export, session = cached
    else:
        log.info("exporting %s to ONNX (once per model and versions; cache key %s)", loaded.name, key)
        export, session = export_to_cache(loaded.model, root, key, parts, open_checked)
        log.info(
            "exported in %.1fs + fused in %.1fs: %s",
            export.meta["export_seconds"],
            export.meta["fusion_seconds"],
            export.meta["fused_operators"],
        )
    engine = OnnxFillMaskEngine(
        loaded.tokenizer,
        loaded.model.config,
        session,
        export,
        name=loaded.name,
        threads=ThreadPolicy(threads, False, flops_per_token),
        architecture=type(loaded.model).__name__,
    )
    engine.source = loaded.source
    engine.load_seconds = time.perf_counter() - started
    log.info(
        "model ready in %.2fs on onnxruntime (%s export %s): %s, mask token %s, up to %d tokens, mask-only head: %s",
        engine.load_seconds,
        "cached" if export.reused else "new",
        export.folder,
        engine.architecture,
        engine.mask_token,
        engine.max_tokens,
        bool(export.meta.get("mask_only_head")),
    )
    return engine
