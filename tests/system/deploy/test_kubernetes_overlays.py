"""deploy/kubernetes-overlays: the documented changes for a real model and for GPU nodes."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from maskserve.config.flags import load_settings
from maskserve.config.model_configs import model_configs
from tests.system.deploy.manifests import (
    KUBERNETES_VERSION,
    OVERLAYS_DIR,
    Object,
    container,
    mebibytes,
    pod_spec,
    render,
    settings,
)

pytestmark = pytest.mark.deploy

# Peak resident memory of a bert-base-shaped model in the benchmark.
BERT_BASE_PEAK_RSS_MIB = 912


@pytest.fixture(scope="module")
def real_model() -> list[Object]:
    return render(OVERLAYS_DIR / "real-model")


@pytest.fixture(scope="module")
def gpu() -> list[Object]:
    return render(OVERLAYS_DIR / "gpu")


@pytest.fixture(scope="module")
def two_models() -> list[Object]:
    return render(OVERLAYS_DIR / "two-models")


def test_overlays_validate_strictly_against_kubernetes_1_33(
    real_model: list[Object], gpu: list[Object], two_models: list[Object]
) -> None:
    import kubernetes_validate

    for obj in real_model + gpu + two_models:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == "1.33"


def test_two_models_come_from_a_models_file_that_maskserve_accepts(two_models: list[Object], tmp_path: Path) -> None:
    env = settings(two_models)
    mounts = {m["mountPath"]: m for m in container(two_models)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(two_models)["volumes"]}
    # The file is where the settings say, mounted from the generated ConfigMap.
    path = Path(env["MASKSERVE_MODELS_FILE"])
    mount = mounts[str(path.parent)]
    config_map_name = volumes[mount["name"]]["configMap"]["name"]
    (config_map,) = [o for o in two_models if o["kind"] == "ConfigMap" and o["metadata"]["name"] == config_map_name]
    local = tmp_path / path.name
    local.write_text(config_map["data"][path.name], encoding="utf-8")
    # maskserve's own start-up check of the models, on the pod's settings with the file's content.
    served = model_configs(load_settings([], env={**env, "MASKSERVE_MODELS_FILE": str(local)}))
    assert [config.name for config in served] == ["english", "multilingual"]
    for config in served:
        assert config.source is not None
        model_mount = mounts[config.source]  # each model's folder is a read-only volume
        assert model_mount["readOnly"] is True
        assert volumes[model_mount["name"]]["persistentVolumeClaim"]["readOnly"] is True
    assert served[1].settings.max_queue == 64 < served[0].settings.max_queue


def test_two_models_get_memory_for_both(two_models: list[Object], real_model: list[Object]) -> None:
    resources = container(two_models)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert mebibytes(resources["limits"]["memory"]) > mebibytes(container(real_model)["resources"]["limits"]["memory"])


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


def test_the_base_hardening_survives_the_overlays(
    real_model: list[Object], gpu: list[Object], two_models: list[Object]
) -> None:
    for objects in (real_model, gpu, two_models):
        assert container(objects)["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod_spec(objects)["enableServiceLinks"] is False


def test_gpu_pods_ask_for_a_gpu_and_run_on_cuda(gpu: list[Object]) -> None:
    main = container(gpu)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert settings(gpu)["MASKSERVE_DEVICE"] == "cuda"
    # A different image: the CPU one has no CUDA torch.
    assert main["image"].endswith("-cuda")
