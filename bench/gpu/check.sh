#!/usr/bin/env bash
# bench/gpu/check.sh — the CUDA backend's check on a GPU machine, in under 8 minutes:
#   1. probe (nvidia-smi, when present)
#   2. configure and build the programs of bench/gpu/programs.sh (Release); or, with
#      KILN_GPU_PREBUILT=DIR, take them from DIR, where bench/gpu/pack.sh packed them elsewhere
#      (for a GPU machine without kiln's build dependencies; NVRTC is then the machine's own)
#   3. the cuda unit tests (codegen, launch helpers, probe, disk cache), NVRTC compilation of
#      every kernel kind for sm_90 and the oldest architecture, and the GPU tests (fails if
#      they skip on a GPU machine), side by side with
#   4. differential tests against the CPU reference executor (random elementwise programs;
#      KILN_DIFF_PROGRAMS, default 300; each is a new structure, so a new NVRTC compilation),
#      and KILN_FAST_DIFF_PROGRAMS (default 100) of them again with fast f32 exp/log
#   5. benchmarks W1-W4 at 2^24..2^28 elements: kiln fused and unfused, a device-to-device copy,
#      kiln fused with fast f32 exp/log (peer kiln-cuda-fused-fastmath),
#      PyTorch eager, torch.compile and CuPy (missing libraries are skipped with a message), in
#      the peer kit's line format; joined into a table when the kit's summarize.py is found;
#      the row workloads LN and CE at 2^24 and 2^28 against PyTorch eager and torch.compile
#   6. kiln-demo on the GPU: kilnd --device cuda and two training workers (KILN_GPU_NO_DEMO=1
#      skips it; KILN_GPU_DEMO_STEPS, default 300)
# Everything goes to $OUT/check.log (default build/gpu/check/check.log); result lines to
# $OUT/results.txt. Exit status: 0 when every step passed, else the number of failed steps.
#
# Knobs: KILN_GPU_BUILD (build dir), KILN_GPU_OUT, KILN_GPU_SIZES (comma list), KILN_GPU_ROW_SIZES, KILN_DIFF_PROGRAMS,
# KILN_GPU_BUDGET_S (total budget, default 470), BENCH_TARGET_S / BENCH_MIN_REPS (timing),
# KILN_GPU_PREBUILT, KILN_GPU_NO_DEMO, PYTHON. Needs bash >= 4.4 (empty arrays under set -u).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KILN_GPU_BUILD:-$ROOT/build/gpu}
OUT=${KILN_GPU_OUT:-$BUILD/check}
SIZES=${KILN_GPU_SIZES:-16777216,33554432,67108864,134217728,268435456}
ROW_SIZES=${KILN_GPU_ROW_SIZES:-16777216,268435456}  # LN and CE
BUDGET=${KILN_GPU_BUDGET_S:-470}
# The kit's defaults (0.4 s per cell) times ~140 cells would not fit in 8 minutes.
export BENCH_TARGET_S=${BENCH_TARGET_S:-0.1}
export BENCH_MIN_REPS=${BENCH_MIN_REPS:-5}
export BENCH_WARMUP_S=${BENCH_WARMUP_S:-0.05}
DIFF_PROGRAMS=${KILN_DIFF_PROGRAMS:-300}
FAST_DIFF_PROGRAMS=${KILN_FAST_DIFF_PROGRAMS:-100}
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
# shellcheck source=bench/gpu/programs.sh
source "$ROOT/bench/gpu/programs.sh"

