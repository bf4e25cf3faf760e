# The two commands a new user needs: `make demo` and `make test`.
# Both create .venv when it is missing and (re)install when pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# One constraints file pins the core stack for make, CI and the Docker images alike
# (how to refresh it: its header).
CONSTRAINTS ?= infra/docker/constraints.txt
PIP    := $(PY) -m pip install --disable-pip-version-check -q -c $(CONSTRAINTS)
ARGS   ?=
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
# Drop pip's noise about extra indexes that do not exist on some machines; keep errors.
QUIET  := { grep -v "^WARNING: Location" || true; }

.PHONY: demo test test-unit test-all smoke install install-dev clean-venv cluster-up cluster-test cluster-down

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "HardPos needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools wheel 2>&1 | $(QUIET)

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PIP) -e . 2>&1 | $(QUIET)
	$(PY) -c "import hardpos, torch, open_clip, ray, mlflow" && touch $@

$(VENV)/.installed-dev: pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PIP) -e '.[dev]' 2>&1 | $(QUIET)
	$(PY) -c "import hardpos, torch, open_clip, ray, mlflow, moto, pytest" && touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

## make demo: the whole pipeline on the embedded default (local Ray, local MLflow, synthetic world, the shipped
## base CLIP finetuned); ARGS=--full adds the w_neg grid and WiSE-FT, ARGS=--from-scratch pretrains the base too
demo: $(VENV)/.installed
	$(PY) jobs/demo.py $(ARGS)

## make test: the default test suite (CPU; real Ray Data/Train/Tune/Serve, MLflow, moto S3)
test: $(VENV)/.installed-dev
	$(PY) -m pytest -m "not gpu and not slow" $(ARGS)

## make test-unit: the unit tests only (no Ray, no server, no subprocess; about a minute)
test-unit: $(VENV)/.installed-dev
	$(PY) -m pytest -m "not integration and not slow and not gpu" $(ARGS)

## make smoke PYTHON=python3.13 VENV=.venv-3.13: another interpreter's install, the unit tests and the
## small demo pipeline (SMOKE_UNIT=0 / SMOKE_DEMO=0: without one of them; CI runs the unit tests on the
## oldest supported Python and the demo pipeline on the newest)
SMOKE_UNIT ?= 1
SMOKE_DEMO ?= 1
smoke: $(VENV)/.installed-dev
	if [[ "$(SMOKE_UNIT)" == 1 ]]; then $(PY) -m pytest -q -m "not integration and not slow and not gpu" -p no:cacheprovider $(ARGS); fi
	if [[ "$(SMOKE_DEMO)" == 1 ]]; then $(PY) -m pytest -q -p no:cacheprovider tests/test_stages_demo.py -k "whole_pipeline_small" $(ARGS); fi

## make test-all: also the slow tests
test-all: $(VENV)/.installed-dev
	$(PY) -m pytest -m "not gpu" $(ARGS)

clean-venv:
	rm -rf $(VENV)

## make cluster-up / cluster-test / cluster-down: a head and two worker hosts on this machine, each its own
## network and mount namespace on one bridge (root; after `make install-dev`): infra/README.md
CLUSTER := HARDPOS_CLUSTER_PYTHON=$(abspath $(PY)) infra/cluster/cluster.sh
cluster-up:
	$(CLUSTER) up

cluster-test:
	$(PY) -m benchmarks.cluster $(ARGS)

cluster-down:
	$(CLUSTER) down
