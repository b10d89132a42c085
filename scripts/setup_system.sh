#!/usr/bin/env bash
# System set-up for the tests: Debian packages, a running docker daemon, the offline-built sandbox image.
# Idempotent: each step is skipped when already done.
set -euo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the web env's preferred headless build (it falls back to chromium) and the driver of benchmarks/web.py's
# MiniWoB++ anchor (Selenium)
command -v chromium-headless-shell >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium-headless-shell ] \
  || need+=(chromium-headless-shell)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)  # the sandboxes' process backend
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)  # ScienceWorld, TextWorldExpress
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# gVisor, the sandboxes' opt-in tier: its tests run where dockerd knows the runtime (they skip elsewhere, so a
# failed install only narrows the tests)
if ! command -v runsc >/dev/null 2>&1; then
  apt-get install -y -q --no-install-recommends runsc >/dev/null 2>&1 || echo "setup: no runsc package: gVisor tests skip"
fi
if command -v runsc >/dev/null 2>&1 && ! grep -q runsc /etc/docker/daemon.json 2>/dev/null; then
  if [ -s /etc/docker/daemon.json ]; then
    echo "setup: /etc/docker/daemon.json exists without runsc: left as is (gVisor tests skip)"
  else
    mkdir -p /etc/docker
    echo '{"runtimes": {"runsc": {"path": "'"$(command -v runsc)"'", "runtimeArgs": ["--network=none"]}}}' \
      > /etc/docker/daemon.json
    pid=$(pidof dockerd || true)
    [ -n "$pid" ] && kill -HUP $pid  # a running daemon reloads its runtimes; a new one reads the file
  fi
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  mkdir -p /var/log
  (dockerd >/var/log/dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/dockerd.log" >&2; tail -20 /var/log/dockerd.log >&2; exit 1; }
fi

if python3 -c "import toolgym.sandboxes.image" 2>/dev/null; then
  python3 -m toolgym sandbox build
  # Terminal-v0's image: FROM the sandbox image, plus git/make/gcc/pip by apt (skipped when up to date)
  python3 -c "from toolgym.envs.terminal.image import ensure_base; print(ensure_base(log=print))"
fi
