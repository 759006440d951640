# whichgpu developer entry points. `make demo` and `make test` work on a fresh machine.
#
# TORCH_SPEC is what `install` asks pip for before the package itself. The default is the CPU
# build these project machines provide; GPU users keep their own build, e.g.
#   TORCH_SPEC="torch" make install        (newest CUDA build from PyPI)
#   TORCH_SPEC= make install               (keep whatever torch the environment already has)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(strip $(TORCH_SPEC)),$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)")
	$(BIN)/python -m pip install --quiet -e ".[all,dev]"
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

format: install
	$(BIN)/ruff check --fix src tests scripts
	$(BIN)/ruff format src tests scripts

# the tests run on every core (pytest-xdist): traces dominate the suite and each runs alone
test: install lint
	$(BIN)/python -m pytest -n auto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
