#!/usr/bin/env bash
# kilnd end to end, as a user runs it (ctest: apps_daemon_e2e, label app):
#   1. kilnd starts on the CPU with a plan cache and answers kilnctl;
#   2. a second kilnd for the same device refuses to start, with the reason, on the same socket
#      and on another one (the per-device lock names the running daemon's pid);
#   3. kiln-demo --connect trains two workers through it (their losses must fall);
#   4. SIGTERM: kilnd exits 0 with nothing left on the device and saves its plans;
#   5. a restarted kilnd loads those plans: the store is full before any client came.
# Usage: daemon_e2e.sh BIN_DIR (the build's apps/ directory)
set -euo pipefail
bin=${1:?usage: daemon_e2e.sh BIN_DIR}
dir=$(mktemp -d /tmp/kiln-e2e-XXXXXX)
run=$dir/run cache=$dir/plans locks=$dir/locks pid=""
cleanup() { [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "daemon_e2e: FAIL: $*" >&2; for f in "$dir"/*.log; do echo "--- $f"; cat "$f"; done >&2; exit 1; }

start_daemon() {  # $1: log file
  "$bin/kilnd" --device cpu --runtime-dir "$run" --lock-dir "$locks" --plan-cache "$cache" >"$1" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    [[ -S $run/kilnd-cpu.sock ]] && "$bin/kilnctl" status --runtime-dir "$run" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || fail "kilnd exited at start"
    sleep 0.05
  done
  fail "kilnd did not answer within 10 s"
}
stop_daemon() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=""
  ((rc == 0)) || fail "kilnd exited $rc after SIGTERM"
}
plans() { "$bin/kilnctl" status --json --runtime-dir "$run" | sed -n 's/.*"plans":\([0-9]*\).*/\1/p'; }

echo "== 1. start"
start_daemon "$dir/first.log"
"$bin/kilnctl" status --runtime-dir "$run" | grep -q "plan store" || fail "kilnctl status has no plan store line"

echo "== 2. a second daemon on the same device"
if "$bin/kilnd" --device cpu --runtime-dir "$run" --lock-dir "$locks" >"$dir/second.log" 2>&1; then
  fail "a second kilnd started"
fi
grep -q "another kilnd (pid $pid) already serves device cpu" "$dir/second.log" ||
  fail "the second kilnd did not say why it refused"
if "$bin/kilnd" --device cpu --runtime-dir "$run" --socket other.sock --lock-dir "$locks" >"$dir/third.log" 2>&1; then
  fail "a second kilnd for the device started under another socket name"
fi
grep -q "another kilnd (pid $pid) already serves device cpu" "$dir/third.log" ||
  fail "the kilnd on another socket did not say why it refused"

echo "== 3. demo workers against it"
"$bin/kiln-demo" --connect --device cpu --runtime-dir "$run" --workers 2 --steps 60 >"$dir/demo.log" 2>&1 ||
  fail "kiln-demo --connect failed"
grep -q "OK: every worker's loss fell" "$dir/demo.log" || fail "no success line from kiln-demo"
before=$(plans)
[[ $before -gt 0 ]] || fail "no plans in the store after the demo"

echo "== 4. SIGTERM"
stop_daemon
grep -q "0 tensors and 0 bytes left on the device" "$dir/first.log" || fail "memory left on the device at stop"
# The store may still grow after the status above (the clients' last drops are drained when
# they go), so the reference is what the daemon says it saved.
saved=$(sed -n 's/.*saved \([0-9]*\) plans.*/\1/p' "$dir/first.log")
[[ -n $saved && $saved -ge $before ]] || fail "saved '${saved}' plans, the store had $before after the demo"
[[ -f $cache/plans.kpc ]] || fail "no plans.kpc"

echo "== 5. restart with the saved plans"
start_daemon "$dir/restart.log"
grep -Eq "loaded [1-9][0-9]* plans" "$dir/restart.log" || fail "no plans loaded at restart"
after=$(plans)
[[ $after -eq $saved ]] || fail "restarted store has $after plans, the first run saved $saved"
stop_daemon
echo "daemon_e2e: OK ($saved plans kept across restarts)"
