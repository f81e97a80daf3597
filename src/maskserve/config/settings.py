"""Every knob maskserve has, with its default and its trade-off.

Each field is a CLI flag (``--max-batch-size``) with a ``MASKSERVE_*`` environment fallback
(``MASKSERVE_MAX_BATCH_SIZE``); a field that mirrors a standard variable falls back to it last
(``--traces-exporter``: ``MASKSERVE_TRACES_EXPORTER``, then OpenTelemetry's
``OTEL_TRACES_EXPORTER``). No other module reads the environment (the OpenTelemetry SDK reads its
own ``OTEL_*`` variables, such as the endpoint and the service name; ``engine/cpu.py`` reads
oneDNN's ``ONEDNN_MAX_CPU_ISA``, only to report the kernels that torch and OpenVINO will run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from maskserve.config import values
from maskserve.config.derived_settings import DerivedSettings

ENV_PREFIX = "MASKSERVE_"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag and the value."""


class NamedSettingsError(SettingsError):
    """Raised by a start-up check whose message already names what is at fault (a flag, a file,
    a model): :func:`load_settings` passes it on without a prefix."""


def _setting(default: Any, parse: Callable[[str], Any], help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"parse": parse, "help": help, **extra})


@dataclass(frozen=True)
class Settings(DerivedSettings):
    """One frozen object holding every setting; build it with :func:`load_settings`. What the
    settings imply together (threads, cache folder, masks a text may hold) is derived by the
    methods of :class:`~maskserve.config.derived_settings.DerivedSettings`."""

    host: str = _setting("127.0.0.1", str, "Address to bind. Use 0.0.0.0 to serve other machines.")
    port: int = _setting(8000, values.port, "TCP port to listen on.")
    model: tuple[str, ...] = _setting(
        (),
        values.model_sources,
        "A model to serve: a local directory or hub id, as NAME=SOURCE to name it (NAME= names the default "
        "model). Repeat it to serve "
        "several models from one server, one inference thread shared fairly between them; the first "
        "is the default model (POST /). A bare SOURCE is named by its folder or hub name (with one "
        "model, by --model-name). Default: the small BERT shipped in maskserve[demo]. The variable "
        "takes several, comma-separated.",
        flag_kind="append",
    )
    models_file: str | None = _setting(
        None,
        values.optional_str,
        "A YAML file of models to serve, each with its own name, source, backend, precision and "
        "limits (docs: Several models); served after the --model ones. For fleets that configure "
        "by a ConfigMap.",
    )
    model_name: str = _setting(
        "maskserve",
        values.model_name,
        "The name clients use for the one model served: in the /models/NAME and Open Inference Protocol "
        "/v2/models/NAME routes, in /info and in the metrics. Several models are named by --model.",
    )
    model_repository: str | None = _setting(
        None,
        values.optional_str,
        "A folder of models, each a local model folder named as the model, with an optional "
        "maskserve.yaml of its own settings (a models-file entry's keys: backend, precision, limits). "
        "What is served from it follows --model-control-mode (docs: Model repository).",
    )
    model_control_mode: str = _setting(
        "none",
        values.choice("none", "explicit", "on-demand"),
        "none: serve what is named at start (with --model-repository and no --model, every model "
        "in it), no load or unload routes. explicit: load and unload on request (needs "
        "--control-key; --model NAME preloads a repository model, else its first by name). "
        "on-demand: as explicit, and a request to a repository model not loaded loads it, within "
        "its deadline.",
    )
    models_memory: str | None = _setting(
        None,
        values.memory_budget,
        "The most resident memory the loaded models may hold together: a size (1500MiB, 2GB) or a "
        "share of the container's memory limit (60%). A load that would pass it first unloads the "
        "least recently used idle models; if that is not enough it is refused (507) and nothing is "
        "unloaded. Unset: no budget.",
    )
    model_load_timeout: float = _setting(
        600.0,
        values.positive_float,
        "Seconds a load (its files read, any export or quantization, its warm-up) may take before it "
        "is abandoned: the model stays unavailable (or a reload's old model keeps serving), its memory "
        "is handed back and later loads may start; a model named at start that outlasts it stops the "
        "start-up. Long enough for a first export of a large model; short enough that a hung load "
        "does not block the loads after it for ever.",
    )
    model_min_residency: float = _setting(
        30.0,
        values.non_negative_float,
        "Seconds a model loaded on demand stays loaded before an on-demand load may evict it to make "
        "room. Requests alternating among more models than fit would otherwise evict and load on "
        "every turn; within this time such a request is answered 503 with Retry-After instead. "
        "Explicit unloads and loads are not held by it. 0: no pacing.",
    )
    device: str = _setting("cpu", values.choice("cpu", "cuda", "auto"), "cpu, cuda, or auto (cuda when present).")
    dtype: str = _setting(
        "auto",
        values.choice("auto", "float32", "float16", "bfloat16"),
        "Precision of the forward pass. auto = float32 on CPU (the pipeline's answers), float16 on "
        "CUDA. bfloat16 on the CPU (torch, openvino): runs on the CPU's matrix units where it has AMX "
        "(several times faster) or AVX-512 BF16 (/info names them), at a small cost in agreement with "
        "float32 (docs: Backends and precision); without them it is emulated and slower than float32. float16: "
        "CUDA only.",
    )
    quantize: str = _setting(
        "none",
        values.choice("none", "int8"),
        "int8: answers move a little from float32's (docs: Backends and precision, for the measured "
        "agreement). On torch, dynamic int8 of the linear layers (CPU only). On openvino (pip install "
        "'maskserve[openvino-int8]'), the encoder quantized to int8 by NNCF on built-in calibration "
        "texts, the head kept in float32: fast on CPUs with VNNI or AMX. onnxruntime refuses it.",
    )
    threads: int = _setting(
        0,
        values.non_negative_int,
        "Threads of a forward pass, on every backend (torch intra-op, ONNX Runtime, OpenVINO). 0 = "
        "auto: the CPUs this process may use (affinity and cgroup aware); on torch, one thread for "
        "small batches, whose threads would otherwise spin for cores the event loop needs. N = "
        "always N. --torch-threads is its older name.",
        aliases=("torch_threads",),
    )
    workers: int = _setting(
        1,
        values.positive_int,
        "Server processes on one port (gunicorn), each with its own model, queue and inference "
        "thread; the CPUs are divided among them. 1 suits a big model (one wide process); several "
        "suit a small model on many cores. /metrics reports every worker.",
    )
    backend: str = _setting(
        "torch",
        values.choice("torch", "onnxruntime", "openvino"),
        "What runs the model. torch: any device, dtype and --quantize. onnxruntime (pip install "
        "'maskserve[onnx]'): CPU and float32 only; the model is exported to ONNX once (cached in "
        "--cache-dir) with attention, layer norm and GELU fused, and runs faster per pass, most of all "
        "for a text or a few at a time. openvino (pip install 'maskserve[openvino]'): CPU, float32 or "
        "--dtype bfloat16; the model is converted once (cached in --cache-dir) and uses the CPU's "
        "matrix units. Their threads follow --threads. Start-up exits 2 if the export fails or the "
        "backend cannot run what is asked.",
    )
    cache_dir: str | None = _setting(
        None,
        values.optional_str,
        "Where maskserve keeps what it builds from a model: the onnxruntime backend's exports go in its "
        "onnx/ subfolder, the openvino backend's graphs and compiled models in openvino/, one per model, "
        "weights, settings and library versions (never stale). "
        "Default: $XDG_CACHE_HOME/maskserve, else ~/.cache/maskserve.",
    )
    max_batch_size: int = _setting(
        32, values.positive_int, "Most texts in one forward pass. Larger batches raise throughput and latency."
    )
    max_batch_tokens: int = _setting(
        8192,
        values.positive_int,
        "Padded token budget of one forward pass: texts x longest text in tokens. Bounds memory "
        "and the time one batch holds the model.",
    )
    max_batch_delay: float = _setting(
        0.0,
        values.non_negative_float,
        "Seconds a batch may wait for more requests to join it, counted once from its oldest request. "
        "0 = never wait: requests that arrive while the model is busy batch together anyway.",
    )
    max_queue: int = _setting(
        4096,
        values.positive_int,
        "Most texts waiting for the model, each row a forward pass reads counted once: a text, a window of "
        "a long text, a scored or whole-word copy. When full, new requests get 503 at once. The default "
        "holds the copies of one text of --max-score-tokens scored tokens; the predicted wait, not the "
        "count, sheds load before a queue of short texts fills it.",
    )
    request_timeout: float = _setting(
        30.0,
        values.positive_float,
        "Seconds a request may take end to end before 504. Clients may shorten it with X-Request-Timeout.",
    )
    max_body_bytes: int = _setting(1_048_576, values.positive_int, "Largest request body; larger ones get 413.")
    max_text_chars: int = _setting(
        32_768,
        values.positive_int,
        "Longest text in characters, checked before tokenizing: eight characters a token of --max-text-tokens "
        "(English prose takes four or five), so that the token limit is what a long text meets.",
    )
    max_text_tokens: int = _setting(
        4096,
        values.positive_int,
        "Longest text in tokens. A text longer than the model reads (512 tokens for BERT) is read in windows "
        "of the model's length around the masks or scored tokens it asks about, each window a row of its "
        "own, queued and batched like a text; the default is eight BERT lengths. A request may ask for a "
        '422 instead of windows (parameters.long_text "refuse").',
    )
    max_inputs: int = _setting(64, values.positive_int, "Most texts in one JSON request.")
    max_top_k: int = _setting(100, values.positive_int, "Largest top_k a request may ask for.")
    max_targets: int = _setting(100, values.positive_int, "Most targets a request may name.")
    default_top_k: int = _setting(5, values.positive_int, "top_k when the request gives none (the pipeline's 5).")
    max_masks_per_text: int = _setting(
        8,
        values.positive_int,
        "Most mask tokens in one text, for every model length of it: a text of 1,500 tokens on a model "
        "that reads 512 may hold 3 x 8, so a long document read in windows holds as many masks a window "
        "as a sentence (real sentences have a few). Set, it holds for a text of any length. Each mask "
        "costs a softmax over the vocabulary and top_k predictions, each with its own decoded copy of "
        "the text; admission weighs that cost as measured.",
    )
    max_predictions: int = _setting(
        2048,
        values.positive_int,
        "Most predictions one request may ask for: texts x masks x top_k. Each prediction carries the "
        "whole text decoded again (its 'sequence'), so this bounds the work after the forward pass.",
    )
    max_score_tokens: int = _setting(
        4096,
        values.positive_int,
        "Most tokens POST /score scores in one text: by default a whole text of --max-text-tokens. Each "
        "token is one masked copy of the text (of its window, past the model's length), queued and read "
        "like a text of its own, so a text's cost grows with its length times the model's; admission "
        "weighs that cost as measured, and a request that could not end within --request-timeout here "
        "is refused (422 request_too_costly) before any work.",
    )
    max_word_copies: int = _setting(
        64,
        values.positive_int,
        "Most copies of its texts one fill-mask request's whole-word targets may take. A target of k "
        "tokens is scored on each mask by k copies of the text, each queued and read like a text of its "
        "own, so a request's cost grows with its texts x masks x the targets' tokens.",
    )
    max_response_bytes: int = _setting(
        4 * 1_048_576,
        values.positive_int,
        "Largest answer, in bytes, that a request may ask for; checked against an upper bound before "
        "the request is queued (422 response_too_large), so no work is spent on an answer too big to send.",
    )
    header_timeout: float = _setting(
        10.0,
        values.positive_float,
        "Seconds a client has to send a request's headers: from its connection's opening for the first "
        "request, from its first byte for a later one. Real clients send them in one packet; a client "
        "that trickles them (slowloris) is cut here instead of holding a socket without end.",
    )
    body_timeout: float = _setting(
        10.0,
        values.positive_float,
        "Seconds a client has to send a request's body once its headers are in (408 past it, and the "
        "connection closed). The default asks at least 100 KB/s of a --max-body-bytes body; raise it "
        "for clients on slow uplinks.",
    )
    write_timeout: float = _setting(
        60.0,
        values.positive_float,
        "Seconds an answer may take to be written to its client. A client that does not read its answer "
        "(or reads it too slowly) is cut here and the answer's memory freed. The default asks about "
        "70 KB/s for the largest answer (--max-response-bytes).",
    )
    keepalive_timeout: float = _setting(
        15.0,
        values.positive_float,
        "Seconds an idle keep-alive connection stays open between requests. Longer saves clients a "
        "reconnect; shorter frees sockets sooner. A proxy in front should close its idle connections "
        "to this server sooner than this (the HAProxy example: 10 s).",
    )
    max_connections: int = _setting(
        1000,
        values.positive_int,
        "Most client connections open at once; past it a new connection is answered 503 with "
        "Retry-After and closed, without reading its request. Each costs a socket (a file "
        "descriptor: keep this under ulimit -n) and a little memory.",
    )
    max_unsent_bytes: int = _setting(
        32 * 1_048_576,
        values.positive_int,
        "Most bytes of answers being written to clients that have not yet taken them, across "
        "connections (each is held whole until written, and the socket's buffer copies the rest: "
        "about twice this in memory). Past it, the connections whose answers have waited longest "
        "(the slowest readers) are closed to make room: clients that do not read cannot make the "
        "server hold answers without bound, and normal clients keep being answered.",
    )
    drain_delay: float = _setting(
        0.0,
        values.non_negative_float,
        "Seconds to keep accepting and answering requests after SIGTERM/SIGINT while /readyz answers "
        "503, so load balancers stop sending before the listener closes. 0 suits a laptop; behind a "
        "balancer set it above its health check interval x failures. A second signal cuts it short.",
    )
    drain_timeout: float = _setting(
        10.0,
        values.non_negative_float,
        "Seconds to finish queued work once the listener closes (after --drain-delay) before answering the rest 503.",
    )
    stall_timeout: float = _setting(
        10.0,
        values.positive_float,
        "The least stall budget, in seconds: /livez answers 503 once one batch has held the inference "
        "thread longer than the larger of this and four times the longest batch the limits admit "
        "(predicted from the measured cost, see --warmup), so a stall means a bug, never a big request.",
    )
    warmup: bool = _setting(
        True,
        values.flag,
        "Before listening, run a few forward passes of short and longest texts: the first requests "
        "then pay no one-time start-up cost, and admission, Retry-After and the stall budget start "
        "from measured costs instead of none.",
        flag_kind="bool",
    )
    agent_port: int = _setting(
        0,
        values.port,
        "A TCP port for HAProxy's agent-check: each connection reads one line, this server's weight "
        "by its load (full when idle, lower as its queue and predicted wait grow, never zero) or "
        "'drain' while it shuts down. A load signal for balancers, apart from /readyz. 0 = off.",
    )
    grpc_port: int = _setting(
        0,
        values.port,
        "A TCP port for the Open Inference Protocol over gRPC (Triton's inference.GRPCInferenceService, "
        "the grpc.health.v1 health service and server reflection), beside HTTP, in the same process. "
        "0 = off; Triton's port is 8001, which the container image sets.",
    )
    log_level: str = _setting("info", values.choice("debug", "info", "warning", "error"), "Logging level.")
    log_json: bool = _setting(False, values.flag, "Log one JSON object per line.", flag_kind="bool")
    middleware: str = _setting(
        "default",
        str,
        "The middleware chain, outermost first: 'default', then -NAME to remove a stage, +NAME to add "
        "one at its slot, NAME to append; NAME is a built-in, an entry point or package.module:factory. "
        "Checked at start-up (docs: Middleware, keys and CORS).",
    )
    # repr=False: the key never shows in a log line or a traceback that prints the settings.
    api_key: str | None = field(
        default=None,
        repr=False,
        metadata={
            "parse": values.api_keys,
            "help": "Bearer key(s) every route but health and the demo page then needs; comma-separated "
            "to roll keys over. Prefer the environment variable: flags show in the process list.",
            "secret": True,
        },
    )
    # repr=False: as the API key, never in a log line or a traceback.
    control_key: str | None = field(
        default=None,
        repr=False,
        metadata={
            "parse": values.api_keys,
            "help": "Bearer key(s) the model repository's load and unload routes need (the API key "
            "does not grant them); comma-separated to roll keys over. Without one, those routes "
            "answer 403, and --model-control-mode explicit refuses to start.",
            "secret": True,
        },
    )
    traces_exporter: str | None = _setting(
        None,
        values.exporters,
        "OpenTelemetry span exporters, comma-separated: console, otlp (OTLP over HTTP to "
        "OTEL_EXPORTER_OTLP_ENDPOINT), none, or any installed exporter's entry point. Set (and not "
        "none), it turns the tracing stage on; needs maskserve[otel].",
        env_fallback="OTEL_TRACES_EXPORTER",
    )
    cors_origins: str = _setting(
        "",
        values.origins,
        "Comma-separated origins (https://app.example.com) whose pages may call this server from a "
        "browser, or * for any. Empty = CORS off.",
    )

    # The names of the settings the user wrote (a flag, a variable, a models file's entry), as
    # opposed to defaults: only these are held fixed when a default moves to fit (settings_from).
    # Not a setting: no flag, no variable, and no part of equality.
    given: frozenset[str] = field(default=frozenset(), compare=False)


def flag_name(name: str) -> str:
    """A setting's flag: max_queue -> --max-queue."""
    return "--" + name.replace("_", "-")


def setting_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields that are settings (each a flag and a variable): all but :attr:`Settings.given`."""
    return tuple(f for f in dataclasses.fields(Settings) if "parse" in f.metadata)
