"""deploy/ray/rayjob.yaml: a batch job on a KubeRay cluster made for it. KubeRay's CRD schema is not in
kubernetes-validate, but its head and worker templates are Pod templates: each is validated
strictly as a 1.33 Pod; the job's command is checked against maskserve's own flags."""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any

import pytest
import yaml

from maskserve.config.flags import build_command
from tests.system.deploy import containerfile
from tests.system.deploy.manifests import KUBERNETES_VERSION, ROOT, cpus

pytestmark = pytest.mark.deploy

RAY_JOB = ROOT / "deploy" / "ray" / "rayjob.yaml"
BATCH_CLI = ROOT / "src" / "maskserve" / "batch" / "cli.py"


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RAY_JOB.read_text(encoding="utf-8"))
    return loaded


def templates(job: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = job["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *(group["template"] for group in cluster["workerGroupSpecs"])]


def as_pod(template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "maskserve-batch"}, "spec": template["spec"]}


def entrypoint(job: dict[str, Any]) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def batch_options() -> set[str]:
    """``maskserve batch``'s own options, read from its source (this env has no pyarrow)."""
    return set(re.findall(r'@click\.option\(\s*"(--[a-z-]+)"', BATCH_CLI.read_text(encoding="utf-8")))


def test_it_is_a_ray_job_whose_pod_templates_are_valid_pods(job: dict[str, Any]) -> None:
    import kubernetes_validate

    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    for template in templates(job):
        assert kubernetes_validate.validate(as_pod(template), KUBERNETES_VERSION, strict=True) == "1.33"
    broken = copy.deepcopy(templates(job)[1])
    broken["spec"]["containers"][0]["resource"] = {}  # a typo must fail
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(as_pod(broken), KUBERNETES_VERSION, strict=True)


def test_the_job_runs_maskserve_batch_on_the_cluster_with_flags_maskserve_has(job: dict[str, Any]) -> None:
    words = entrypoint(job)
    assert words[:2] == ["maskserve", "batch"]
    assert words[words.index("--ray") + 1] == "auto"  # the cluster KubeRay made, not one of its own
    server = {name for option in build_command().params for name in getattr(option, "opts", ())}
    flags = [word for word in words[4:] if word.startswith("--")]
    assert flags and set(flags) <= batch_options() | server, set(flags) - batch_options() - server
    assert {"--task", "--parameters", "--ray", "--part-rows", "--overwrite", "--quiet"} <= batch_options()
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_each_worker_holds_one_replica_at_the_jobs_threads_and_reads_and_writes_one_volume(
    job: dict[str, Any],
) -> None:
    words = entrypoint(job)
    threads = int(words[words.index("--threads") + 1])
    (worker,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    resources = worker["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] and cpus(resources["limits"]["cpu"]) == threads
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # no model replica on the head
    input_path, output_path = words[2:4]
    for template in templates(job):
        (container,) = template["spec"]["containers"]
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"]}
        assert input_path.startswith("/data/") and output_path.startswith("/data/") and mounts["/data"] in claims
        assert set(claims.values()) == {"maskserve-batch-data"}
        assert container["image"] == "maskserve-ray"
        assert template["spec"]["securityContext"]["runAsUser"] == 10001


def test_the_image_it_names_is_built_from_the_containerfile_with_the_ray_extra(job: dict[str, Any]) -> None:
    args = {i.args.split("=", 1)[0] for i in containerfile.instructions() if i.keyword == "ARG"}
    assert "EXTRAS" in args
    assert "--build-arg EXTRAS=ray -t maskserve-ray" in RAY_JOB.read_text(encoding="utf-8")
