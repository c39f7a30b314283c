#!/usr/bin/env bash
# Opt-in (`make docker-check`): build the Dockerfile with podman from a locally made python:3.11-slim
# stand-in, print the image size (fails above MAX_IMAGE_MB, default 300), run it, wait for /ready, run the
# image's HEALTHCHECK, call both endpoints and a /students endpoint (state written to the image's volume, still
# there after a restart), call the gRPC transport from inside the container, stop it with SIGTERM. DOCKER_CHECK_IMAGE, DOCKER_CHECK_NAME and DOCKER_CHECK_PORT
# override the image tag, the container name and the host port (default: a free one).
# DOCKER_CHECK_TARGET=runtime-gpu checks the GPU image instead, built on the same stand-in (which has no CUDA
# libraries): without a GPU, its default MNEMO_PROVIDER=cuda must refuse to start, naming CUDA, and the checks
# then run it with MNEMO_PROVIDER=cpu (onnxruntime-gpu's CPU provider); with nvidia-smi, on the GPU.
# Needs ../shared/tools/container-base (this workplace's machines); elsewhere use docker directly.
set -euo pipefail
cd "$(dirname "$0")/.."
base_tool=${CONTAINER_BASE_TOOL:-../shared/tools/container-base}
"$base_tool" >/dev/null
# shellcheck disable=SC1091
source /tmp/mnemo-containers/env
target=${DOCKER_CHECK_TARGET:-runtime}
build_args=(--target "$target" --build-arg "PYTHON_IMAGE=$MNEMO_BASE_IMAGE")
run_args=()
max_mb=${MAX_IMAGE_MB:-300}
image=${DOCKER_CHECK_IMAGE:-mnemo:local}
name=${DOCKER_CHECK_NAME:-mnemo-check}
if [ "$target" = runtime-gpu ]; then
  build_args+=(--build-arg "CUDA_IMAGE=$MNEMO_BASE_IMAGE")
  max_mb=${MAX_IMAGE_MB:-1200}  # onnxruntime-gpu is 255 MB packed; the CUDA base adds its libraries elsewhere
  image=${DOCKER_CHECK_IMAGE:-mnemo:gpu-local}
  name=${DOCKER_CHECK_NAME:-mnemo-gpu-check}
fi
port=${DOCKER_CHECK_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
podman build --format docker "${build_args[@]}" \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro -t "$image" .
size=$(podman image inspect -f '{{.Size}}' "$image")
echo "image size: $((size / 1000000)) MB ($size bytes; podman image inspect)"
if ((size > max_mb * 1000000)); then
  echo "the image is over $max_mb MB" >&2
  exit 1
fi
if [ "$target" = runtime-gpu ]; then
  podman run --rm "$image" python3 -c "import importlib.metadata as m, onnxruntime as o; print('onnxruntime-gpu', m.version('onnxruntime-gpu'), o.get_available_providers())"
  if command -v nvidia-smi >/dev/null; then
    run_args+=(--device nvidia.com/gpu=all)
  else
    refusal=$(timeout 120 podman run --rm "$image" 2>&1 || true)
    grep -m 1 -o 'asked for CUDAExecutionProvider but onnxruntime created the session on [A-Za-z]*' <<<"$refusal" \
      || { echo "without a GPU, MNEMO_PROVIDER=cuda did not refuse to start naming CUDA" >&2; exit 1; }
    echo "without a GPU the image's MNEMO_PROVIDER=cuda refuses to start (above); the checks below run it on CPU"
    run_args+=(-e MNEMO_PROVIDER=cpu)
  fi
fi
podman rm -f "$name" >/dev/null 2>&1 || true
podman run -d --name "$name" --memory 1g -p "127.0.0.1:$port:8000" "${run_args[@]}" "$image" >/dev/null  # compose's mem_limit
trap 'podman rm -f -v "$name" >/dev/null 2>&1 || true' EXIT
wait_ready() {
  for _ in $(seq 1 120); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  echo "the container did not become ready in 120 s" >&2
  podman logs "$name" 2>&1 | tail -n 20 >&2
  return 1
}
wait_ready
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
print("students:", post("/students/docker-check/interactions", {"interactions": [{"question": 1, "correct": True}]})["interactions"], "interaction stored")
PY
podman exec "$name" python3 -c "import os; print('state:', os.listdir('/srv/mnemo/state'), 'owner uid', os.stat('/srv/mnemo/state').st_uid)"
podman restart -t 25 "$name" >/dev/null
wait_ready
python3 - "$port" <<'PY'
import json, sys, urllib.request
student = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/students/docker-check", timeout=30))
assert student["interactions"] == 1, student
print("students after a restart:", student["interactions"], "interaction, kept on the state volume")
PY
podman healthcheck run "$name" && echo "healthcheck: healthy"
podman exec "$name" python3 -c "import os; assert os.getuid() == 10001" && echo "runs as uid 10001"
podman exec "$name" python3 -c "import importlib.util as u; assert u.find_spec('torch') is None" && echo "no torch in the image"
podman exec "$name" python3 -c "import redis; print('redis-py', redis.__version__, 'for MNEMO_STATE_URL=redis://')"
# the gRPC transport, from inside the container (its port is not published): one ModelInfer per task with the
# official tritonclient.grpc, as users call it
podman exec -i "$name" python3 - <<'PY'
import os
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(f"127.0.0.1:{os.environ['MNEMO_GRPC_PORT']}")
assert client.is_server_live() and client.is_server_ready(), "the gRPC server is not ready"
task_inputs = {  # a task's first inputs -> the tensors of one request
    ("q", "r", "len"): [("q", np.array([[1, 2, 3]]), "INT64"), ("r", np.array([[1, 0, 1]]), "INT64"), ("len", np.array([3]), "INT64")],
    ("sentence_a", "sentence_b"): [("sentence_a", np.array([b"A man is playing a guitar."], dtype=np.object_), "BYTES"),
                                   ("sentence_b", np.array([b"A man plays a guitar."], dtype=np.object_), "BYTES")],
}
for model in client.get_model_repository_index().models:
    names = tuple(tensor.name for tensor in client.get_model_metadata(model.name).inputs)
    task = next((task for task in task_inputs if names[: len(task)] == task), None)
    if task is None:
        continue
    tensors = []
    for name, array, datatype in task_inputs.pop(task):
        tensors.append(grpcclient.InferInput(name, list(array.shape), datatype))
        tensors[-1].set_data_from_numpy(array)
    outputs = client.infer(model.name, tensors).get_response().outputs
    print("grpc ModelInfer:", model.name, {output.name: list(output.shape) for output in outputs})
assert not task_inputs, f"no model served over gRPC takes {list(task_inputs)}"
PY
podman stop -t 25 "$name" >/dev/null
echo "stopped with SIGTERM, exit code $(podman inspect -f '{{.State.ExitCode}}' "$name")"
podman logs "$name" 2>&1 | tail -n 3