if [[ -n ${KILN_GPU_PREBUILT:-} ]]; then
  # Programs built elsewhere by bench/gpu/pack.sh: this machine needs the CUDA driver and NVRTC
  # (the toolkit's or a Python wheel's), not kiln's build dependencies.
  PRE=$(cd "$KILN_GPU_PREBUILT" && pwd)
  BIN=$PRE/bin
  echo "# prebuilt programs from $PRE (commit $(cat "$PRE/commit" 2> /dev/null || echo '?'))"
  nvrtc_dir=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/libnvrtc.so.13 ]] && nvrtc_dir=$d && break
  done
  if [[ -z $nvrtc_dir ]]; then
    found=$(find /usr /opt -name 'libnvrtc.so.13' 2> /dev/null | head -1 || true)
    [[ -n $found ]] && nvrtc_dir=$(dirname "$found")
  fi
  echo "# NVRTC from ${nvrtc_dir:-nowhere}"
  export LD_LIBRARY_PATH="$PRE/lib${nvrtc_dir:+:$nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [[ -z ${KILN_CUDA_INCLUDE:-} && ! -f /usr/local/cuda/include/cuda_fp16.h ]]; then
    inc=$(find /usr /opt -name cuda_fp16.h -path '*include*' 2> /dev/null | head -1 || true)
    [[ -n $inc ]] && export KILN_CUDA_INCLUDE=$(dirname "$inc")
  fi
  echo "# CUDA headers for NVRTC: ${KILN_CUDA_INCLUDE:-/usr/local/cuda/include}"
  RUN=()
  if ! "$BIN/cuda_probe_test" --gtest_list_tests > /dev/null 2>&1; then
    # An older C library here than where they were built: the packed loader and run time.
    { "$BIN/cuda_probe_test" --gtest_list_tests 2>&1 || true; } | head -3 || true
    RUN=("$PRE/lib/sys/ld-linux-x86-64.so.2" --library-path "$PRE/lib/sys:$LD_LIBRARY_PATH")
    echo "# running the programs through the packed loader"
  fi
else
  BIN=$BUILD/bin-links
  RUN=()
  step configure 120 cmake -S "$ROOT" -B "$BUILD" "${KILN_GPU_CMAKE_FLAGS[@]}"
  if [[ ! -f $BUILD/build.ninja ]]; then
    echo "### configure produced no build; stopping"
    exit 1
  fi
  if ! grep -q "kiln_cuda" "$BUILD/build.ninja"; then
    echo "### CMake did not find the CUDA toolkit: no cuda module to check (see the configure output)"
    exit 1
  fi
  targets=()
  for p in "${KILN_GPU_PROGRAMS[@]}"; do targets+=("$(basename "$p")"); done
  step build 240 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
  mkdir -p "$BIN"
  for p in "${KILN_GPU_PROGRAMS[@]}"; do
    if [[ -x $BUILD/$p ]]; then ln -sf "$BUILD/$p" "$BIN/"; fi
  done
fi
# Every program the steps below run must be there: a missing one is a failed step, never a
# silently skipped check.
for p in "${KILN_GPU_PROGRAMS[@]}"; do
  if [[ ! -x $BIN/$(basename "$p") ]]; then
    echo "### missing program: $(basename "$p") (not built or not packed)"
    FAILED+=("missing $(basename "$p")")
  fi
