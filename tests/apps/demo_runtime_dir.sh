#!/usr/bin/env bash
# kiln-demo with a runtime directory the user chose (ctest: apps_demo_runtime_dir, label app): the
# demo trains through its private kilnd there and, on exit, leaves the directory and whatever the
# user kept in it; only a temporary directory it made itself is removed.
# Usage: demo_runtime_dir.sh BIN_DIR (the build's apps/ directory)
set -euo pipefail
bin=${1:?usage: demo_runtime_dir.sh BIN_DIR}
dir=$(mktemp -d /tmp/kiln-demo-dir-XXXXXX)
trap 'rm -rf "$dir"' EXIT
echo "keep me" >"$dir/user-file"
"$bin/kiln-demo" --device cpu --workers 1 --steps 10 --runtime-dir "$dir" >"$dir.log" 2>&1 ||
  { cat "$dir.log" >&2; rm -f "$dir.log"; echo "demo_runtime_dir: FAIL: kiln-demo failed" >&2; exit 1; }
rm -f "$dir.log"
[[ -f $dir/user-file ]] || { echo "demo_runtime_dir: FAIL: kiln-demo removed the user's directory" >&2; exit 1; }
[[ $(cat "$dir/user-file") == "keep me" ]] || { echo "demo_runtime_dir: FAIL: the user's file changed" >&2; exit 1; }
echo "demo_runtime_dir: the user's runtime directory and its files survive the demo"
