#!/usr/bin/env bash
# bench/gpu/pack.sh [DEST] — builds the GPU check's programs on this machine (Release, the same
# flags as check.sh) and packs them with the shared libraries they load into DEST (default
# .gpu-carry), for `KILN_GPU_PREBUILT=DEST bench/gpu/check.sh` on a GPU machine that has the
# CUDA toolkit and a driver but not kiln's build dependencies (Boost, oneTBB, spdlog, ...).
#
# DEST/bin: the programs. DEST/lib: the libraries they need that are not part of the C and C++
# run time (cudart included; never libcuda, the driver's, nor NVRTC, 100+ MiB: check.sh finds
# the GPU machine's own). DEST/lib/sys: this machine's loader, C and C++ run time, used only
# when the GPU machine's C library is older than the one the programs were built against.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KILN_GPU_BUILD:-$ROOT/build/gpu}
DEST=${1:-$ROOT/.gpu-carry}
# shellcheck source=bench/gpu/programs.sh
source "$ROOT/bench/gpu/programs.sh"

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S "$ROOT" -B "$BUILD" "${KILN_GPU_CMAKE_FLAGS[@]}"
elif ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt"; then
  echo "pack.sh: $BUILD is not a Release build; use another KILN_GPU_BUILD" >&2
  exit 1
fi
targets=()
for p in "${KILN_GPU_PROGRAMS[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"

# DEST is replaced whole: only a directory this script made (it holds `commit`) or a new one.
if [[ -e $DEST && ! -f $DEST/commit ]]; then
  echo "pack.sh: $DEST exists and is not a pack directory (no commit file); not replacing it" >&2
  exit 1
fi
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib/sys"
for p in "${KILN_GPU_PROGRAMS[@]}"; do cp "$BUILD/$p" "$DEST/bin/"; done
declare -A seen=()
for p in "${KILN_GPU_PROGRAMS[@]}"; do
  if ldd "$BUILD/$p" | grep -q 'not found'; then
    echo "pack.sh: $p needs a library this machine does not have:" >&2
    ldd "$BUILD/$p" | grep 'not found' >&2
    exit 1
  fi
  while read -r name path; do
    [[ -z $path || -n ${seen[$name]:-} ]] && continue
    seen[$name]=1
    case $name in
      libcuda.so* | libnvrtc* | linux-vdso*) ;;
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | ld-linux*)
        cp -L "$path" "$DEST/lib/sys/$name" ;;
      *) cp -L "$path" "$DEST/lib/$name" ;;
    esac
  done < <(ldd "$BUILD/$p" | awk '/=>/ {print $1, $3} !/=>/ && /ld-linux/ {n=$1; sub(".*/", "", n); print n, $1}')
done
git -C "$ROOT" rev-parse HEAD > "$DEST/commit" 2> /dev/null || echo unknown > "$DEST/commit"
echo "# packed $(ls "$DEST/bin" | wc -l) programs, $(du -sh "$DEST" | cut -f1), into $DEST"
