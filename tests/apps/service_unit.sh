#!/usr/bin/env bash
# The service install (ctest: apps_service_unit, label app), as an operator uses it:
#   1. `cmake --install --component service` into a fresh prefix puts kilnd, kilnctl, the unit,
#      the example kiln.toml and the operator's guide where the unit says they are;
#   2. systemd-analyze verify accepts the unit for a CPU and a GPU instance (skipped, exit 77,
#      where systemd is not installed);
#   3. kilnd starts with the example configuration and the unit's flags for that instance (paths
#      moved under a temporary directory) and answers kilnctl; SIGTERM stops it with status 0.
# Usage: service_unit.sh BUILD_DIR CMAKE
set -euo pipefail
build=${1:?usage: service_unit.sh BUILD_DIR CMAKE}
cmake=${2:?usage: service_unit.sh BUILD_DIR CMAKE}
dir=$(mktemp -d /tmp/kiln-service-XXXXXX)
prefix=$dir/prefix pid=""
cleanup() {
  set +e
  if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "service_unit: FAIL: $*" >&2; for f in "$dir"/*.log; do [[ -f $f ]] && { echo "--- $f"; cat "$f"; }; done >&2; exit 1; }

echo "== 1. install"
"$cmake" --install "$build" --prefix "$prefix" --component service >"$dir/install.log" 2>&1 || fail "cmake --install failed"
unit=$prefix/lib/systemd/system/kilnd@.service
for f in "$prefix/bin/kilnd" "$prefix/bin/kilnctl" "$unit" "$prefix/etc/kiln/kiln.toml.example" \
  "$prefix/share/doc/kiln/operations.md"; do
  [[ -e $f ]] || fail "not installed: ${f#"$prefix"/}"
done
grep -q "^ExecStart=$prefix/bin/kilnd --device %i --config $prefix/etc/kiln/kiln.toml" "$unit" ||
  fail "the unit does not start the installed kilnd with the installed configuration: $(grep ExecStart "$unit")"
if grep -q "@KILN_" "$unit"; then fail "unsubstituted placeholder in the unit"; fi

echo "== 2. systemd-analyze verify"
if command -v systemd-analyze >/dev/null 2>&1; then
  for instance in cpu cuda0; do
    cp "$unit" "$dir/kilnd@$instance.service"
    if ! systemd-analyze verify --man=no "$dir/kilnd@$instance.service" >"$dir/verify-$instance.log" 2>&1; then
      fail "systemd-analyze verify refused kilnd@$instance"
    fi
    # Warnings are failures too.
    if [[ -s $dir/verify-$instance.log ]]; then fail "systemd-analyze verify warned about kilnd@$instance"; fi
  done
  verified=1
else
  echo "systemd-analyze not installed: the unit is not verified"
  verified=0
fi

echo "== 3. kilnd with the example configuration"
cp "$prefix/etc/kiln/kiln.toml.example" "$dir/kiln.toml"
run=$dir/run
mkdir -p "$dir/cache"
mkdir -m 0710 "$run"  # as systemd makes it (RuntimeDirectory=, RuntimeDirectoryMode=0710, Group=)
chgrp "$(id -gn)" "$run"
"$prefix/bin/kilnd" --device cpu --config "$dir/kiln.toml" --runtime-dir "$run" --lock-dir "$run/locks" \
  --plan-cache "$dir/cache/plans-cpu" --allowed-group "$(id -gn)" >"$dir/kilnd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [[ -S $run/kilnd-cpu.sock ]] && "$prefix/bin/kilnctl" status --runtime-dir "$run" >"$dir/status.log" 2>&1 && break
  kill -0 "$pid" 2>/dev/null || fail "kilnd exited at start with the example configuration"
  sleep 0.05
done
grep -q "plan store" "$dir/status.log" || fail "kilnctl status did not answer"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
((rc == 0)) || fail "kilnd exited $rc after SIGTERM"
((verified)) || exit 77
echo "service_unit: ok"
