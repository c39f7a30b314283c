# mnemo: `make serve` serves the committed models, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= $(or $(MNEMO_DATA_DIR),../shared/data)
DATASET ?= assist2009
POINTER ?= vlmp

.PHONY: venv serve test test-services lint bench loadtest train-kt train-sim export-kt export-sim docker-check clean

$(VENV)/serve.stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/dev.stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[train,dev]'
	touch $@ $(VENV)/serve.stamp

# The stamps make `make test`/`make serve` install only when pyproject.toml changed since the last install.
venv: $(VENV)/dev.stamp  ## .venv with the dev and train extras (what `make test` uses)

serve: $(VENV)/serve.stamp  ## serve artifacts/ on MNEMO_HOST:MNEMO_PORT (default 127.0.0.1:8000)
	$(BIN)/python -m app

# Debian programs the tests run for real (tests/test_student_store.py starts its own redis-server).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# Debian packages the tests need, as `binary:package`; each is installed with apt-get only when missing.
TEST_PACKAGES := redis-server:redis-server chromium:chromium fc-list:fonts-dejavu-core
test-services:  ## install the Debian packages the tests use (redis-server, chromium, fonts) when missing
	@missing="$$(for pair in $(TEST_PACKAGES); do command -v $${pair%%:*} >/dev/null || echo $${pair#*:}; done)"; \
	if [ -n "$$missing" ]; then echo "installing $$missing"; $(SUDO) apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

test: $(VENV)/dev.stamp test-services  ## ruff + the whole pytest suite
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(VENV)/dev.stamp
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/dev.stamp  ## latency table of the committed models -> BENCHMARKS.md
	$(BIN)/python -m benchmarks.run

loadtest: $(VENV)/dev.stamp  ## the service under load with wrk on loopback (about 6 minutes) -> BENCHMARKS.md
	command -v wrk >/dev/null || { $(SUDO) apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
	$(BIN)/python -m benchmarks.load

train-kt: $(VENV)/dev.stamp  ## make train-kt DATASET=assist2009|assist2015|statics|synthetic-v0
	$(BIN)/python -m models.train_kt --dataset $(DATASET) --data-dir $(DATA_DIR)/kt

train-sim: $(VENV)/dev.stamp  ## make train-sim POINTER=vlmp|flmp
	$(BIN)/python -m models.train_sim --pointer $(POINTER) --data-dir $(DATA_DIR)/sick

export-kt: $(VENV)/dev.stamp  ## make export-kt DATASET=assist2009 NAME=dkvmn-assist2009 [FLAGS=--default]
	$(BIN)/python -m export.kt --run runs/kt/$(DATASET) --name $(NAME) $(FLAGS)

export-sim: $(VENV)/dev.stamp  ## make export-sim POINTER=vlmp NAME=rmc-vlmp-sick [FLAGS=--default]
	$(BIN)/python -m export.similarity --run runs/sim/$(POINTER) --name $(NAME) $(FLAGS)

docker-check:  ## opt-in: build and run the image with podman (see README, Docker)
	scripts/docker-check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
