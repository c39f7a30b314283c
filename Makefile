# mnemo: `make serve` serves the committed models, `make test` runs the whole suite.
# Every install comes from the hashed lock files in requirements/ (`make lock` regenerates them from pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
DATA_DIR ?= $(or $(MNEMO_DATA_DIR),../shared/data)
DATASET ?= assist2009
POINTER ?= vlmp
SEED ?= 101
# torch is the one package outside the hashed lock: its exact version from pyproject.toml's train extra, from
# wherever pip finds it. On a CPU-only machine add PyTorch's CPU index (docs/development.md):
#   make venv TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'
TORCH_REQUIREMENT = $(shell $(BIN)/python -c 'import tomllib; print(next(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["train"] if r.startswith("torch")))')
TORCH_PIP_ARGS ?=
# Debian packages the tests need, one BINARY=PACKAGE word each: `make system-deps` (a prerequisite of
# `make test`) installs with apt-get the packages whose binary is not on PATH. Add one line per package.
SYSTEM_DEPS := redis-server=redis-server chromium=chromium fc-list=fonts-dejavu-core nginx=nginx

.PHONY: venv serve test lint audit lock system-deps docs screenshots bench loadtest behaviours train-kt train-sim reproduce export-kt export-sim train-paraphrase export-paraphrase docker-check docker-check-gpu gpu-bench clean FORCE

# .venv is rebuilt when it was made by another interpreter than $(PYTHON) (or by a Python older than 3.11).
INTERPRETER_ID := import sys; assert sys.version_info >= (3, 11); print(sys.base_prefix, *sys.version_info[:3])
ifneq ($(shell $(BIN)/python -c '$(INTERPRETER_ID)' 2>/dev/null),$(shell $(PYTHON) -c '$(INTERPRETER_ID)' 2>/dev/null))
$(BIN)/python: FORCE
endif

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "mnemo needs Python 3.11 or newer, and '$(PYTHON)' is $$($(PYTHON) --version 2>/dev/null || echo 'not found')."; \
	  echo "Install Python 3.11+ and name it, e.g.: make $(or $(MAKECMDGOALS),test) PYTHON=python3.11"; exit 1; }
	@if [ -d $(VENV) ]; then echo "==> $(VENV) was made by another Python: rebuilding it with $(PYTHON)"; fi
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)

# The stamps make `make serve`/`make test` install only when a lock file changed since the last install.
$(VENV)/serve.stamp: requirements/serve.txt $(BIN)/python
	@echo "==> installing the service from requirements/serve.txt into $(VENV) (1 to 2 minutes the first time)"
	$(PIP) install --require-hashes -r requirements/serve.txt
	$(PIP) install --no-deps -e .
	rm -f $(VENV)/dev.stamp
	touch $@

$(VENV)/dev.stamp: requirements/dev.txt $(BIN)/python
	@echo "==> installing the service, test and training tools from requirements/dev.txt into $(VENV) (about 5 minutes the first time)"
	$(PIP) install --require-hashes -r requirements/dev.txt
	@echo "==> installing $(TORCH_REQUIREMENT) (outside the hashed lock: docs/development.md)"
	$(PIP) install $(TORCH_PIP_ARGS) '$(TORCH_REQUIREMENT)'
	$(PIP) install --no-deps -e .
	$(PIP) check
	touch $@ $(VENV)/serve.stamp

venv: $(VENV)/dev.stamp  ## .venv with every extra but gpu (what `make test` uses)

# pip writes the bytecode of what it installs, but app/ is installed editable: its modules are compiled when first
# imported, and again at every start where PYTHONDONTWRITEBYTECODE is set (~0.1 s of a 1 s start). Written here once.
serve: $(VENV)/serve.stamp  ## serve artifacts/ on MNEMO_HOST:MNEMO_PORT (default 127.0.0.1:8000)
	$(BIN)/python -m compileall -q app
	$(BIN)/python -m app

# Two passes, each on two processes (pytest-xdist, a test file per process at a time): first the in-process, training
# and contract tests, which keep the CPUs busy; then the tests that start servers (integration, deploy, any new
# folder), which mostly wait on them, so two files at a time take half the time and no training run competes.
IN_PROCESS_TESTS := tests/unit tests/api tests/training tests/integration/test_openapi_contract.py

test: $(VENV)/dev.stamp system-deps  ## ruff (lint and format) + the whole pytest suite
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $(IN_PROCESS_TESTS)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests $(addprefix --ignore=,$(IN_PROCESS_TESTS))

lint: $(VENV)/dev.stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

audit: $(VENV)/dev.stamp  ## pip-audit of every lock file (exceptions: requirements/audit-exceptions.txt)
	scripts/audit.sh $(BIN)/pip-audit '$(TORCH_REQUIREMENT)'

lock: $(BIN)/python  ## regenerate requirements/*.txt from pyproject.toml (UPGRADE=1: newest releases)
	@test -x $(VENV)/lock-tools/bin/pip-compile || { echo "==> installing pip-tools into $(VENV)/lock-tools"; \
	  $(BIN)/python -m venv $(VENV)/lock-tools && $(VENV)/lock-tools/bin/pip install -q pip-tools==7.6.2; }
	scripts/lock.sh $(VENV)/lock-tools/bin/pip-compile $(if $(UPGRADE),--upgrade)

system-deps:  ## install the Debian packages of SYSTEM_DEPS whose binary is missing
	@scripts/system-deps.sh $(SYSTEM_DEPS)

docs: $(VENV)/dev.stamp  ## docs/configuration.md from the Settings field descriptions (a test fails while it is stale)
	$(BIN)/python -m scripts.config_docs

