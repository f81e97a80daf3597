"""The openvino backend: the encoder and the mask-only head run by OpenVINO's CPU plugin.

Loading goes through the torch backend's checks (:func:`base.load_pretrained`), then the graph of
``openvino_export.py`` is taken from the cache or converted, compiled in the precision asked for,
and checked against torch on a probe batch before anything is served. The torch model is dropped
afterwards. Tokenization, targets, top-k and the answer's shape are the shared
:class:`base.FillMaskEngine`'s; this module only runs the graph.

float32 is set explicitly: OpenVINO's own default on a CPU with AMX is bfloat16, which would
change the answers without the operator asking. ``--dtype bfloat16`` compiles the same graph in
bfloat16, where the CPU runs it natively (AMX or AVX-512 BF16); elsewhere it is refused.
``--quantize int8`` serves the graph of ``openvino_quantize.py`` instead: int8 encoder, float32
head.
"""

from __future__ import annotations

import functools
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
from .cpu import describe_features, int8_fast, int8_in_effect, int8_kernels, native_bf16, precision_in_effect
from .onnx_export import INPUTS, CachedExport, ExportFailed, export_to_cache, one_line, open_cached
from .openvino_export import COMPILED_DIR, MODEL_FILE, convert_graph, export_key
from .openvino_quantize import Int8Recipe, quantize_graph, quantized_key, recipe_for
from .probe import Probe

log = logging.getLogger(__name__)

# --dtype -> OpenVINO's inference precision. float16 is left out: the CPU plugin runs it only on
# the few CPUs with AVX-512 FP16 or AMX-FP16, and torch on CUDA is the place for it.
PRECISIONS = {"auto": "f32", "float32": "f32", "bfloat16": "bf16"}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
# A graph must give torch float32's scores within this on the probe: the fidelity bound for
# float32, and for bfloat16 the bound its fidelity test holds the default model to.
PROBE_SCORE_TOLERANCE = {"f32": 1e-4, "bf16": 0.02}
# int8 moves scores further than bfloat16 does, most on the probe's short texts of a small model:
# here the probe only has to tell a right graph, a little off, from a broken one, whose scores
# would be unrelated to torch's. int8's agreement is measured by benchmarks/agreement.py.
INT8_PROBE_SCORE_TOLERANCE = 0.25


# The graph's shapes are dynamic: the CPU plugin prepares kernels and buffers for each (batch,
# length) it meets and keeps them in a cache, megabytes per shape on a bert-base-sized graph (most
# in int8). Its own default keeps thousands, and served texts of varied lengths make thousands of
# shapes: resident memory would grow by gigabytes. Bounded here; a shape that fell out is prepared
# again, which costs little beside a forward pass (benchmarks/memory_soak.py measures both).
RUNTIME_CACHE_SHAPES = 64


def _require_nncf() -> None:
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        raise BackendUnavailable(
            "--backend openvino --quantize int8 needs nncf (OpenVINO's quantizer): "
            "pip install 'maskserve[openvino-int8]'"
        )


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailable(
            f"--backend openvino needs openvino ({one_line(exc)}): pip install 'maskserve[openvino]'"
        ) from exc
    return openvino


@functools.cache
def shared_core() -> Any:
    """The process's one OpenVINO Core, kept until exit.

    Each Core starts its own CPU plugin, and the plugin swaps the signal stack of the thread that
    starts it, restoring the previous one when it ends. Plugins that end in another order than
    they started leave a freed signal stack in place, and the next signal (SIGTERM, for a drain)
    crashes the process. One Core, never released, starts the plugin once.
    """
    return _openvino().Core()


def compile_graph(model_file: Path, precision: str, threads: int, *, keep_compiled: bool = True) -> Any:
    """``model_file`` compiled for this CPU in ``precision`` on ``threads`` threads, one stream.

    One stream with the latency hint: maskserve runs one batch at a time, so all the threads go
    to that batch. With ``keep_compiled``, the compiled model is kept in the entry's ``compiled/``
    folder by OpenVINO. The plugin's cache of per-shape kernels is bounded
    (:data:`RUNTIME_CACHE_SHAPES`).
    """
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES,
    }
    if keep_compiled:
        config["CACHE_DIR"] = str(model_file.parent / COMPILED_DIR)
    try:
        core = shared_core()
        return core.compile_model(core.read_model(str(model_file)), "CPU", config)
    except Exception as exc:  # OpenVINO raises RuntimeError with a long multi-line message
        raise ExportFailed(f"OpenVINO cannot compile {model_file}: {one_line(exc)}") from exc