done
# printf %q: the runner's words survive the bash -c of the benchmark steps.
RUN_Q=""
if ((${#RUN[@]} > 0)); then RUN_Q=$(printf '%q ' "${RUN[@]}"); fi

if [[ -x $BIN/cuda_gpu_test ]]; then
  for t in codegen launch probe disk_cache; do
    step "unit-$t" 60 "${RUN[@]}" "$BIN/cuda_${t}_test" --gtest_brief=1
  done
  # Every kernel kind compiled by this machine's NVRTC for sm_90 and the oldest architecture.
  step nvrtc 150 "${RUN[@]}" "$BIN/cuda_nvrtc_test" --gtest_brief=1
  # The GPU tests and the differential run side by side (NVRTC compiles on the CPU); the
  # benchmarks below run alone. The GPU test's own differential case is left to step
  # "differential", which runs more programs (each a new structure: a new NVRTC compilation).
  timeout --kill-after=10 150 "${RUN[@]}" "$BIN/cuda_gpu_test" --gtest_filter='-*Random*' > "$OUT/gpu_test.txt" 2>&1 &
  gpu_pid=$!
  # The same differential programs with fast f32 exp/log (CudaBackendOptions::fast_math): the
  # approximations must stay inside the same tolerances.
  timeout --kill-after=10 150 env KILN_CUDA_FAST_MATH=1 KILN_DIFF_PROGRAMS="$FAST_DIFF_PROGRAMS" "${RUN[@]}" \
    "$BIN/cuda_gpu_test" --gtest_filter='*RandomElementwise*' > "$OUT/gpu_fast_diff.txt" 2>&1 &
  fast_pid=$!
  step differential 150 env KILN_DIFF_PROGRAMS="$DIFF_PROGRAMS" "${RUN[@]}" "$BIN/cuda_gpu_test" \
    --gtest_filter='*RandomElementwise*'
  gpu_rc=0 fast_rc=0
  wait "$gpu_pid" || gpu_rc=$?
  wait "$fast_pid" || fast_rc=$?
  echo "### differential-fast-math (side by side; output follows)"
  tail -5 "$OUT/gpu_fast_diff.txt"
  if ((fast_rc != 0)); then
    { grep -B2 -A8 Failure "$OUT/gpu_fast_diff.txt" || true; } | head -40 || true
    echo "### differential-fast-math: FAILED (exit $fast_rc)"
    FAILED+=("differential-fast-math (exit $fast_rc)")
  else
    echo "### differential-fast-math: ok"
  fi
  echo "### gpu-tests (side by side with the differential run; output follows)"
  cat "$OUT/gpu_test.txt"
  if ((gpu_rc != 0)); then
    echo "### gpu-tests: FAILED (exit $gpu_rc)"
    FAILED+=("gpu-tests (exit $gpu_rc)")
  elif grep -q SKIPPED "$OUT/gpu_test.txt" && command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
    echo "### gpu-tests: SKIPPED on a machine with a GPU"
    FAILED+=("gpu-tests (skipped)")
  else
    echo "### gpu-tests: ok"
  fi
fi

if [[ -x $BIN/kiln-gpu-bench ]]; then
  step bench-kiln 150 bash -c "set -o pipefail; ${RUN_Q}'$BIN/kiln-gpu-bench' --sizes '$SIZES' | tee -a '$RESULTS'"
  step bench-kiln-fast-math 90 bash -c "set -o pipefail; ${RUN_Q}'$BIN/kiln-gpu-bench' --sizes '$SIZES' --fast-math \
    --no-copy --modes fused | tee -a '$RESULTS'"
  step bench-kiln-rows 60 bash -c "set -o pipefail; ${RUN_Q}'$BIN/kiln-gpu-bench' --workloads LN,CE \
    --sizes '$ROW_SIZES' --no-copy | tee -a '$RESULTS'"
fi
PY=${PYTHON:-python3}
if command -v "$PY" > /dev/null; then
  step bench-peers 200 bash -c "set -o pipefail; '$PY' '$ROOT/bench/gpu/peer_gpu.py' --sizes '$SIZES' | tee -a '$RESULTS'"
  step bench-peers-rows 90 bash -c "set -o pipefail; '$PY' '$ROOT/bench/gpu/peer_gpu.py' --peers torch,compile \
    --workloads LN,CE --sizes '$ROW_SIZES' | tee -a '$RESULTS'"
else
  echo "# no $PY: PyTorch / CuPy peers skipped"
fi

if [[ -x $BIN/kiln-demo && -z ${KILN_GPU_NO_DEMO:-} ]]; then
  if ((${#RUN[@]} > 0)); then
    # kiln-demo starts kilnd and its workers itself (exec), past the packed loader.
    echo "### demo: skipped (the programs need the packed loader here, and kiln-demo execs kilnd directly)"
  else
    # The daemon on the GPU, two training workers over IPC (the README's demo, shorter).
    step demo 90 "$BIN/kiln-demo" --device cuda --workers 2 --steps "${KILN_GPU_DEMO_STEPS:-300}"
  fi
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
