"""Dockerfile, docker-compose.yml, Makefile and CI script: the facts a deployment relies on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def _stages() -> dict[str, list[str]]:
    """Dockerfile instructions (continuations joined) grouped by stage name."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(2) or match.group(1)
            stages[current] = []
        stages[current].append(line)
    return stages


def test_dockerfile_is_multistage_on_a_build_arg_base_with_a_lean_non_root_runtime():
    stages = _stages()
    assert any(line.startswith("ARG PYTHON_IMAGE=python:3.11-slim") for line in stages[""])
    assert {"builder", "runtime", "runtime-gpu"} <= set(stages)
    assert stages["builder"][0] == "FROM ${PYTHON_IMAGE} AS builder"
    assert "pip install --require-hashes -r requirements/serve.txt" in "\n".join(stages["builder"])
    # the CPU runtime is the builder's assembled file system only (Python, venv, app, artifacts)
    assert stages["runtime"][:2] == ["FROM scratch AS runtime", "COPY --from=builder /rootfs /"]
    assert list(stages)[-1] == "runtime"  # the default build target is the CPU runtime
    for name in ("runtime", "runtime-gpu"):
        body = "\n".join(stages[name])
        assert "torch" not in body.replace("no torch", "")
        assert "uninstall" not in body
        assert not re.search(r"build-essential|gcc|g\+\+", body)
        assert re.search(r"^USER 10001$", body, re.MULTILINE)
        assert "HEALTHCHECK" in body and "/ready" in body
        cmd = next(line for line in stages[name] if line.startswith("CMD"))
        assert json.loads(cmd.removeprefix("CMD").strip()) == ["python3", "-m", "app"]  # exec form
        for setting in ("MNEMO_ARTIFACTS_DIR", "MNEMO_HOST", "MNEMO_PORT", "MNEMO_PROVIDER", "MNEMO_LOG_FORMAT"):
            assert setting + "=" in body
    gpu = "\n".join(stages["runtime-gpu"])
    assert stages["runtime-gpu"][0].startswith("FROM ${CUDA_IMAGE}")
    assert "COPY requirements/gpu.txt" in gpu and "--require-hashes" in gpu
    assert "LD_LIBRARY_PATH" in gpu and "MNEMO_PROVIDER=cuda" in gpu


