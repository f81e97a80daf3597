"""The Kubernetes objects `kubectl kustomize deploy/kubernetes` renders, and ways to look into them."""

from __future__ import annotations

import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tests.paths import ROOT

KUSTOMIZE_DIR = ROOT / "deploy" / "kubernetes"
OVERLAYS_DIR = ROOT / "deploy" / "kubernetes-overlays"
KUBERNETES_VERSION = "1.33.0"

Object = dict[str, Any]

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL_SUFFIXES = {"m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9)}


def render(directory: Path = KUSTOMIZE_DIR) -> list[Object]:
    """Every object of a kustomization, as kubectl renders it (kubectl ships kustomize)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "tox -e deploy needs kubectl (with its built-in kustomize) on PATH"
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_yaml(name: str) -> Any:
    """A file of deploy/kubernetes that is not in the kustomization, parsed."""
    return yaml.safe_load((KUSTOMIZE_DIR / name).read_text(encoding="utf-8"))


def one(objects: list[Object], kind: str) -> Object:
    """The only object of ``kind``."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(objects: list[Object]) -> Object:
    spec: Object = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(objects: list[Object]) -> Object:
    """The maskserve container (the pod has no other)."""
    containers = pod_spec(objects)["containers"]
    assert len(containers) == 1
    found: Object = containers[0]
    return found


def container_ports(objects: list[Object]) -> dict[str, int]:
    """The container's ports by name ("http", "grpc"), in the order they are declared."""
    return {port["name"]: int(port["containerPort"]) for port in container(objects)["ports"]}


def env_entry(objects: list[Object], name: str) -> Object:
    """The container's ``env`` entry for ``name``."""
    found = [e for e in container(objects).get("env", []) if e["name"] == name]
    assert len(found) == 1, f"{name} should be set once in the container's env"
    return found[0]


def settings(objects: list[Object]) -> dict[str, str]:
    """The ConfigMap the container takes its MASKSERVE_* variables from (envFrom)."""
    refs = [source["configMapRef"]["name"] for source in container(objects).get("envFrom", [])]
    assert len(refs) == 1, "the settings come from one ConfigMap"
    found = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == refs[0]]
    assert found, f"envFrom names {refs[0]}, which the kustomization does not render"
    data: dict[str, str] = found[0]["data"]
    return data


def env_names(objects: list[Object]) -> set[str]:
    """Every variable the container gets: its env entries and the ConfigMap's keys."""
    return {e["name"] for e in container(objects).get("env", [])} | set(settings(objects))


def cpus(quantity: str | int) -> Decimal:
    """A CPU quantity ("2", "500m") in CPUs."""
    text = str(quantity)
    if text.endswith("m"):
        return Decimal(text[:-1]) / 1000
    return Decimal(text)


def mebibytes(quantity: str | int) -> Decimal:
    """A memory quantity ("768Mi", "1Gi", "800M") in MiB."""
    text = str(quantity)
    for suffix, factor in _BINARY_SUFFIXES.items():
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * factor / 2**20
    for suffix, factor in _DECIMAL_SUFFIXES.items():
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * factor / 2**20
    return Decimal(text) / 2**20


def value(quantity: str | int | float) -> Decimal:
    """A plain quantity ("600m", "2") as a number."""
    return cpus(quantity)


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a matchLabels selector selects an object with ``labels``."""
    return bool(selector) and all(labels.get(key) == val for key, val in selector.items())
