"""deploy/Containerfile read as its instructions, the way a builder reads it (enough for the tests)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.paths import ROOT

CONTAINERFILE = ROOT / "deploy" / "Containerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LOCK = ROOT / "deploy" / "requirements.lock"


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword in capitals, its arguments as written, the stage it is in."""

    keyword: str
    args: str
    stage: int


def instructions(path: Path = CONTAINERFILE) -> list[Instruction]:
    """Every instruction, with continuation lines joined and comment lines dropped."""
    found: list[Instruction] = []
    stage = -1  # ARGs before the first FROM belong to no stage
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stage += 1
        found.append(Instruction(keyword.upper(), args.strip(), stage))
    return found


def stages() -> int:
    return sum(1 for i in instructions() if i.keyword == "FROM")


def final_stage() -> list[Instruction]:
    everything = instructions()
    last = max(i.stage for i in everything)
    return [i for i in everything if i.stage == last]


def env() -> dict[str, str]:
    """The ENV of the image that runs (the last stage), name to value as written."""
    values: dict[str, str] = {}
    for instruction in final_stage():
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.args):
                name, _, value = pair.partition("=")
                values[name] = value
    return values


def arg_defaults() -> dict[str, str]:
    """Every build argument that has a default, name to default."""
    defaults: dict[str, str] = {}
    for instruction in instructions():
        if instruction.keyword == "ARG" and "=" in instruction.args:
            name, _, value = instruction.args.partition("=")
            defaults[name] = shlex.split(value)[0] if value.strip() else ""
    return defaults


def with_defaults(text: str) -> str:
    """``text`` with ``${NAME}`` replaced by each build argument's default."""
    defaults = arg_defaults()
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), text)


def exec_form(keyword: str) -> list[str] | None:
    """The last ENTRYPOINT or CMD of the final stage as a JSON array; None if absent."""
    found = [i for i in final_stage() if i.keyword == keyword]
    if not found:
        return None
    value = json.loads(found[-1].args)  # shell form is not JSON: this raises, and the test fails
    assert isinstance(value, list) and all(isinstance(part, str) for part in value)
    return value


def locked() -> dict[str, Version]:
    """Canonical name to pinned version, one per `name==version` line of the lock."""
    pins: dict[str, Version] = {}
    for raw in LOCK.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"not a `name==version` pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{name} is pinned twice"
        pins[name] = Version(match.group(2))
    return pins
