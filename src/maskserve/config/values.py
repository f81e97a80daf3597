"""The value parsers of the settings: each turns a flag's or variable's text into its value, or
raises ValueError saying why in a few words (the loader adds the flag and the value)."""

from __future__ import annotations

import re
from collections.abc import Callable


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise ValueError("must be greater than 0")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be between 0 and 65535")
    return value


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return value

    return parse


def flag(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


# A path segment the router and every OIP client can carry unquoted.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def model_name(text: str) -> str:
    if not _MODEL_NAME.fullmatch(text):
        raise ValueError("must be 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit")
    return text


def model_sources(text: str) -> tuple[str, ...]:
    """``[NAME=]SOURCE``s, comma-separated (a flag given several times adds each); empty: none, so
    the default model, as an empty ``MASKSERVE_MODEL`` has always meant."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def optional_str(text: str) -> str | None:
    return text or None


# RFC 6750 b64token: what fits in an ``Authorization: Bearer`` header unquoted.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def api_keys(text: str) -> str | None:
    keys = [key.strip() for key in text.split(",") if key.strip()]
    for key in keys:
        # Long enough that guessing is hopeless; the error never echoes a key (see _parse).
        if len(key) < 16 or not _BEARER_TOKEN.fullmatch(key):
            raise ValueError("each key needs 16 or more of A-Z a-z 0-9 . _ ~ + / - (then optional =)")
    return ",".join(keys) or None


_ORIGIN = re.compile(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?|\*")


def origins(text: str) -> str:
    origins = [origin.strip().lower() for origin in text.split(",") if origin.strip()]
    for origin in origins:
        if not _ORIGIN.fullmatch(origin):
            raise ValueError(f"{origin!r} is not * or scheme://host[:port] (no path, no trailing slash)")
    return ",".join(origins)


_EXPORTER = re.compile(r"[a-z][a-z0-9_]*")


def exporters(text: str) -> str | None:
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    for name in names:
        if not _EXPORTER.fullmatch(name):
            raise ValueError(f"{name!r} is not an exporter name (console, otlp, none, ...)")
    if "none" in names and len(names) > 1:
        raise ValueError("none turns tracing off; it cannot be combined with other exporters")
    return ",".join(names) or None
