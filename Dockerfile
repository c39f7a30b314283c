# mnemo: the FastAPI + ONNX Runtime service with the committed models baked in.
#   docker build -t mnemo .                                   # CPU image (default target)
#   docker build --target runtime-gpu -t mnemo:gpu .          # CUDA image (onnxruntime-gpu)
# The runtime stages hold no torch and no compilers; training happens outside the image.
ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# ---- builder: a venv with the serving dependencies (no torch) ---------------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip install . \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels .

# ---- GPU runtime: onnxruntime-gpu on a CUDA + cuDNN runtime base -----------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /wheels /wheels
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install "$(ls /wheels/*.whl)[gpu]" \
 && /opt/venv/bin/pip uninstall -y onnxruntime \
 && /opt/venv/bin/pip install --force-reinstall --no-deps onnxruntime-gpu \
 && rm -rf /wheels
RUN useradd --system --uid 10001 --no-create-home mnemo
WORKDIR /srv/mnemo
COPY artifacts ./artifacts
# CUDA and cuDNN from the base image, found by onnxruntime's CUDA provider at run time.
ENV PATH=/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu \
    PYTHONUNBUFFERED=1 \
    MNEMO_ARTIFACTS_DIR=/srv/mnemo/artifacts \
    MNEMO_HOST=0.0.0.0 \
    MNEMO_PORT=8000 \
    MNEMO_PROVIDER=cuda \
    MNEMO_LOG_FORMAT=json \
    MNEMO_LOG_LEVEL=info \
    MNEMO_ON_MODEL_ERROR=exit
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('MNEMO_PORT', '8000'), timeout=4)"]
CMD ["python3", "-m", "app"]

# ---- CPU runtime (default): slim Python, the venv, the app and the committed artifacts --------------
FROM ${PYTHON_IMAGE} AS runtime
RUN useradd --system --uid 10001 --no-create-home mnemo
COPY --from=builder /opt/venv /opt/venv
WORKDIR /srv/mnemo
COPY artifacts ./artifacts
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MNEMO_ARTIFACTS_DIR=/srv/mnemo/artifacts \
    MNEMO_HOST=0.0.0.0 \
    MNEMO_PORT=8000 \
    MNEMO_PROVIDER=cpu \
    MNEMO_LOG_FORMAT=json \
    MNEMO_LOG_LEVEL=info \
    MNEMO_ON_MODEL_ERROR=exit \
    MNEMO_MAX_BODY_BYTES=1048576
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('MNEMO_PORT', '8000'), timeout=4)"]
# exec form: python is PID 1 and uvicorn receives SIGTERM for a graceful shutdown
CMD ["python3", "-m", "app"]
