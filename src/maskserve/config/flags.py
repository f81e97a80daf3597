"""Settings from the command line and the environment: each field a flag (``--max-batch-size``) and
``MASKSERVE_*`` variables, read once at start-up, with errors that name the flag or variable and
the value."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from maskserve import __version__
from maskserve.config.bounds import contradictions, follows_note, settings_from
from maskserve.config.settings import ENV_PREFIX, NamedSettingsError, Settings, SettingsError, flag_name, setting_fields


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
