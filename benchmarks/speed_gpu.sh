#!/usr/bin/env bash
# The decode engine's and the update's GPU benchmarks (device side, from the repository root), one or more
# per call:
#   bash benchmarks/speed_gpu.sh rollout grpo_step      # ~2.5 min on an H100
#   bash benchmarks/speed_gpu.sh update generation      # ~4 min on an H100
# Expects, carried from the developer's machine: .whl/ (gymnasium, pydantic, ... wheels the image lacks) and
# .bench/smollm2 (SmolLM2-135M's config + tokenizer files, no weights). Results (NAME.md, NAME.json, NAME.log)
# land in $OUT; copy them to benchmarks/results/. Each benchmark has a time limit so one call stays < 10 min.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ ! -d /tmp/site/gymnasium ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee -a "$out/gpu.txt"
for name in "$@"; do
  start=$(date +%s)
  case "$name" in
    rollout)  # 16 tasks x 8 leaves, ARPO, 3 turns x <= 64 tokens, 10 ms env steps (the old HF path is ~55 s)
      timeout 300 python3 benchmarks/rollout.py --model .bench/smollm2 --new 64 --turns 3 --out "$out/rollout" ;;
    update)  # both shapes, eager padded vs packed vs packed + compile, then the 0.5B 32x1024 fit
      timeout 420 python3 benchmarks/update.py --variants eager_padded:8,packed:16,packed_compile:16 \
        --out "$out/update" ;;
    grpo_step)  # 8 prompts x 8 samples, <= 64 new tokens, one turn: fast vs hf, 4 steps each
      timeout 240 python3 benchmarks/grpo_step.py --model .bench/smollm2 --out "$out/grpo_step" ;;
    generation)  # the 135M shape only (the headline keys); add qwen2.5-0.5b with --models if time allows
      timeout 300 python3 benchmarks/generation.py --models smollm2-135m --static 256 --dynamic 1,256 \
        --out "$out/generation" ;;
    *) echo "unknown benchmark $name (rollout | update | grpo_step | generation)"; continue ;;
  esac 2>&1 | tee "$out/$name.log" | tail -30
  echo "$name: rc=${PIPESTATUS[0]} seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
  [ -f "$out/$name.json" ] && rm -f "$out/$name.partial.json"  # a call returns at most 8 files
done