screenshots: $(VENV)/dev.stamp system-deps  ## the explorer screenshots of docs/explorer.md, from tests/integration/test_explorer.py in Chromium
	MNEMO_TEST_ARTIFACTS_DIR=tmp/artifacts CI=true $(BIN)/python -m pytest -q tests/integration/test_explorer.py
	$(BIN)/python scripts/readme_screenshots.py tmp/artifacts/explorer docs/screenshots

bench: $(VENV)/dev.stamp  ## latency table of the committed models -> BENCHMARKS.md
	$(BIN)/python -m benchmarks.run

loadtest: $(VENV)/dev.stamp  ## the service under load with wrk, and over gRPC, on loopback (about 6 minutes) -> BENCHMARKS.md
	@scripts/system-deps.sh wrk=wrk
	$(BIN)/python -m benchmarks.load
	$(BIN)/python -m benchmarks.grpc_load

GPU_PYTHON ?= python3
gpu-bench:  ## on a GPU machine, in an environment of requirements/gpu.txt (GPU_PYTHON): CUDA vs CPU, bare and served -> BENCHMARKS.md
	$(GPU_PYTHON) -m benchmarks.gpu

behaviours: $(VENV)/dev.stamp system-deps  ## make behaviours BASE=/tmp/base [ARGS='--seconds 5']: issue 27's behaviours against a baseline checkout, one run, 3 rounds of the timing scenarios (~10 min) -> BENCHMARKS.md
	@test -n "$(BASE)" || { echo "name the baseline checkout: git worktree add /tmp/base fd656d7 && make behaviours BASE=/tmp/base"; exit 2; }
	@scripts/system-deps.sh wrk=wrk
	$(BIN)/python -m benchmarks.behaviours --base $(BASE) $(ARGS)

# train-kt and train-sim run the served recipe (models/recipes.py); RECIPE='...' replaces its arguments
# (RECIPE= for the trainers' plain defaults). train-sim trains one member of the served ensemble (SEED).
SERVED_RECIPE = $(if $(filter command line,$(origin RECIPE)),$(RECIPE),$(shell $(BIN)/python -m models.recipes $(1)))

train-kt: $(VENV)/dev.stamp  ## make train-kt DATASET=assist2009|assist2015|statics|synthetic-vK [ARGS=--resume]
	$(BIN)/python -m models.train_kt --dataset $(DATASET) --data-dir $(DATA_DIR)/kt \
	  $(call SERVED_RECIPE,train-kt $(DATASET)) $(ARGS)

train-sim: $(VENV)/dev.stamp  ## make train-sim POINTER=vlmp|flmp SEED=101 [ARGS=--resume]: one served member
	$(BIN)/python -m models.train_sim --data-dir $(DATA_DIR)/sick --out runs/sim/$(POINTER)-s$(SEED) \
	  $(call SERVED_RECIPE,train-sim $(POINTER) --seed $(SEED)) $(ARGS)

reproduce: $(VENV)/dev.stamp  ## make reproduce MODEL=dkvmn-synthetic: rebuild a served model in runs/reproduce/, compare
	@test -n "$(MODEL)" || { echo "name the model: make reproduce MODEL=<name> (artifacts/manifest.json)"; exit 2; }
	$(BIN)/python -m export.reproduce $(MODEL) --data-dir $(DATA_DIR)

export-kt: $(VENV)/dev.stamp  ## make export-kt DATASET=assist2009 NAME=dkvmn-assist2009 [FLAGS=--default]
	$(BIN)/python -m export.kt --run runs/kt/$(DATASET) --name $(NAME) $(FLAGS)

export-sim: $(VENV)/dev.stamp  ## make export-sim POINTER=vlmp NAME=rmc-vlmp-sick [FLAGS=--default]
	$(BIN)/python -m export.similarity --run runs/sim/$(POINTER)-s$(SEED) --name $(NAME) $(FLAGS)
	$(BIN)/python -m export.embeddings --name $(NAME)

# The MSRP paraphrase head on rmc-vlmp-sick's encoder, by its protocol (docs/protocols/rmc-vlmp-msrp.md): four
# validation-only runs (dropout x learning rate), then the export chooses one on validation and evaluates test once.
PARAPHRASE_GRID := 0.25,1e-3 0.25,1e-4 0.5,1e-3 0.5,1e-4
paraphrase_run = runs/msrp/d$(word 1,$(subst $(comma), ,$(1)))-lr$(word 2,$(subst $(comma), ,$(1)))
comma := ,
train-paraphrase: $(VENV)/dev.stamp  ## the 4 validation-only runs of the MSRP paraphrase head [ARGS=--resume]
	$(foreach cell,$(PARAPHRASE_GRID),$(BIN)/python -m models.train_paraphrase --data-dir $(DATA_DIR)/msrp \
	  --out $(call paraphrase_run,$(cell)) --dropout $(word 1,$(subst $(comma), ,$(cell))) \
	  --lr $(word 2,$(subst $(comma), ,$(cell))) $(ARGS) &&) true

export-paraphrase: $(VENV)/dev.stamp  ## choose on validation, export rmc-vlmp-msrp, evaluate MSRP test once
	$(BIN)/python -m export.paraphrase $(foreach cell,$(PARAPHRASE_GRID),--run $(call paraphrase_run,$(cell))) \
	  --name rmc-vlmp-msrp --data-dir $(DATA_DIR)/msrp

docker-check:  ## opt-in: build the CPU and the GPU image with podman, print their sizes, run and probe them (see docs/deployment.md)
	scripts/docker-check.sh
	DOCKER_CHECK_TARGET=runtime-gpu scripts/docker-check.sh

docker-check-gpu:  ## opt-in: the GPU image alone (onnxruntime-gpu on the stand-in base here: served on CPU without a GPU)
	DOCKER_CHECK_TARGET=runtime-gpu scripts/docker-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
