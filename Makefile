# litlab: `make help` lists the targets. Every target sets up .venv first if it is missing or stale.
SHELL := /bin/bash
VENV ?= .venv
PYTHON := $(VENV)/bin/python
SETUP := $(VENV)/.installed
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help setup train test test-fast bench lint format clean rename

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'
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
	$(PYTHON) -m pytest $(ARGS)

test-fast: $(SETUP) ## Run the tests not marked slow (the inner loop)
	$(PYTHON) -m pytest -m "not slow" $(ARGS)

bench: $(SETUP) ## Measure litlab against plain PyTorch (a few minutes; logs/bench/<time>/bench.md)
	$(PYTHON) -m litlab.bench $(ARGS)

lint: $(SETUP) ## ruff check and ruff format --check
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts

format: $(SETUP) ## Format and auto-fix with ruff
	$(VENV)/bin/ruff format src tests scripts
	$(VENV)/bin/ruff check --fix src tests scripts

rename: ## Rename the template for your fork: make rename NAME=myproject
	python3 scripts/rename.py '$(NAME)'

clean: ## Remove run outputs and caches (keeps .venv)
	find logs -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
	rm -rf .pytest_cache .ruff_cache outputs multirun .submitit
	find . -name __pycache__ -not -path './$(VENV)/*' -exec rm -rf {} +
