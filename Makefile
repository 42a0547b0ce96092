# plsh_dist: the README's commands. Each target creates or reuses .venv.
#   make quickstart   set up, then pretrain + evaluate a tiny Qwen3 on CPU
#   make test         set up, then run the test suite
#   make bench        set up, then run the attention benchmarks
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export DS_ACCELERATOR ?= cpu
export PYTHONPATH := $(CURDIR)

.PHONY: venv quickstart test bench bench-sp clean-venv

venv: $(STAMP)

# torch==2.13.0 first (a CPU wheel; anything unpinned may pull gigabytes of
# CUDA), then deepspeed without build isolation (its setup imports torch),
# then the package with its extras.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-build-isolation "deepspeed>=0.14"
	$(PY) -m pip install --quiet --no-build-isolation -e ".[train,dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(PY) launchers/bench_attention.py --lengths 1024,4096 --repeats 3 --out runs/quickstart_bench

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
test: $(STAMP)
	@$(PY) -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): failing" >&2; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(PY) launchers/bench_attention.py --out bench_results/attention

clean-venv:
	rm -rf $(VENV)
