#!/usr/bin/env bash
# bench/gpu/check.sh — the CUDA backend's check on a GPU machine, in under 8 minutes:
#   1. probe (nvidia-smi, when present)
#   2. configure and build the cuda module, its tests and kiln-gpu-bench (Release)
#   3. the cuda tests (NVRTC compilation for sm_90 and the oldest architecture, codegen, launch
#      helpers, disk cache, and the GPU tests; fails if the GPU tests skip on a GPU machine)
#   4. differential tests against the CPU reference executor (random elementwise programs;
#      KILN_DIFF_PROGRAMS, default 300; each is a new structure, so a new NVRTC compilation)
#   5. benchmarks W1-W4 at 2^24..2^28 elements: kiln fused and unfused, a device-to-device copy,
#      PyTorch eager, torch.compile and CuPy (missing libraries are skipped with a message), in
#      the peer kit's line format; joined into a table when the kit's summarize.py is found
# Everything goes to $OUT/check.log (default build/gpu/check/check.log); result lines to
# $OUT/results.txt. Exit status: 0 when every step passed, else the number of failed steps.
#
# Knobs: KILN_GPU_BUILD (build dir), KILN_GPU_OUT, KILN_GPU_SIZES (comma list), KILN_DIFF_PROGRAMS,
# KILN_GPU_BUDGET_S (total budget, default 470), BENCH_TARGET_S / BENCH_MIN_REPS (timing).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KILN_GPU_BUILD:-$ROOT/build/gpu}
OUT=${KILN_GPU_OUT:-$BUILD/check}
SIZES=${KILN_GPU_SIZES:-16777216,33554432,67108864,134217728,268435456}
BUDGET=${KILN_GPU_BUDGET_S:-470}
# The kit's defaults (0.4 s per cell) times ~140 cells would not fit in 8 minutes.
export BENCH_TARGET_S=${BENCH_TARGET_S:-0.1}
export BENCH_MIN_REPS=${BENCH_MIN_REPS:-5}
export BENCH_WARMUP_S=${BENCH_WARMUP_S:-0.05}
DIFF_PROGRAMS=${KILN_DIFF_PROGRAMS:-300}
# Kernels compiled by this run land in a private cache (rebuilt on every check).
export KILN_CUDA_CACHE_DIR=${KILN_CUDA_CACHE_DIR:-$OUT/kernel-cache}

mkdir -p "$OUT"
LOG=$OUT/check.log
RESULTS=$OUT/results.txt
: > "$RESULTS"
exec > >(tee "$LOG") 2>&1

START=$SECONDS
FAILED=()
left() { echo $((BUDGET - (SECONDS - START))); }

# step NAME MAX_SECONDS CMD...: runs CMD with a timeout of min(MAX, budget left), records failures.
step() {
  local name=$1 max=$2
  shift 2
  local limit
  limit=$(left)
  if ((limit > max)); then limit=$max; fi
  if ((limit < 5)); then
    echo "### $name: skipped, the time budget is spent"
    FAILED+=("$name (no time left)")
    return 0
  fi
  echo "### $name (limit ${limit}s) $(date +%T)"
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "### $name: TIMED OUT after ${limit}s"
    FAILED+=("$name (timeout)")
  elif ((rc != 0)); then
    echo "### $name: FAILED (exit $rc) after $((SECONDS - t0))s"
    FAILED+=("$name (exit $rc)")
  else
    echo "### $name: ok in $((SECONDS - t0))s"
  fi
}

echo "# kiln GPU check $(date -Is) on $(hostname), log $LOG"
echo "# source $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')), build $BUILD"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true
else
  echo "# nvidia-smi not found (the probe in the tests reports what cudart sees)"
fi
command -v nvcc > /dev/null && nvcc --version | tail -1 || echo "# nvcc not on PATH (CMake may still find the toolkit)"

JOBS=$(nproc 2> /dev/null || echo 4)
TARGETS=(kiln_cuda cuda_codegen_test cuda_launch_test cuda_probe_test cuda_disk_cache_test cuda_nvrtc_test
  cuda_gpu_test kiln-gpu-bench)

step configure 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" -DKILN_BUILD_FUZZERS=OFF -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=ON
if [[ ! -f $BUILD/build.ninja ]]; then
  echo "### configure produced no build; stopping"
  exit 1
fi
if ! grep -q "kiln_cuda" "$BUILD/build.ninja"; then
  echo "### CMake did not find the CUDA toolkit: no cuda module to check (see the configure output)"
  exit 1
fi
step build 240 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

if [[ -x $BUILD/tests/cuda/cuda_gpu_test ]]; then
  # (the GPU test's own differential run is 100 programs; step 4 runs more)
  step tests 150 ctest --test-dir "$BUILD" -R '^cuda_' --output-on-failure --timeout 140 -j 2
  # On a GPU machine the GPU tests must run, not skip.
  if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    step gpu-tests-ran 60 bash -c "! '$BUILD/tests/cuda/cuda_gpu_test' --gtest_filter='-*Random*' | tee '$OUT/gpu_test.txt' | grep -q SKIPPED"
  fi
  step differential 120 env KILN_DIFF_PROGRAMS="$DIFF_PROGRAMS" "$BUILD/tests/cuda/cuda_gpu_test" \
    --gtest_filter='*RandomElementwise*'
fi

if [[ -x $BUILD/bench/gpu/kiln-gpu-bench ]]; then
  step bench-kiln 150 bash -c "'$BUILD/bench/gpu/kiln-gpu-bench' --sizes '$SIZES' | tee -a '$RESULTS'"
fi
PY=${PYTHON:-python3}
if command -v "$PY" > /dev/null; then
  step bench-peers 200 bash -c "'$PY' '$ROOT/bench/gpu/peer_gpu.py' --sizes '$SIZES' | tee -a '$RESULTS'"
else
  echo "# no $PY: PyTorch / CuPy peers skipped"
fi

KIT=${KILN_PEERS_DIR:-$ROOT/../shared/bench-peers}
if [[ -f $KIT/summarize.py ]] && grep -q '^peer=' "$RESULTS"; then
  "$PY" "$KIT/summarize.py" "$RESULTS" > "$OUT/results.md" 2> /dev/null && echo "# table: $OUT/results.md" ||
    echo "# summarize.py could not join the results (its tables expect the CPU peers); raw lines in $RESULTS"
fi

echo
echo "# ---- results (ns_per_elem, gbps) ----"
grep '^peer=' "$RESULTS" | awk '{print $1, $2, $3, $4, $5}' || echo "# no result lines"
echo "# total $((SECONDS - START))s; log $LOG; results $RESULTS"
if ((${#FAILED[@]} > 0)); then
  echo "# FAILED steps: ${FAILED[*]}"
  exit "${#FAILED[@]}"
fi
echo "# all steps passed"
