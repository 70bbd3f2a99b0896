#!/usr/bin/env bash
# Stop the single-node SLURM started by scripts/slurm-up.sh: only the daemons whose PIDs it
# recorded, in reverse order. `--wipe` also deletes the state (job ids then restart at 1).
set -euo pipefail

DIR=${TWOCLOCKS_SLURM_DIR:-/var/tmp/twoclocks-slurm}

stop() {  # stop NAME: SIGTERM the recorded pid, wait, then SIGKILL
  local f="$DIR/pids/$1.pid" pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    echo "slurm-down: stopped $1 (pid $pid)" >&2
  fi
  rm -f "$f"
}

for d in slurmd slurmctld slurmdbd mariadbd munged; do stop "$d"; done
if [ "${1:-}" = "--wipe" ]; then
  rm -rf "$DIR"
  echo "slurm-down: wiped $DIR" >&2
fi
