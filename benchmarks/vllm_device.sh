#!/usr/bin/env bash
# The GPU machine's side of staging vLLM (benchmarks/vllm_stage.py makes the parts; docs/vllm.md).
#
#   bash benchmarks/vllm_device.sh take      # copy the .vllm*/ part folders of this transfer to $PARTS
#   bash benchmarks/vllm_device.sh install   # join the wheels, check their sha256, pip install --no-index --no-deps --target $SITE
#   bash benchmarks/vllm_device.sh check     # import vllm and its compiled extensions against this machine's torch
#   bash benchmarks/vllm_device.sh env       # print the export line for later commands
#
# Steps may be chained: `take install check`. Each transfer carries one part folder (.vllmA/, .vllmB/, …, each
# at most 48 MiB); `take` after every transfer keeps them outside the work tree, which the next transfer
# replaces. PARTS and SITE default to /root/vllm-parts and /root/vllm-site.
set -euo pipefail
PARTS=${PARTS:-/root/vllm-parts}
SITE=${SITE:-/root/vllm-site}
WHEELS=${WHEELS:-/root/vllm-wheels}
PY=${PY:-python3}

take() {
  mkdir -p "$PARTS"
  shopt -s nullglob
  local n=0
  for d in .vllm*/; do
    cp -f "$d"* "$PARTS"/ && n=$((n + 1))
    echo "took $d ($(du -sh "$d" | cut -f1))"
  done
  [ "$n" -gt 0 ] || echo "no .vllm*/ folder in this transfer"
  ls "$PARTS" | wc -l | xargs echo "files in $PARTS:"
}

install() {
  mkdir -p "$WHEELS" "$SITE"
  "$PY" "$(dirname "${BASH_SOURCE[0]}")/join_parts.py" "$PARTS" "$WHEELS" || return 1
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
  echo "installed into $SITE"
}

check() {
  PYTHONPATH="$SITE:${PYTHONPATH:-}" "$PY" - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
import vllm
print("vllm", vllm.__version__, vllm.__file__)
# the compiled extensions (0.26 names its main one _C_stable_libtorch; each links libcudart.so.13 and torch's
# libraries); cumem_allocator is what sleep mode runs on
for ext in ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch", "vllm.cumem_allocator"):
    importlib.import_module(ext)
    print("loads", ext)
for mod in ("vllm.vllm_flash_attn", "vllm.entrypoints.llm", "vllm.entrypoints.openai.api_server", "flashinfer", "xgrammar"):
    try:
        importlib.import_module(mod)
        print("ok  ", mod)
    except Exception as exc:  # reported, not fatal: the smoke run says whether it matters
        print("FAIL", mod, type(exc).__name__, str(exc)[:300])
# the API agents/vllm_policy.py calls (names checked against the 0.26.0 source): a rename shows here, not mid-run
import dataclasses, inspect
def has(what, obj, names):
    have = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set(dir(obj))
    have |= set(getattr(obj, "__struct_fields__", ()))
    missing = [n for n in names.split() if n not in have]
    print("api ", what, "ok" if not missing else f"MISSING {missing}")
try:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
    has("EngineArgs", EngineArgs, "load_format max_model_len max_num_seqs max_num_batched_tokens enable_prefix_caching "
        "enable_sleep_mode logprobs_mode distributed_executor_backend weight_transfer_config")
    has("SamplingParams", SamplingParams, "max_tokens temperature top_p top_k min_p repetition_penalty stop "
        "stop_token_ids ignore_eos logprobs seed output_kind detokenize")
    has("LLMEngine", LLMEngine, "add_request step abort_request reset_prefix_cache sleep wake_up collective_rpc")
    has("Worker", Worker, "get_model reload_weights init_weight_transfer_engine start_weight_update update_weights "
        "finish_weight_update")
    has("NCCLWeightTransferEngine", NCCLWeightTransferEngine, "trainer_init trainer_send_weights")
    has("vllm.inputs", importlib.import_module("vllm.inputs"), "tokens_input TokensPrompt")
    print("api  LLMEngine.add_request", list(inspect.signature(LLMEngine.add_request).parameters)[:4])
except Exception as exc:
    print("FAIL api check", type(exc).__name__, str(exc)[:300])
# vLLM's requirements against what this machine has (the machine's own versions were not checked when staging)
from importlib import metadata
from packaging.requirements import Requirement
for line in metadata.requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        print("missing ", req)
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        print("version ", req, "but", have, "is installed")
EOF
}

env_line() { echo "export PYTHONPATH=$SITE:\$PWD"; }

[ $# -gt 0 ] || { sed -n 2,12p "$0"; exit 2; }
for step in "$@"; do
  case "$step" in
    take) take ;;
    install) install ;;
    check) check ;;
    env) env_line ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
