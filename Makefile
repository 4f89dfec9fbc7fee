# litlab: `make help` lists the targets. Every target sets up .venv first if it is missing or stale.
SHELL := /bin/bash
VENV ?= .venv
PYTHON := $(VENV)/bin/python
SETUP := $(VENV)/.installed
ARGS ?=
LOGS ?= $(or $(LITLAB_LOG_DIR),logs)
PORT ?= 6006
# pytest-xdist workers for make test / test-fast (one per core, at most 4: DDP tests start 2 ranks each);
# a test file's tests stay on one worker, so its module fixtures run once; files are handed out in
# collection order: slow files, then the other integration files, then the unit files (tests/conftest.py).
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
PYTEST := $(PYTHON) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder

.DEFAULT_GOAL := help
.PHONY: help setup train test test-fast coverage mutation bench lint format clean rename tensorboard image test-image

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  Pass overrides with ARGS, e.g. make train ARGS='model=mlp trainer.max_epochs=3'"

$(SETUP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[dev]'
	touch $(SETUP)

setup: $(SETUP) ## Create .venv with the package (editable) and the extras the tests need

train: $(SETUP) ## Train the default experiment (CNN on the embedded digits, CPU)
	$(VENV)/bin/litlab-train $(ARGS)

test: $(SETUP) ## Run the whole test suite (DDP, sweeps and resume included)
	$(PYTEST) $(ARGS)

test-fast: $(SETUP) ## Run the in-process unit tests (tests/unit, the inner loop: under 2 minutes)
	$(PYTEST) tests/unit $(ARGS)

coverage: $(SETUP) ## Run the suite under coverage.py, child processes included (report: htmlcov/; ~25 min on 2 cores)
	rm -f .coverage .coverage.*
	$(PYTHON) -m coverage run -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS); status=$$?; \
	$(PYTHON) -m coverage combine --quiet && $(PYTHON) -m coverage report && $(PYTHON) -m coverage html --quiet \
	&& $(PYTHON) -m coverage json --quiet --include='src/litlab/*' -o htmlcov/engine.json \
	&& $(PYTHON) -c 'import json; t = json.load(open("htmlcov/engine.json"))["totals"]; \
	print("engine (src/litlab): %.1f%% of lines, %.1f%% of branches" \
	% (100 * t["covered_lines"] / t["num_statements"], 100 * t["covered_branches"] / t["num_branches"]))'; \
	exit $$status

mutation: $(SETUP) ## Mutation-test the engine's pure modules with mutmut (mutants/; about an hour on 2 cores)
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $(or $(JOBS),2)
	$(VENV)/bin/mutmut export-cicd-stats
	@$(PYTHON) -c 'import json, sys; s = json.load(open("mutants/mutmut-cicd-stats.json")); \
	n = s["total"] - s["skipped"]; k = s["killed"] + s["timeout"]; \
	print("mutation score: %.1f%% (%d of %d mutants killed, %d survived, %d reached by no test)" \
	% (100 * k / n, k, n, s["survived"], s["no_tests"])); sys.exit(k < 0.8 * n)'

# TensorBoard follows links, and a sweep's multiruns/<sweep>/<n> links to a run folder in runs/: so it is
# given each task's runs/ folder, named by the task, to show every run once (all of $(LOGS) before any run).
comma := ,
empty :=
space := $(empty) $(empty)
TASK_RUNS = $(patsubst %/,%,$(wildcard $(LOGS)/*/runs/))
LOGDIR_SPEC = $(subst $(space),$(comma),$(foreach runs,$(TASK_RUNS),$(notdir $(runs:%/runs=%)):$(runs)))

tensorboard: $(SETUP) ## Open TensorBoard on logs/: every run once, HParams with final metrics (PORT=6006)
	$(VENV)/bin/tensorboard $(if $(TASK_RUNS),--logdir_spec $(LOGDIR_SPEC),--logdir $(LOGS)) --port $(PORT)

bench: $(SETUP) ## Measure litlab against bare Lightning and plain PyTorch (benchmarks/; logs/bench/<time>/bench.md)
	$(PYTHON) -m benchmarks.bench $(ARGS)

lint: $(SETUP) ## ruff check, ruff format --check, and the engine's layers (lint-imports)
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/ruff format --check src tests scripts benchmarks
	$(VENV)/bin/lint-imports

format: $(SETUP) ## Format and auto-fix with ruff
	$(VENV)/bin/ruff format src tests scripts benchmarks
	$(VENV)/bin/ruff check --fix src tests scripts benchmarks

# The container image (Dockerfile). CONTAINER: docker where its daemon answers, else podman (on some
# machines podman needs CONTAINER='podman --runtime runc', docs/cloud.md). BASE=<image> builds on another
# base than the Dockerfile's (podman's --from); IMAGE_BUILD_FLAGS are added to the build command.
IMAGE ?= litlab
CONTAINER ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)

image: ## Build the container image IMAGE (litlab): docker, or podman where no Docker daemon runs
	$(CONTAINER) build $(if $(BASE),--from $(BASE)) $(IMAGE_BUILD_FLAGS) -t $(IMAGE) .

test-image: $(SETUP) ## Build the image (podman, Debian base), train, kill and resume in it (~10 min cold, 1-3 warm; not in make test)
	$(PYTHON) -m pytest -n 0 tests/container_image.py $(ARGS)

rename: ## Rename the template for your fork: make rename NAME=myproject
	python3 scripts/rename.py '$(NAME)'

clean: ## Remove run outputs and caches (keeps .venv)
	find logs -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
	rm -rf .pytest_cache .ruff_cache outputs multirun .submitit
	find . -name __pycache__ -not -path './$(VENV)/*' -exec rm -rf {} +
