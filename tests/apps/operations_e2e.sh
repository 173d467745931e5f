#!/usr/bin/env bash
# Operating kilnd, end to end, as an operator does it (ctest: apps_operations_e2e, label app):
#   1. kilnd from a kiln.toml with the metrics endpoint on its Unix socket and JSON logs;
#   2. scrapes under load (two demo workers): every answer parses with prometheus_client's parser;
#   3. after the load the metrics add up with `kilnctl status --json`;
#   3b. kilnctl plans: the listing credits the demo's job, one plan as DOT, clear;
#   4. kilnctl jobs, clients, limits set, disconnect (a held client goes, its memory with it);
#   5. SIGHUP and kilnctl reload: a changed limit applies live, a changed arena_mib is named as
#      needing a restart;
#   6. every log line is one JSON object; client lines carry the client and the job;
#   7. kilnctl drain --exit: no client left, the daemon stops and exits 0.
# Usage: operations_e2e.sh BIN_DIR HOSTILE PYTHON (the build's apps/ directory, kiln_hostile, a
# python with prometheus_client: the project venv's)
set -euo pipefail
bin=${1:?usage: operations_e2e.sh BIN_DIR HOSTILE PYTHON}
hostile=${2:?usage: operations_e2e.sh BIN_DIR HOSTILE PYTHON}
python=${3:?usage: operations_e2e.sh BIN_DIR HOSTILE PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
"$python" -c "import prometheus_client" 2>/dev/null || {
  echo "operations_e2e: $python has no prometheus_client: run scripts/setup.sh" >&2
  exit 1
}
dir=$(mktemp -d /tmp/kiln-ops-XXXXXX)
run=$dir/run locks=$dir/locks log=$dir/kilnd.log conf=$dir/kiln.toml pid="" holder=""
cleanup() {
  set +e
  [[ -n $holder ]] && kill "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
  if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "operations_e2e: FAIL: $*" >&2; echo "--- kilnd log" >&2; tail -40 "$log" >&2; exit 1; }
ctl() { "$bin/kilnctl" "$@" --runtime-dir "$run"; }
json_field() { "$python" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

echo "== 1. start from kiln.toml with metrics and JSON logs"
cat >"$conf" <<TOML
[daemon]
metrics = "unix"
log_format = "json"
job_memory_mib = 0
TOML
"$bin/kilnd" --device cpu --config "$conf" --runtime-dir "$run" --lock-dir "$locks" >"$log" 2>&1 &
pid=$!
metrics=$run/kilnd-cpu.metrics
for _ in $(seq 200); do
  [[ -S $metrics ]] && ctl status >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || fail "kilnd exited at start"
  sleep 0.05
done
[[ -S $metrics ]] || fail "no metrics socket at $metrics"
[[ $(stat -c %a "$metrics") == 600 ]] || fail "the metrics socket is $(stat -c %a "$metrics"), not 0600"

echo "== 2. scrapes under load"
"$bin/kiln-demo" --connect --device cpu --runtime-dir "$run" --workers 2 --steps 200 >"$dir/demo.log" 2>&1 &
demo=$!
scrapes=0 loaded=0
while kill -0 "$demo" 2>/dev/null; do
  s=$("$python" "$here/scrape_metrics.py" "unix:$metrics" --json) || fail "a scrape under load failed"
  scrapes=$((scrapes + 1))
  # A scrape that saw the demo's workers connected was taken under their load.
  [[ $(json_field "int(d.get('kiln_job_clients{job=\"demo\",owner_uid=\"$(id -u)\"}', 0))" <<<"$s") -ge 1 ]] &&
    loaded=$((loaded + 1))
done
wait "$demo" || fail "kiln-demo --connect failed: $(tail -5 "$dir/demo.log")"
echo "$scrapes scrapes parsed, $loaded of them with the demo's workers connected"
((loaded >= 1)) || fail "no scrape ran while the demo's workers were connected"

echo "== 3. the metrics add up with the status"
for _ in $(seq 100); do  # the workers' sessions end (their last drops drained)
  [[ $(ctl clients --json | json_field "sum(1 for c in d if not c['job'].startswith('kilnctl-'))") == 0 ]] && break
  sleep 0.1
done
m=$("$python" "$here/scrape_metrics.py" "unix:$metrics" --json) || fail "scrape after the load"
st=$(ctl status --json)
for pair in plans:kiln_plans cache_hits:kiln_plan_cache_hits_total explorations:kiln_plan_cache_misses_total \
  fused_launches:'kiln_launches_total{kind="fused"}' memory_bytes:kiln_memory_bytes; do
  key=${pair%%:*} metric=${pair#*:}
  a=$(json_field "d['$key']" <<<"$st")
  b=$(json_field "int(d['$metric'])" <<<"$m")
  [[ $a == "$b" ]] || fail "status $key = $a, metrics $metric = $b"
done
served=$(json_field "d['clients_served']" <<<"$st")
[[ $(json_field "int(d['kiln_clients_served_total'])" <<<"$m") -le $served ]] || fail "clients served"
[[ $(json_field "int(d['kiln_request_duration_seconds_count{command=\"read\"}'])" <<<"$m") -ge 400 ]] ||
  fail "fewer than 400 reads (200 steps, 2 workers) in the request histogram"

echo "== 3b. plans: list, show as DOT, clear"
ctl plans --limit 5 | grep -q "CREATED BY" || fail "kilnctl plans has no header"
first=$(ctl plans --json --sort id --limit 1 | json_field "d['shown'][0]['id']")
[[ $(ctl plans --json --limit 0 | json_field "d['plans']") -gt 0 ]] || fail "kilnctl plans lists no plan"
ctl plans --json --limit 0 | json_field "[p['created_by'] for p in d['shown']]" | grep -q demo ||
  fail "no plan is credited to the demo's job"
ctl plans show "$first" --format dot >"$dir/plan.dot" || fail "kilnctl plans show $first --format dot"
head -1 "$dir/plan.dot" | grep -q "^digraph plan_$first {" || fail "not a DOT graph: $(head -3 "$dir/plan.dot")"
if command -v dot >/dev/null; then dot -Tsvg "$dir/plan.dot" >/dev/null || fail "dot rejected the graph"; fi
count=$(ctl plans --json | json_field "d['plans']")
ctl plans clear | grep -q "^retired $count of $count plans" || fail "kilnctl plans clear"
[[ $(ctl status --json | json_field "d['plans']") == 0 ]] || fail "plans left after kilnctl plans clear"

echo "== 4. jobs, clients, limits, disconnect"
"$hostile" --runtime-dir "$run" --socket kilnd-cpu.sock --job holder --seconds 60 join >"$dir/holder.log" 2>&1 &
holder=$!
for _ in $(seq 100); do ctl jobs | grep -q '^holder ' && break; sleep 0.1; done
ctl jobs | grep -q '^holder ' || fail "kilnctl jobs does not list the holder's job"
id=$(ctl clients --json | json_field "[c['id'] for c in d if c['job'] == 'holder'][0]")
ctl limits set job_memory_mib=2048 uid_jobs=8 | grep -q "^job_memory_mib = 2048$" || fail "limits set"
[[ $(ctl limits --json | json_field "d['uid_jobs']") == 8 ]] || fail "uid_jobs not set live"
if ctl limits set job_memory=1 2>"$dir/bad.err"; then fail "an unknown limit key was accepted"; fi
grep -q "unknown key 'job_memory'" "$dir/bad.err" || fail "no reason for the unknown key: $(cat "$dir/bad.err")"
ctl disconnect "$id" | grep -q "client $id (job holder" || fail "kilnctl disconnect $id"
ctl jobs | grep -q '^holder ' && fail "the holder's job is still listed after its disconnect"
kill "$holder" 2>/dev/null || true  # it holds its connection for 60 s: it was told nothing
wait "$holder" 2>/dev/null || true
holder=""

echo "== 5. SIGHUP and kilnctl reload"
cat >"$conf" <<TOML
[daemon]
metrics = "unix"
log_format = "json"
job_memory_mib = 512
TOML
kill -HUP "$pid"
for _ in $(seq 100); do [[ $(ctl limits --json | json_field "d['job_memory_mib']") == 512 ]] && break; sleep 0.05; done
[[ $(ctl limits --json | json_field "d['job_memory_mib']") == 512 ]] || fail "SIGHUP did not apply job_memory_mib"
kill -0 "$pid" || fail "kilnd died on SIGHUP"
echo "arena_mib = 128" >>"$conf"
out=$(ctl reload) || fail "kilnctl reload"
grep -q "arena_mib: 64 -> 128" <<<"$out" || fail "reload did not name arena_mib as needing a restart: $out"
grep -q "needs a restart" <<<"$out" || fail "reload output: $out"
echo "uid_jobs = -3" >>"$conf"
if ctl reload 2>"$dir/reload.err"; then fail "a malformed kiln.toml was reloaded"; fi
grep -q "uid_jobs" "$dir/reload.err" || fail "the failed reload did not name the key: $(cat "$dir/reload.err")"
[[ $(ctl limits --json | json_field "d['job_memory_mib']") == 512 ]] || fail "a failed reload changed the limits"

echo "== 6. JSON logs"
"$python" - "$log" <<'PY' || fail "the log is not one JSON object per line"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
objs = [json.loads(l) for l in lines]
assert all({"time", "level", "msg", "pid"} <= o.keys() for o in objs), "a line lacks a field"
gone = [o for o in objs if "gone:" in o["msg"]]
assert gone and all("client" in o and "job" in o for o in gone), "client lines without client and job"
assert any(o.get("job") == "holder" and "disconnected by the operator" in o["msg"] for o in objs), \
    "the operator's disconnect is not logged with the client's job"
assert any("reload: arena_mib: 64 -> 128 (at the next restart)" in o["msg"] for o in objs), "no reload line"
print(f"{len(objs)} JSON log lines")
PY

echo "== 7. drain --exit"
ctl drain --exit --timeout 30 | grep -q "drained: no client left" || fail "kilnctl drain --exit"
rc=0
wait "$pid" || rc=$?
pid=""
((rc == 0)) || fail "kilnd exited $rc after drain --exit"
[[ -e $metrics ]] && fail "the metrics socket was left behind"
echo "operations_e2e: OK"
