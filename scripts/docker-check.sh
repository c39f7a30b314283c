#!/usr/bin/env bash
# Opt-in (`make docker-check`): build the Dockerfile with podman from a locally made python:3.11-slim
# stand-in, print the image size (fails above MAX_IMAGE_MB, default 300), run it, wait for /ready, run the
# image's HEALTHCHECK, call both endpoints, stop it with SIGTERM.
# Needs ../shared/tools/container-base (this workplace's machines); elsewhere use docker directly.
set -euo pipefail
cd "$(dirname "$0")/.."
base_tool=${CONTAINER_BASE_TOOL:-../shared/tools/container-base}
"$base_tool" >/dev/null
# shellcheck disable=SC1091
source /tmp/mnemo-containers/env
name=mnemo-check
port=${DOCKER_CHECK_PORT:-18000}
podman build --format docker --build-arg "PYTHON_IMAGE=$MNEMO_BASE_IMAGE" \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro -t mnemo:local .
size=$(podman image inspect -f '{{.Size}}' mnemo:local)
echo "image size: $((size / 1000000)) MB ($size bytes; podman image inspect)"
if ((size > ${MAX_IMAGE_MB:-300} * 1000000)); then
  echo "the image is over ${MAX_IMAGE_MB:-300} MB" >&2
  exit 1
fi
podman rm -f "$name" >/dev/null 2>&1 || true
podman run -d --name "$name" -p "127.0.0.1:$port:8000" mnemo:local >/dev/null
trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 120); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; then
    break
  fi
  sleep 1
done
python3 - "$port" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def post(path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=30))
print("ready:", json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/ready")))
print("models:", [(m["name"], m["provider"]) for m in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/models"))["models"]])
print("similarity:", post("/similarity", {"sentence_a": "A man is playing a guitar.", "sentence_b": "A man plays a guitar.", "return_attention": False})["relatedness"])
print("knowledge-trace:", post("/knowledge-trace", {"interactions": [{"question": 1, "correct": True}], "next_questions": [2]})["next"])
PY
podman healthcheck run "$name" && echo "healthcheck: healthy"
podman exec "$name" python3 -c "import os; assert os.getuid() == 10001" && echo "runs as uid 10001"
podman exec "$name" python3 -c "import importlib.util as u; assert u.find_spec('torch') is None" && echo "no torch in the image"
podman stop -t 20 "$name" >/dev/null
echo "stopped with SIGTERM, exit code $(podman inspect -f '{{.State.ExitCode}}' "$name")"
podman logs "$name" 2>&1 | tail -n 3
