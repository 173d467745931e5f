#!/usr/bin/env bash
# Runs kiln-bench-peers inside the peer kit's passes (../shared/bench-peers/run.sh with
# EXTRA_PEER_CMD), so that kiln and its peers (numpy, numexpr, torch, Eigen, the STREAM probe)
# are measured in the same passes on the same machine state, then prints the joined markdown
# table (the kit's summarize.py) followed by kiln's target ratios, and saves both under build/.
#
# usage: bench/peers/run-with-peers.sh [--quick] [--no-install] [--help]
#   --quick       the kit's smoke run: 1 pass, few repetitions (BENCH_QUICK=1)
#   --no-install  passed to run.sh: never call apt-get
# env:
#   PASSES           passes of the whole suite (default 3; the summary keeps each cell's best)
#   BUILD_DIR        where kiln-bench-peers is built (default <repo>/build/release; when the
#                    binary is missing there, the release preset is configured and built)
#   KILN_BENCH_ARGS  extra options for kiln-bench-peers (e.g. "--mode fused")
#   PEER_KIT         the kit's folder (default <repo>/../shared/bench-peers)
#   PEERS_WORK       where the kit builds its C++ peers and writes results
#                    (default <repo>/build/bench-peers; shared/ is read-only in CI)
#   BENCH_TARGET_S / BENCH_MIN_REPS / BENCH_MAX_REPS / BENCH_WARMUP_S: as in the kit
# output: $PEERS_WORK/results/{latest,quick}.{txt,md} (run.sh) and
#         $PEERS_WORK/results/kiln-with-peers{,-quick}.md (the table + kiln's target ratios)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

QUICK=0
KIT_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1; KIT_ARGS+=(--quick) ;;
    --no-install) KIT_ARGS+=(--no-install) ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg (see --help)" >&2; exit 2 ;;
  esac
done

KIT="${PEER_KIT:-$REPO/../shared/bench-peers}"
[[ -x $KIT/run.sh ]] || { echo "peer kit not found at $KIT (set PEER_KIT)" >&2; exit 1; }
KIT="$(cd "$KIT" && pwd)"

DEFAULT_BUILD="$REPO/build/release"
BUILD_DIR="${BUILD_DIR:-$DEFAULT_BUILD}"
BIN="$BUILD_DIR/bench/kiln-bench-peers"
if [[ ! -x $BIN ]]; then
  if [[ $BUILD_DIR -ef $DEFAULT_BUILD || $BUILD_DIR == "$DEFAULT_BUILD" ]]; then
    echo ">> $BIN missing: building the release preset" >&2
    (cd "$REPO" && cmake --preset release >&2 && cmake --build --preset release --target kiln-bench-peers >&2)
  else
    echo "$BIN missing (build it: cmake --build $BUILD_DIR --target kiln-bench-peers)" >&2
    exit 1
  fi
fi

# The kit runs EXTRA_PEER_CMD from its own folder: give the program relative to it.
REL_BIN="$(realpath --relative-to="$KIT" "$BIN")"
export EXTRA_PEER_CMD="$REL_BIN${KILN_BENCH_ARGS:+ $KILN_BENCH_ARGS}"
export PASSES="${PASSES:-3}"
export PEERS_WORK="${PEERS_WORK:-$REPO/build/bench-peers}"
mkdir -p "$PEERS_WORK"
PEERS_WORK="$(cd "$PEERS_WORK" && pwd)"

echo ">> peer kit: $KIT" >&2
echo ">> EXTRA_PEER_CMD=$EXTRA_PEER_CMD  PASSES=$PASSES  PEERS_WORK=$PEERS_WORK" >&2
status=0
"$KIT/run.sh" "${KIT_ARGS[@]}" > "$PEERS_WORK/run.log" || status=$?

if ((QUICK)); then NAME=quick; OUTMD="$PEERS_WORK/results/kiln-with-peers-quick.md"
else NAME=latest; OUTMD="$PEERS_WORK/results/kiln-with-peers.md"; fi
TXT="$PEERS_WORK/results/$NAME.txt"
if [[ ! -f $TXT ]]; then
  echo "run.sh produced no $TXT (exit status $status); its output is in $PEERS_WORK/run.log" >&2
  exit 1
fi
PY="${PYTHON:-/usr/bin/python3}"
{
  "$PY" "$KIT/summarize.py" "$TXT"
  echo
  "$PY" "$HERE/targets.py" "$TXT"
} > "$OUTMD"
cat "$OUTMD"
echo >&2
echo "wrote $OUTMD (raw lines: $TXT, kit log: $PEERS_WORK/run.log)" >&2
if ((status != 0)); then
  echo "run.sh exited with status $status (a peer failed: see '# FAILED' lines in $TXT)" >&2
fi
exit "$status"
