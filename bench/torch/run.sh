#!/usr/bin/env bash
# Runs bench/torch/bench_torch.py (kiln as a PyTorch device against PyTorch CPU eager and
# torch.compile: GPT and CNN training steps, the host cost of one small op) with a build's kiln
# package and the project venv, and keeps a copy of the output under the build folder.
#
# usage: bench/torch/run.sh [--quick] [bench_torch.py options...]   (see bench_torch.py --help)
#   --quick   smoke run: 1 round, 3 timed steps, short host loops (BENCH_QUICK=1)
# env:
#   KILN_BUILD  the build whose python/ folder holds kiln (default <repo>/build/release); a
#               sanitizer build (e.g. build/dev) gets the ASan runtime preloaded in the processes
#               that import kiln, and its figures are marked as not benchmarks
#   PYTHON      the Python with torch 2.11 (default <repo>/.venv/bin/python)
#   OUT         where the output is copied (default $KILN_BUILD/bench-torch/latest.txt, or
#               quick.txt with --quick)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

ARGS=()
QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exec "${PYTHON:-$REPO/.venv/bin/python}" "$HERE/bench_torch.py" --help ;;
    *) ARGS+=("$arg") ;;
  esac
done
((QUICK)) && export BENCH_QUICK=1

BUILD="${KILN_BUILD:-$REPO/build/release}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x $PY ]] || { echo "no Python at $PY (scripts/setup.sh makes .venv; or set PYTHON)" >&2; exit 1; }
INFO="$BUILD/python/kiln/_build_info.py"
if [[ ! -f $INFO ]]; then
  echo "no kiln package in $BUILD/python (build it: cmake --preset release && cmake --build --preset release;" \
       "or set KILN_BUILD)" >&2
  exit 1
fi

PRELOAD=()
if grep -q 'SANITIZE = ".*address' "$INFO"; then
  PRELOAD=(--kiln-preload "$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)")
  echo ">> $BUILD is a sanitizer build: ASan preloaded for kiln's processes; the figures are not benchmarks" >&2
fi

if ((QUICK)); then NAME=quick; else NAME=latest; fi
OUT="${OUT:-$BUILD/bench-torch/$NAME.txt}"
mkdir -p "$(dirname "$OUT")"
echo ">> $PY bench_torch.py --kiln-path $BUILD/python ${ARGS[*]:-}  -> $OUT" >&2
"$PY" "$HERE/bench_torch.py" --kiln-path "$BUILD/python" --python "$PY" "${PRELOAD[@]}" "${ARGS[@]}" | tee "$OUT"
