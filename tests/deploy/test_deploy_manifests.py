"""deploy/: the kustomizations render (kubectl's built-in kustomize) and every object validates offline against
the Kubernetes JSON schemas shipped in `kubernetes-validate` (strict: unknown fields are errors)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pydantic
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KSERVE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
KSERVE_GPU = ROOT / "deploy" / "kserve-gpu"
GPU_SETTINGS = {"MNEMO_PROVIDER", "MNEMO_CUDA_MEM_LIMIT_MB"}  # what the GPU variants change, and nothing else
KUBERNETES_VERSION = "1.32.0"  # the oldest minor the manifests promise to fit; also checked on the newest shipped
# Fields of KServe's ComponentExtensionSpec that sit beside the inlined PodSpec in a predictor.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
    "autoScaling",
}
IMAGE_PROGRAMS = {"python3", "python3.11"}  # the only programs in the CPU image (scripts/image-rootfs.sh)
ENGINE_SETTINGS = (
    "MNEMO_MAX_BATCH",
    "MNEMO_MAX_WAIT_MS",
    "MNEMO_MAX_QUEUE",
    "MNEMO_REQUEST_TIMEOUT_S",
    "MNEMO_DRAIN_S",
    "MNEMO_STATE_URL",
)


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`: the real kustomize (v5, built into kubectl), no cluster needed."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render deploy/k8s"
    rendered = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}


def assert_valid(obj: dict[str, Any]) -> None:
    for version in (KUBERNETES_VERSION, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict[str, Any]]:
    return by_kind(render(K8S / "base"))


@pytest.fixture(scope="module")
def redis_overlay() -> dict[tuple[str, str], dict[str, Any]]:
    return by_kind(render(K8S / "overlays" / "redis"))


@pytest.fixture(scope="module")
def gpu_overlay() -> dict[tuple[str, str], dict[str, Any]]:
    return by_kind(render(K8S / "overlays" / "gpu"))


def config_map(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (name,) = [name for kind, name in objects if kind == "ConfigMap"]
    return objects["ConfigMap", name]


def test_base_renders_the_five_objects_and_each_validates(base):
    kinds = sorted(kind for kind, _ in base)
    assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]
    for obj in base.values():
        assert_valid(obj)


def test_redis_overlay_adds_redis_and_points_the_state_at_it(base, redis_overlay):
    for obj in redis_overlay.values():
        assert_valid(obj)
    assert set(base) - {("ConfigMap", name) for _, name in base} <= set(redis_overlay)
    assert ("Deployment", "mnemo-redis") in redis_overlay and ("Service", "mnemo-redis") in redis_overlay
    settings = config_map(redis_overlay)["data"]
    assert settings["MNEMO_STATE_URL"] == "redis://mnemo-redis:6379/0"
    assert redis_overlay["Service", "mnemo-redis"]["spec"]["ports"][0]["port"] == 6379
    assert {k: v for k, v in settings.items() if k != "MNEMO_STATE_URL"} == {
        k: v for k, v in config_map(base)["data"].items() if k != "MNEMO_STATE_URL"
    }
    # the server's pods read the overlay's ConfigMap (kustomize renamed it with a new content hash)
    pod = redis_overlay["Deployment", "mnemo"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["envFrom"][0]["configMapRef"]["name"] == config_map(redis_overlay)["metadata"]["name"]


def test_config_map_holds_every_setting_of_the_service(base):
    from app.core.settings import Settings

    settings = config_map(base)["data"]
    derived = {"MNEMO_INTRA_OP_THREADS", "MNEMO_CONCURRENT_RUNS", "MNEMO_MAX_CONNECTIONS"}
    secrets = {"MNEMO_API_KEYS", "MNEMO_API_KEYS_FILE"}
    expected = {f"MNEMO_{name.upper()}" for name in Settings.model_fields} - derived - secrets
    assert expected | set(ENGINE_SETTINGS) <= set(settings)
    assert settings["MNEMO_HOST"] == "0.0.0.0" and settings["MNEMO_STATE_URL"].startswith("sqlite:////var/lib/mnemo/")
    known = {key.removeprefix("MNEMO_").lower(): value for key, value in settings.items()}
    Settings(**{name: value for name, value in known.items() if name in Settings.model_fields})  # they parse


def _pod_and_container(deployment: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def assert_hardened(pod: dict[str, Any], container: dict[str, Any], uid: int) -> None:
    """Non-root, read-only root filesystem with every mount an emptyDir, no capabilities, seccomp on."""
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        assert "emptyDir" in volumes[mount["name"]], mount


def exec_commands(node: Any) -> list[list[str]]:
    """Every `exec.command` under `node` (probes and lifecycle hooks)."""
    if isinstance(node, list):
        return [command for item in node for command in exec_commands(item)]
    if not isinstance(node, dict):
        return []
    own = [node["exec"]["command"]] if isinstance(node.get("exec"), dict) else []
    return own + [command for value in node.values() for command in exec_commands(value)]


def assert_drains_before_it_is_killed(pod: dict[str, Any], container: dict[str, Any], drain_s: float) -> None:
    """preStop pauses in the kubelet, and the grace period covers that pause, the drain and the shutdown after it.

    The CPU image (`FROM scratch`, scripts/image-rootfs.sh) holds no shell and no `sleep`: an exec hook or probe
    must run Python, else it fails at once (a preStop `sleep` let SIGTERM come before the endpoints dropped the
    pod, so the drain's 503s reached clients).
    """
    from app.server import GIVE_UP_S, SHUTDOWN_GRACE_S

    for command in exec_commands(container):
        assert command[0] in IMAGE_PROGRAMS, command
    pause_s = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pause_s + drain_s + GIVE_UP_S + SHUTDOWN_GRACE_S


def test_server_deployment_is_hardened_probed_and_drains_before_it_is_killed(base):
    pod, container = _pod_and_container(base["Deployment", "mnemo"])
    assert_hardened(pod, container, uid=10001)
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    state_path = config_map(base)["data"]["MNEMO_STATE_URL"].removeprefix("sqlite:///")
    assert "/tmp" in mounts and str(Path(state_path).parent) in mounts
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    probe_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "probes")
    assert probe_port == int(config_map(base)["data"]["MNEMO_PROBE_PORT"])
    assert {container[probe]["httpGet"]["port"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")} == {
        "probes"
    }
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]) & set(container["resources"]["limits"])
    assert_drains_before_it_is_killed(pod, container, float(config_map(base)["data"]["MNEMO_DRAIN_S"]))


def test_service_hpa_and_pdb_select_the_server_pods(base):
    deployment = base["Deployment", "mnemo"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert base["Service", "mnemo"]["spec"]["selector"].items() <= labels.items()
    assert base["PodDisruptionBudget", "mnemo"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = base["HorizontalPodAutoscaler", "mnemo"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "mnemo")
    hpa = base["HorizontalPodAutoscaler", "mnemo"]["spec"]
    assert hpa["minReplicas"] > base["PodDisruptionBudget", "mnemo"]["spec"]["minAvailable"]
    port = base["Service", "mnemo"]["spec"]["ports"][0]["targetPort"]
    assert port in {p["name"] for p in _pod_and_container(deployment)[1]["ports"]}


def test_redis_deployment_is_hardened_too(redis_overlay):
    pod, container = _pod_and_container(redis_overlay["Deployment", "mnemo-redis"])
    assert_hardened(pod, container, uid=999)


def test_kserve_inference_service_is_a_v2_custom_predictor_whose_pod_spec_validates(base):
    """The InferenceService CRD schema ships in no registry package here: its structure is checked, and the
    predictor's inlined PodSpec is validated against the Kubernetes Pod schema."""
    (service,) = [doc for doc in yaml.safe_load_all(KSERVE.read_text()) if doc]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    assert set(service["spec"]) == {"predictor"}
    predictor = dict(service["spec"]["predictor"])
    extension = {key: predictor.pop(key) for key in list(predictor) if key in KSERVE_COMPONENT_FIELDS}
    assert 1 <= extension["minReplicas"] <= extension["maxReplicas"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mnemo-predictor"}, "spec": predictor}
    assert_valid(pod)
    container = predictor["containers"][0]
    assert container["name"] == "kserve-container"  # the container KServe reads PROTOCOL from
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["PROTOCOL"] == "v2"
    assert int(env["MNEMO_PORT"]) == container["ports"][0]["containerPort"]
    mnemo_env = {key: value for key, value in env.items() if key.startswith("MNEMO_") and key != "MNEMO_PORT"}
    assert mnemo_env == {k: v for k, v in config_map(base)["data"].items() if k != "MNEMO_PORT"}  # same settings
    assert_hardened(predictor, container, uid=10001)
    assert_drains_before_it_is_killed(predictor, container, float(env["MNEMO_DRAIN_S"]))


def test_an_invalid_manifest_is_rejected(base):
    """The validation above can fail: a misspelt field and a wrong type are both errors."""
    deployment = yaml.safe_load(yaml.safe_dump(base["Deployment", "mnemo"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(deployment)
    hpa = yaml.safe_load(yaml.safe_dump(base["HorizontalPodAutoscaler", "mnemo"]))
    hpa["spec"]["minReplicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid(hpa)


def test_every_image_is_pinned_to_a_release_tag(base, redis_overlay):
    """`latest` with `IfNotPresent` runs whichever image a node pulled first, and a new push never reaches it:
    every image names a tag, never `latest`, and mnemo's is the package version (pyproject.toml)."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (kserve,) = [doc for doc in yaml.safe_load_all(KSERVE.read_text()) if doc]
    (kserve_gpu,) = render(KSERVE_GPU)
    deployments = [obj for obj in (*base.values(), *redis_overlay.values()) if obj["kind"] == "Deployment"]
    images = [container["image"] for obj in deployments for container in _pod_and_container(obj)[1:]]
    images += [container["image"] for container in kserve["spec"]["predictor"]["containers"]]
    assert len(images) == 4, images
    gpu_images = [_pod_and_container(by_kind(render(K8S / "overlays" / "gpu"))["Deployment", "mnemo"])[1]["image"]]
    gpu_images += [container["image"] for container in kserve_gpu["spec"]["predictor"]["containers"]]
    for image in images + gpu_images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, image
        if name.endswith("mnemo"):
            assert tag == (f"{version}-gpu" if image in gpu_images else version), image


def test_no_pod_gets_service_link_variables_which_collide_with_the_settings(base, redis_overlay, monkeypatch):
    """Kubernetes gives every pod `<SERVICE>_PORT=tcp://IP:PORT` for each Service of its namespace: the Service
    `mnemo` makes that MNEMO_PORT, which the service cannot read (it starts only while mnemo.env sets
    MNEMO_PORT itself). Every pod spec turns those variables off."""
    from app.core.settings import Settings

    monkeypatch.setenv("MNEMO_PORT", "tcp://10.96.0.12:8000")  # what the Service below would inject
    with pytest.raises(pydantic.ValidationError, match="port"):
        Settings()
    assert ("Service", "mnemo") in base
    (kserve,) = [doc for doc in yaml.safe_load_all(KSERVE.read_text()) if doc]
    deployments = [obj for obj in (*base.values(), *redis_overlay.values()) if obj["kind"] == "Deployment"]
    pods = [_pod_and_container(obj)[0] for obj in deployments] + [kserve["spec"]["predictor"]]
    assert len(pods) == 4
    for pod in pods:
        assert pod.get("enableServiceLinks") is False, pod.get("containers", [{}])[0].get("name")


# -- the GPU variants: the base and the InferenceService on one NVIDIA GPU ----------------------------------------
def assert_on_one_gpu(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """One nvidia.com/gpu (an extended resource: a limit, which is also the request), the GPU taint tolerated."""
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
    tolerations = pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_gpu_overlay_requests_one_gpu_and_serves_on_cuda(base, gpu_overlay):
    for obj in gpu_overlay.values():
        assert_valid(obj)
    assert {kind for kind, _ in gpu_overlay} == {kind for kind, _ in base}
    pod, container = _pod_and_container(gpu_overlay["Deployment", "mnemo"])
    assert_on_one_gpu(pod, container)
    assert_hardened(pod, container, uid=10001)
    assert container["image"].endswith("-gpu")
    settings = config_map(gpu_overlay)["data"]
    assert settings["MNEMO_PROVIDER"] == "cuda" and settings["MNEMO_CUDA_TF32"] == "false"
    assert {k: v for k, v in settings.items() if k not in GPU_SETTINGS} == {
        k: v for k, v in config_map(base)["data"].items() if k not in GPU_SETTINGS
    }
    from app.core.settings import Settings
    from app.runtime.sessions import cuda_options

    known = {key.removeprefix("MNEMO_").lower(): value for key, value in settings.items()}
    options = cuda_options(Settings(**{name: value for name, value in known.items() if name in Settings.model_fields}))
    assert (
        options["use_tf32"] == "0" and int(options["gpu_mem_limit"]) == int(settings["MNEMO_CUDA_MEM_LIMIT_MB"]) << 20
    )
    assert pod["containers"][0]["envFrom"][0]["configMapRef"]["name"] == config_map(gpu_overlay)["metadata"]["name"]


def test_kserve_gpu_variant_is_the_inference_service_on_one_gpu(base):
    (service,) = render(KSERVE_GPU)
    (cpu_service,) = [doc for doc in yaml.safe_load_all(KSERVE.read_text()) if doc]
    predictor = dict(service["spec"]["predictor"])
    for key in KSERVE_COMPONENT_FIELDS:
        predictor.pop(key, None)
    assert_valid({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mnemo-predictor"}, "spec": predictor})
    container = predictor["containers"][0]
    assert_on_one_gpu(predictor, container)
    assert_hardened(predictor, container, uid=10001)
    assert container["image"].endswith("-gpu")
    env = {item["name"]: item["value"] for item in container["env"]}
    cpu_env = {item["name"]: item["value"] for item in cpu_service["spec"]["predictor"]["containers"][0]["env"]}
    assert env["MNEMO_PROVIDER"] == "cuda" and int(env["MNEMO_CUDA_MEM_LIMIT_MB"]) > 0
    assert {k: v for k, v in env.items() if k not in GPU_SETTINGS} == {
        k: v for k, v in cpu_env.items() if k not in GPU_SETTINGS
    }


def test_kserve_gpu_patches_fail_the_render_when_the_env_list_is_reordered(tmp_path):
    """The JSON patches replace env entries by position; their `test` ops make a reordered list an error, not a
    silently wrong setting."""
    shutil.copytree(ROOT / "deploy" / "kserve", tmp_path / "kserve")
    shutil.copytree(KSERVE_GPU, tmp_path / "kserve-gpu")
    manifest = tmp_path / "kserve" / "inferenceservice.yaml"
    (service,) = [doc for doc in yaml.safe_load_all(manifest.read_text()) if doc]
    env = service["spec"]["predictor"]["containers"][0]["env"]
    env.insert(0, env.pop(next(i for i, item in enumerate(env) if item["name"] == "MNEMO_PROVIDER")))
    manifest.write_text(yaml.safe_dump(service))
    rendered = subprocess.run(
        [shutil.which("kubectl"), "kustomize", str(tmp_path / "kserve-gpu")], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode != 0 and "test" in rendered.stderr.lower()
