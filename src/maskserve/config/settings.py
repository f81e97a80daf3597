"""Every knob maskserve has, with its default and its trade-off.

Each field is a CLI flag (``--max-batch-size``) with a ``MASKSERVE_*`` environment fallback
(``MASKSERVE_MAX_BATCH_SIZE``); a field that mirrors a standard variable falls back to it last
(``--traces-exporter``: ``MASKSERVE_TRACES_EXPORTER``, then OpenTelemetry's
``OTEL_TRACES_EXPORTER``). No other module reads the environment (the OpenTelemetry SDK reads its
own ``OTEL_*`` variables, such as the endpoint and the service name; ``engine/cpu.py`` reads
oneDNN's ``ONEDNN_MAX_CPU_ISA``, only to report the kernels that torch and OpenVINO will run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskserve import __version__

ENV_PREFIX = "MASKSERVE_"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag and the value."""


class NamedSettingsError(SettingsError):
    """Raised by a start-up check whose message already names what is at fault (a flag, a file,
    a model): :func:`load_settings` passes it on without a prefix."""


def available_cpus() -> int:
    """The CPUs this process may really use: affinity mask, then the cgroup v2/v1 quota.

    torch defaults to the *node's* core count, which oversubscribes a container limited to fewer
    cores: its threads then wait for CPU time the quota never grants, and every pass is throttled.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            period_us = int(f.read())
        if quota_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise ValueError("must be greater than 0")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535")
    return value


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value

    return parse


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


# A path segment the router and every OIP client can carry unquoted.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _model_name(text: str) -> str:
    if not _MODEL_NAME.fullmatch(text):
        raise ValueError("must be 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit")
    return text


def _model_sources(text: str) -> tuple[str, ...]:
    """``[NAME=]SOURCE``s, comma-separated (a flag given several times adds each); empty: none, so
    the default model, as an empty ``MASKSERVE_MODEL`` has always meant."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _optional_str(text: str) -> str | None:
    return text or None


# RFC 6750 b64token: what fits in an ``Authorization: Bearer`` header unquoted.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def _api_keys(text: str) -> str | None:
    keys = [key.strip() for key in text.split(",") if key.strip()]
    for key in keys:
        # Long enough that guessing is hopeless; the error never echoes a key (see _parse).
        if len(key) < 16 or not _BEARER_TOKEN.fullmatch(key):
            raise ValueError("each key needs 16 or more of A-Z a-z 0-9 . _ ~ + / - (then optional =)")
    return ",".join(keys) or None


_ORIGIN = re.compile(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?|\*")


def _origins(text: str) -> str:
    origins = [origin.strip().lower() for origin in text.split(",") if origin.strip()]
    for origin in origins:
        if not _ORIGIN.fullmatch(origin):
            raise ValueError(f"{origin!r} is not * or scheme://host[:port] (no path, no trailing slash)")
    return ",".join(origins)


_EXPORTER = re.compile(r"[a-z][a-z0-9_]*")


def _exporters(text: str) -> str | None:
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    for name in names:
        if not _EXPORTER.fullmatch(name):
            raise ValueError(f"{name!r} is not an exporter name (console, otlp, none, ...)")
    if "none" in names and len(names) > 1:
        raise ValueError("none turns tracing off; it cannot be combined with other exporters")
    return ",".join(names) or None


def _setting(default: Any, parse: Callable[[str], Any], help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"parse": parse, "help": help, **extra})


