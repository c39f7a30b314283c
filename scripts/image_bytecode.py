"""Docker build step: keep bytecode (.pyc) only for the modules the service really imports.

Deletes every `__pycache__` of the standard library and of the serving venv, then runs the service from the venv
(`python -m app`, with the image's settings and artifacts) and sends it one request of every operation in its
own OpenAPI (the schemas' example bodies, every served model by name), the pages, the probe port, the
HEALTHCHECK's command and a few refused requests. Python writes a .pyc for each module it imports along the way,
so the image ships bytecode for exactly these; a module imported later (e.g. redis-py for a redis:// state URL)
still works from its source, compiled in memory (the image's files are root's, the service runs as uid 10001).
The build fails if any answer is a 5xx or the service does not exit 0 on SIGTERM.

Run it with `python3 -B` (its own imports write nothing).
Usage (in the builder stage): python3 -B scripts/image_bytecode.py VENV ARTIFACTS_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

STUDENT = "image-build"
SENTENCE = "A man is playing a guitar."
# the requests outside the OpenAPI: pages, static files, and refusals (404, 405, 413, 422)
EXTRA_REQUESTS = [
    ("GET", "/", None),
    ("GET", "/explorer/js/main.js", None),
    ("GET", "/docs-assets/no-such-file.js", None),
    ("GET", "/docs", None),
    ("GET", "/docs/oauth2-redirect", None),
    ("GET", "/redoc", None),
    ("HEAD", "/health", None),
    ("OPTIONS", "/similarity", None),
    ("GET", "/no-such-path", None),
    ("DELETE", "/models", None),
    ("POST", "/similarity", b"{not json"),
    ("POST", "/similarity", b'{"sentence_a": "!!!", "sentence_b": NaN}'),
    ("POST", "/knowledge-trace", b'{"interactions": [{"question": -1, "correct": 2}]}'),
    ("POST", "/similarity", b" " * (2 << 20)),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def request(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of one request; any 5xx stops the build."""
    headers = {"content-type": "application/json"} if body is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers, method=method), timeout=60) as answer:
            status, payload = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read()
    if status >= 500:
        sys.exit(f"image_bytecode: {method} {url} answered {status}: {payload[:300]!r}")
    return status, payload


def wait_ready(base: str, service: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if service.poll() is not None:
            sys.exit(f"image_bytecode: the service exited with {service.returncode} before it was ready")
        try:
            urllib.request.urlopen(f"{base}/ready", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit("image_bytecode: the service was not ready in 120 s")


def example_body(operation: dict, schemas: dict) -> bytes | None:
    """The first example of the operation's JSON request body, if it has a body."""
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if content is None:
        return None
    schema = content["schema"]
    schema = schemas.get(schema.get("$ref", "").rsplit("/", 1)[-1], schema)
    examples = schema.get("examples") or [{}]
    return json.dumps(examples[0]).encode()


def inference_body(metadata: dict) -> bytes:
    """An Open Inference Protocol request for one row: a sentence for BYTES inputs, 1 for numbers."""
    inputs = []
    for tensor in metadata["inputs"]:
        shape = [1 if size < 0 else size for size in tensor["shape"]]
        count = 1
        for size in shape:
            count *= size
        value = SENTENCE if tensor["datatype"] == "BYTES" else 1
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"], "data": [value] * count})
    return json.dumps({"inputs": inputs}).encode()


def exercise(base: str) -> Counter[int]:
    """One request of every OpenAPI operation (for each served model where a path names one), then the extras;
    how many answers had each status."""
    spec = json.loads(request(f"{base}/openapi.json")[1])
    models = [model["name"] for model in json.loads(request(f"{base}/models")[1])["models"]]
    order = {"post": 0, "get": 1, "delete": 2}  # a student is written before it is read and deleted
    operations = sorted(
        ((method, path, operation) for path, item in spec["paths"].items() for method, operation in item.items()),
        key=lambda entry: order.get(entry[0], 3),
    )
    statuses: Counter[int] = Counter()
    for method, path, operation in operations:
        for name in models if "{name}" in path else [None]:
            url = base + path.replace("{student_id}", STUDENT).replace("{name}", name or "")
            body = example_body(operation, spec["components"]["schemas"])
            if path.endswith("/infer"):
                body = inference_body(json.loads(request(f"{base}/v2/models/{name}")[1]))
            statuses[request(url, method.upper(), body)[0]] += 1
    for method, path, body in EXTRA_REQUESTS:
        statuses[request(base + path, method, body)[0]] += 1
    return statuses


def bytecode_size(directories: list[Path]) -> tuple[int, int]:
    files = [file for directory in directories for file in directory.rglob("*.pyc")]
    return len(files), sum(file.stat().st_size for file in files)


def library_directories(python: Path) -> list[Path]:
    """The interpreter's standard library and the venv's site-packages."""
    script = "import sysconfig; print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('purelib'))"
    output = subprocess.run([python, "-B", "-c", script], check=True, capture_output=True, text=True).stdout
    return [Path(line) for line in output.split()]


def service_environment(artifacts: Path, port: int, probe_port: int, state: str) -> dict[str, str]:
    """The image's settings (Dockerfile, runtime stage) on free local ports, with a throwaway state file."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("MNEMO_", "PYTHON"))}
    environment.update(
        MNEMO_ARTIFACTS_DIR=str(artifacts),
        MNEMO_HOST="127.0.0.1",
        MNEMO_PORT=str(port),
        MNEMO_PROBE_PORT=str(probe_port),
        MNEMO_PROVIDER="cpu",
        MNEMO_STATE_URL=f"sqlite:///{state}/students.db",
        MNEMO_LOG_FORMAT="json",
        MNEMO_LOG_LEVEL="info",
        MNEMO_ON_MODEL_ERROR="exit",
        MNEMO_MAX_BODY_BYTES="1048576",
        LANG="C.UTF-8",
    )
    return environment


def serve_and_exercise(python: Path, artifacts: Path) -> Counter[int]:
    """Run the service, send it every kind of request and the HEALTHCHECK, stop it with SIGTERM (exit 0)."""
    port, probe_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as state:
        environment = service_environment(artifacts, port, probe_port, state)
        log = Path(state) / "service.log"
        with log.open("wb") as output:
            service = subprocess.Popen([python, "-m", "app"], env=environment, cwd=state, stdout=output, stderr=output)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, service)
            statuses = exercise(base)
            for path in ("/health", "/ready"):
                request(f"http://127.0.0.1:{probe_port}{path}")
            healthcheck = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{probe_port}/ready', timeout=4)"
            subprocess.run([python, "-c", healthcheck], env=environment, check=True)
            service.send_signal(signal.SIGTERM)
            code = service.wait(timeout=60)
        except BaseException:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            if service.poll() is None:
                service.kill()
    if code != 0:
        sys.exit(f"image_bytecode: the service exited with {code} on SIGTERM")
    return statuses


def main(venv: Path, artifacts: Path) -> None:
    python = venv / "bin" / "python"
    directories = library_directories(python)
    count, size = bytecode_size(directories)
    for directory in directories:
        for cache in list(directory.rglob("__pycache__")):
            shutil.rmtree(cache)
    statuses = serve_and_exercise(python, artifacts)
    kept_count, kept_size = bytecode_size(directories)
    answers = ", ".join(f"{times} x {status}" for status, times in sorted(statuses.items()))
    print(f"image_bytecode: {statuses.total()} requests ({answers})")
    print(
        f"image_bytecode: kept {kept_count} of {count} .pyc files, {kept_size / 1e6:.1f} of {size / 1e6:.1f} MB "
        f"({', '.join(map(str, directories))})"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