def precision_of(compiled: Any) -> str:
    """The inference precision OpenVINO settled on ('f32', 'bf16'), which may differ from the hint."""
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    return str(value.to_string() if hasattr(value, "to_string") else value)


def run_graph(request: Any, input_ids: np.ndarray, attention_mask: np.ndarray, mask_index: np.ndarray) -> np.ndarray:
    result = request.infer(dict(zip(INPUTS, (input_ids, attention_mask, mask_index))))
    logits: np.ndarray = result[0]
    return logits


class OpenVinoFillMaskEngine(FillMaskEngine):
    """The openvino backend: one graph on the CPU, float32 or bfloat16, a fixed thread count."""

    backend = "openvino"

    def __init__(
        self,
        tokenizer: Any,
        config: Any,
        compiled: Any,
        export: CachedExport,
        *,
        name: str,
        threads: ThreadPolicy,
        architecture: str,
        precision: str,
        quantize: str = "none",
    ) -> None:
        super().__init__(
            tokenizer,
            config,
            name=name,
            device=torch.device("cpu"),
            threads=threads,
            architecture=architecture,
            dtype=DTYPES[precision],
        )
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.export = export
        self.quantize = quantize

    def _mask_logits(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> torch.Tensor:
        # torch only takes the softmax and top-k of a few rows here: one thread, so that no
        # spinning torch thread takes a core from OpenVINO's.
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        mask_index = (rows * input_ids.shape[1] + cols).astype(np.int64)
        return torch.from_numpy(run_graph(self.request, input_ids, attention_mask, mask_index))

    def _describe_backend(self) -> dict[str, str | int | float]:
        import openvino

        return {
            "torch_threads": 1,
            "openvino_threads": self.threads.max_threads,
            "thread_policy": "fixed, one OpenVINO stream",
            "mask_only_head": "yes" if self.export.meta.get("mask_only_head") else "no",
            "openvino_version": openvino.__version__,
            "export_cache_key": self.export.key,
            "export_path": str(self.export.model_file),
            **(
                {
                    "precision": int8_in_effect(),
                    "int8_kernels": int8_kernels() if int8_fast() else "AVX2, with the overflow fix",
                    "int8_recipe": str(self.export.meta["parts"]["recipe"]["name"]),
                }
                if self.quantize == "int8"
                else {}
            ),
        }


def _not_on_this_cpu(got: str, precision: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"OpenVINO runs this graph in {got}, not {precision}, on this CPU (matrix features: "
        f"{describe_features()}); bfloat16 needs AMX or AVX-512 BF16, else use --dtype float32 "
        "or --backend torch (which emulates bfloat16, slower than float32)"
    )


def _precision_for(dtype: str) -> str:
    precision = PRECISIONS.get(dtype)
    if precision is None:
        raise BackendUnavailable(
            f"--backend openvino runs float32 or bfloat16, not --dtype {dtype}; use --backend torch for it"
        )
    return precision


def load_openvino_engine(
    model: str | None,
    *,
    cache_dir: Path,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int = 1,
    quantize: str = "none",
    int8_recipe: Int8Recipe | None = None,
) -> OpenVinoFillMaskEngine:
    """Load ``model``, reuse or make its graph under ``cache_dir``/openvino, compile, check, serve.

    ``int8_recipe`` overrides the recipe chosen for this CPU (tests and benchmarks compare them).

    Raises :class:`ModelLoadError` for a model no backend can serve (exit 1), and
    :class:`BackendUnavailable` (exit 2) when this backend cannot serve it as asked.
    """
    started = time.perf_counter()
    if device == "cuda":
        raise BackendUnavailable("--backend openvino runs on the CPU only; use --backend torch for --device cuda")
    precision = _precision_for(dtype)
    if precision == "bf16" and not native_bf16():
        # Refused before anything is loaded: without AMX or AVX-512 BF16 the CPU plugin either
        # fails to compile a bfloat16 graph, with a message that names neither, or runs float32.
        raise _not_on_this_cpu("f32", precision)
    if quantize == "int8":
        if precision != "f32":
            raise BackendUnavailable(
                f"--backend openvino --quantize int8 runs with --dtype float32 (the default), not --dtype {dtype}: "
                "its int8 graph keeps the head in float32"
            )
        _require_nncf()
    elif quantize != "none":
        raise BackendUnavailable(f"--backend openvino runs --quantize int8 or none, not {quantize}")
    _openvino()
    torch.set_num_threads(1)  # see OpenVinoFillMaskEngine._mask_logits
    root = cache_dir / "openvino"
    log.info(
        "loading model from %s for openvino (%s, %d threads, cache %s); CPU matrix features: %s",
        model or default_model_dir(),
        int8_in_effect() if quantize == "int8" else precision_in_effect(DTYPES[precision], "cpu"),
        threads,
        root,
        describe_features(),
    )
    if quantize == "int8" and not int8_fast():
        # Served all the same: the operator asked for it, and it still answers closely.
        log.warning("--quantize int8 on a CPU without VNNI or AMX: %s", int8_in_effect())
    loaded = load_pretrained(model, device=torch.device("cpu"), dtype=torch.float32)
    flops_per_token = encoder_flops_per_token(loaded.model)
    key, parts = export_key(loaded.model)
    probe = Probe(loaded.tokenizer, loaded.model)

    def open_checked(
        model_file: Path, tolerance: float = PROBE_SCORE_TOLERANCE[precision], keep_compiled: bool = True
    ) -> Any:
        compiled = compile_graph(model_file, precision, threads, keep_compiled=keep_compiled)
        got = precision_of(compiled)
        if got != precision:
            raise _not_on_this_cpu(got, precision)
        request = compiled.create_infer_request()
        probe.check(lambda *inputs: run_graph(request, *inputs), tolerance)
        return compiled

    def float32_graph() -> tuple[CachedExport, Any]:
        cached = open_cached(root, key, open_checked, MODEL_FILE)
        if cached is not None:
            return cached
        log.info("converting %s to OpenVINO (once per model and versions; cache key %s)", loaded.name, key)
        made = export_to_cache(
            loaded.model, root, key, parts, open_checked, build=convert_graph, model_name=MODEL_FILE, what="OpenVINO"
        )
        log.info("converted in %.1fs", made[0].meta["convert_seconds"])
        return made

    def int8_graph() -> tuple[CachedExport, Any]:
        recipe = int8_recipe or recipe_for()
        int8_key, int8_parts = quantized_key(parts, recipe)

        def open_int8(model_file: Path) -> Any:
            # Compiled from the graph at every start (a second or two), never restored from
            # OpenVINO's compiled cache: OpenVINO 2025.1, inside this extra's bounds, restored an
            # int8 graph from it that answered every token alike, and the loose probe let that by.
            return open_checked(model_file, INT8_PROBE_SCORE_TOLERANCE, keep_compiled=False)

        cached = open_cached(root, int8_key, open_int8, MODEL_FILE)
        if cached is not None:
            return cached
        # Read after the float32 graph is compiled: the shared Core starts before NNCF's own.
        float32_export = float32_graph()[0]
        float32 = shared_core().read_model(str(float32_export.model_file))
        log.info("quantizing %s to int8 with NNCF (once per model and versions; cache key %s)", loaded.name, int8_key)

        def build(_model: Any, folder: Path) -> dict[str, Any]:
            done = quantize_graph(float32, folder, loaded.tokenizer, recipe)
            return {**done, "mask_only_head": float32_export.meta.get("mask_only_head")}

        made = export_to_cache(
            loaded.model,
            root,
            int8_key,
            int8_parts,
            open_int8,
            build=build,
            model_name=MODEL_FILE,
            what="OpenVINO int8",
        )
        log.info("quantized in %.1fs", made[0].meta["quantize_seconds"])
        return made

    export, compiled = int8_graph() if quantize == "int8" else float32_graph()
    engine = OpenVinoFillMaskEngine(
        loaded.tokenizer,
        loaded.model.config,
        compiled,
        export,
        name=loaded.name,
        threads=ThreadPolicy(threads, False, flops_per_token),
        architecture=type(loaded.model).__name__,
        precision=precision,
        quantize=quantize,
    )
    engine.source = loaded.source
    engine.load_seconds = time.perf_counter() - started
    log.info(
        "model ready in %.2fs on openvino %s (%s graph %s): %s, mask token %s, up to %d tokens, mask-only head: %s",
        engine.load_seconds,
        engine.describe()["precision"],
        "cached" if export.reused else "new",
        export.folder,
        engine.architecture,
        engine.mask_token,
        engine.max_tokens,
        bool(export.meta.get("mask_only_head")),
    )
    return engine