@dataclass(frozen=True)
class Settings:
    """One frozen object holding every setting; build it with :func:`load_settings`."""

    host: str = _setting("127.0.0.1", str, "Address to bind. Use 0.0.0.0 to serve other machines.")
    port: int = _setting(8000, _port, "TCP port to listen on.")
    model: tuple[str, ...] = _setting(
        (),
        _model_sources,
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
        _optional_str,
        "A YAML file of models to serve, each with its own name, source, backend, precision and "
        "limits (docs: Several models); served after the --model ones. For fleets that configure "
        "by a ConfigMap.",
    )
    model_name: str = _setting(
        "maskserve",
        _model_name,
        "The name clients use for the one model served: in the /models/NAME and Open Inference Protocol "
        "/v2/models/NAME routes, in /info and in the metrics. Several models are named by --model.",
    )
    device: str = _setting("cpu", _choice("cpu", "cuda", "auto"), "cpu, cuda, or auto (cuda when present).")
    dtype: str = _setting(
        "auto",
        _choice("auto", "float32", "float16", "bfloat16"),
        "Precision of the forward pass. auto = float32 on CPU (the pipeline's answers), float16 on "
        "CUDA. bfloat16 on the CPU (torch, openvino): runs on the CPU's matrix units where it has AMX "
        "(several times faster) or AVX-512 BF16 (/info names them), at a small cost in agreement with "
        "float32 (docs: Backends and precision); without them it is emulated and slower than float32. float16: "
        "CUDA only.",
    )
    quantize: str = _setting(
        "none",
        _choice("none", "int8"),
        "int8: answers move a little from float32's (docs: Backends and precision, for the measured "
        "agreement). On torch, dynamic int8 of the linear layers (CPU only). On openvino (pip install "
        "'maskserve[openvino-int8]'), the encoder quantized to int8 by NNCF on built-in calibration "
        "texts, the head kept in float32: fast on CPUs with VNNI or AMX. onnxruntime refuses it.",
    )
    threads: int = _setting(
        0,
        _non_negative_int,
        "Threads of a forward pass, on every backend (torch intra-op, ONNX Runtime, OpenVINO). 0 = "
        "auto: the CPUs this process may use (affinity and cgroup aware); on torch, one thread for "
        "small batches, whose threads would otherwise spin for cores the event loop needs. N = "
        "always N. --torch-threads is its older name.",
        aliases=("torch_threads",),
    )
    workers: int = _setting(
        1,
        _positive_int,
        "Server processes on one port (gunicorn), each with its own model, queue and inference "
        "thread; the CPUs are divided among them. 1 suits a big model (one wide process); several "
        "suit a small model on many cores. /metrics reports every worker.",
    )
    backend: str = _setting(
        "torch",
        _choice("torch", "onnxruntime", "openvino"),
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
        _optional_str,
        "Where maskserve keeps what it builds from a model: the onnxruntime backend's exports go in its "
        "onnx/ subfolder, the openvino backend's graphs and compiled models in openvino/, one per model, "
        "weights, settings and library versions (never stale). "
        "Default: $XDG_CACHE_HOME/maskserve, else ~/.cache/maskserve.",
    )
    max_batch_size: int = _setting(
        32, _positive_int, "Most texts in one forward pass. Larger batches raise throughput and latency."
    )
    max_batch_tokens: int = _setting(
        8192,
        _positive_int,
        "Padded token budget of one forward pass: texts x longest text in tokens. Bounds memory "
        "and the time one batch holds the model.",
    )
    max_batch_delay: float = _setting(
        0.0,
        _non_negative_float,
        "Seconds a batch may wait for more requests to join it, counted once from its oldest request. "
        "0 = never wait: requests that arrive while the model is busy batch together anyway.",
    )
    max_queue: int = _setting(
        256,
        _positive_int,
        "Most texts waiting for the model. When full, new requests get 503 at once.",
    )
    request_timeout: float = _setting(
        30.0,
        _positive_float,
        "Seconds a request may take end to end before 504. Clients may shorten it with X-Request-Timeout.",
    )
    max_body_bytes: int = _setting(1_048_576, _positive_int, "Largest request body; larger ones get 413.")
    max_text_chars: int = _setting(
        10_000, _positive_int, "Longest text in characters; tokens are also capped by the model's maximum."
    )
    max_inputs: int = _setting(64, _positive_int, "Most texts in one JSON request.")
    max_top_k: int = _setting(100, _positive_int, "Largest top_k a request may ask for.")
    max_targets: int = _setting(100, _positive_int, "Most targets a request may name.")
    default_top_k: int = _setting(5, _positive_int, "top_k when the request gives none (the pipeline's 5).")
    max_masks_per_text: int = _setting(
        8,
        _positive_int,
        "Most mask tokens in one text. Each mask costs a softmax over the vocabulary and top_k "
        "predictions, each with its own decoded copy of the text; real sentences have a few.",
    )
    max_predictions: int = _setting(
        2048,
        _positive_int,
        "Most predictions one request may ask for: texts x masks x top_k. Each prediction carries the "
        "whole text decoded again (its 'sequence'), so this bounds the work after the forward pass.",
    )
    max_score_tokens: int = _setting(
        256,
        _positive_int,
        "Most tokens POST /score scores in one text: a paragraph by default. Each token is one masked "
        "copy of the whole text, queued and read like a text of its own, so a text's cost grows with "
        "the square of its length; admission weighs that cost as measured, and a request that could not "
        "end within --request-timeout here is refused (422 request_too_costly) before any work.",
    )
    max_word_copies: int = _setting(
        64,
        _positive_int,
        "Most copies of its texts one fill-mask request's whole-word targets may take. A target of k "
        "tokens is scored on each mask by k copies of the text, each queued and read like a text of its "
        "own, so a request's cost grows with its texts x masks x the targets' tokens.",
    )
    max_response_bytes: int = _setting(
        4 * 1_048_576,
        _positive_int,
        "Largest answer, in bytes, that a request may ask for; checked against an upper bound before "
        "the request is queued (422 response_too_large), so no work is spent on an answer too big to send.",
    )
    header_timeout: float = _setting(
        10.0,
        _positive_float,
        "Seconds a client has to send a request's headers: from its connection's opening for the first "
        "request, from its first byte for a later one. Real clients send them in one packet; a client "
        "that trickles them (slowloris) is cut here instead of holding a socket without end.",
    )
    body_timeout: float = _setting(
        10.0,
        _positive_float,
        "Seconds a client has to send a request's body once its headers are in (408 past it, and the "
        "connection closed). The default asks at least 100 KB/s of a --max-body-bytes body; raise it "
        "for clients on slow uplinks.",
    )
    write_timeout: float = _setting(
        60.0,
        _positive_float,
        "Seconds an answer may take to be written to its client. A client that does not read its answer "
        "(or reads it too slowly) is cut here and the answer's memory freed. The default asks about "
        "70 KB/s for the largest answer (--max-response-bytes).",
    )
    keepalive_timeout: float = _setting(
        15.0,
        _positive_float,
        "Seconds an idle keep-alive connection stays open between requests. Longer saves clients a "
        "reconnect; shorter frees sockets sooner. A proxy in front should close its idle connections "
        "to this server sooner than this (the HAProxy example: 10 s).",
    )
    max_connections: int = _setting(
        1000,
        _positive_int,
        "Most client connections open at once; past it a new connection is answered 503 with "
        "Retry-After and closed, without reading its request. Each costs a socket (a file "
        "descriptor: keep this under ulimit -n) and a little memory.",
    )
    max_unsent_bytes: int = _setting(
        32 * 1_048_576,
        _positive_int,
        "Most bytes of answers being written to clients that have not yet taken them, across "
        "connections (each is held whole until written, and the socket's buffer copies the rest: "
        "about twice this in memory). Past it, the connections whose answers have waited longest "
        "(the slowest readers) are closed to make room: clients that do not read cannot make the "
        "server hold answers without bound, and normal clients keep being answered.",
    )
    drain_delay: float = _setting(
        0.0,
        _non_negative_float,
        "Seconds to keep accepting and answering requests after SIGTERM/SIGINT while /readyz answers "
        "503, so load balancers stop sending before the listener closes. 0 suits a laptop; behind a "
        "balancer set it above its health check interval x failures. A second signal cuts it short.",
    )
    drain_timeout: float = _setting(
        10.0,
        _non_negative_float,
        "Seconds to finish queued work once the listener closes (after --drain-delay) before answering the rest 503.",
    )
    stall_timeout: float = _setting(
        10.0,
        _positive_float,
        "The least stall budget, in seconds: /livez answers 503 once one batch has held the inference "
        "thread longer than the larger of this and four times the longest batch the limits admit "
        "(predicted from the measured cost, see --warmup), so a stall means a bug, never a big request.",
    )
    warmup: bool = _setting(
        True,
        _flag,
        "Before listening, run a few forward passes of short and longest texts: the first requests "
        "then pay no one-time start-up cost, and admission, Retry-After and the stall budget start "
        "from measured costs instead of none.",
        flag_kind="bool",
    )
    agent_port: int = _setting(
        0,
        _port,
        "A TCP port for HAProxy's agent-check: each connection reads one line, this server's weight "
        "by its load (full when idle, lower as its queue and predicted wait grow, never zero) or "
        "'drain' while it shuts down. A load signal for balancers, apart from /readyz. 0 = off.",
    )
    log_level: str = _setting("info", _choice("debug", "info", "warning", "error"), "Logging level.")
    log_json: bool = _setting(False, _flag, "Log one JSON object per line.", flag_kind="bool")
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
            "parse": _api_keys,
            "help": "Bearer key(s) every route but health and the demo page then needs; comma-separated "
            "to roll keys over. Prefer the environment variable: flags show in the process list.",
            "secret": True,
        },
    )
    traces_exporter: str | None = _setting(
        None,
        _exporters,
        "OpenTelemetry span exporters, comma-separated: console, otlp (OTLP over HTTP to "
        "OTEL_EXPORTER_OTLP_ENDPOINT), none, or any installed exporter's entry point. Set (and not "
        "none), it turns the tracing stage on; needs maskserve[otel].",
        env_fallback="OTEL_TRACES_EXPORTER",
    )
    cors_origins: str = _setting(
        "",
        _origins,
        "Comma-separated origins (https://app.example.com) whose pages may call this server from a "
        "browser, or * for any. Empty = CORS off.",
    )

    # The names of the settings the user wrote (a flag, a variable, a models file's entry), as
    # opposed to defaults: only these are held fixed when a default moves to fit (settings_from).
    # Not a setting: no flag, no variable, and no part of equality.
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def max_text_predictions(self) -> int:
        """The most predictions one text may ask for: its masks x top_k, within a request's limit."""
        return min(self.max_masks_per_text * self.max_top_k, self.max_predictions)

    @property
    def max_json_depth(self) -> int:
        """How deeply a JSON body may nest. A valid body nests three levels ({"parameters":
        {"targets": [...]}}); the slack is for "options". Checked before schema validation, whose
        error messages repr the instance recursively: a body nested near Python's recursion limit
        would otherwise end in a 500. Not a setting: no valid request comes near it."""
        return 32

    def resolved_threads(self) -> int:
        """The most threads a forward pass may use: ``--threads``, or this process's share of the
        usable CPUs (all of them with one worker)."""
        return self.threads if self.threads > 0 else max(1, available_cpus() // self.workers)

    def resolved_cache_dir(self, env: Mapping[str, str] | None = None) -> Path:
        """``--cache-dir``, or ``$XDG_CACHE_HOME/maskserve``, or ``~/.cache/maskserve``."""
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        xdg = (os.environ if env is None else env).get("XDG_CACHE_HOME", "")
        # The XDG spec ignores a relative XDG_CACHE_HOME.
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "maskserve"

    @property
    def adaptive_threads(self) -> bool:
        """Whether small batches run on one torch thread (``--threads 0``, see engine.ThreadPolicy)."""
        return self.threads == 0


def flag_name(name: str) -> str:
    """A setting's flag: max_queue -> --max-queue."""
    return "--" + name.replace("_", "-")


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def env_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The environment variables a field reads, first match wins: MASKSERVE_*, its older names,
    then a standard one."""
    names = (_env_name(f.name), *(_env_name(alias) for alias in f.metadata.get("aliases", ())))
    fallback = f.metadata.get("env_fallback")
    return (*names, fallback) if fallback else names


def flag_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The flags that set a field: its own, then its older names (kept working)."""
    return (flag_name(f.name), *(flag_name(alias) for alias in f.metadata.get("aliases", ())))


def _parse(f: dataclasses.Field[Any], raw: str, origin: str) -> Any:
    try:
        return f.metadata["parse"](raw)
    except ValueError as exc:
        reason = str(exc) if not str(exc).startswith("invalid literal") else "not a number"
        shown = "(hidden)" if f.metadata.get("secret") else repr(raw)
        raise SettingsError(f"{origin}: invalid value {shown} ({reason})") from None


# The settings as --help and the docs show them: a group each, in this order.
GROUPS: dict[str, tuple[str, ...]] = {
    "model and backend": (
        "model",
        "models_file",
        "model_name",
        "backend",
        "device",
        "dtype",
        "quantize",
        "threads",
        "cache_dir",
        "warmup",
    ),
    "batching": ("max_batch_size", "max_batch_tokens", "max_batch_delay", "max_queue"),
    "admission and limits": (
        "request_timeout",
        "max_body_bytes",
        "max_text_chars",
        "max_inputs",
        "max_top_k",
        "max_targets",
        "default_top_k",
        "max_masks_per_text",
        "max_predictions",
        "max_score_tokens",
        "max_word_copies",
        "max_response_bytes",
    ),
    "server": ("host", "port", "workers", "drain_delay", "drain_timeout", "middleware", "api_key", "cors_origins"),
    "connections": (
        "header_timeout",
        "body_timeout",
        "write_timeout",
        "keepalive_timeout",
        "max_connections",
        "max_unsent_bytes",
    ),
    "operations": ("stall_timeout", "agent_port", "log_level", "log_json", "traces_exporter"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maskserve",
        description="Serve a Hugging Face fill-mask model over HTTP. Every flag also reads "
        f"{ENV_PREFIX}<FLAG> from the environment (e.g. {ENV_PREFIX}PORT).",
    )
    parser.add_argument("--version", action="version", version=f"maskserve {__version__}")
    fields = {f.name: f for f in setting_fields()}
    for title, names in GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            _add_flags(group, fields[name])
    return parser


def follows_note(name: str) -> str:
    """How a limit's default moves to fit the ones the user sets (:data:`BOUNDS`), for ``--help``
    and the docs; "" for a setting whose default never moves."""
    lowers = [flag_name(b.lower) for b in BOUNDS if b.upper == name]
    uppers = [flag_name(b.upper) for b in BOUNDS if b.lower == name]
    if lowers:
        return f"or the largest of {', '.join(lowers)} you set, if larger"
    if uppers:
        return f"or the smallest of {', '.join(uppers)} you set, if smaller"
    return ""


def _default_help(f: dataclasses.Field[Any]) -> str:
    note = follows_note(f.name)
    return f"default {f.default!r}" + (f", {note}" if note else "")


def _add_flags(group: argparse._ArgumentGroup, f: dataclasses.Field[Any]) -> None:
    help_text = f"{f.metadata['help']} [env {' or '.join(env_names(f))}; {_default_help(f)}]"
    if f.metadata.get("flag_kind") == "bool":
        group.add_argument(
            flag_name(f.name), dest=f.name, default=None, action=argparse.BooleanOptionalAction, help=help_text
        )
    elif f.metadata.get("flag_kind") == "append":
        group.add_argument(
            flag_name(f.name), dest=f.name, default=None, action="append", metavar="VALUE", help=help_text
        )
    else:
        group.add_argument(flag_name(f.name), dest=f.name, default=None, metavar="VALUE", help=help_text)
    for alias in f.metadata.get("aliases", ()):
        # Its own destination, so that an error names the flag the operator typed.
        group.add_argument(
            flag_name(alias), dest=f"{f.name}:{alias}", default=None, metavar="VALUE", help=f"= {flag_name(f.name)}"
        )


@dataclass(frozen=True)
class Bound:
    """Two limits of which ``lower`` may not exceed ``upper``, and why.

    A user who sets one of them alone gets the other's default moved to fit (see
    :func:`settings_from`): one setting changed is one setting written. Only values the user wrote
    can contradict each other, and start-up refuses that (exit 2), naming both.
    """

    lower: str
    upper: str
    why: str


BOUNDS: tuple[Bound, ...] = (
    Bound(
        "max_inputs",
        "max_queue",
        "a request of more texts than the queue holds would be admitted by the limits and then refused 503 "
        "forever, since the queue can never hold it",
    ),
    Bound(
        "max_score_tokens",
        "max_queue",
        "each scored token is one queued copy of its text, so a text at the limit could never be queued",
    ),
    Bound(
        "max_word_copies",
        "max_queue",
        "each whole-word copy is one queued text, so a request at the limit could never be queued",
    ),
    Bound("default_top_k", "max_top_k", "a request that names no top_k would ask for more than any request may"),
    Bound("default_top_k", "max_predictions", "a request of one text and one mask would already ask for too many"),
    Bound(
        "max_response_bytes",
        "max_unsent_bytes",
        "an answer of the largest size would not fit under the bound even alone, so every reader of one "
        "would be cut to make room for the next",
    ),
)
# A limit is the lower of some bounds or the upper of others, never both: so following needs one
# pass that raises uppers and one that lowers lowers, in that order, and never a fixed point.
assert not {b.lower for b in BOUNDS} & {b.upper for b in BOUNDS}, "a limit both lower and upper: this is a bug"


def setting_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields that are settings (each a flag and a variable): all but :attr:`Settings.given`."""
    return tuple(f for f in dataclasses.fields(Settings) if "parse" in f.metadata)


def settings_from(given: Mapping[str, Any]) -> Settings:
    """The settings the user ``given`` (values by name, already parsed), the rest at their defaults,
    each default bounded by a user's value moved to fit it (:data:`BOUNDS`).

    An upper limit the user left alone rises to the largest lower one they set (``--max-inputs 300``
    raises the queue to 300); then a lower limit left alone takes the largest value its uppers allow
    (``--max-queue 8`` brings ``--max-inputs``, ``--max-score-tokens`` and ``--max-word-copies`` to 8).
    ``max_batch_delay`` and ``request_timeout`` never move: the timeout is the wait promised to every
    client, not a capacity, and the delay's default (0) fits every timeout.
    """
    values: dict[str, Any] = {f.name: f.default for f in setting_fields()} | dict(given)
    for bound in BOUNDS:
        if bound.lower in given and bound.upper not in given:
            values[bound.upper] = max(values[bound.upper], values[bound.lower])
    for bound in BOUNDS:
        if bound.lower not in given:
            values[bound.lower] = min(values[bound.lower], values[bound.upper])
    return Settings(**values, given=frozenset(given))


def followed(settings: Settings) -> dict[str, str]:
    """The limits whose default moved to fit a value the user set: each name, and the setting it follows."""
    defaults = {f.name: f.default for f in setting_fields()}
    moved: dict[str, str] = {}
    for bound in BOUNDS:
        for name, other in ((bound.lower, bound.upper), (bound.upper, bound.lower)):
            value = getattr(settings, name)
            if name not in settings.given and value != defaults[name] and value == getattr(settings, other):
                moved.setdefault(name, other)
    return moved


def contradictions(settings: Settings) -> Iterator[tuple[str, str, str]]:
    """``(setting, other setting, why)`` for each pair of values that cannot both hold.

    Each would start a server that misbehaves only later, under load or for one kind of request:
    start-up refuses it instead (exit 2), naming both settings. Built by :func:`settings_from`, only
    values the user wrote can contradict. Pairs that involve the middleware chain are checked by the
    layer that builds it (see ``checks`` in :func:`load_settings`).
    """
    for bound in BOUNDS:
        if getattr(settings, bound.lower) > getattr(settings, bound.upper):
            yield bound.lower, bound.upper, bound.why
    if settings.max_batch_delay >= settings.request_timeout:
        yield "max_batch_delay", "request_timeout", "a request could time out waiting for others to batch with"


# A check of the settings by a higher layer, handed down at start-up (the middleware chain is
# checked by the layer that builds it): it raises ValueError (SettingsError included) naming the
# problem, and load_settings prefixes the flag or variable the value came from.
SettingsCheck = Callable[["Settings"], object]


def load_settings(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    checks: Mapping[str, SettingsCheck] | None = None,
) -> Settings:
    """Settings from CLI flags, then ``MASKSERVE_*`` variables, then defaults.

    ``checks`` maps a setting's name to a check of the whole settings, run after parsing.
    Raises :class:`SettingsError` naming the flag (or variable) and the bad value.
    """
    environ = os.environ if env is None else env
    args = build_parser().parse_args(list(argv) if argv is not None else [])
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}  # the flag or variable each value came from, for error messages
    for f in setting_fields():
        given, flag = getattr(args, f.name), flag_name(f.name)
        for alias in f.metadata.get("aliases", ()):
            if given is None and getattr(args, f"{f.name}:{alias}") is not None:
                given, flag = getattr(args, f"{f.name}:{alias}"), flag_name(alias)
        if isinstance(given, bool):
            values[f.name], origins[f.name] = given, flag_name(f.name)
        elif isinstance(given, list):  # a repeatable flag: each occurrence parsed on its own
            values[f.name] = tuple(item for raw in given for item in _parse(f, raw, flag))
            origins[f.name] = flag
        elif given is not None:
            values[f.name], origins[f.name] = _parse(f, given, flag), flag
        else:
            variable = next((name for name in env_names(f) if name in environ), None)
            if variable is not None:
                values[f.name], origins[f.name] = _parse(f, environ[variable], variable), variable
    settings = settings_from(values)
    for first, second, reason in contradictions(settings):

        def named(name: str) -> str:
            shown = f"{origins.get(name, flag_name(name))}={getattr(settings, name)!r}"
            return shown if name in origins else f"{shown} (the default)"

        raise SettingsError(f"{named(first)} contradicts {named(second)}: {reason}")
    for name, check in (checks or {}).items():
        try:
            check(settings)
        except NamedSettingsError:
            raise
        except ValueError as exc:
            raise SettingsError(f"{origins.get(name, _env_name(name))}: {exc}") from None
    return settings
