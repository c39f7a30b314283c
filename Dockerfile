# mnemo: the FastAPI + ONNX Runtime service with the committed models baked in.
#   docker build -t mnemo .                                   # CPU image (default target)
#   docker build --target runtime-gpu -t mnemo:gpu .          # CUDA image (onnxruntime-gpu)
# Both install the hashed lock files (requirements/serve.txt, requirements/gpu.txt): the CPU image holds
# onnxruntime, the GPU image onnxruntime-gpu, never both. The runtime stages hold no torch and no compilers.
# Both hold redis-py (the `redis` extra) for MNEMO_STATE_URL=redis://...; by default the state is an SQLite file
# in /srv/mnemo/state, a volume owned by the service user (uid 10001).
ARG PYTHON_IMAGE=python:3.11-slim
# onnxruntime-gpu 1.31 links CUDA 13 and cuDNN 9
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

# ---- builder: the serving venv from the lock, the app, and the CPU image's whole file system in /rootfs -----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements/serve.txt requirements/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes -r requirements/serve.txt
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/venv/bin/pip install --no-deps .
COPY scripts/image-slim-venv.sh scripts/image_bytecode.py scripts/image-rootfs.sh ./scripts/
RUN scripts/image-slim-venv.sh /opt/venv
COPY artifacts /srv/mnemo/artifacts
# the code's licence and the data sets' terms, which bind the weights (the SICK models: non-commercial)
COPY LICENSE NOTICE /srv/mnemo/
# Bytecode only for the modules the service imports: it runs here once and answers every kind of request.
RUN python3 -B scripts/image_bytecode.py /opt/venv /srv/mnemo/artifacts
RUN scripts/image-rootfs.sh /rootfs 10001

# ---- GPU runtime: onnxruntime-gpu on a CUDA + cuDNN runtime base -----------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY requirements/gpu.txt /tmp/requirements-gpu.txt
# The app from its sources (not the CPU builder's wheel: that stage installs the CPU onnxruntime lock)
COPY pyproject.toml README.md /tmp/src/
COPY app /tmp/src/app
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes -r /tmp/requirements-gpu.txt \
 && /opt/venv/bin/pip install --no-deps /tmp/src \
 && rm -rf /tmp/src /tmp/requirements-gpu.txt
# The service user and its state directory (MNEMO_STATE_URL's SQLite file), as in the CPU image
RUN groupadd --system --gid 10001 mnemo \
 && useradd --system --uid 10001 --gid 10001 --no-create-home mnemo \
 && install -d -o 10001 -g 10001 -m 0750 /srv/mnemo/state
WORKDIR /srv/mnemo
COPY artifacts ./artifacts
COPY LICENSE NOTICE ./
# CUDA and cuDNN from the base image, found by onnxruntime-gpu's CUDA provider at run time. The service user has
# no home directory: HOME=/tmp gives CUDA's kernel cache (~/.nv/ComputeCache) somewhere writable.
ENV PATH=/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    MNEMO_ARTIFACTS_DIR=/srv/mnemo/artifacts \
    MNEMO_HOST=0.0.0.0 \
    MNEMO_PORT=8000 \
    MNEMO_PROBE_PORT=8001 \
    MNEMO_GRPC_PORT=8081 \
    MNEMO_PROVIDER=cuda \
    MNEMO_STATE_URL=sqlite:////srv/mnemo/state/students.db \
    MNEMO_LOG_FORMAT=json \
    MNEMO_LOG_LEVEL=info \
    MNEMO_ON_MODEL_ERROR=exit
# per-student state: a named volume here (docker-compose.yml) keeps it across restarts and upgrades
VOLUME ["/srv/mnemo/state"]
USER 10001
EXPOSE 8000 8001 8081
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % (os.environ.get('MNEMO_PROBE_PORT') or os.environ.get('MNEMO_PORT', '8000')), timeout=4)"]
CMD ["python3", "-m", "app"]

# ---- CPU runtime (default): only the builder's /rootfs (Python, the venv, the app, the artifacts) --------
# No shell and no package manager; see docs/deployment.md (debug with the builder stage: --target builder).
FROM scratch AS runtime
COPY --from=builder /rootfs /
WORKDIR /srv/mnemo
ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8 \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    MNEMO_ARTIFACTS_DIR=/srv/mnemo/artifacts \
    MNEMO_HOST=0.0.0.0 \
    MNEMO_PORT=8000 \
    MNEMO_PROBE_PORT=8001 \
    MNEMO_GRPC_PORT=8081 \
    MNEMO_PROVIDER=cpu \
    MNEMO_STATE_URL=sqlite:////srv/mnemo/state/students.db \
    MNEMO_LOG_FORMAT=json \
    MNEMO_LOG_LEVEL=info \
    MNEMO_ON_MODEL_ERROR=exit \
    MNEMO_MAX_BODY_BYTES=1048576
# per-student state: a named volume here (docker-compose.yml) keeps it across restarts and upgrades
VOLUME ["/srv/mnemo/state"]
USER 10001
EXPOSE 8000 8001 8081
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % (os.environ.get('MNEMO_PROBE_PORT') or os.environ.get('MNEMO_PORT', '8000')), timeout=4)"]
# exec form: gunicorn's master (python -m app) is PID 1: it passes SIGTERM on to the workers, which drain, and
# reaps every child. Connection limits that no Python server has come from nginx in front (docker-compose.yml).
CMD ["python3", "-m", "app"]
