# plsh_dist: the README's commands. Each target creates or reuses .venv.
#   make quickstart   set up, then pretrain + evaluate a tiny Qwen3 on CPU
#   make test         set up, then run the test suite (make test-slow: launcher-level runs)
#   make bench        set up, then run the attention benchmark (also bench-sp,
#                     bench-training, bench-compile, approx)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export DS_ACCELERATOR ?= cpu
export PYTHONPATH := $(CURDIR)
# the CPU image's build directory (make image-check; docker/image_check.sh)
IMAGE_DIR ?= build/image
IMAGE_ROOTFS := $(IMAGE_DIR)/rootfs.id

.PHONY: venv quickstart test test-slow test-cluster cluster-deps image-deps image-check image-rootfs clean-image rehearsal gpu-check golden lint bench bench-sp bench-training bench-compile approx prose-corpus clean-venv

venv: $(STAMP)

# torch==2.13.0 first (a CPU wheel; anything unpinned may pull gigabytes of
# CUDA), then Triton 3.6.x (the GPU machine's: the kernel's CPU interpreter
# tests and sm_90 / sm_80 compiles; the CPU torch wheel does not bring it),
# then deepspeed without build isolation (its setup imports torch), then the
# package with its extras.
# DeepSpeed's CPU communication backend loads its shared-memory op
# (deepspeed_shm_comm) in every process it starts; not prebuilt, each launch
# JIT-compiles it into ~/.cache/torch_extensions (40 s to 3 minutes on 2 cores,
# again wherever that cache is not kept, and a build killed midway leaves a
# lock that stalls the next). DS_BUILD_SHM_COMM=1 compiles it once, here, for
# the CPU accelerator: a deepspeed installed without it is replaced,
# --no-cache-dir keeps pip from reusing a wheel built without it, and the
# check after the install fails the recipe if it is still missing. The stamp
# depends on this Makefile too, so an existing .venv gets the op at its next use.
SHM_OP_CHECK = DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.git_version_info import installed_ops, accelerator_name; \
    assert installed_ops.get('deepspeed_shm_comm') and accelerator_name == 'cpu', 'deepspeed has no prebuilt CPU shm op'"
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet "triton==3.6.*"
	$(SHM_OP_CHECK) 2>/dev/null || $(PY) -m pip uninstall --quiet --yes deepspeed
	DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(PY) -m pip install --quiet --no-cache-dir \
	    --no-build-isolation "deepspeed>=0.14"
	$(SHM_OP_CHECK)
	$(PY) -m pip install --quiet --no-build-isolation -e ".[train,dev]"
	touch $(STAMP)

# corpus + tokenizer, 2-process SP training through the deepspeed launcher,
# then validation perplexity and the extrapolation table of the checkpoint.
quickstart: $(STAMP)
	$(PY) launchers/quickstart.py --fresh

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
PYTEST = rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests (exit 5): failing" >&2; exit 1; fi; exit $$rc
test: $(STAMP)
	@$(PY) -m pytest -q -m "not slow and not cluster and not image" tests; $(PYTEST)

# Whole-job reliability runs through the real launchers (kill -9 and resume,
# failing ranks, two nodes on one machine): minutes, so kept out of `make test`.
test-slow: $(STAMP)
	@$(PY) -m pytest -q -m "slow and not cluster and not image" tests; $(PYTEST)

# Two hosts on this machine (network + UTS + mount + PID namespaces, root): DeepSpeed's hostfile
# runner over pdsh/ssh and Slurm (slurmctld + a slurmd per host), with their fault cases
# (results/cluster/README.md). cluster-deps apt-installs sshd, pdsh, munge and Slurm, or names what
# is missing; the tests skip naming the missing capability when it is still absent.
cluster-deps:
	bash tools/cluster/deps.sh

# The hostfile test from the image (tests/cluster/test_image_hosts.py) chroots each host into the CPU
# image's root filesystem: built by `make image-check`, or here by image-rootfs when absent.
test-cluster: $(STAMP) cluster-deps $(IMAGE_ROOTFS)
	@PLSH_IMAGE_ROOTFS=$(CURDIR)/$(IMAGE_DIR)/rootfs $(PY) -m pytest -q -m cluster tests/cluster; $(PYTEST)