def test_compose_runs_the_service_with_healthcheck_restart_and_a_gpu_profile():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["mnemo"]
    assert service["build"]["target"] == "runtime"
    assert any(port.endswith(":8080") for port in service["ports"])  # nginx's port, in this service's network
    assert service["restart"] == "unless-stopped"
    assert "/ready" in " ".join(service["healthcheck"]["test"])
    assert service["environment"]["MNEMO_PROVIDER"] == "cpu"
    assert "./artifacts:/srv/mnemo/artifacts:ro" in service["volumes"]
    gpu = compose["services"]["mnemo-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["target"] == "runtime-gpu"
    device = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def mnemo_services(compose: dict) -> list[tuple[str, dict]]:
    """The services that run the service itself (not nginx in front)."""
    return [(name, service) for name, service in compose["services"].items() if name.startswith("mnemo")]


def test_compose_puts_nginx_with_the_deployment_config_in_front_of_the_service():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    edge = compose["services"]["edge"]
    assert edge["network_mode"] == "service:mnemo" and edge["depends_on"] == ["mnemo"]
    assert "./deploy/nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in edge["volumes"]
    config = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
    assert "listen 8080" in config and "server 127.0.0.1:8000;" in config


def _seconds(duration: str) -> float:
    """A compose duration such as `25s`, `1m30s` or `500ms`, in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(number) * units[unit] for number, unit in parts)


def test_compose_lets_the_drain_finish_before_docker_kills_the_server():
    """docker stop's default 10 s is shorter than the default drain (15 s): SIGKILL came mid-drain, exit 137."""
    from app.core.settings import Settings
    from app.server import GIVE_UP_S, SHUTDOWN_GRACE_S

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in mnemo_services(compose):
        drain_s = float(service["environment"].get("MNEMO_DRAIN_S", Settings.model_fields["drain_s"].default))
        assert _seconds(service["stop_grace_period"]) > drain_s + GIVE_UP_S + SHUTDOWN_GRACE_S, name


def test_compose_runs_the_cpu_service_hardened_like_the_kubernetes_pod():
    """Read-only root filesystem with a /tmp tmpfs (PROMETHEUS_MULTIPROC_DIR of MNEMO_WORKERS > 1, HOME), no
    capabilities, no privilege escalation: the image runs so (`podman run --read-only --cap-drop ALL`)."""
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["mnemo"]
    assert service["read_only"] is True
    assert [mount.split(":")[0] for mount in service["tmpfs"]] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"] and "cap_add" not in service
    assert "no-new-privileges:true" in service["security_opt"]
    assert service["mem_limit"] == "1g"  # as `make docker-check` runs the image (scripts/docker-check.sh)


STATE_DIR = "/srv/mnemo/state"


def test_both_images_keep_student_state_in_a_volume_the_service_user_owns():
    stages = _stages()
    for name in ("runtime", "runtime-gpu"):
        body = "\n".join(stages[name])
        assert "HOME=/tmp" in body, name  # the user has no home; CUDA's kernel cache and Python's caches need one
        assert f"MNEMO_STATE_URL=sqlite:///{STATE_DIR}/students.db" in body, name
        assert f'VOLUME ["{STATE_DIR}"]' in body, name
    assert f"install -d -o 10001 -g 10001 -m 0750 {STATE_DIR}" in "\n".join(stages["runtime-gpu"])
    # the CPU image's file system is assembled by image-rootfs.sh, called with the service user's uid
    assert "scripts/image-rootfs.sh /rootfs 10001" in "\n".join(stages["builder"])
    rootfs = (ROOT / "scripts" / "image-rootfs.sh").read_text()
    assert 'install -d -o "$uid" -g "$uid" -m 0750 "$root/srv/mnemo/state"' in rootfs
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in mnemo_services(compose):
        state_url = service["environment"]["MNEMO_STATE_URL"]
        assert state_url.startswith(f"sqlite:///{STATE_DIR}/"), name
        volume = next(v for v in service["volumes"] if v.endswith(f":{STATE_DIR}"))
        assert volume.split(":")[0] in compose["volumes"], name  # a named volume: it survives restarts


def test_ci_runs_the_audit_and_make_test_and_fails_on_any_error():
    script = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in script
    commands = [line for line in script.splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["make audit", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\n(\t.*\n)*\t\$\(BIN\)/python -m pytest", makefile, re.MULTILINE)
    assert re.search(r"^test:.*\n(\t.*\n)*\t\$\(BIN\)/ruff format --check \.\n", makefile, re.MULTILINE)
    assert re.search(r"^serve:.*\n(\t.*\n)*\t\$\(BIN\)/python -m app$", makefile, re.MULTILINE)


def test_the_configuration_page_documents_every_setting():
    from app.core.settings import Settings

    page = (ROOT / "docs" / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description to document it"
        assert f"| `MNEMO_{name.upper()}` |" in page, name


def test_makefile_targets_install_from_the_lock_files_only_when_they_change():
    makefile = (ROOT / "Makefile").read_text()
    targets = ("venv", "serve", "test", "lint", "audit", "lock", "system-deps", "bench", "train-kt", "docker-check")
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    for stamp, lock in (("serve", "serve.txt"), ("dev", "dev.txt")):
        header = rf"^\$\(VENV\)/{stamp}\.stamp: requirements/{lock} \$\(BIN\)/python\n"
        rule = re.search(header + r"((\t.*\n)*)", makefile, re.MULTILINE)
        assert rule, stamp
        assert f"$(PIP) install --require-hashes -r requirements/{lock}" in rule.group(1)
    assert re.search(r"^test: \$\(VENV\)/dev\.stamp system-deps", makefile, re.MULTILINE)
    assert re.search(r"^serve: \$\(VENV\)/serve\.stamp", makefile, re.MULTILINE)


def _health_checks() -> dict[str, list[str]]:
    """The exec-form health check command of compose's services and of both images."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    checks = {f"compose {name}": service["healthcheck"]["test"][1:] for name, service in mnemo_services(compose)}
    for stage, lines in _stages().items():
        for line in lines:
            if line.startswith("HEALTHCHECK"):
                checks[f"Dockerfile {stage}"] = json.loads(line.split(" CMD ", 1)[1])
    return checks


def test_every_health_check_asks_the_probe_port_the_service_was_given(tmp_path):
    """Each check runs as Docker runs it (the container's environment) against a real probe server on a port
    other than the image's 8001, and fails once that server is gone: compose's check hard-coded 8001."""
    checks = _health_checks()
    assert len(checks) == 4, checks
    port = free_port()
    command = [sys.executable, "-m", "app.transports.probe_server", "127.0.0.1", str(port)]
    probe = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    environment = {"PATH": os.environ["PATH"], "MNEMO_PORT": str(free_port()), "MNEMO_PROBE_PORT": str(port)}
    try:
        assert probe.stdout.readline().strip() == "listening"
        probe.stdin.write('[200, {"status": "ready"}]\n')
        probe.stdin.flush()
        for name, check in checks.items():
            assert check[0] == "python3", name
            result = subprocess.run([sys.executable, *check[1:]], env=environment, capture_output=True, timeout=30)
            assert result.returncode == 0, (name, result.stderr.decode()[-300:])
    finally:
        probe.stdin.close()
        probe.wait(10)
    gone = subprocess.run([sys.executable, *checks["compose mnemo"][1:]], env=environment, capture_output=True)
    assert gone.returncode != 0
