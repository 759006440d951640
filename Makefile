# whichgpu developer entry points. `make demo` and `make test` work on a fresh machine.
#
# `make install` builds .venv from the lock, requirements/dev.txt: every package the suite was
# last run with, direct and transitive, at exact versions (torch is the 2.13.0 CPU build these
# project machines provide). The package's own dependencies in pyproject.toml stay ranges.
#   make lock            after a change of pyproject.toml's dependencies: lock what is new,
#                        keep every other pin
#   make lock-upgrade    re-resolve to the newest versions, run the whole suite on them in a
#                        separate venv, and write the new lock only when it passes
#   make test-oldest     the tests that build a model's step, on the oldest transformers
#                        whichgpu supports (requirements/oldest.txt), in .venv-oldest; make
#                        test runs it after the suite
# GPU users keep their own torch: TORCH_SPEC="torch==2.11.0" make install installs the lock
# without its torch line, and that torch instead.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOCK ?= requirements/dev.txt
TORCH_SPEC ?=
STAMP := $(VENV)/.installed

# pip-compile's settings for the lock: the extras CI installs and the package's own build
# backend (hatchling, so the editable install builds without an unpinned build environment),
# no machine-specific index locations, pip and setuptools pinned too, torch held by
# requirements/torch-cpu.in
COMPILE = CUSTOM_COMPILE_COMMAND="make $@" $(BIN)/pip-compile --quiet --strip-extras \
	--allow-unsafe --no-emit-index-url --no-emit-find-links --extra torch --extra report \
	--extra dev --build-deps-for editable -c requirements/torch-cpu.in

.PHONY: install demo test lint format clean lock lock-upgrade lock-oldest test-oldest

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(if $(strip $(TORCH_SPEC)),$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" -r <(grep -v '^torch==' $(LOCK)),$(BIN)/python -m pip install --quiet -r $(LOCK))
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	-timeout 300 $(BIN)/python -m playwright install chromium >/dev/null 2>&1 || echo "note: no browser for the HTML report's browser test (it will be skipped)"
	touch $(STAMP)

demo: install
	$(BIN)/whichgpu gpus --min-memory 24 --sort memory_bandwidth_gbps
	$(BIN)/whichgpu compare 2080ti 3090 4090 5090
	$(BIN)/whichgpu show h100-sxm
	$(BIN)/whichgpu fit llama-3.2-1b --gpu 4090 --gpu 3090 --gpu a100-80gb --gpu h100-sxm --seq-len 2048
	$(BIN)/whichgpu predict llama-3.2-1b --gpu 5090 --gpu a100-80gb --gpu h100-sxm --gpu h200-sxm
	$(BIN)/whichgpu cost breakeven --system-cost 2200 --gpu-watts 350 --cpu-watts 100 --utilization 0.15 --electricity 0.12 --cloud-rate 2.14
	$(BIN)/whichgpu recommend bert-large --seq-len 512 --epochs 10 --dataset-size 1000000 --rent --top 5
	$(BIN)/whichgpu report bert-large --seq-len 512 --rent --epochs 10 --dataset-size 1000000 --out report.html

lint: install
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo

format: install
	$(BIN)/ruff check --fix src tests scripts
	$(BIN)/ruff format src tests scripts

# the tests run on every core (pytest-xdist): traces dominate the suite and each runs alone
test: install lint
	$(BIN)/python -m pytest -n auto --dist worksteal
	$(MAKE) test-oldest

# After a change of pyproject.toml's dependencies: add what is new to the lock, keeping every
# other pin (the suite then runs on it as usual).
lock: install
	$(COMPILE) --output-file $(LOCK) pyproject.toml
	$(MAKE) lock-oldest

# Move the lock forward on purpose: compile the newest set into a candidate lock, build a
# separate venv from it and run the whole suite there; only a green suite replaces the lock.
lock-upgrade: install
	$(COMPILE) --upgrade --output-file $(LOCK).new pyproject.toml
	rm -rf .venv-lock
	$(MAKE) test VENV=.venv-lock LOCK=$(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock
	$(MAKE) lock-oldest
	@echo "lock moved forward: review 'git diff $(LOCK)', note it in CHANGELOG.md, commit"

# The oldest supported transformers (docs/compatibility.md): the locked set with transformers
# (and what it pulls) held at that release, and the tests that build a model's step with it.
# `make lock-oldest` recompiles requirements/oldest.txt from the lock and requirements/oldest.in.
OLDEST_TESTS := tests/trace/test_inference_trace.py tests/trace/test_trace.py tests/bench/test_bench_flops.py

lock-oldest: install
	cp $(LOCK) requirements/oldest.txt
	$(COMPILE) -c requirements/oldest.in --output-file requirements/oldest.txt pyproject.toml

test-oldest:
	$(MAKE) install VENV=.venv-oldest LOCK=requirements/oldest.txt
	.venv-oldest/bin/python -m pytest -n auto -p no:cacheprovider $(OLDEST_TESTS)

clean:
	rm -rf $(VENV) .venv-lock .venv-oldest .pytest_cache .mypy_cache .ruff_cache
