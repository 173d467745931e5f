#!/usr/bin/env bash
# What a hostile client costs the others (issue 19, items 10 and 11), measured on a real kilnd:
#   1. a victim worker (kiln-demo --connect, one worker) timed alone and next to a client that
#      spams its doorbell, alternating, ROUNDS times each: the victim's slowdown;
#   2. SIGTERM with a client that never pops its completions: the time kilnd takes to exit.
# Usage: scripts/measure-hostile.sh [BUILD_DIR (build/release)] [ROUNDS (3)] [STEPS (400)]
set -euo pipefail
build=${1:-build/release} rounds=${2:-3} steps=${3:-400}
bin=$build/apps hostile=$build/tests/ipc/kiln_hostile
for f in "$bin/kilnd" "$bin/kiln-demo" "$hostile"; do
  [[ -x $f ]] || { echo "measure-hostile: $f is not built (cmake --build $build)" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/kiln-hostile-XXXXXX) pid=""
trap 'set +e; if [[ -n $pid ]]; then kill -9 $pid 2>/dev/null; fi; rm -rf "$dir"' EXIT
start_daemon() {
  # A completion timeout far past the measurement: only the stop may end the stuck client's wait.
  "$bin/kilnd" --device cpu --runtime-dir "$dir/run" --lock-dir "$dir/locks" --completion-timeout-ms 600000 \
    >>"$dir/kilnd.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do "$bin/kilnctl" status --runtime-dir "$dir/run" >/dev/null 2>&1 && return; sleep 0.05; done
  echo "kilnd did not start" >&2; exit 1
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
victim() {  # prints the victim's wall time
  local t0
  t0=$(now)
  "$bin/kiln-demo" --connect --device cpu --runtime-dir "$dir/run" --workers 1 --steps "$steps" >"$dir/victim.log" 2>&1 ||
    { echo "the victim failed:" >&2; cat "$dir/victim.log" >&2; exit 1; }
  elapsed "$t0"
}

echo "== 1. victim alone / next to doorbell spam ($rounds rounds each, alternating, $steps steps)"
start_daemon
victim >/dev/null  # warm: the plans are in the store for every timed run
alone=() spammed=()
for r in $(seq "$rounds"); do
  alone+=("$(victim)")
  "$hostile" --runtime-dir "$dir/run" --socket kilnd-cpu.sock --job spam --seconds 600 spam-doorbell >/dev/null 2>&1 &
  spam=$!
  sleep 0.2
  spammed+=("$(victim)")
  kill "$spam" 2>/dev/null || true
  wait "$spam" 2>/dev/null || true
  echo "round $r: alone ${alone[-1]} s, with spam ${spammed[-1]} s"
done
awk -v a="${alone[*]}" -v s="${spammed[*]}" 'BEGIN {
  n = split(a, x, " "); split(s, y, " "); ma = 1e9; ms = 1e9
  for (i = 1; i <= n; i++) { if (x[i] < ma) ma = x[i]; if (y[i] < ms) ms = y[i] }
  printf "victim: best alone %.3f s, best with spam %.3f s: slowdown %.2fx\n", ma, ms, ms / ma }'
kill -TERM "$pid"; wait "$pid" || true; pid=""

echo "== 2. SIGTERM with a client that never pops ($rounds times)"
for r in $(seq "$rounds"); do
  start_daemon
  "$hostile" --runtime-dir "$dir/run" --socket kilnd-cpu.sock --job stuck --seconds 600 never-pop >"$dir/stuck.log" 2>&1 &
  stuck=$!
  for _ in $(seq 200); do grep -q "popped none" "$dir/stuck.log" && break; sleep 0.05; done
  t0=$(now)
  kill -TERM "$pid"; wait "$pid" || true; pid=""
  echo "round $r: kilnd exited $(elapsed "$t0") s after SIGTERM"
  kill "$stuck" 2>/dev/null || true
  wait "$stuck" 2>/dev/null || true
done
