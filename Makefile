# The two commands of the README: `make run` and `make test`. Both set up .venv on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export MLFLOW_DISABLE_TELEMETRY := true
export GX_ANALYTICS_ENABLED := false
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: run test venv java bench clean

run: java
	$(BIN)/sentinel demo

test: java
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: java
	$(BIN)/python benchmarks/validation.py
	$(BIN)/python benchmarks/kafka_io.py
	$(BIN)/python benchmarks/detection.py
	$(BIN)/python benchmarks/hot_path.py
	$(BIN)/python benchmarks/job_age.py
	$(BIN)/python benchmarks/collector.py
	$(BIN)/python benchmarks/decisions.py
	$(BIN)/python benchmarks/stateful_input.py
	$(BIN)/python benchmarks/novelty_scoring.py
	$(BIN)/python benchmarks/input_keying.py
	$(BIN)/python benchmarks/worker_start.py
	$(BIN)/python benchmarks/cli_setup_error.py

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "checkpoint-sentinel needs Python >= 3.11, found " + sys.version.split()[0])'
	@echo "Setting up $(VENV) (the first time takes about two minutes)..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[stack,test]'
	@touch $(STAMP)

java: $(STAMP)
	@$(BIN)/python -m pipelines.spark_session

clean:
	-$(BIN)/sentinel down
	rm -rf $(VENV) .venv-flink .sentinel