# The container image without a Docker daemon or a registry (root; docker/README.md): image-deps apt-installs
# buildah, runc, debootstrap (or names what is missing); image-check builds the CPU image (docker/Dockerfile
# --target cpu) on a debootstrap base, runs the debug training, a resume, an evaluation and from_pretrained in
# it as its non-root user with no network, checks its HEALTHCHECK and entry command, lints the Dockerfile and
# builds the GPU target up to its first CUDA step. 7-9 min on 2 cores; buildah's storage is deleted after,
# the exported root filesystem ($(IMAGE_DIR)/rootfs, 2.2 GB) is kept for test-cluster, which rebuilds it only
# when absent (clean-image deletes it).
image-deps:
	bash docker/image_deps.sh

image-check: $(STAMP) image-deps
	IMAGE_DIR=$(IMAGE_DIR) PYTHON=$(CURDIR)/$(PY) bash docker/image_check.sh

$(IMAGE_ROOTFS): | $(STAMP)
	bash docker/image_deps.sh
	IMAGE_DIR=$(IMAGE_DIR) PYTHON=$(CURDIR)/$(PY) bash docker/image_check.sh --rootfs-only

image-rootfs: $(IMAGE_ROOTFS)

clean-image:
	rm -rf $(IMAGE_DIR)

# The 0.6B rehearsal on the two hosts (configs/qwen3_0.6b_8k_plsh_s10.toml, SP = 2 across them, ZeRO-3,
# 4k tokens; a checkpoint, a SIGKILL of node-1's rank mid-step, the resume, the ZeRO-3 export and an
# evaluation at 2x the length): ~50 min on an otherwise idle 2-core CPU with ~21 GiB free. Writes runs/rehearsal/rehearsal.json and
# results/cluster/rehearsal.md. REHEARSAL_ARGS="--tiny --out DIR": the same phases on the debug model.
REHEARSAL_ARGS ?=
rehearsal: $(STAMP) cluster-deps
	$(PY) tools/rehearsal.py $(REHEARSAL_ARGS)

# GPU machine (no downloads): the installed PyTorch, this package without its
# dependencies; the smoke stage (bf16 kernel check, two timings), the graph
# stage (one 0.6B training step at 8k: eager, compiled, in a CUDA graph), then
# the CUDA tests + GPU benchmark; results in $(GPU_OUT). No .venv. Without make:
# python3 tools/gpu_check.py --out gpu_results [--stage smoke|graph|full|both|all].
GPU_OUT ?= gpu_results
GPU_STAGE ?= all
gpu-check:
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation -e . \
	    || echo "pip install -e . failed: running from the source tree (PYTHONPATH)"
	$(PYTHON) tools/gpu_check.py --out $(GPU_OUT) --stage $(GPU_STAGE)

# The English-prose corpus for experiments (Debian's jargon-text: the Jargon File,
# public domain; apt needs root and the package registry). Not part of the quickstart.
PROSE_OUT ?= data_cache/jargon_corpus
prose-corpus: $(STAMP)
	test -e /usr/share/doc/jargon-text/jargon.txt.gz || apt-get install -y -q jargon-text
	$(PY) launchers/prepare_prose_corpus.py --out $(PROSE_OUT)

# Regenerate the debug config's golden losses (tests/train/golden/debug_losses.json)
# after an intended numerical change; say why in the commit.
golden: $(STAMP)
	$(PY) tests/train/golden/regenerate.py

# hadolint on docker/Dockerfile, shellcheck on docker/*.sh and launchers/*.sh
# (tools from the dev extra; the test suite runs them too)
lint: $(STAMP)
	bash docker/lint.sh

bench: $(STAMP)
	$(PY) benchmarks/bench_attention.py --out bench_results/attention

bench-sp: $(STAMP)
	$(PY) benchmarks/bench_sp.py --seq-lens 16384 65536 --worlds 2 4 --alibi-repeats 1 --out bench_results/bench_sp.json

bench-training: $(STAMP)
	$(PY) benchmarks/bench_training.py --lengths 8192,16384

# one decoder layer's graph breaks and compile time per bias (one process, and SP = 2 over gloo),
# training tokens/s with [run].compile off / aot_eager / inductor (one process, and SP = 2 with
# activation checkpointing) (~30 min on 2 cores)
bench-compile: $(STAMP)
	$(PY) benchmarks/bench_compile.py --out bench_results/compile

approx: $(STAMP)
	$(PY) -m experiments.approximation --out runs/approx

clean-venv:
	rm -rf $(VENV)
