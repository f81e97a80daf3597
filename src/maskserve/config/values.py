"""The value parsers of the settings: each turns a flag's or variable's text into its value, or
raises ValueError saying why in a few words (the loader adds the flag and the value)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass


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


# Sizes by suffix, case-insensitive. A decimal prefix with B is decimal (GB = 10^9), as disk and
# cloud prices count; with i (GiB, Gi) it is binary. K, M, G alone are binary, as Docker's
# --memory and the kernel's own sizes read them: "512M" means what a container limit of 512M does.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[a-z]*)", re.IGNORECASE)
_SHARE = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*%")


@dataclass(frozen=True)
class MemoryBudget:
    """A budget as written: a number of bytes, or a share (0 < share <= 1) of the container's limit."""

    text: str
    size: int | None = None
    share: float | None = None

    def resolve(self, limit: int | None) -> int:
        """The budget in bytes, a share taken of ``limit`` (the container's, read once at start)."""
        if self.size is not None:
            return self.size
        assert self.share is not None, "a budget is a size or a share: this is a bug"
        if limit is None:
            raise ValueError(
                f"memory budget {self.text!r} is a share of the container's memory limit, and this process "
                "has none (no cgroup memory.max or memory.limit_in_bytes set): give a size such as 1500MiB"
            )
        return max(1, int(limit * self.share))


def parse_memory_budget(text: str) -> MemoryBudget:
    """Read ``1500MiB``, ``2GB``, ``2G``, ``512M``, ``1.5GiB``, ``1000000`` (bytes) or ``60%``.

    GB, MB, KB are decimal; GiB, Gi, G, M, K are binary. Raises ValueError naming the text.
    """
    stripped = text.strip()
    share = _SHARE.fullmatch(stripped)
    if share is not None:
        percent = float(share["number"])
        if not 0 < percent <= 100:
            raise ValueError(f"memory budget {text!r}: a share must be above 0% and at most 100%")
        return MemoryBudget(text, share=percent / 100)
    size = _SIZE.fullmatch(stripped)
    if size is None or size["unit"].lower() not in _UNITS:
        raise ValueError(
            f"memory budget {text!r} is not a size (1500MiB, 2GB, 2G, 512M, bytes) or a share of the "
            "container's limit (60%)"
        )
    value = float(size["number"]) * _UNITS[size["unit"].lower()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"memory budget {text!r} must be at least one byte")
    return MemoryBudget(text, size=int(value))


def memory_budget(text: str) -> str | None:
    """``--models-memory``: checked here, kept as written (a share is resolved where the server runs)."""
    return parse_memory_budget(text).text.strip() if text.strip() else None
