"""Settings from the command line and the environment: each field a flag (``--max-batch-size``) and
``MASKSERVE_*`` variables, read once at start-up, with errors that name the flag or variable and
the value.

click does the plumbing: each flag an option with its variables, flag over variable over default,
the command line's own errors (an unknown flag, a flag without its value), --help and --version.
Each setting's own parser reads the text, so that every bad value is refused in one form, naming the
flag or variable it came from."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

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
    "model repository": (
        "model_repository",
        "model_control_mode",
        "models_memory",
        "model_load_timeout",
        "model_min_residency",
        "control_key",
    ),
    "batching": ("max_batch_size", "max_batch_tokens", "max_batch_delay", "max_queue"),
    "admission and limits": (
        "request_timeout",
        "max_body_bytes",
        "max_text_chars",
        "max_text_tokens",
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
    "server": (
        "host",
        "port",
        "grpc_port",
        "workers",
        "drain_delay",
        "drain_timeout",
        "middleware",
        "api_key",
        "cors_origins",
    ),
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


@dataclass
class _Environment:
    """The variables the options read (load_settings' ``env``, else os.environ), handed to them as
    the context's object, and the variable each setting's value came from, for error messages."""

    variables: Mapping[str, str]
    read: dict[str, str] = field(default_factory=dict)


class _Text(click.types.StringParamType):
    """A setting's text, left for the setting's own parser; a variable is one value even for a
    repeatable flag (``MASKSERVE_MODEL``'s parser splits it at commas, not click at whitespace)."""

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return (rv,)


class _Switch(click.types.BoolParamType):
    """A bool flag's value: True or False from ``--x``/``--no-x``, or a variable's text left for the
    setting's parser (values.flag), whose refusal names the variable like any other."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value


class _SettingOption(click.Option):
    """One flag of a setting (its own, or an older name's), reading the setting's variables from
    the mapping load_settings was given rather than from os.environ, as click would."""

    def __init__(self, setting: str, decls: Sequence[str], variables: tuple[str, ...] = (), **attrs: Any) -> None:
        super().__init__(decls, envvar=list(variables) or None, **attrs)
        self.setting, self.variables = setting, variables

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        environment = ctx.find_object(_Environment)
        if environment is None:
            return None
        # Set and empty is set (click would skip it): the setting's parser says whether "" is a value.
        found = next((name for name in self.variables if name in environment.variables), None)
        if found is None:
            return None
        environment.read[self.setting] = found
        return environment.variables[found]


def _default_help(f: dataclasses.Field[Any]) -> str:
    note = follows_note(f.name)
    return f"default {f.default!r}" + (f", {note}" if note else "")


def _options(f: dataclasses.Field[Any]) -> list[_SettingOption]:
    """A setting's options: its flag, which reads its variables, then one per older name."""
    help_text = f"{f.metadata['help']} [env {' or '.join(env_names(f))}; {_default_help(f)}]"
    flag, variables = flag_name(f.name), env_names(f)
    if f.metadata.get("flag_kind") == "bool":
        no = "--no-" + flag.removeprefix("--")
        options = [_SettingOption(f.name, [f"{flag}/{no}"], variables, type=_Switch(), help=help_text)]
    else:
        many = f.metadata.get("flag_kind") == "append"
        options = [
            _SettingOption(f.name, [flag], variables, type=_Text(), multiple=many, metavar="VALUE", help=help_text)
        ]
    # Its own option (and no variable: those are the flag's), so that an error names the flag the
    # operator typed.
    options += [
        _SettingOption(f.name, [flag_name(alias)], type=_Text(), metavar="VALUE", help=f"= {flag}")
        for alias in f.metadata.get("aliases", ())
    ]
    return options


class _Command(click.Command):
    """maskserve's command line; its --help shows the settings in :data:`GROUPS`, a section each
    (click has no option groups of its own)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)
        sections = [("options", [p for p in params if not isinstance(p, _SettingOption)])]
        sections += [
            (title, [p for name in names for p in params if isinstance(p, _SettingOption) and p.setting == name])
            for title, names in GROUPS.items()
        ]
        for title, members in sections:
            with formatter.section(title):
                formatter.write_dl([record for p in members if (record := p.get_help_record(ctx)) is not None])


def build_command() -> click.Command:
    """The ``maskserve`` command: every setting's flags, --version and --help."""
    fields = {f.name: f for f in setting_fields()}
    command = _Command(
        "maskserve",
        params=[option for names in GROUPS.values() for name in names for option in _options(fields[name])],
        help="Serve a Hugging Face fill-mask model over HTTP. Every flag also reads "
        f"{ENV_PREFIX}<FLAG> from the environment (e.g. {ENV_PREFIX}PORT).",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    return click.version_option(__version__, prog_name="maskserve", message="%(prog)s %(version)s")(command)


def help_text() -> str:
    """What ``maskserve --help`` prints."""
    command = build_command()
    return command.get_help(click.Context(command, info_name="maskserve", **command.context_settings))


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

    ``env`` is read instead of os.environ when given. ``checks`` maps a setting's name to a check
    of the whole settings, run after parsing.
    Raises :class:`SettingsError` naming the flag (or variable) and the bad value; ``--help`` and
    ``--version`` print and raise SystemExit(0).
    """
    environment = _Environment(os.environ if env is None else env)
    command = build_command()
    try:
        ctx = command.make_context("maskserve", list(argv) if argv is not None else [], obj=environment)
    except click.exceptions.Exit as done:  # --help or --version, printed
        raise SystemExit(done.exit_code) from None
    except click.ClickException as exc:  # an unknown flag, a flag without its value, a stray argument
        raise SettingsError(f"{exc.format_message()} (maskserve --help lists the flags)") from None
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}  # the flag or variable each value came from, for error messages
    for f in setting_fields():
        options = [p for p in command.params if isinstance(p, _SettingOption) and p.setting == f.name]
        # A flag beats every variable, the setting's own flag its older names: the first one typed.
        typed = [p for p in options if ctx.get_parameter_source(str(p.name)) is ParameterSource.COMMANDLINE]
        if typed:
            given, origin = ctx.params[str(typed[0].name)], typed[0].opts[0]
        elif ctx.get_parameter_source(f.name) is ParameterSource.ENVIRONMENT:
            given, origin = ctx.params[f.name], environment.read[f.name]
        else:
            continue
        if isinstance(given, bool):  # --x or --no-x
            values[f.name], origins[f.name] = given, flag_name(f.name)
        elif isinstance(given, tuple):  # a repeatable flag: each occurrence parsed on its own
            values[f.name], origins[f.name] = tuple(item for raw in given for item in _parse(f, raw, origin)), origin
        else:
            values[f.name], origins[f.name] = _parse(f, given, origin), origin
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
