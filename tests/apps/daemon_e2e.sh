#!/usr/bin/env bash
# kilnd end to end, as a user runs it (ctest: apps_daemon_e2e, label app):
#   1. kilnd starts on the CPU with a plan cache and answers kilnctl;
#   2. a second kilnd for the same device refuses to start, with the reason, on the same socket
#      and on another one (the per-device lock names the running daemon's pid);
#   3. kiln-demo --connect trains two workers through it (their losses must fall);
#   4. SIGTERM: kilnd exits 0 with nothing left on the device and saves its plans;
#   5. a restarted kilnd loads those plans: the store is full before any client came;
#   6. plans are saved while the daemon runs: after a SIGKILL the next one loads them;
#   7. a 300 MiB tensor's memory goes back to the system after it is freed, and a client that
#      never pops its completions does not hold up SIGTERM;
#   8. (root, where a memory cgroup can be made) kilnd in a 1.5 GiB memory cgroup sets its limit
#      from it; a client's 2 GiB request fails for that client alone, and the daemon serves on.
# Usage: daemon_e2e.sh BIN_DIR HOSTILE (the build's apps/ directory; the kiln_hostile tool)
set -euo pipefail
bin=${1:?usage: daemon_e2e.sh BIN_DIR HOSTILE}
hostile=${2:?usage: daemon_e2e.sh BIN_DIR HOSTILE}
dir=$(mktemp -d /tmp/kiln-e2e-XXXXXX)
run=$dir/run cache=$dir/plans locks=$dir/locks pid="" cg=""
cleanup() {
  set +e  # every step runs, whatever the one before did
  if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  if [[ -n $cg ]]; then rmdir "$cg" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "daemon_e2e: FAIL: $*" >&2; for f in "$dir"/*.log; do echo "--- $f"; cat "$f"; done >&2; exit 1; }

start_daemon() {  # $1: log file, then extra kilnd flags
  local log=$1
  shift
  "$bin/kilnd" --device cpu --runtime-dir "$run" --lock-dir "$locks" --plan-cache "$cache" "$@" >"$log" 2>&1 &
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

echo "== 6. SIGKILL after the plans were learned"
rm -rf "$cache"
start_daemon "$dir/killed.log" --plan-save-ms 100
"$bin/kiln-demo" --connect --device cpu --runtime-dir "$run" --workers 1 --steps 20 >"$dir/demo2.log" 2>&1 ||
  fail "kiln-demo --connect failed (step 6)"
# The demo's clients are cleaned up (their last drops drained, which may still add a plan), then
# the store is saved within plan_save_ms of its last new plan.
for _ in $(seq 100); do
  others=$("$bin/kilnctl" status --json --runtime-dir "$run" | grep -o '"job":"[^"]*","pid"' | grep -vc kilnctl || true)
  ((others == 0)) && break
  sleep 0.1
done
for _ in $(seq 100); do [[ -f $cache/plans.kpc ]] && break; sleep 0.1; done
sleep 1
learned=$(plans)
sleep 0.5
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
pid=""
# Step 7 needs a completion timeout no stop can hide behind: only the stop may end the wait.
start_daemon "$dir/after-kill.log" --completion-timeout-ms 600000
grep -Eq "loaded [1-9][0-9]* plans" "$dir/after-kill.log" || fail "no plans loaded after a SIGKILL"
reloaded=$(plans)
[[ $reloaded -eq $learned ]] || fail "after a SIGKILL the store has $reloaded plans, the killed daemon had learned $learned"

echo "== 7. memory goes back after a large tensor; SIGTERM with a client that never pops"
rss() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$pid/status"; }
base=$(rss)
"$hostile" --runtime-dir "$run" --socket kilnd-cpu.sock --job big --mib 300 alloc >"$dir/alloc.log" 2>&1
grep -q "sync: ok" "$dir/alloc.log" || fail "a 300 MiB tensor: $(cat "$dir/alloc.log")"
# Freed large blocks go back after the 2 s retention (the daemon checks every second).
back=""
for _ in $(seq 100); do
  (($(rss) < base + (64 << 20))) && back=yes && break
  sleep 0.1
done
[[ -n $back ]] || fail "resident memory stayed at $(($(rss) >> 20)) MiB after a 300 MiB tensor was freed (baseline $((base >> 20)) MiB)"
echo "resident memory back to $(($(rss) >> 20)) MiB (baseline $((base >> 20)) MiB) after a 300 MiB tensor"
"$hostile" --runtime-dir "$run" --socket kilnd-cpu.sock --job stuck --seconds 60 never-pop >"$dir/stuck.log" 2>&1 &
stuck=$!
for _ in $(seq 200); do grep -q "popped none" "$dir/stuck.log" && break; sleep 0.05; done
grep -q "popped none" "$dir/stuck.log" || fail "the stuck client did not fill its ring"
start=$(date +%s.%N)
stop_daemon
stop_secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
kill "$stuck" 2>/dev/null || true
wait "$stuck" 2>/dev/null || true
echo "SIGTERM with a stuck client: kilnd exited in ${stop_secs} s"
awk -v t="$stop_secs" 'BEGIN { exit !(t < 10) }' || fail "SIGTERM took ${stop_secs} s with a stuck client"

echo "== 8. a memory cgroup's limit"
if [[ $(id -u) -eq 0 && -d /sys/fs/cgroup/memory && -w /sys/fs/cgroup/memory ]]; then
  cg=/sys/fs/cgroup/memory/kiln-e2e-$$ limit_file=memory.limit_in_bytes
elif [[ $(id -u) -eq 0 && -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  cg=/sys/fs/cgroup/kiln-e2e-$$ limit_file=memory.max
fi
if [[ -n $cg ]] && mkdir "$cg" 2>/dev/null; then
  echo $((1536 << 20)) >"$cg/$limit_file"
  # The limit is read at start: the daemon runs inside the cgroup from its first instruction.
  sh -c "echo \$\$ >'$cg/cgroup.procs'; exec '$bin/kilnd' --device cpu --runtime-dir '$run' --lock-dir '$locks'" \
    >"$dir/cgroup.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do "$bin/kilnctl" status --runtime-dir "$run" >/dev/null 2>&1 && break; sleep 0.05; done
  grep -q "device memory limit 1228 MiB (80% of the memory cgroup's 1536 MiB" "$dir/cgroup.log" ||
    fail "kilnd did not take its limit from the memory cgroup"
  "$hostile" --runtime-dir "$run" --socket kilnd-cpu.sock --job big --mib 2048 alloc >"$dir/big.log" 2>&1
  grep -q "sync: ResourceExhausted" "$dir/big.log" || fail "a 2 GiB request in a 1.5 GiB cgroup: $(cat "$dir/big.log")"
  kill -0 "$pid" 2>/dev/null || fail "kilnd died on a request past its memory limit"
  "$hostile" --runtime-dir "$run" --socket kilnd-cpu.sock --job small --mib 64 alloc >"$dir/small.log" 2>&1
  grep -q "sync: ok" "$dir/small.log" || fail "the daemon did not serve the next client: $(cat "$dir/small.log")"
  echo "in a 1536 MiB cgroup: $(grep -o 'device memory limit [^(]*' "$dir/cgroup.log"); a 2 GiB request got: $(cat "$dir/big.log")"
  stop_daemon
  rmdir "$cg" 2>/dev/null || true
  cg=""
else
  cg=""
  echo "skipped: needs root and a writable memory cgroup hierarchy"
fi
echo "daemon_e2e: OK ($saved plans kept across restarts; SIGTERM with a stuck client ${stop_secs} s)"
