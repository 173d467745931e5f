#!/usr/bin/env bash
# quickstart.sh: kiln's two entry points (see README.md).
#
#   ./quickstart.sh demo   install dependencies, build the `release` preset, run the main job
#   ./quickstart.sh test   install dependencies, build the `dev` preset (ASan + UBSan),
#                          run every test (ctest --preset dev); non-zero on any failure,
#                          and on a run where no test ran
#
# Options:
#   --preset NAME   use another CMake preset (dev, release, tsan; see CMakePresets.json)
#   -h, --help      show this help
#
# Environment: KILN_JOBS (build/test parallelism, default: nproc),
#              KILN_TEST_TIMEOUT (seconds, default 600, for tests that set no TIMEOUT of their own)
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT"

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { printf 'quickstart: %s\n' "$*" >&2; exit 2; }

# step "what" cmd...: prints a progress line, runs cmd, and stops with a clear message on failure.
step() {
  local what=$1 rc=0; shift
  echo "==> $what ..."
  "$@" || rc=$?
  if ((rc != 0)); then
    printf 'quickstart: %s failed (exit %d)\n' "$what" "$rc" >&2
    exit "$rc"
  fi
}

# ---- main job ---------------------------------------------------------------------------------
# What `./quickstart.sh demo` runs after the build: examples/torch/train_workers.py starts kilnd
# on the best device (the CPU without a GPU) and four PyTorch worker processes, each training
# the GPT of examples/torch/gpt.py on the `kiln` device through that daemon (its own seed); it
# prints each worker's steps, loss and tokens/s and the daemon's plan-cache figures, writes the
# loss curves to <build>/kiln-demo-losses.png, and exits 0 only if every worker's loss fell.
# KILN_DEMO_ARGS adds options (e.g. "--workers 2 --steps 500 --out /tmp/losses.png"; --help
# lists them). Without the PyTorch device (KILN_SETUP_TORCH=0, or CMake found no torch) it says
# so and runs the C++ demo, apps/kiln-demo (MLP workers through the same kilnd), instead.
main_job() {
  local bin=$1 kilnd=$1/apps/kilnd kilnctl=$1/apps/kilnctl python
  # The Python the device was built against (CMake's KILN_TORCH_PYTHON), else the project venv's.
  python=$(sed -n 's/^KILN_TORCH_PYTHON:[A-Z]*=//p' "$bin/CMakeCache.txt" 2>/dev/null) || true
  [[ -n $python ]] || python=$ROOT/.venv/bin/python
  if [[ -f $bin/python/kiln/libkiln_torch.so && -x $python ]]; then
    [[ -x $kilnd && -x $kilnctl ]] || die "$kilnd or $kilnctl was not built"
    # shellcheck disable=SC2086
    step "running the demo (examples/torch/train_workers.py ${KILN_DEMO_ARGS:-})" \
      "$python" examples/torch/train_workers.py --kilnd "$kilnd" --kilnctl "$kilnctl" \
      --pythonpath "$bin/python" --out "$bin/kiln-demo-losses.png" ${KILN_DEMO_ARGS:-}
  else
    echo "quickstart: the PyTorch device was not built ($bin/python/kiln/libkiln_torch.so is missing:" \
      "KILN_SETUP_TORCH=0, or CMake found no torch 2.11; see docs/pytorch.md), so the PyTorch demo" \
      "cannot run; running the C++ demo (apps/kiln-demo) instead" >&2
    local demo=$bin/apps/kiln-demo
    [[ -x $demo ]] || die "$demo was not built"
    # shellcheck disable=SC2086
    step "running the C++ demo ($demo --workers 2 ${KILN_DEMO_ARGS:-})" "$demo" --workers 2 ${KILN_DEMO_ARGS:-}
  fi
}
# -----------------------------------------------------------------------------------------------

cmd="" preset=""
while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --preset) (($# >= 2)) || die "--preset needs a name"; preset=$2; shift 2 ;;
    --preset=*) preset=${1#--preset=}; shift ;;
    demo|test) [[ -z $cmd ]] || die "give one command, not '$cmd' and '$1'"; cmd=$1; shift ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ -n $cmd ]] || { usage >&2; die "give a command: demo or test"; }
if [[ -z $preset ]]; then
  if [[ $cmd == demo ]]; then preset=release; else preset=dev; fi
fi
[[ $preset =~ ^[A-Za-z0-9_-]+$ ]] || die "bad preset name '$preset'"

jobs=${KILN_JOBS:-$(nproc 2>/dev/null || echo 2)}
bin_dir=build/$preset   # binaryDir of every preset in CMakePresets.json
start=$SECONDS

step "setup (scripts/setup.sh)" bash scripts/setup.sh
step "configuring ($preset)" cmake --preset "$preset"
step "building ($preset) with $jobs jobs" cmake --build --preset "$preset" --parallel "$jobs"

case $cmd in
  demo)
    main_job "$bin_dir"
    ;;
  test)
    # Sanitizer reports with a stack; the dev preset already makes UBSan fatal.
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
    step "testing ($preset)" ctest --preset "$preset" --output-on-failure --no-tests=error \
      --parallel "$jobs" --timeout "${KILN_TEST_TIMEOUT:-600}"
    ;;
esac
echo "==> $cmd ($preset) done in $((SECONDS - start)) s"
