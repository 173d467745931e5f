#!/usr/bin/env bash
# Runs bench/layers/bench_layers.py (kiln's fast CPU paths for convolution, pooling, layer norm,
# embedding backward and sort against PyTorch's CPU kernels, side by side) with a build's kiln
# package and the project venv, and keeps a copy of the output under the build folder.
#
# usage: bench/layers/run.sh [--quick] [bench_layers.py options...]   (see bench_layers.py --help)
#   --quick   smoke run: small shapes, 2 reps (not a benchmark)
# env:
#   KILN_BUILD  the build whose python/ folder holds kiln (default <repo>/build/release)
#   PYTHON      the Python with torch 2.11 (default <repo>/.venv/bin/python)
#   OUT         where the output is copied (default $KILN_BUILD/bench-layers/latest.txt, or
#               quick.txt with --quick)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

ARGS=()
NAME=latest
for arg in "$@"; do
  case "$arg" in
    --quick) NAME=quick; ARGS+=("$arg") ;;
    -h|--help) sed -n '2,12p' "$0"; exec "${PYTHON:-$REPO/.venv/bin/python}" "$HERE/bench_layers.py" --help ;;
    *) ARGS+=("$arg") ;;
  esac
done

BUILD="${KILN_BUILD:-$REPO/build/release}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x $PY ]] || { echo "no Python at $PY (scripts/setup.sh makes .venv; or set PYTHON)" >&2; exit 1; }
if [[ ! -f $BUILD/python/kiln/_build_info.py ]]; then
  echo "no kiln package in $BUILD/python (build it: cmake --preset release && cmake --build --preset release;" \
       "or set KILN_BUILD)" >&2
  exit 1
fi
if grep -q 'SANITIZE = ".*address' "$BUILD/python/kiln/_build_info.py"; then
  echo "$BUILD is a sanitizer build: its figures would not be benchmarks (use build/release)" >&2
  exit 1
fi

OUT="${OUT:-$BUILD/bench-layers/$NAME.txt}"
mkdir -p "$(dirname "$OUT")"
echo ">> $PY bench_layers.py --kiln-path $BUILD/python ${ARGS[*]:-}  -> $OUT" >&2
"$PY" "$HERE/bench_layers.py" --kiln-path "$BUILD/python" --python "$PY" "${ARGS[@]}" | tee "$OUT"
