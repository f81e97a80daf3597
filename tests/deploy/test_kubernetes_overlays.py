"""deploy/kubernetes-overlays: the documented changes for a real model and for GPU nodes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from .manifests import KUBERNETES_VERSION, OVERLAYS_DIR, Object, container, mebibytes, pod_spec, render, settings

pytestmark = pytest.mark.deploy

# Peak resident memory of a bert-base-shaped model in the benchmark.
BERT_BASE_PEAK_RSS_MIB = 912


@pytest.fixture(scope="module")
def real_model() -> list[Object]:
    return render(OVERLAYS_DIR / "real-model")


@pytest.fixture(scope="module")
def gpu() -> list[Object]:
    return render(OVERLAYS_DIR / "gpu")


def test_overlays_validate_strictly_against_kubernetes_1_33(real_model: list[Object], gpu: list[Object]) -> None:
    import kubernetes_validate

    for obj in real_model + gpu:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == "1.33"


def test_the_real_model_is_read_from_a_read_only_volume(real_model: list[Object]) -> None:
    model = settings(real_model)["MASKSERVE_MODEL"]
    volumes = {v["name"]: v for v in pod_spec(real_model)["volumes"]}
    (mount,) = [m for m in container(real_model)["volumeMounts"] if m["mountPath"] == model]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["persistentVolumeClaim"]["readOnly"] is True


def test_the_real_model_gets_memory_for_its_size(real_model: list[Object]) -> None:
    resources = container(real_model)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert mebibytes(resources["limits"]["memory"]) >= Decimal("1.3") * BERT_BASE_PEAK_RSS_MIB


def test_the_base_hardening_survives_the_overlays(real_model: list[Object], gpu: list[Object]) -> None:
    for objects in (real_model, gpu):
        assert container(objects)["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod_spec(objects)["enableServiceLinks"] is False


def test_gpu_pods_ask_for_a_gpu_and_run_on_cuda(gpu: list[Object]) -> None:
    main = container(gpu)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert settings(gpu)["MASKSERVE_DEVICE"] == "cuda"
    # A different image: the CPU one has no CUDA torch.
    assert main["image"].endswith("-cuda")
