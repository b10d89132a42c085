#!/usr/bin/env bash
# The GPU machine's side of issue 32's env_workers_speedup run (16 cores, Python 3.12, no network, no docker):
# Coding-v0 episodes/s with the envs in the trainer's threads vs on 2 local Ray nodes, Coding-v0 on the process
# sandbox (bubblewrap). benchmarks/ray_stage.py makes the parts here (Ray's wheel is 79 MB: two transfers).
#
#   bash benchmarks/ray_device.sh take      # copy this transfer's .rayA/ or .rayB/ to $PARTS (outside the tree)
#   bash benchmarks/ray_device.sh install   # join the wheels, check their sha256, pip install --no-index
#                                           # --no-deps --target $SITE; bwrap from the parts; toolgym -e
#   bash benchmarks/ray_device.sh run       # scale.py env_workers $RAY_BENCH_ARGS (results into $OUT/results)
#   bash benchmarks/ray_device.sh pinned    # the same with --pin: each node on 6 cores of its own, the trainer
#                                           # (its env threads and their sandboxes) on the other 4 (results_pinned)
#
# The calls, back to back on one warm machine (the second needs the first's $PARTS; give the first a GPU kind
# of one card, the second the same kind):
#   1. command "bash benchmarks/ray_device.sh take"              carry [".rayA"]   ~5 s (+ the machine's start)
#   2. command "bash benchmarks/ray_device.sh take install run pinned"  carry [".rayB"]  ~200-400 s; timeout_s 600
#      (each benchmark is cut at 250 s; the install takes ~30 s)
# $OUT gets machine.txt (cores, load, /dev/shm, bwrap, ray, the process sandbox's first run), bench.log and
# bench_pinned.log, results/ and results_pinned/ (scale_env_workers.{md,json}, scale.json); here,
#   python benchmarks/scale.py env_workers_report FILES_AT/results/scale_env_workers.json
# writes one into benchmarks/results (the 2-core run's md/json are replaced: copy them aside first to keep them).
# Build the parts here (network): python benchmarks/ray_stage.py download && python benchmarks/ray_stage.py split
#
# RAY_DEVICE_DRY=1: a local rehearsal (any Python, e.g. 3.11 here): take and the join/check run for real, the
# pip installs and the bwrap install are skipped (this machine's own ray, toolgym and bwrap run the benchmark).
# PARTS, SITE, WHEELS, OUT, PY and RAY_BENCH_ARGS may be set.
set -uo pipefail
PARTS=${PARTS:-/root/parts}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-/root/ray-wheels}
PY=${PY:-python3}
OUT=${OUT:-/tmp/out}
DRY=${RAY_DEVICE_DRY:-0}
# 2 nodes x 6 CPUs on a 16-core host (the trainer and its sandboxes keep the rest); the 2-core run's sizes
RAY_BENCH_ARGS=${RAY_BENCH_ARGS:---envs 8 --episodes 32 --repeats 3 --sandbox process --nodes 2 --node-cpus 6}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PATH="$SITE/bin:$PATH"
export RAY_USAGE_STATS_ENABLED=0

take() {
  mkdir -p "$PARTS"
  shopt -s nullglob
  local n=0
  for d in .ray[A-Z]/; do
    cp -rf "$d". "$PARTS"/ && n=$((n + 1))
    echo "took $d ($(du -sh "$d" | cut -f1))"
  done
  [ "$n" -gt 0 ] || echo "no .rayA/ or .rayB/ in this transfer"
  echo "files in $PARTS: $(find "$PARTS" -type f | wc -l)"
}

install() {
  mkdir -p "$WHEELS"
  "$PY" "$(dirname "${BASH_SOURCE[0]}")/join_parts.py" "$PARTS" "$WHEELS" || return 1
  if [ "$DRY" = 1 ]; then
    echo "dry run: pip install --target $SITE, bwrap and toolgym -e skipped"
    return 0
  fi
  mkdir -p "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || return 1
  if ! command -v bwrap >/dev/null && [ -x "$PARTS/bwrap/bwrap" ]; then  # as benchmarks/papers/device.sh
    mkdir -p /usr/local/lib/toolgym-bwrap
    for lib in libselinux.so.1 libcap.so.2 libpcre2-8.so.0; do  # only what the image lacks: never shadow its own
      ldconfig -p | grep -q "$lib " || cp "$PARTS/bwrap/$lib" /usr/local/lib/toolgym-bwrap/
    done
    echo /usr/local/lib/toolgym-bwrap > /etc/ld.so.conf.d/toolgym-bwrap.conf && ldconfig
    command install -m 0755 "$PARTS/bwrap/bwrap" /usr/local/bin/bwrap  # (the binary, not this function)
  fi
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || {
    echo "pip install -e . failed"; return 1; }
  echo "installed into $SITE"
}

machine() {
  {
    echo "cores $(nproc) (os.cpu_count $("$PY" -c 'import os; print(os.cpu_count())'))"
    uptime
    df -h /dev/shm | tail -1  # Ray's object store (80 MiB a node) lives there
    "$PY" --version
    bwrap --version || echo "no bwrap"
    ray --version || echo "no ray command on PATH"
    "$PY" -c "import ray; print('ray', ray.__version__, ray.__file__)"
    # the process sandbox first: a broken bwrap shows here in a second, not mid-benchmark
    "$PY" -c "from toolgym.sandboxes import get_sandbox; sb = get_sandbox('process', pool_size=1); print('process sandbox:', sb.run('print(6*7)').stdout.strip()); sb.close()"
    git log -1 --format='commit %h' 2>/dev/null
  } 2>&1 | tee -a "$OUT/machine.txt"
}

bench() {  # bench NAME [FLAG]: one benchmark into $OUT/NAME, its log $OUT/bench${FLAG:+_pinned}.log
  local name=$1 log="$OUT/bench${2:+_pinned}.log"
  mkdir -p "$OUT/$name"
  [ -f "$OUT/machine.txt" ] || machine
  # shellcheck disable=SC2086  (the flags are words)
  timeout 250 "$PY" benchmarks/scale.py env_workers $RAY_BENCH_ARGS ${2:-} --results "$OUT/$name" > "$log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(uptime)" | tee -a "$OUT/machine.txt"
  tail -30 "$log"
  return $rc
}

[ $# -gt 0 ] || { sed -n 2,28p "$0"; exit 2; }
rc=0
for step in "$@"; do
  case "$step" in
    take) take ;;
    install) install || exit 1 ;;
    run) bench results || rc=1 ;;  # a failed run still lets the pinned one run
    pinned) bench results_pinned --pin || rc=1 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
exit $rc
